#include "core/device_collectives.h"

#include <algorithm>
#include <cstring>
#include <mutex>

namespace zero3d {

size_t MessageSlices::part() const {
  size_t n = 0;
  for (size_t c : counts) n += c;
  return n;
}

void MessageSlices::pack(const void* whole, void* part, int p, int r, size_t elem) const {
  const char* from = static_cast<const char*>(whole);
  char* to = static_cast<char*>(part);
  for (size_t c : counts) {
    std::memcpy(to, from + r * c * elem, c * elem);
    from += p * c * elem, to += c * elem;
  }
}

void MessageSlices::unpack(const void* part, void* whole, int p, int r, size_t elem) const {
  const char* from = static_cast<const char*>(part);
  char* to = static_cast<char*>(whole);
  for (size_t c : counts) {
    std::memcpy(to + r * c * elem, from, c * elem);
    from += c * elem, to += p * c * elem;
  }
}

namespace {
std::mutex device_collectives_mu;
std::vector<DeviceCollectives*>& device_collectives_live() {
  static std::vector<DeviceCollectives*> live;
  return live;
}
}  // namespace

void register_device_collectives(DeviceCollectives* d) {
  std::lock_guard<std::mutex> lock(device_collectives_mu);
  device_collectives_live().push_back(d);
}

void unregister_device_collectives(DeviceCollectives* d) {
  std::lock_guard<std::mutex> lock(device_collectives_mu);
  auto& live = device_collectives_live();
  live.erase(std::remove(live.begin(), live.end(), d), live.end());
}

void abort_device_collectives() {
  std::lock_guard<std::mutex> lock(device_collectives_mu);
  for (DeviceCollectives* d : device_collectives_live()) d->abort();
}

}  // namespace zero3d
