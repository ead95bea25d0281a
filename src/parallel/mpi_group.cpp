// parallel/mpi_group.cpp: the data collectives over MPI (non-blocking: MPI_Iallreduce,
// MPI_Ireduce_scatter_block, MPI_Iallgather, MPI_Ibcast, MPI_Isend/Irecv), except that
// all-reduce, reduce-scatter and all-gather on host memory go through the node's shared memory
// (parallel/shm_collectives.h) when the group's ranks share a node, or through shared memory
// inside each node and MPI across (Hierarchy) when they span nodes, as the settings of
// comm_context() at the group's creation say (CollectiveImpl, shm_min_bytes).
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

#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/shared_memory.h"
#include "kernels/math/dtype.h"
#include "parallel/comm.h"
#include "parallel/shm_collectives.h"
#include "parallel/worker.h"

namespace zero3d {

namespace {

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

// The collectives of a group that spans nodes, with the same number k of its ranks on every node:
// the node's shared memory inside the node, MPI across nodes among the ranks at the same place on
// their nodes, on 1/k of the data (reduce-scatter inside the node, then across; all-gather across,
// then inside; all-reduce: reduce-scatter inside, all-reduce across, all-gather inside). It all
// runs on the node's helper thread, which then calls MPI: MPI_THREAD_MULTIPLE is required.
// Sums: each node's in rank order, then MPI's across nodes (one addition for 2 nodes).
class Hierarchy final : public HostCollectives {
 public:
  // Collective over comm; `node` holds this rank's k ranks of comm on its node (split_node_comm),
  // the same k on every node. Null without shared memory on some node.
  static std::unique_ptr<Hierarchy> create(MPI_Comm comm, MPI_Comm node, size_t chunk_bytes) {
    int p = 1, me = 0, k = 1, l = 0;
    MPI_CHECK(MPI_Comm_size(comm, &p));
    MPI_CHECK(MPI_Comm_rank(comm, &me));
    MPI_CHECK(MPI_Comm_size(node, &k));
    MPI_CHECK(MPI_Comm_rank(node, &l));
    auto h = std::unique_ptr<Hierarchy>(new Hierarchy());
    h->k_ = k, h->l_ = l;
    h->node_ = ShmCollectives::create(node, chunk_bytes);
    MPI_CHECK(MPI_Comm_split(comm, l, me, &h->cross_));
    MPI_CHECK(MPI_Comm_size(h->cross_, &h->n_));
    MPI_CHECK(MPI_Comm_rank(h->cross_, &h->j_));
    int place = h->j_ * k + l, ok = h->node_ != nullptr;
    std::vector<int> places(p);
    MPI_CHECK(MPI_Allgather(&place, 1, MPI_INT, places.data(), 1, MPI_INT, comm));
    MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, comm));
    if (!ok) return nullptr;
    h->grank_.assign(p, 0);
    for (int g = 0; g < p; ++g) h->grank_[places[g]] = g;
    return h;
  }
  ~Hierarchy() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    node_.reset();  // joins the helper
    if (cross_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&cross_);
  }
  std::string describe() const override {
    return strprintf("shared memory in each node (%d ranks), MPI across the %d nodes", k_, n_);
  }

  PendingOp reduce_scatter(const void* send, void* recv, const MessageSlices& pc, CommType t, const ProcessGroup* g) override {
    return node_->run("reduce-scatter", g, [=, this] {
      const size_t e = elem_bytes(t), count = pc.part(), block = count * e;
      // Place l of every node takes the parts of the ranks at place l, node by node.
      char* a = scratch(a_, k_ * n_ * block);
      for (int l = 0; l < k_; ++l)
        for (int j = 0; j < n_; ++j) pc.pack(send, a + (l * n_ + j) * block, k_ * n_, grank(j, l), e);
      char* b = scratch(b_, n_ * block);
      node_->reduce_scatter_here(a, b, n_ * count, t);
      MPI_CHECK(MPI_Reduce_scatter_block(b, recv, count_of(count), mpi_type(t), mpi_op(t, RedOp::sum), cross_));
    });
  }

  PendingOp all_gather(const void* send, void* recv, const MessageSlices& pc, CommType t, const ProcessGroup* g) override {
    return node_->run("all-gather", g, [=, this] {
      const size_t e = elem_bytes(t), count = pc.part(), block = count * e;
      const int p = k_ * n_;
      char* a = scratch(a_, (n_ + 1) * block);
      const void* mine = send;
      if (!mine) {  // in place: this rank's blocks, packed
        pc.pack(recv, a + n_ * block, p, grank(j_, l_), e);
        mine = a + n_ * block;
      }
      MPI_CHECK(MPI_Allgather(mine, count_of(count), mpi_type(t), a, count_of(count), mpi_type(t), cross_));
      char* b = scratch(b_, k_ * n_ * block);
      node_->all_gather_here(a, b, n_ * count, t);
      for (int l = 0; l < k_; ++l)
        for (int j = 0; j < n_; ++j) pc.unpack(b + (l * n_ + j) * block, recv, p, grank(j, l), e);
    });
  }

  PendingOp all_reduce(void* buf, size_t n, CommType t, RedOp op, const ProcessGroup* g) override {
    return node_->run("all-reduce", g, [=, this] {
      const size_t e = elem_bytes(t), c = (n + k_ - 1) / k_;  // padded to k equal parts
      char* a = scratch(a_, k_ * c * e);
      std::memcpy(a, buf, n * e);
      std::memset(a + n * e, 0, (k_ * c - n) * e);
      char* b = scratch(b_, c * e);
      if (op == RedOp::sum) node_->reduce_scatter_here(a, b, c, t);
      else {  // max: the whole buffer inside the node, then this place's part
        node_->all_reduce_here(a, k_ * c, t, op);
        std::memcpy(b, a + l_ * c * e, c * e);
      }
      MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, b, count_of(c), mpi_type(t), mpi_op(t, op), cross_));
      node_->all_gather_here(b, a, c, t);
      std::memcpy(buf, a, n * e);
    });
  }

 private:
  Hierarchy() = default;
  size_t grank(int node, int place) const { return static_cast<size_t>(grank_[node * k_ + place]); }
  static char* scratch(SharedBytes& s, size_t bytes) {
    if (s.size() < bytes) s = SharedBytes(bytes);
    return s.data();
  }
  std::unique_ptr<ShmCollectives> node_;
  MPI_Comm cross_ = MPI_COMM_NULL;
  int k_ = 1, l_ = 0, n_ = 1, j_ = 0;  // k ranks per node, this rank's place l; n nodes, this one j
  std::vector<int> grank_;      // [node * k + place]: the group rank there
  SharedBytes a_, b_;  // the helper's scratch, shared: the node's steps on it read in place
};

// The collectives beside MPI's for a group (collective over comm): shared memory when its ranks
// share a node, the hierarchy when they span nodes with the same number k > 1 on each and MPI
// allows threads; null (MPI moves everything) otherwise.
std::unique_ptr<HostCollectives> make_host_collectives(MPI_Comm comm, size_t chunk_bytes) {
  int p = 1, level = MPI_THREAD_SINGLE;
  MPI_CHECK(MPI_Comm_size(comm, &p));
  MPI_CHECK(MPI_Query_thread(&level));
  if (p < 2) return nullptr;
  MPI_Comm node = split_node_comm(comm);
  int k = 1;
  MPI_CHECK(MPI_Comm_size(node, &k));
  int range[2] = {-k, k};  // -min and max of k over the group
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, range, 2, MPI_INT, MPI_MAX, comm));
  std::unique_ptr<HostCollectives> out;
  if (range[1] == p)  // one node (k == p on one rank means on all)
    out = ShmCollectives::create(comm, chunk_bytes);
  else if (level >= MPI_THREAD_MULTIPLE && -range[0] == range[1] && k > 1)
    out = Hierarchy::create(comm, node, chunk_bytes);
  MPI_CHECK(MPI_Comm_free(&node));
  return out;
}

// Buffers taken for one operation and given back at its completion: allocated on first need and
// reused after (the smallest free one that fits), so a step's operations fault in no new pages.
class BufferPool {
 public:
  BufferPool(std::function<void*(size_t)> alloc, std::function<void(void*)> free)
      : alloc_(std::move(alloc)), free_(std::move(free)) {}
  ~BufferPool() { clear(); }
  void clear() {  // every buffer given back
    for (const Buffer& b : buffers_) free_(b.p);
    buffers_.clear();
  }
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;
  void* take(size_t bytes) {
    bytes = std::max<size_t>(bytes, 1);
    Buffer* best = nullptr;
    for (Buffer& b : buffers_)
      if (!b.busy && b.bytes >= bytes && (!best || b.bytes < best->bytes)) best = &b;
    if (!best) {
      buffers_.push_back({alloc_(bytes), bytes, false});
      best = &buffers_.back();
    }
    best->busy = true;
    return best->p;
  }
  void give(void* p) {
    for (Buffer& b : buffers_)
      if (b.p == p) b.busy = false;
  }
  bool empty() const { return buffers_.empty(); }

 private:
  struct Buffer {
    void* p;
    size_t bytes;
    bool busy;
  };
  std::function<void*(size_t)> alloc_;
  std::function<void(void*)> free_;
  std::vector<Buffer> buffers_;
};

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
  // Host memory for this operation alone (the group's scratch pool), given back at completion.
  char* scratch(size_t bytes);
  // Runs at completion, before the outputs go back to the device.
  void at_completion(std::function<void()> f) { then_ = std::move(f); }
  PendingOp::Then finish();

 private:
  struct Back {
    void* device;
    const void* host;
    size_t bytes;
  };
  MpiGroup& g_;
  std::vector<Back> back_;
  std::vector<std::pair<BufferPool*, void*>> taken_;
  std::function<void()> then_;
};

class MpiGroup final : public ProcessGroup {
 public:
  MpiGroup(MPI_Comm comm, bool owned, std::string name) : ProcessGroup(comm, owned, std::move(name)) {
    const CommContext& ctx = comm_context();
    if (comm != MPI_COMM_NULL && ctx.collectives != CollectiveImpl::mpi) {
      host_ = make_host_collectives(comm, ctx.shm_chunk_bytes);
      shm_min_bytes_ = ctx.collectives == CollectiveImpl::shm ? 0 : ctx.shm_min_bytes;
    }
    int level = MPI_THREAD_SINGLE;
    MPI_CHECK(MPI_Query_thread(&level));
    send_thread_ = comm != MPI_COMM_NULL && ctx.send_thread && level >= MPI_THREAD_MULTIPLE;
  }
  ~MpiGroup() override { detach_device(); }
  // Collective over the group (the device library's communicator is made here). Null detaches:
  // the staging buffers and the device library go, before the backend that made them does.
  void use_device_memory(DeviceMemory* dev, bool point_to_point) override {
    if (!dev) return detach_device();
    Z3D_ASSERT(pinned_.empty() && !device_, "use_device_memory after staging began");
    dev_ = dev;
    cuda_aware_ = mpi_reads_device_memory();
    if (comm() == MPI_COMM_NULL || !comm_context().device_library) return;
    device_ = dev->make_collectives(size(), rank(), name(), point_to_point, [this](const void* mine, void* all, size_t n) {
      MPI_CHECK(MPI_Allgather(mine, count_of(n), MPI_BYTE, all, count_of(n), MPI_BYTE, comm()));
    });
    if (device_) register_device_collectives(device_.get());
  }
  std::string device_path() const override {
    if (!dev_) return "host memory only";
    if (device_) return "device buffers by " + device_->describe();
    return cuda_aware_ ? "device buffers to MPI (CUDA-aware MPI)" : "device buffers staged through pinned host buffers";
  }
  std::string collectives_path() const override {
    if (!host_) return "MPI";
    const std::string how = host_->describe();
    return shm_min_bytes_ ? strprintf("%s from %zu bytes, MPI below", how.c_str(), shm_min_bytes_) : how;
  }

 protected:
  PendingOp all_reduce_impl(MemRef<void> buf, size_t n, CommType t, RedOp op) override {
    if (on_device(buf.kind)) return PendingOp(device_->all_reduce(buf.ptr, n, t, op), "all-reduce", this);
    if (on_shm(n * elem_bytes(t), buf.kind))
      return host_->all_reduce(buf.ptr, n, t, op, this);
    Staging st(*this);
    void* b = host_view(st, buf, n * elem_bytes(t));
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1) MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, b, count_of(n), mpi_type(t), mpi_op(t, op), comm(), &r));
    return PendingOp(r, "all-reduce", this, st.finish());
  }

  // Several pieces go to MPI as one operation on the data in rank order: packed into scratch
  // (reduce-scatter), or gathered there and unpacked at completion (all-gather).
  PendingOp reduce_scatter_impl(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) override {
    const size_t eb = elem_bytes(t), part = pc.part();
    if (on_device(send.kind, recv.kind))
      return PendingOp(device_->reduce_scatter(send.ptr, recv.ptr, pc, t), "reduce-scatter", this);
    if (on_shm(size() * part * eb, send.kind, recv.kind))
      return host_->reduce_scatter(send.ptr, recv.ptr, pc, t, this);
    Staging st(*this);
    const bool copied = pc.counts.size() > 1 || size() == 1;  // bytes this code moves itself
    const void* s = host_in(st, send, size() * part * eb, copied);
    void* d = host_out(st, recv, part * eb, /*load=*/false, copied);
    if (pc.counts.size() > 1) {
      char* packed = st.scratch(size() * part * eb);
      for (int r = 0; r < size(); ++r) pc.pack(s, packed + r * part * eb, size(), r, eb);
      s = packed;
    }
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1)
      MPI_CHECK(MPI_Ireduce_scatter_block(s, d, count_of(part), mpi_type(t), mpi_op(t, RedOp::sum), comm(), &r));
    else if (s != d)
      std::memmove(d, s, part * eb);
    return PendingOp(r, "reduce-scatter", this, st.finish());
  }

  PendingOp all_gather_impl(MemRef<const void> send, MemRef<void> recv, const MessageSlices& pc, CommType t) override {
    const size_t eb = elem_bytes(t), part = pc.part(), at = static_cast<size_t>(rank()) * part * eb;
    if (on_device(send.kind, recv.kind))
      return PendingOp(device_->all_gather(send.ptr, recv.ptr, pc, t), "all-gather", this);
    if (on_shm(size() * part * eb, send.kind, recv.kind))
      return host_->all_gather(send.ptr, recv.ptr, pc, t, this);
    const bool in_place = send.ptr == nullptr, one = pc.counts.size() == 1;
    Staging st(*this);
    // Staged in place, recv comes in with this rank's blocks (one copy of the whole buffer).
    const bool copied = !one || !in_place;  // bytes this code moves itself
    char* d = static_cast<char*>(host_out(st, recv, size() * part * eb, /*load=*/in_place, copied));
    char* g = one ? d : st.scratch(size() * part * eb);  // rank-major: MPI's layout
    if (!in_place) std::memmove(g + at, host_in(st, send, part * eb, /*copied=*/true), part * eb);
    else if (!one) pc.pack(d, g + at, size(), rank(), eb);
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1)
      MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g, count_of(part), mpi_type(t), comm(), &r));
    if (!one)
      st.at_completion([g, d, pc, p = size(), eb, part] {
        for (int q = 0; q < p; ++q) pc.unpack(g + q * part * eb, d, p, q, eb);
      });
    return PendingOp(r, "all-gather", this, st.finish());
  }

  PendingOp broadcast_impl(MemRef<void> buf, size_t bytes, int root) override {
    if (on_device(buf.kind)) return PendingOp(device_->broadcast(buf.ptr, bytes, root), "broadcast", this);
    Staging st(*this);
    void* b = host_view(st, buf, bytes, /*load=*/rank() == root);
    MPI_Request r = MPI_REQUEST_NULL;
    if (size() > 1) MPI_CHECK(MPI_Ibcast(b, count_of(bytes), MPI_BYTE, root, comm(), &r));
    return PendingOp(r, "broadcast", this, st.finish());
  }

  // On the device library, sends and receives match in issue order per peer and direction (no
  // tags); the pipeline's tags already say the same ("one stream per neighbour and direction").
  PendingOp send_impl(MemRef<const void> buf, size_t bytes, int peer, int tag) override {
    if (on_device(buf.kind) && device_->point_to_point()) return PendingOp(device_->send(buf.ptr, bytes, peer), "send", this);
    if (send_thread_ && !buf.on_device()) {
      // Send progress: the group's send thread issues and polls it (MPI's non-overtaking order
      // holds: every host send of the group goes this way, in order), so a large message moves
      // while the caller computes even where MPI needs the sender's calls to move it.
      auto done = std::make_shared<AsyncCompletion>();
      sender_.post([this, done, b = buf.ptr, bytes, peer, tag] {
        MPI_Request r = MPI_REQUEST_NULL;
        MPI_CHECK(MPI_Isend(b, count_of(bytes), MPI_BYTE, peer, tag, comm(), &r));
        done->begin();
        const auto t0 = Clock::now();
        long polls = 0;
        for (int sent = 0; !sent; poll_backoff(polls, seconds_since(t0))) MPI_CHECK(MPI_Test(&r, &sent, MPI_STATUS_IGNORE));
        done->finish();
      });
      return PendingOp(std::move(done), "send", this);  // the watchdog covers its wait
    }
    Staging st(*this);
    const void* b = host_in(st, buf, bytes);
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Isend(b, count_of(bytes), MPI_BYTE, peer, tag, comm(), &r));
    return PendingOp(r, "send", this, st.finish());
  }

  PendingOp recv_impl(MemRef<void> buf, size_t bytes, int peer, int tag) override {
    if (on_device(buf.kind) && device_->point_to_point()) return PendingOp(device_->recv(buf.ptr, bytes, peer), "receive", this);
    Staging st(*this);
    void* b = host_out(st, buf, bytes, /*load=*/false);
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_CHECK(MPI_Irecv(b, count_of(bytes), MPI_BYTE, peer, tag, comm(), &r));
    return PendingOp(r, "receive", this, st.finish());
  }

 private:
  friend class Staging;

  // The pointer MPI gets for a buffer: itself (host memory, or a CUDA-aware MPI), else staged.
  // `copied`: this code reads or writes the bytes itself too (packing pieces, the own block), so
  // device memory is staged even where MPI could read it.
  const void* host_in(Staging& st, MemRef<const void> ref, size_t bytes, bool copied = false) {
    return direct(ref.kind, copied) ? ref.ptr : st.in(ref, bytes);
  }
  void* host_out(Staging& st, MemRef<void> ref, size_t bytes, bool load = false, bool copied = false) {
    return direct(ref.kind, copied) ? ref.ptr : st.out(ref, bytes, load);
  }
  void* host_view(Staging& st, MemRef<void> ref, size_t bytes, bool load = true) {
    return host_out(st, ref, bytes, load);
  }
  // Whether a collective of `bytes` (the whole buffer) on memory of these kinds goes through
  // shared memory: host memory only (device buffers take MPI's path, staged or CUDA-aware).
  bool on_shm(size_t bytes, MemKind a, MemKind b = MemKind::host) const {
    return host_ && a == MemKind::host && b == MemKind::host && bytes >= shm_min_bytes_;
  }

  void detach_device() {
    pinned_.clear();
    if (device_) unregister_device_collectives(device_.get());
    device_.reset();
    dev_ = nullptr, cuda_aware_ = false;
  }

  // Whether an operation on memory of these kinds goes to the device's library: device memory only
  // (a mix of host and device buffers is staged).
  bool on_device(MemKind a, MemKind b = MemKind::device) const {
    return device_ && a == MemKind::device && b == MemKind::device;
  }

  bool direct(MemKind kind, bool copied = false) {
    if (kind == MemKind::host) return true;
    Z3D_ASSERT(dev_, "a device buffer reached a group without device memory (use_device_memory)");
    if (copied) return false;
    if (cuda_aware_) dev_->synchronize();
    return cuda_aware_;
  }

  DeviceMemory* dev_ = nullptr;
  bool cuda_aware_ = false;
  // Page-locked staging buffers for device memory, and host scratch (several pieces in one message).
  BufferPool pinned_{[this](size_t n) { return dev_->alloc_pinned(n); }, [this](void* p) { dev_->free_pinned(p); }};
  BufferPool scratch_{[](size_t n) { return ::operator new(n); }, [](void* p) { ::operator delete(p); }};
  std::unique_ptr<HostCollectives> host_;  // shared memory, or the hierarchy; null: MPI moves everything
  std::unique_ptr<DeviceCollectives> device_;  // the device's library (NCCL); null: device buffers staged
  bool send_thread_ = false;
  OrderedWorker sender_;  // the send thread (started by the first send), joined before the members above go
  size_t shm_min_bytes_ = 0;
};

const void* Staging::in(MemRef<const void> ref, size_t bytes) {
  void* h = g_.pinned_.take(bytes);
  taken_.push_back({&g_.pinned_, h});
  if (bytes) g_.dev_->to_host(h, ref.ptr, bytes);
  return h;
}

void* Staging::out(MemRef<void> ref, size_t bytes, bool load) {
  void* h = g_.pinned_.take(bytes);
  taken_.push_back({&g_.pinned_, h});
  if (load && bytes) g_.dev_->to_host(h, ref.ptr, bytes);
  back_.push_back({ref.ptr, h, bytes});
  return h;
}

char* Staging::scratch(size_t bytes) {
  void* h = g_.scratch_.take(bytes);
  taken_.push_back({&g_.scratch_, h});
  return static_cast<char*>(h);
}

PendingOp::Then Staging::finish() {
  if (taken_.empty()) return {};
  return [g = &g_, back = std::move(back_), taken = std::move(taken_), then = std::move(then_)] {
    if (then) then();
    for (const Back& b : back)
      if (b.bytes) g->dev_->to_device(b.device, b.host, b.bytes);
    for (const auto& [pool, p] : taken) pool->give(p);
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
  return std::make_unique<MpiGroup>(split_node_comm(comm_), /*owned=*/true, std::move(name));
}

}  // namespace zero3d
