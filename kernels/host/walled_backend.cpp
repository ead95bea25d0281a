// kernels/host/walled_backend.cpp: the host backend behind device-memory walls, for tests. Its
// memory says it is device memory (MemKind::device) and is unreadable (PROT_NONE) except while one
// of its own ops runs or while it copies to or from the host, as a GPU's memory is to the CPU. Any
// code that reads or writes "device" memory from the host directly, instead of through the
// backend's copies, faults here at once, on a machine without a GPU; the numbers are the host
// backend's, bit for bit. Collectives stage its buffers through DeviceMemory, as a GPU's without
// NCCL. Ops and copies are serialized (one lock): another thread's copy must not close memory an op
// is using.
//
// With a counting host backend behind the walls (HostOptions::count_only) it is the planner's
// sizing backend (make_sizing_backend): the engine and the model are built on it as a run builds
// them, their allocations reserve address space only (PROT_NONE, never memory) and are counted,
// copies to and from the host do nothing, and every op is counted in profile() without running (its
// operands are never opened). So `zero3d plan` sizes a layout with the allocating code itself, and
// reads a step's work off the code that does it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "core/check.h"
#include "kernels/backend.h"
#include "core/device_collectives.h"  // DeviceCollectives (none here)

namespace zero3d {

namespace {

HostOptions counting() {
  HostOptions o;
  o.count_only = true;
  return o;
}

class WalledBackend final : public Backend, public DeviceMemory {
 public:
  explicit WalledBackend(const HostOptions& options) : inner_(make_host_backend(options)) {}
  WalledBackend(MemKind kind, std::shared_ptr<MemoryTally> tally)
      : inner_(make_host_backend(counting())), kind_(kind), tally_(std::move(tally)) {}
  ~WalledBackend() override {
    if (tally_)
      for (auto& [p, len] : regions_) release(p, len);
    if (arena_) munmap(arena_, kArenaBytes);
  }

  BackendKind kind() const override { return BackendKind::host; }
  std::string describe() const override {
    return tally_ ? "sizing (zero3d plan)" : inner_->describe() + ", behind device-memory walls (tests)";
  }
  MemKind memory_kind() const override { return kind_; }
  // Sizing: a companion that sizes too (the engine's own account reports what it offloads).
  std::unique_ptr<Backend> host_companion() const override {
    return tally_ ? std::make_unique<WalledBackend>(MemKind::host, std::make_shared<MemoryTally>()) : nullptr;
  }
  DeviceMemory* device_memory() override { return this; }

  void* alloc_bytes(size_t bytes) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    void* p = tally_ ? reserve(bytes) : take(bytes);
    ++allocs_;
    if (tally_) sizes_[static_cast<char*>(p)] = bytes, tally_->add(bytes);
    return p;
  }
  size_t alloc_count() const override { return allocs_; }
  OpProfile* profile() override { return inner_->profile(); }
  void free_bytes(void* p) override {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    auto it = regions_.find(static_cast<char*>(p));
    Z3D_ASSERT(it != regions_.end(), "walled backend: free of memory it did not allocate");
    if (tally_) release(it->first, it->second);
    else give_back(it->first, it->second);
    regions_.erase(it);
    if (tally_) tally_->live -= sizes_.at(static_cast<char*>(p)), sizes_.erase(static_cast<char*>(p));
  }
  // Sizing: no bytes move.
  void copy_from_host(void* dst, const void* src, size_t bytes) override {
    if (!tally_) to_device(dst, src, bytes);
  }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (!tally_) to_host(dst, src, bytes);
  }
  void copy(void* dst, const void* src, size_t bytes) override { run([&] { inner_->copy(dst, src, bytes); }); }
  void zero(void* p, size_t bytes) override { run([&] { inner_->zero(p, bytes); }); }
  void synchronize() override {}

  // ---- DeviceMemory ----
  void to_host(void* dst, const void* src, size_t bytes) override { run([&] { std::memcpy(dst, src, bytes); }); }
  void to_device(void* dst, const void* src, size_t bytes) override { run([&] { std::memcpy(dst, src, bytes); }); }
  void* alloc_pinned(size_t bytes) override {
    if (!tally_) return ::operator new(bytes);
    return reserve(bytes);  // sizing: page-locked host memory is not this backend's, so not counted
  }
  void free_pinned(void* p) override {
    if (!tally_) return ::operator delete(p);
    std::lock_guard<std::recursive_mutex> lock(mu_);
    release(static_cast<char*>(p), regions_.at(static_cast<char*>(p)));
    regions_.erase(static_cast<char*>(p));
  }
  std::unique_ptr<DeviceCollectives> make_collectives(int, int, const std::string&, bool,
                                                      const Share&) override {
    return nullptr;  // staged, as a GPU's memory without NCCL
  }

  // ---- every op: the walls down while the host backend runs it ----
  void gemm(bool ta, bool tb, int m, int n, int k, float alpha, ConstView A, int lda, GemmWeight B, int ldb,
            float beta, View C, int ldc) override {
    run([&] { inner_->gemm(ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc); });
  }
  void linear_forward(View y, ConstView x, GemmWeight w, const float* bias, ConstView residual, int N, int in,
                      int out) override {
    run([&] { inner_->linear_forward(y, x, w, bias, residual, N, in, out); });
  }
  void linear_gelu_forward(View out, View pre, ConstView x, GemmWeight w, const float* bias, int N, int in,
                           int F) override {
    run([&] { inner_->linear_gelu_forward(out, pre, x, w, bias, N, in, F); });
  }
  bool bf16_gemm() const override { return inner_->bf16_gemm(); }
  uint64_t launch_count() const override { return inner_->launch_count(); }
  std::string describe_gemm() const override { return tally_ ? "none (sizing)" : inner_->describe_gemm(); }
  void embedding_forward(View out, const int32_t* tokens, const float* wte, const float* wpe, int N, int T, int C,
                         int vocab_start, int vocab_rows) override {
    run([&] { inner_->embedding_forward(out, tokens, wte, wpe, N, T, C, vocab_start, vocab_rows); });
  }
  void embedding_backward(float* dwte, float* dwpe, ConstView dout, const int32_t* tokens, int N, int T, int C,
                          int vocab_start, int vocab_rows) override {
    run([&] { inner_->embedding_backward(dwte, dwpe, dout, tokens, N, T, C, vocab_start, vocab_rows); });
  }
  void layernorm_forward(View out, float* mean, float* rstd, ConstView x, const float* w, const float* b, int N,
                         int C) override {
    run([&] { inner_->layernorm_forward(out, mean, rstd, x, w, b, N, C); });
  }
  void layernorm_backward(View dx, float* dw, float* db, ConstView dy, ConstView x, const float* w,
                          const float* mean, const float* rstd, int N, int C) override {
    run([&] { inner_->layernorm_backward(dx, dw, db, dy, x, w, mean, rstd, N, C); });
  }
  void bias_backward(float* dbias, ConstView dout, int N, int C) override {
    run([&] { inner_->bias_backward(dbias, dout, N, C); });
  }
  void gelu_forward(View out, ConstView x, size_t n) override { run([&] { inner_->gelu_forward(out, x, n); }); }
  void gelu_backward(View dx, float* dbias, ConstView x, ConstView y, ConstView dout, int N, int C) override {
    run([&] { inner_->gelu_backward(dx, dbias, x, y, dout, N, C); });
  }
  void accumulate(float* out, const float* a, size_t n) override { run([&] { inner_->accumulate(out, a, n); }); }
  void attention_forward(View out, float* lse, ConstView qkv, int B, int T, int H, int Hkv, int A) override {
    run([&] { inner_->attention_forward(out, lse, qkv, B, T, H, Hkv, A); });
  }
  void attention_backward(View dqkv, ConstView dout, ConstView out, const float* lse, ConstView qkv, int B, int T,
                          int H, int Hkv, int A) override {
    run([&] { inner_->attention_backward(dqkv, dout, out, lse, qkv, B, T, H, Hkv, A); });
  }
  void rmsnorm_forward(View out, float* rstd, ConstView x, const float* w, int N, int C, float eps) override {
    run([&] { inner_->rmsnorm_forward(out, rstd, x, w, N, C, eps); });
  }
  void rmsnorm_backward(View dx, float* dw, ConstView dy, ConstView x, const float* w, const float* rstd, int N,
                        int C) override {
    run([&] { inner_->rmsnorm_backward(dx, dw, dy, x, w, rstd, N, C); });
  }
  void rope(View x, const float* cs, int N, int T, int heads, int hd, long ld, bool backward) override {
    run([&] { inner_->rope(x, cs, N, T, heads, hd, ld, backward); });
  }
  void swiglu_forward(View out, ConstView h, int N, int F) override {
    run([&] { inner_->swiglu_forward(out, h, N, F); });
  }
  void swiglu_backward(View dh, ConstView h, ConstView dout, int N, int F) override {
    run([&] { inner_->swiglu_backward(dh, h, dout, N, F); });
  }
  void crossentropy(float* losses, View dlogits, ConstView logits, const int32_t* targets, int N, int V, int ld,
                    float dloss) override {
    run([&] { inner_->crossentropy(losses, dlogits, logits, targets, N, V, ld, dloss); });
  }
  void vocab_row_max(float* row_max, ConstView logits, int N, int V, int ld) override {
    run([&] { inner_->vocab_row_max(row_max, logits, N, V, ld); });
  }
  void vocab_sumexp(float* sumexp, float* target_logit, ConstView logits, const float* row_max,
                    const int32_t* targets, int vocab_start, int N, int V, int ld) override {
    run([&] { inner_->vocab_sumexp(sumexp, target_logit, logits, row_max, targets, vocab_start, N, V, ld); });
  }
  void vocab_crossentropy_grad(View dlogits, ConstView logits, const float* row_max, const float* sumexp,
                               const int32_t* targets, int vocab_start, int N, int V, int ld, float dloss) override {
    run([&] { inner_->vocab_crossentropy_grad(dlogits, logits, row_max, sumexp, targets, vocab_start, N, V, ld, dloss); });
  }

  void adam_steps(const AdamRun* runs, size_t count, const math::AdamParams& a, bool fp16) override {
    run([&] { inner_->adam_steps(runs, count, a, fp16); });
  }
  void scale(float* x, float s, size_t n) override { run([&] { inner_->scale(x, s, n); }); }
  void cast_to_bf16(uint16_t* out, const float* x, size_t n) override { run([&] { inner_->cast_to_bf16(out, x, n); }); }
  void cast_from_bf16(float* out, const uint16_t* x, size_t n) override {
    run([&] { inner_->cast_from_bf16(out, x, n); });
  }
  void cast_to_fp16(uint16_t* out, const float* x, size_t n) override { run([&] { inner_->cast_to_fp16(out, x, n); }); }
  void cast_from_fp16(float* out, const uint16_t* x, size_t n) override {
    run([&] { inner_->cast_from_fp16(out, x, n); });
  }
  void accumulate_bf16(uint16_t* acc, const float* x, size_t n) override {
    run([&] { inner_->accumulate_bf16(acc, x, n); });
  }
  void accumulate_fp16(uint16_t* acc, const float* x, size_t n) override {
    run([&] { inner_->accumulate_fp16(acc, x, n); });
  }
  double sum_squares(const float* x, size_t n) override {
    double r = 0;
    run([&] { r = inner_->sum_squares(x, n); });
    return r;
  }

 private:
  // Address space for `bytes`, unreadable (PROT_NONE, zeroed, no memory until opened), unmapped at the end.
  void* reserve(size_t bytes) {
    std::lock_guard<std::recursive_mutex> lock(mu_);
    const size_t len = round_up(bytes ? bytes : 1);
    void* p = mmap(nullptr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED && tally_) {
      // Sizing a layout larger than the address space (a micro-batch of 10^9): nothing reads a
      // sizing buffer, so it gets an address range past the user address space (never mapped, never
      // unmapped), and the plan goes on to say how much the layout needs.
      p = reinterpret_cast<void*>(next_unmapped_);
      next_unmapped_ += len;
    }
    Z3D_ASSERT(p != MAP_FAILED, "walled backend: mmap failed");
    regions_[static_cast<char*>(p)] = len;
    return p;
  }
  void release(char* p, size_t len) {
    if (reinterpret_cast<uintptr_t>(p) < kUnmappedBase) munmap(p, len);
  }
  // Walled: every allocation lies in one reserved range, so the walls go down and up around an
  // op with one mprotect of the part in use (one per allocation made every op tens of system
  // calls: 80,000 in a 6-step run of gpt-tiny, 3 s of its 3.4). A freed range is emptied (zero
  // again, as new memory) and reused first-fit; while an op runs it is open with the rest.
  static constexpr size_t kArenaBytes = size_t{1} << 38;  // address space only (256 GiB)
  char* arena_ = nullptr;
  size_t used_ = 0;                 // [arena_, arena_ + used_): handed out, now or before
  std::map<size_t, size_t> holes_;  // freed below used_: offset -> bytes, never two adjacent
  char* take(size_t bytes) {
    const size_t len = round_up(bytes ? bytes : 1);
    if (!arena_) {
      void* a = mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      Z3D_ASSERT(a != MAP_FAILED, "walled backend: cannot reserve its address space");
      arena_ = static_cast<char*>(a);
      madvise(arena_, kArenaBytes, MADV_HUGEPAGE);  // where the kernel allows: 512x fewer entries to protect
    }
    size_t off = used_;
    auto hole = std::find_if(holes_.begin(), holes_.end(), [&](const auto& h) { return h.second >= len; });
    if (hole != holes_.end()) {
      off = hole->first;
      if (hole->second > len) holes_[off + len] = hole->second - len;
      holes_.erase(hole);
    } else {
      Z3D_ASSERT(used_ + len <= kArenaBytes, "walled backend: more device memory than its 256 GiB of address space");
      used_ += len;
    }
    regions_[arena_ + off] = len;
    return arena_ + off;
  }
  void give_back(char* p, size_t len) {
    madvise(p, len, MADV_DONTNEED);
    size_t off = static_cast<size_t>(p - arena_);
    auto next = holes_.find(off + len);
    if (next != holes_.end()) len += next->second, holes_.erase(next);
    auto prev = holes_.lower_bound(off);
    if (prev != holes_.begin() && std::prev(prev)->first + std::prev(prev)->second == off) {
      --prev;
      off = prev->first, len += prev->second;
      holes_.erase(prev);
    }
    if (off + len == used_) used_ = off;  // the top shrinks instead
    else holes_[off] = len;
  }
  static constexpr uintptr_t kUnmappedBase = uintptr_t{1} << 56;  // above x86-64's and AArch64's user space
  uintptr_t next_unmapped_ = kUnmappedBase;
  static size_t round_up(size_t n) {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    return (n + page - 1) / page * page;
  }
  // f with every region readable and writable, then the walls back up; sizing: f only counts, the
  // walls stay up.
  template <typename F>
  void run(F&& f) {
    if (tally_) return f();
    std::lock_guard<std::recursive_mutex> lock(mu_);
    struct Walls {  // down for the outermost op, up again however it ends
      WalledBackend& b;
      explicit Walls(WalledBackend& be) : b(be) {
        if (b.depth_++ == 0) b.protect(PROT_READ | PROT_WRITE);
      }
      ~Walls() {
        if (--b.depth_ == 0) b.protect(PROT_NONE);
      }
    } walls(*this);
    f();
  }
  void protect(int prot) {
    const size_t huge = size_t{2} << 20;  // whole huge pages: mprotect of part of one splits it
    if (used_) Z3D_ASSERT(mprotect(arena_, (used_ + huge - 1) / huge * huge, prot) == 0, "walled backend: mprotect failed");
  }

  std::unique_ptr<Backend> inner_;  // sizing: one that counts (HostOptions::count_only)
  MemKind kind_ = MemKind::device;
  std::shared_ptr<MemoryTally> tally_;  // sizing: what was allocated
  std::recursive_mutex mu_;
  std::map<char*, size_t> regions_, sizes_;
  int depth_ = 0;
  size_t allocs_ = 0;
};

}  // namespace

std::unique_ptr<Backend> make_walled_backend(const HostOptions& options) {
  return std::make_unique<WalledBackend>(options);
}

std::unique_ptr<Backend> make_sizing_backend(MemKind kind, std::shared_ptr<MemoryTally> tally) {
  return std::make_unique<WalledBackend>(kind, std::move(tally));
}

}  // namespace zero3d
