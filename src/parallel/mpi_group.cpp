// parallel/mpi_group.cpp: the data collectives over MPI (non-blocking: MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv).
//
// 16-bit sums: MPI has no 16-bit float type, so they run through a user-defined MPI_Op that
// converts each pair to float, adds, and rounds back to nearest even (see comm.h).
//
// Device buffers: handed to MPI as they are when the library is CUDA-aware (after the device's
// queued work is done); otherwise each operation stages its device buffers through page-locked
// host buffers taken from a pool (allocated on first use, reused after), copied to the host before
// the MPI call and back to the device when the operation completes, before anyone sees it.
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "kernels/math/dtype.h"
#include "parallel/comm.h"

namespace zero3d {

namespace {

int count_of(size_t n) {
  Z3D_ASSERT(n <= static_cast<size_t>(INT_MAX), "message larger than 2^31 elements: lower the bucket size");
  return static_cast<int>(n);
}

// inout[i] = in[i] + inout[i], through float, rounded back to 16 bits: commutative, not associative.
// Each addition equals the correctly rounded 16-bit sum: rounding twice (to float, then to 16 bits)
// is innocuous when the intermediate has >= 2p+2 significand bits (Figueroa 1995), and float's 24
// cover p = 8 (bf16) and p = 11 (fp16).
template <float (*to_float)(uint16_t), uint16_t (*from_float)(float)>
void sum16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = from_float(to_float(a[i]) + to_float(b[i]));
}

// The MPI handles for 16-bit sums, created on first use. Lifetime: MPI_Finalize itself frees
// them. A static destructor would run after main returns, i.e. after MPI_Finalize, when MPI calls
// are erroneous; freeing them from main would tie the seam to main.cpp. Instead an attribute on
// MPI_COMM_SELF carries a delete callback: MPI_Finalize first frees MPI_COMM_SELF, running that
// callback while MPI is still fully usable (MPI >= 2.0, section "Allowing User Functions at
// Process Termination"), whatever main does. A 16-bit op is never pending at finalize: every
// PendingOp waits in its destructor.
struct Mpi16 {
  MPI_Datatype type = MPI_DATATYPE_NULL;  // 2 contiguous bytes: no predefined op applies to it
  MPI_Op sum_bf16 = MPI_OP_NULL, sum_fp16 = MPI_OP_NULL;
};

int free_mpi16(MPI_Comm, int, void* attr, void*) {
  auto* h = static_cast<Mpi16*>(attr);
  MPI_Op_free(&h->sum_bf16);
  MPI_Op_free(&h->sum_fp16);
  MPI_Type_free(&h->type);
  return MPI_SUCCESS;
}

const Mpi16& mpi16() {
  static Mpi16 h;
  static const bool created = [] {
    MPI_CHECK(MPI_Type_contiguous(2, MPI_BYTE, &h.type));
    MPI_CHECK(MPI_Type_set_name(h.type, const_cast<char*>("zero3d_float16")));
    MPI_CHECK(MPI_Type_commit(&h.type));
    MPI_CHECK(MPI_Op_create(&sum16<math::float_from_bf16, math::bf16_from_float>, /*commute=*/1, &h.sum_bf16));
    MPI_CHECK(MPI_Op_create(&sum16<math::float_from_fp16, math::fp16_from_float>, /*commute=*/1, &h.sum_fp16));
    int key = MPI_KEYVAL_INVALID;
    MPI_CHECK(MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, free_mpi16, &key, nullptr));
    MPI_CHECK(MPI_Comm_set_attr(MPI_COMM_SELF, key, &h));
    MPI_CHECK(MPI_Comm_free_keyval(&key));  // the key itself lives on until the attribute is deleted
    return true;
  }();
  (void)created;
  return h;
}

MPI_Datatype mpi_type(CommType t) { return t == CommType::f32 ? MPI_FLOAT : mpi16().type; }

MPI_Op mpi_op(CommType t, RedOp op) {
  if (t == CommType::f32) return op == RedOp::sum ? MPI_SUM : MPI_MAX;
  Z3D_ASSERT(op == RedOp::sum, "16-bit collectives only sum");
  return t == CommType::bf16 ? mpi16().sum_bf16 : mpi16().sum_fp16;
}

// Whether this MPI library reads device memory itself: asked at run time where the library can
// say (OpenMPI's extension); no elsewhere.
bool mpi_reads_device_memory() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

class MpiGroup;

// One operation's buffers as MPI sees them: host pointers, where device buffers are staged
// through the group's pinned buffers; finish() copies the outputs back at completion.
class Staging {
 public:
  explicit Staging(MpiGroup& g) : g_(g) {}
  // A host pointer holding ref's bytes.
  const void* in(MemRef<const void> ref, size_t bytes);
  // A host pointer whose bytes go to ref at completion; `load`: it starts with ref's bytes.
  void* out(MemRef<void> ref, size_t bytes, bool load);
  PendingOp::Then finish();

 private:
  struct Back {
    void* device;
    const void* host;
    size_t bytes;
  };
  MpiGroup& g_;
  std::vector<Back> back_;
  std::vector<void*> taken_;
};

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, bool owned, std::string name) : ProcessGroup(comm, owned, std::move(name)) {}
  ~MpiGroup() override {
    for (const Pinned& b : pinned_) dev_->free_pinned(b.p);
  }

  void use_device_memory(DeviceMemory* dev) override {
    Z3D_ASSERT(pinned_.empty(), "use_device_memory after staging began");
    dev_ = dev;
    cuda_aware_ = dev && mpi_reads_device_memory();
  }
  std::string device_path() const override {
    if (!dev_) return "host memory only";
    return cuda_aware_ ? "device buffers to MPI (CUDA-aware MPI)" : "device buffers staged through pinned host buffers";
  }

 protected:
  PendingOp all_reduce_impl(MemRef<void> buf, size_t n, CommType t, RedOp op) override {
    Staging st(*this);
    void* b = host_view(st, buf, n * elem_bytes(t));
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1) MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, b, count_of(n), mpi_type(t), mpi_op(t, op), comm(), &r));
    return PendingOp(r, "all-reduce", this, st.finish());
  }

  PendingOp reduce_scatter_impl(MemRef<const void> send, MemRef<void> recv, size_t count, CommType t) override {
    const size_t eb = elem_bytes(t);
    Staging st(*this);
    const void* s = host_in(st, send, size() * count * eb);
    void* d = host_out(st, recv, count * eb);
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1)
      MPI_CHECK(MPI_Ireduce_scatter_block(s, d, count_of(count), mpi_type(t), mpi_op(t, RedOp::sum), comm(), &r));
    else if (s != d)
      std::memmove(d, s, count * eb);
    return PendingOp(r, "reduce-scatter", this, st.finish());
  }

  PendingOp all_gather_impl(MemRef<const void> send, MemRef<void> recv, size_t count, CommType t) override {
    const size_t eb = elem_bytes(t), block = count * eb, at = static_cast<size_t>(rank()) * block;
    const bool in_place = send.ptr == static_cast<const char*>(recv.ptr) + at;
    Staging st(*this);
    char* d = static_cast<char*>(host_out(st, recv, size() * block, /*load=*/false));
    const void* s = in_place ? nullptr : host_in(st, send, block);
    if (in_place && d != recv.ptr) s = host_in(st, send, block);  // staged: the own block comes in as input
    if (s) std::memmove(d + at, s, block);
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1)
      MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d, count_of(count), mpi_type(t), comm(), &r));
    return PendingOp(r, "all-gather", this, st.finish());
  }

  PendingOp broadcast_impl(MemRef<void> buf, size_t bytes, int root) override {
    Staging st(*this);
    void* b = host_view(st, buf, bytes, /*load=*/rank() == root);
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1) MPI_CHECK(MPI_Ibcast(b, count_of(bytes), MPI_BYTE, root, comm(), &r));
    return PendingOp(r, "broadcast", this, st.finish());
  }

  PendingOp send_impl(MemRef<const void> buf, size_t bytes, int peer, int tag) override {
    Staging st(*this);
    const void* b = host_in(st, buf, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Isend(b, count_of(bytes), MPI_BYTE, peer, tag, comm(), &r));
    return PendingOp(r, "send", this, st.finish());
  }

  PendingOp recv_impl(MemRef<void> buf, size_t bytes, int peer, int tag) override {
    Staging st(*this);
    void* b = host_out(st, buf, bytes, /*load=*/false);
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Irecv(b, count_of(bytes), MPI_BYTE, peer, tag, comm(), &r));
    return PendingOp(r, "receive", this, st.finish());
  }

 private:
  friend class Staging;

  // The pointer MPI gets for a buffer: itself (host memory, or a CUDA-aware MPI), else staged.
  const void* host_in(Staging& st, MemRef<const void> ref, size_t bytes) {
    return direct(ref.kind) ? ref.ptr : st.in(ref, bytes);
  }
  void* host_out(Staging& st, MemRef<void> ref, size_t bytes, bool load = false) {
    return direct(ref.kind) ? ref.ptr : st.out(ref, bytes, load);
  }
  void* host_view(Staging& st, MemRef<void> ref, size_t bytes, bool load = true) {
    return host_out(st, ref, bytes, load);
  }
  bool direct(MemKind kind) {
    if (kind == MemKind::host) return true;
    Z3D_ASSERT(dev_, "a device buffer reached a group without device memory (use_device_memory)");
    if (cuda_aware_) dev_->synchronize();
    return cuda_aware_;
  }

  // The pool of page-locked staging buffers: taken for one operation, given back at its completion.
  struct Pinned {
    void* p;
    size_t bytes;
    bool busy;
  };
  void* take(size_t bytes) {
    Pinned* best = nullptr;  // the smallest free buffer that fits
    for (Pinned& b : pinned_)
      if (!b.busy && b.bytes >= bytes && (!best || b.bytes < best->bytes)) best = &b;
    if (!best) {
      pinned_.push_back({dev_->alloc_pinned(std::max<size_t>(bytes, 1)), std::max<size_t>(bytes, 1), false});
      best = &pinned_.back();
    }
    best->busy = true;
    return best->p;
  }
  void give(void* p) {
    for (Pinned& b : pinned_)
      if (b.p == p) b.busy = false;
  }

  DeviceMemory* dev_ = nullptr;
  bool cuda_aware_ = false;
  std::vector<Pinned> pinned_;
};

const void* Staging::in(MemRef<const void> ref, size_t bytes) {
  void* h = g_.take(bytes);
  taken_.push_back(h);
  if (bytes) g_.dev_->to_host(h, ref.ptr, bytes);
  return h;
}

void* Staging::out(MemRef<void> ref, size_t bytes, bool load) {
  void* h = g_.take(bytes);
  taken_.push_back(h);
  if (load && bytes) g_.dev_->to_host(h, ref.ptr, bytes);
  back_.push_back({ref.ptr, h, bytes});
  return h;
}

PendingOp::Then Staging::finish() {
  if (taken_.empty()) return {};
  return [g = &g_, back = std::move(back_), taken = std::move(taken_)] {
    for (const Back& b : back)
      if (b.bytes) g->dev_->to_device(b.device, b.host, b.bytes);
    for (void* p : taken) g->give(p);
  };
}

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::world() {
  return std::make_unique<MpiGroup>(MPI_COMM_WORLD, /*owned=*/false, "world");
}

std::unique_ptr<ProcessGroup> ProcessGroup::split(const ProcessGroup& parent, int color, int key, std::string name) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split(parent.comm(), color, key, &comm));
  return std::make_unique<MpiGroup>(comm, /*owned=*/true, std::move(name));
}

std::unique_ptr<ProcessGroup> ProcessGroup::split_node(std::string name) const {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_CHECK(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &comm));
  return std::make_unique<MpiGroup>(comm, /*owned=*/true, std::move(name));
}

}  // namespace zero3d
