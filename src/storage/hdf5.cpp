#include "storage/hdf5.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/check.h"

namespace zero3d {

void Hid::reset() {
  if (id_ < 0) return;
  switch (H5Iget_type(id_)) {
    case H5I_FILE: H5Fclose(id_); break;
    case H5I_GROUP: H5Gclose(id_); break;
    case H5I_DATASET: H5Dclose(id_); break;
    case H5I_DATASPACE: H5Sclose(id_); break;
    case H5I_DATATYPE: H5Tclose(id_); break;
    case H5I_ATTR: H5Aclose(id_); break;
    case H5I_GENPROP_LST: H5Pclose(id_); break;
    default: break;
  }
  id_ = H5I_INVALID_HID;
}

QuietHdf5::QuietHdf5() {
  H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}
QuietHdf5::~QuietHdf5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }

namespace {

void write_scalar(hid_t obj, const char* name, hid_t file_type, hid_t mem_type, const void* value) {
  Hid space(H5Screate(H5S_SCALAR));
  Hid attr(H5Acreate2(obj, name, file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT));
  if (!attr.valid() || H5Awrite(attr.get(), mem_type, value) < 0)
    throw Hdf5Error(std::string("writing attribute '") + name + "'");
}

bool read_scalar(hid_t obj, const char* name, H5T_class_t cls, hid_t mem_type, void* value) {
  QuietHdf5 quiet;
  if (H5Aexists(obj, name) <= 0) return false;
  Hid attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr.valid()) return false;
  Hid type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != cls) return false;
  return H5Aread(attr.get(), mem_type, value) >= 0;
}

}  // namespace

void write_attr(hid_t obj, const char* name, const std::string& value) {
  Hid type(H5Tcopy(H5T_C_S1));
  if (H5Tset_size(type.get(), std::max<size_t>(1, value.size())) < 0 || H5Tset_strpad(type.get(), H5T_STR_NULLPAD) < 0)
    throw Hdf5Error(std::string("writing attribute '") + name + "'");
  write_scalar(obj, name, type.get(), type.get(), value.empty() ? "" : value.data());
}
void write_attr(hid_t obj, const char* name, int64_t value) {
  write_scalar(obj, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
}
void write_attr(hid_t obj, const char* name, uint64_t value) {
  write_scalar(obj, name, H5T_STD_U64LE, H5T_NATIVE_UINT64, &value);
}
void write_attr(hid_t obj, const char* name, double value) {
  write_scalar(obj, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &value);
}

bool read_attr(hid_t obj, const char* name, std::string& value) {
  QuietHdf5 quiet;
  if (H5Aexists(obj, name) <= 0) return false;
  Hid attr(H5Aopen(obj, name, H5P_DEFAULT));
  if (!attr.valid()) return false;
  Hid type(H5Aget_type(attr.get()));
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) > 0) return false;
  std::vector<char> buf(H5Tget_size(type.get()) + 1, '\0');
  if (H5Aread(attr.get(), type.get(), buf.data()) < 0) return false;
  value.assign(buf.data());
  return true;
}
bool read_attr(hid_t obj, const char* name, int64_t& value) {
  return read_scalar(obj, name, H5T_INTEGER, H5T_NATIVE_INT64, &value);
}
bool read_attr(hid_t obj, const char* name, uint64_t& value) {
  return read_scalar(obj, name, H5T_INTEGER, H5T_NATIVE_UINT64, &value);
}
bool read_attr(hid_t obj, const char* name, double& value) {
  return read_scalar(obj, name, H5T_FLOAT, H5T_NATIVE_DOUBLE, &value);
}

}  // namespace zero3d

namespace zero3d {

std::string hdf5_error_stack() {
  char* text = nullptr;
  size_t size = 0;
  FILE* f = open_memstream(&text, &size);
  if (!f) return "";
  H5Eprint2(H5E_DEFAULT, f);
  std::fclose(f);
  std::string out(text ? text : "", size);
  std::free(text);
  return out;
}

std::string hdf5_system_error(const std::string& stack) {
  // The file drivers report the system call's failure as "..., error message = '<strerror>'".
  const std::string key = "error message = '";
  const size_t at = stack.rfind(key);
  if (at == std::string::npos) return "";
  const size_t end = stack.find('\'', at + key.size());
  return stack.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
}

}  // namespace zero3d
