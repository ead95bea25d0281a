// core/device_collectives.h: the words kernels/ and parallel/ both speak about collectives:
// the element types a collective moves, its reductions, a multi-piece message (MessageSlices), and the
// interface of a device library's collectives (NCCL), which a backend implements (kernels/cuda)
// and a process group drives (parallel/comm.h). Here, below both, so neither includes the other.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zero3d {

// Which 16-bit float format a uint16_t buffer holds.
enum class Dtype16 { bf16, fp16 };

// The element types the data collectives move (16-bit floats as raw bits) and their reductions.
enum class CommType : uint8_t { f32, bf16, fp16 };
enum class RedOp : uint8_t { sum, max };
inline size_t elem_bytes(CommType t) { return t == CommType::f32 ? 4 : 2; }
inline CommType comm_type(Dtype16 t) { return t == Dtype16::bf16 ? CommType::bf16 : CommType::fp16; }

// One reduce-scatter or all-gather that does the work of several: the slices of consecutive
// buckets in one message (reduce_bucket_size, allgather_bucket_size; the words are
// model/flat_layout.h's). Bucket j gives every rank counts[j] elements. A buffer with every rank's
// data (a reduce-scatter's send, an all-gather's recv) holds the buckets one after another, each
// as its ranks' slices in rank order; a buffer with one rank's data (a reduce-scatter's recv, an
// all-gather's send) holds that rank's slices one after another. One bucket of `count` elements
// is the plain collective.
struct MessageSlices {
  std::vector<size_t> counts;
  size_t part() const;  // one rank's elements: the sum of counts
  // Rank r's slices, from a buffer with all p ranks' data into one with one rank's (pack), or back
  // (unpack); elem: bytes per element.
  void pack(const void* whole, void* part, int p, int r, size_t elem) const;
  void unpack(const void* part, void* whole, int p, int r, size_t elem) const;
};

// Data collectives on device memory that the device's own library moves (NCCL), one per group,
// made by the backend (DeviceMemory::make_collectives). Each operation runs on a stream of the
// group's, after the work queued on the backend's compute stream when it was issued; the host
// polls its completion. As with MPI, every rank of the group issues the group's operations in the
// same order. Sends and receives carry no tag: they match in issue order per peer and direction.
class DeviceCollectives {
 public:
  // An issued operation: done() polls without blocking, and fails the job (naming the library's
  // error) when the library reports one.
  class Op {
   public:
    virtual ~Op() = default;
    virtual bool done() = 0;
  };
  using OpPtr = std::unique_ptr<Op>;
  virtual ~DeviceCollectives() = default;
  virtual std::string describe() const = 0;  // for the run record: "NCCL 2.28.9"
  virtual bool point_to_point() const = 0;    // send and recv may be called
  virtual OpPtr all_reduce(void* buf, size_t n, CommType t, RedOp op) = 0;
  virtual OpPtr reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t) = 0;
  virtual OpPtr all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t) = 0;  // send null: in place
  virtual OpPtr broadcast(void* buf, size_t bytes, int root) = 0;
  virtual OpPtr send(const void* buf, size_t bytes, int peer) = 0;
  virtual OpPtr recv(void* buf, size_t bytes, int peer) = 0;
  // Stops the library's pending work (ncclCommAbort) so the device is released: the watchdog's
  // last act before it aborts the job. Any thread may call it.
  virtual void abort() = 0;
};
// Every live DeviceCollectives, so the watchdog can abort them all (called from any thread).
void register_device_collectives(DeviceCollectives* d);
void unregister_device_collectives(DeviceCollectives* d);
void abort_device_collectives();

}  // namespace zero3d
