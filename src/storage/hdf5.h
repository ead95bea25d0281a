// storage/hdf5.h: a move-only owner for every HDF5 identifier (file, group, dataset, dataspace,
// datatype, attribute, property list), closed by the H5*close that matches its kind, and the
// small attribute helpers the checkpoint format uses. Identifiers never leak, also when a reader
// throws halfway through a corrupt file.
#pragma once
#include <hdf5.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

namespace zero3d {

class Hid {
 public:
  Hid() = default;
  explicit Hid(hid_t id) : id_(id) {}
  Hid(Hid&& o) noexcept : id_(std::exchange(o.id_, H5I_INVALID_HID)) {}
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = std::exchange(o.id_, H5I_INVALID_HID);
    }
    return *this;
  }
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  ~Hid() { reset(); }
  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  hid_t release() { return std::exchange(id_, H5I_INVALID_HID); }  // closed by the caller
  void reset();  // closes with H5Fclose/H5Dclose/... chosen by H5Iget_type

 private:
  hid_t id_ = H5I_INVALID_HID;
};

// Silences HDF5's error-stack printing while alive (readers turn failures into one clear message).
class QuietHdf5 {
 public:
  QuietHdf5();
  ~QuietHdf5();
  QuietHdf5(const QuietHdf5&) = delete;
  QuietHdf5& operator=(const QuietHdf5&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// HDF5's current error stack as text (what H5Eprint2 would print), and the system error it holds
// ("No space left on device"), "" when it holds none.
std::string hdf5_error_stack();
std::string hdf5_system_error(const std::string& stack);

// A failed HDF5 call outside a collective (the caller reports it). It keeps HDF5's error stack
// as it was when thrown: the clean-up that follows (closing handles) starts new API calls, which
// clear it.
struct Hdf5Error : std::runtime_error {
  explicit Hdf5Error(const std::string& what) : std::runtime_error(what), stack(hdf5_error_stack()) {}
  std::string stack;
};

// Attributes on any object; writers throw Hdf5Error. Collective in a parallel file (same value on every rank).
void write_attr(hid_t obj, const char* name, const std::string& value);
void write_attr(hid_t obj, const char* name, int64_t value);
void write_attr(hid_t obj, const char* name, uint64_t value);
void write_attr(hid_t obj, const char* name, double value);
// Readers return false when the attribute is missing or has another type.
bool read_attr(hid_t obj, const char* name, std::string& value);
bool read_attr(hid_t obj, const char* name, int64_t& value);
bool read_attr(hid_t obj, const char* name, uint64_t& value);
bool read_attr(hid_t obj, const char* name, double& value);

}  // namespace zero3d
