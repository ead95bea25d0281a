// test_kernels: every op of the Backend interface (kernels/backend.h) against a plain
// double-precision reference written here with naive loops, and every backward op by central
// finite differences (ggml test-backend-ops style). Tests touch backend memory only through
// copy_from_host / copy_to_host and run on every backend of the build: the host at every ISA level
// of its loops this CPU runs (avx512, avx2, sse2), the host with its GEMMs through the CBLAS,
// CUDA in CUDA builds on a machine with a GPU, and Kokkos in builds with Kokkos.
//
// Two finite-difference checks per backward op:
//   * through the float op itself (h = 1e-3): proves the backward is the derivative of the forward
//     the model actually runs. A perturbation changes only the outputs of its own row; their float
//     rounding (2^-24 |y| each, ~sqrt(C) of them, |r| <= 1) divided by the step 2h gives noise of
//     ~sqrt(16) * 6e-8 * 3 / 2e-3 ~ 4e-4, and the O(h^2) truncation error is ~1e-6, hence
//     abs 1e-3 + rel 1e-2;
//   * through the double reference (h = 1e-6, error ~1e-10): tight (abs 2e-5 + rel 1e-4), so a
//     wrong constant or a dropped term in a backward formula cannot hide in the loose tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <numbers>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/host/cpu_kernels.h"
#include "kernels/host/gemm.h"
#include "kernels/math/dtype.h"
#include "kernels/math/rope.h"

namespace {

using zero3d::Backend;
using zero3d::DeviceBuffer;
using zero3d::GemmWeight;
using Vec = std::vector<double>;

// ---------------------------------------------------------------------------------------------
// helpers: backend memory, random inputs, comparison, finite differences
// ---------------------------------------------------------------------------------------------

template <typename T>
DeviceBuffer<T> to_device(Backend& be, const std::vector<T>& h) {
  DeviceBuffer<T> d(be, h.size());
  be.copy_from_host(d.data(), h.data(), d.bytes());
  return d;
}

template <typename T>
std::vector<T> to_host(Backend& be, const DeviceBuffer<T>& d) {
  std::vector<T> h(d.size());
  be.synchronize();
  be.copy_to_host(h.data(), d.data(), d.bytes());
  be.synchronize();
  return h;
}

std::vector<float> uniform(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<int32_t> random_ints(std::mt19937& rng, size_t n, int32_t below) {
  std::uniform_int_distribution<int32_t> dist(0, below - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

const float kNaN = std::numeric_limits<float>::quiet_NaN();

Vec to_double(const std::vector<float>& v) { return Vec(v.begin(), v.end()); }

double dot(const std::vector<float>& r, const std::vector<float>& y) {
  double s = 0.0;
  for (size_t i = 0; i < r.size(); ++i) s += static_cast<double>(r[i]) * y[i];
  return s;
}
double dot(const std::vector<float>& r, const Vec& y) {
  double s = 0.0;
  for (size_t i = 0; i < r.size(); ++i) s += r[i] * y[i];
  return s;
}

// Every element must satisfy |got - want| <= atol + rtol |want|; the first few misses are listed.
void expect_close(const std::vector<float>& got, const Vec& want, double rtol, double atol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double err = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= atol + rtol * std::fabs(want[i]))) {
      if (++misses <= 8) ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << got.size() << " elements out of tolerance";
}

void expect_bits_equal(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0 && ++misses <= 8)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << ", want " << want[i];
  }
  EXPECT_EQ(misses, 0) << what;
}

// Central differences of the scalar f() over every entry of x, which f reads; x is perturbed in
// place and restored. The divisor is the step actually taken after rounding x +- h to T.
template <typename T, typename F>
Vec finite_diff(std::vector<T>& x, T h, F&& f) {
  Vec g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const T x0 = x[i];
    x[i] = x0 + h;
    const T xp = x[i];
    const double fp = f();
    x[i] = x0 - h;
    const T xm = x[i];
    const double fm = f();
    x[i] = x0;
    g[i] = (fp - fm) / (static_cast<double>(xp) - static_cast<double>(xm));
  }
  return g;
}

constexpr float kStepFloat = 1e-3f;
constexpr double kStepDouble = 1e-6;
// Tolerances of the two finite-difference checks (see the top of the file).
constexpr double kFdOpRtol = 1e-2, kFdOpAtol = 1e-3;
constexpr double kFdRefRtol = 1e-4, kFdRefAtol = 2e-5;
// Forward ops against the double reference.
constexpr double kFwdRtol = 1e-5, kFwdAtol = 1e-6;

// `+=` semantics: a backward into pre-filled buffers gives prefill + (result from zeros).
void expect_accumulated(const std::vector<float>& got, const std::vector<float>& prefill,
                        const std::vector<float>& from_zero, const char* what) {
  Vec want(got.size());
  for (size_t i = 0; i < got.size(); ++i) want[i] = static_cast<double>(prefill[i]) + from_zero[i];
  expect_close(got, want, 1e-6, 1e-6, what);
}

// ---------------------------------------------------------------------------------------------
// double-precision references
// ---------------------------------------------------------------------------------------------

Vec ref_embedding(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int N, int T, int C) {
  Vec out(static_cast<size_t>(N) * C);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) out[n * C + c] = wte[tokens[n] * C + c] + wpe[(n % T) * C + c];
  return out;
}

Vec ref_layernorm(const Vec& x, const Vec& w, const Vec& b, int N, int C, Vec* mean = nullptr,
                  Vec* rstd = nullptr) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double mu = 0.0, var = 0.0;
    for (int c = 0; c < C; ++c) mu += x[n * C + c];
    mu /= C;
    for (int c = 0; c < C; ++c) var += (x[n * C + c] - mu) * (x[n * C + c] - mu);
    var /= C;
    const double rs = 1.0 / std::sqrt(var + 1e-5);
    for (int c = 0; c < C; ++c) out[n * C + c] = (x[n * C + c] - mu) * rs * w[c] + b[c];
    if (mean) (*mean)[n] = mu;
    if (rstd) (*rstd)[n] = rs;
  }
  return out;
}

double ref_gelu(double x) {
  const double s = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(s * (x + 0.044715 * x * x * x)));
}

// loss_n = logsumexp(z_n) - z_n[target_n]
Vec ref_crossentropy(const Vec& z, const std::vector<int32_t>& targets, int N, int V) {
  Vec loss(N);
  for (int n = 0; n < N; ++n) {
    double mx = z[n * V];
    for (int i = 1; i < V; ++i) mx = std::max(mx, z[n * V + i]);
    double s = 0.0;
    for (int i = 0; i < V; ++i) s += std::exp(z[n * V + i] - mx);
    loss[n] = std::log(s) + mx - z[n * V + targets[n]];
  }
  return loss;
}

// C = alpha op(A) op(B) + beta C, row-major; also returns the magnitude alpha |op(A)||op(B)| + |beta C|
// that bounds the rounding error of a float GEMM element.
void ref_gemm(bool ta, bool tb, int m, int n, int k, double alpha, const float* A, int lda, const float* B,
              int ldb, double beta, const float* C, int ldc, double* out, double* mag) {
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double s = 0.0, sa = 0.0;
      for (int p = 0; p < k; ++p) {
        const double a = ta ? A[p * lda + i] : A[i * lda + p];
        const double b = tb ? B[j * ldb + p] : B[p * ldb + j];
        s += a * b;
        sa += std::fabs(a * b);
      }
      const double c = beta == 0.0 ? 0.0 : beta * C[i * ldc + j];  // BLAS: beta = 0 never reads C
      out[i * n + j] = alpha * s + c;
      mag[i * n + j] = std::fabs(alpha) * sa + std::fabs(c);
    }
}

// Every test runs on each host variant (every ISA level of the host loops this CPU runs, and the
// best level with GEMM through the CBLAS), on the CUDA backend too in CUDA builds on a machine
// with a GPU, and on the Kokkos backend in builds with Kokkos: the same references hold for all.
struct Variant {
  zero3d::BackendKind kind;
  std::string isa, gemm;  // host only
  std::string name;
};
// How gtest (and ctest's list of discovered tests) prints a variant: its name, not its bytes.
void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> backends_to_test() {
  std::vector<Variant> v;
  for (const zero3d::cpu::Kernels* k : zero3d::cpu::runnable())
    v.push_back({zero3d::BackendKind::host, k->isa, "auto", std::string("host_") + k->isa});
  v.push_back({zero3d::BackendKind::host, "", "cblas", "host_cblas"});
#if defined(ZERO3D_HAVE_CUDA)
  if (zero3d::cuda_device_count() > 0) v.push_back({zero3d::BackendKind::cuda, "", "", "cuda"});
#endif
#if defined(ZERO3D_HAVE_KOKKOS)
  v.push_back({zero3d::BackendKind::kokkos, "", "", "kokkos"});
#endif
  return v;
}

std::unique_ptr<Backend> make_backend(const Variant& v) {
#if defined(ZERO3D_HAVE_CUDA)
  if (v.kind == zero3d::BackendKind::cuda) return zero3d::make_cuda_backend(0);
#endif
#if defined(ZERO3D_HAVE_KOKKOS)
  if (v.kind == zero3d::BackendKind::kokkos) return zero3d::make_kokkos_backend();
#endif
  zero3d::HostOptions o;
  o.isa = v.isa;
  o.gemm = v.gemm;
  return zero3d::make_host_backend(o);
}

class Kernels : public ::testing::TestWithParam<Variant> {
 protected:
  std::unique_ptr<Backend> be = make_backend(GetParam());
  std::mt19937 rng{20240607u};
};

std::string backend_name(const ::testing::TestParamInfo<Variant>& p) { return p.param.name; }
INSTANTIATE_TEST_SUITE_P(Backends, Kernels, ::testing::ValuesIn(backends_to_test()), backend_name);

// ---------------------------------------------------------------------------------------------
// memory
// ---------------------------------------------------------------------------------------------

TEST_P(Kernels, MemoryAllocIsZeroedAndCopiesRoundTrip) {
  EXPECT_EQ(be->kind(), GetParam().kind);
  EXPECT_FALSE(be->describe().empty());

  for (size_t bytes : {size_t{1}, size_t{13}, size_t{64}, size_t{1000}}) {
    void* p = be->alloc_bytes(bytes);
    ASSERT_NE(p, nullptr);
    std::vector<unsigned char> h(bytes, 0xAB);
    be->copy_to_host(h.data(), p, bytes);
    be->synchronize();
    EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](unsigned char c) { return c == 0; })) << bytes << " bytes";
    be->free_bytes(p);
  }

  std::vector<float> x = uniform(rng, 37, -1, 1);
  auto a = to_device(*be, x);
  DeviceBuffer<float> b(*be, x.size());
  be->copy(b.data(), a.data(), a.bytes());
  expect_bits_equal(to_host(*be, b), x, "copy");

  be->zero(b.data() + 5, 10 * sizeof(float));  // a slice only
  std::vector<float> want = x;
  std::fill(want.begin() + 5, want.begin() + 15, 0.0f);
  expect_bits_equal(to_host(*be, b), want, "zero slice");

  // The peak of device memory held: the buffers above on a GPU; nothing on the host (the OS's).
  if (be->kind() == zero3d::BackendKind::cuda) EXPECT_GE(be->device_peak_bytes(), a.bytes() + b.bytes());
  else EXPECT_EQ(be->device_peak_bytes(), 0u);

  DeviceBuffer<float> moved = std::move(a);  // move-only buffer: the source gives up its memory
  EXPECT_EQ(a.data(), nullptr);
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(moved.size(), x.size());
  expect_bits_equal(to_host(*be, moved), x, "moved buffer");
}

// The walled backend (ZERO3D_DEVICE_WALLS, the device-walls tests): its memory faults when the
// host touches it outside the backend's ops and copies, ops and copies see it, and memory freed
// and allocated again is zero, as new memory is. Buffers of several huge pages and of a few bytes.
TEST(WalledBackend, DeviceMemoryIsClosedToTheHostOutsideItsOps) {
  auto be = zero3d::make_walled_backend();
  const size_t big = (size_t{5} << 20) / sizeof(float) + 3;
  DeviceBuffer<float> a(*be, 1000), b(*be, big);
  std::vector<float> x(big);
  for (size_t i = 0; i < big; ++i) x[i] = static_cast<float>(i % 1000) - 500.0f;
  be->copy_from_host(a.data(), x.data(), a.bytes());
  be->copy_from_host(b.data(), x.data(), b.bytes());
  be->scale(b.data(), 2.0f, big);
  std::vector<float> got = to_host(*be, b);
  int wrong = 0;
  for (size_t i = 0; i < big; ++i) wrong += got[i] != 2 * x[i];
  EXPECT_EQ(wrong, 0);
  float* pa = a.data();
  float* pb = b.data();
  EXPECT_DEATH({ std::printf("%f\n", static_cast<double>(*static_cast<volatile float*>(pa))); }, "");
  EXPECT_DEATH({ *static_cast<volatile float*>(pb + big - 1) = 1.0f; }, "");
  for (int round = 0; round < 2; ++round) {  // freed, allocated again (in the hole, then at the top): zero
    a = DeviceBuffer<float>();
    if (round == 1) b = DeviceBuffer<float>();
    DeviceBuffer<float> c(*be, 1000), d(*be, big);
    for (const std::vector<float>& h : {to_host(*be, c), to_host(*be, d)})
      EXPECT_TRUE(std::all_of(h.begin(), h.end(), [](float v) { return v == 0.0f; })) << "round " << round;
    a = std::move(c);
    if (round == 1) b = std::move(d);
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM
// ---------------------------------------------------------------------------------------------

// Row-major storage of op(X) (rows x cols) transposed or not, with leading dimension ld > needed
// and NaN in the padding, so reading past the logical matrix poisons the result.
struct Operand {
  std::vector<float> data;
  int ld;
};
Operand make_operand(std::mt19937& rng, bool trans, int rows, int cols, int pad, int batch, long* stride) {
  const int srows = trans ? cols : rows, scols = trans ? rows : cols;
  Operand o{{}, scols + pad};
  *stride = static_cast<long>(srows) * o.ld + 7;  // a gap between matrices, NaN as well
  o.data.assign(static_cast<size_t>(*stride) * batch, std::numeric_limits<float>::quiet_NaN());
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int b = 0; b < batch; ++b)
    for (int r = 0; r < srows; ++r)
      for (int c = 0; c < scols; ++c) o.data[b * *stride + r * o.ld + c] = dist(rng);
  return o;
}

void check_gemm(Backend& be, std::mt19937& rng, bool ta, bool tb, int batch, float alpha, float beta) {
  const int m = 13, n = 7, k = 9;
  long sA = 0, sB = 0;
  Operand A = make_operand(rng, ta, m, k, 3, batch, &sA);
  Operand B = make_operand(rng, tb, k, n, 2, batch, &sB);
  const int ldc = n + 4;
  const long sC = static_cast<long>(m) * ldc + 5;
  std::vector<float> C(static_cast<size_t>(sC) * batch, 777.0f);  // padding sentinel, must survive
  std::uniform_real_distribution<float> dist(-1, 1);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) C[b * sC + i * ldc + j] = beta == 0.0f ? kNaN : dist(rng);

  auto dA = to_device(be, A.data), dB = to_device(be, B.data), dC = to_device(be, C);
  for (int b = 0; b < batch; ++b)
    be.gemm(ta, tb, m, n, k, alpha, dA.data() + b * sA, A.ld, dB.data() + b * sB, B.ld, beta, dC.data() + b * sC, ldc);
  const std::vector<float> got = to_host(be, dC);

  std::vector<double> want(static_cast<size_t>(m) * n), mag(want.size());
  int misses = 0;
  for (int b = 0; b < batch; ++b) {
    ref_gemm(ta, tb, m, n, k, alpha, A.data.data() + b * sA, A.ld, B.data.data() + b * sB, B.ld, beta,
             C.data() + b * sC, ldc, want.data(), mag.data());
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j) {
        const double g = got[b * sC + i * ldc + j], w = want[i * n + j];
        if (!(std::fabs(g - w) <= 1e-5 * mag[i * n + j] + 1e-7) && ++misses <= 8)
          ADD_FAILURE() << "ta=" << ta << " tb=" << tb << " batch " << b << " C[" << i << "," << j << "] = " << g
                        << ", want " << w;
      }
    for (long e = 0; e < sC; ++e) {  // padding and gap untouched
      const bool inside = e / ldc < m && e % ldc < n;
      if (!inside && got[b * sC + e] != 777.0f && ++misses <= 8)
        ADD_FAILURE() << "ta=" << ta << " tb=" << tb << " wrote outside C at offset " << e;
    }
  }
  EXPECT_EQ(misses, 0) << "ta=" << ta << " tb=" << tb << " batch=" << batch;
}

TEST_P(Kernels, GemmAllTransposesPaddedLeadingDims) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      check_gemm(*be, rng, ta, tb, 1, 0.75f, -1.5f);
      check_gemm(*be, rng, ta, tb, 1, -2.0f, 0.0f);  // beta = 0 overwrites C even where it holds NaN
    }
}

// Larger than the library's blocking and not multiples of any vector width, so packing tails run.
TEST_P(Kernels, GemmLargeOddShapes) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int m = 67, n = 45, k = 131;
      long sA = 0, sB = 0;
      Operand A = make_operand(rng, ta, m, k, 1, 1, &sA), B = make_operand(rng, tb, k, n, 0, 1, &sB);
      auto dA = to_device(*be, A.data), dB = to_device(*be, B.data);
      auto dC = to_device(*be, std::vector<float>(static_cast<size_t>(m) * n, kNaN));
      be->gemm(ta, tb, m, n, k, 1.0f, dA.data(), A.ld, dB.data(), B.ld, 0.0f, dC.data(), n);
      std::vector<double> want(static_cast<size_t>(m) * n), mag(want.size());
      ref_gemm(ta, tb, m, n, k, 1.0, A.data.data(), A.ld, B.data.data(), B.ld, 0.0, nullptr, n, want.data(), mag.data());
      const std::vector<float> got = to_host(*be, dC);
      int misses = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 1e-5 * mag[i] + 1e-7) && ++misses <= 8)
          ADD_FAILURE() << "ta=" << ta << " tb=" << tb << " C[" << i << "] = " << got[i] << ", want " << want[i];
      EXPECT_EQ(misses, 0);
    }
}

// y = x W^T + bias + residual: every combination of the optional terms, y pre-filled with NaN
// (written, never read).
TEST_P(Kernels, LinearForwardFoldsBiasAndResidual) {
  const int N = 37, in = 21, out = 19;
  const std::vector<float> x = uniform(rng, N * in, -1, 1), w = uniform(rng, out * in, -1, 1),
                           bias = uniform(rng, out, -1, 1), res = uniform(rng, N * out, -1, 1);
  auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, bias), dr = to_device(*be, res);
  for (bool with_bias : {false, true})
    for (bool with_res : {false, true}) {
      auto dy = to_device(*be, std::vector<float>(static_cast<size_t>(N) * out, kNaN));
      be->linear_forward(dy.data(), dx.data(), dw.data(), with_bias ? db.data() : nullptr,
                         with_res ? dr.data() : nullptr, N, in, out);
      std::vector<double> want(static_cast<size_t>(N) * out), mag(want.size());
      ref_gemm(false, true, N, out, in, 1.0, x.data(), in, w.data(), in, 0.0, nullptr, out, want.data(), mag.data());
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < out; ++o) {
          const size_t i = static_cast<size_t>(n) * out + o;
          if (with_bias) want[i] += bias[o], mag[i] += std::fabs(bias[o]);
          if (with_res) want[i] += res[i], mag[i] += std::fabs(res[i]);
        }
      const std::vector<float> got = to_host(*be, dy);
      int misses = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 1e-5 * mag[i] + 1e-7) && ++misses <= 8)
          ADD_FAILURE() << "bias=" << with_bias << " residual=" << with_res << " y[" << i << "] = " << got[i]
                        << ", want " << want[i];
      EXPECT_EQ(misses, 0) << "bias=" << with_bias << " residual=" << with_res;
    }
}

// The linear layers on operands at offsets into packed buffers, as the flat parameters and carved
// activations are: x, W, the residual and the outputs 0, 16 and 4 bytes in with the bias aligned
// (on CUDA each offset its own cuBLASLt plan, told its alignment), then the bias 4 bytes in too (a
// bias under 16 bytes takes the fallback), each against the double reference.
TEST_P(Kernels, LinearLayersAtOffsetsIntoPackedBuffers) {
  const int N = 24, in = 32, out = 16;
  const size_t nx = N * in, nw = out * in, ny = N * out;
  const std::vector<float> x = uniform(rng, nx + 4, -1, 1), w = uniform(rng, nw + 4, -1, 1),
                           bias = uniform(rng, out + 4, -1, 1), res = uniform(rng, ny + 4, -1, 1);
  auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, bias), dr = to_device(*be, res);
  for (const auto& [at, bias_at] : {std::pair<size_t, size_t>{0, 0}, {4, 0}, {1, 0}, {1, 1}}) {
    auto dy = to_device(*be, std::vector<float>(ny + 4, kNaN)), dpre = to_device(*be, std::vector<float>(ny + 4, kNaN));
    auto dg = to_device(*be, std::vector<float>(ny + 4, kNaN));
    be->linear_forward(zero3d::View(dy.data() + at, ny), zero3d::ConstView(dx.data() + at, nx), dw.data() + at,
                       db.data() + bias_at, zero3d::ConstView(dr.data() + at, ny), N, in, out);
    be->linear_gelu_forward(zero3d::View(dg.data() + at, ny), zero3d::View(dpre.data() + at, ny),
                            zero3d::ConstView(dx.data() + at, nx), dw.data() + at, db.data() + bias_at, N, in, out);
    std::vector<double> want(ny), mag(ny);
    ref_gemm(false, true, N, out, in, 1.0, x.data() + at, in, w.data() + at, in, 0.0, nullptr, out, want.data(),
             mag.data());
    const std::vector<float> got[3] = {to_host(*be, dy), to_host(*be, dpre), to_host(*be, dg)};
    int misses = 0;
    for (size_t i = 0; i < ny; ++i) {
      const double p = want[i] + bias[bias_at + i % out], tol = 1e-5 * (mag[i] + 1), y = p + res[at + i];
      const double g = 0.5 * p * (1 + std::tanh(std::sqrt(2 / M_PI) * (p + 0.044715 * p * p * p)));
      if (!(std::fabs(got[0][at + i] - y) <= tol && std::fabs(got[1][at + i] - p) <= tol &&
            std::fabs(got[2][at + i] - g) <= 2 * tol) &&
          ++misses <= 8)
        ADD_FAILURE() << "offset " << at << ", bias " << bias_at << " [" << i << "]: y " << got[0][at + i] << " (want " << y << "), pre "
                      << got[1][at + i] << " (want " << p << "), gelu " << got[2][at + i] << " (want " << g << ")";
    }
    EXPECT_EQ(misses, 0) << "offset " << at << ", bias " << bias_at;
  }
}

// pre = x W^T + bias and out = gelu(pre) in one call (on CUDA one cuBLASLt matmul with the GELU
// in its epilogue when F divides by 8, else the fallback), with and without the bias.
TEST_P(Kernels, LinearGeluForwardKeepsThePreActivation) {
  const int N = 29, in = 21;
  for (int F : {24, 19})
    for (bool with_bias : {false, true}) {
      const std::vector<float> x = uniform(rng, N * in, -1, 1), w = uniform(rng, F * in, -1, 1),
                               bias = uniform(rng, F, -1, 1);
      auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, bias);
      auto dout = to_device(*be, std::vector<float>(static_cast<size_t>(N) * F, kNaN));
      auto dpre = to_device(*be, std::vector<float>(static_cast<size_t>(N) * F, kNaN));
      be->linear_gelu_forward(dout.data(), dpre.data(), dx.data(), dw.data(), with_bias ? db.data() : nullptr, N, in, F);
      std::vector<double> want(static_cast<size_t>(N) * F), mag(want.size());
      ref_gemm(false, true, N, F, in, 1.0, x.data(), in, w.data(), in, 0.0, nullptr, F, want.data(), mag.data());
      const std::vector<float> pre = to_host(*be, dpre), out = to_host(*be, dout);
      int misses = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        const double p = want[i] + (with_bias ? bias[i % F] : 0.0), tol = 1e-5 * (mag[i] + 1) + 1e-7;
        const double g = 0.5 * p * (1 + std::tanh(std::sqrt(2 / M_PI) * (p + 0.044715 * p * p * p)));
        if (!(std::fabs(pre[i] - p) <= tol && std::fabs(out[i] - g) <= 2 * tol) && ++misses <= 8)
          ADD_FAILURE() << "F=" << F << " bias=" << with_bias << " [" << i << "] pre " << pre[i] << " (want " << p
                        << "), out " << out[i] << " (want " << g << ")";
      }
      EXPECT_EQ(misses, 0) << "F=" << F << " bias=" << with_bias;
    }
}

// ---------------------------------------------------------------------------------------------
// embedding
// ---------------------------------------------------------------------------------------------

TEST_P(Kernels, EmbeddingForwardBackward) {
  const int B = 2, T = 4, C = 5, V = 7, N = B * T;
  std::vector<int32_t> tokens = random_ints(rng, N, V);
  tokens[3] = tokens[6] = 2;  // a repeated token: its gradient rows must add up
  std::vector<float> wte = uniform(rng, V * C, -1, 1), wpe = uniform(rng, T * C, -1, 1);
  const std::vector<float> r = uniform(rng, N * C, -1, 1);
  auto dtok = to_device(*be, tokens);

  auto forward = [&](const std::vector<float>& e, const std::vector<float>& p) {
    auto de = to_device(*be, e), dp = to_device(*be, p);
    auto out = to_device(*be, std::vector<float>(N * C, kNaN));
    be->embedding_forward(out.data(), dtok.data(), de.data(), dp.data(), N, T, C, 0, V);
    return to_host(*be, out);
  };
  expect_close(forward(wte, wpe), ref_embedding(tokens, to_double(wte), to_double(wpe), N, T, C), kFwdRtol, kFwdAtol,
               "embedding out");

  // backward with dout = r, from zeros and into pre-filled gradients
  auto backward = [&](const std::vector<float>& dwte0, const std::vector<float>& dwpe0) {
    auto dwte = to_device(*be, dwte0), dwpe = to_device(*be, dwpe0), dout = to_device(*be, r);
    be->embedding_backward(dwte.data(), dwpe.data(), dout.data(), dtok.data(), N, T, C, 0, V);
    return std::make_pair(to_host(*be, dwte), to_host(*be, dwpe));
  };
  const auto [gte, gpe] = backward(std::vector<float>(V * C, 0.0f), std::vector<float>(T * C, 0.0f));

  auto L_op = [&] { return dot(r, forward(wte, wpe)); };
  expect_close(gte, finite_diff(wte, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "dwte vs fd(op)");
  expect_close(gpe, finite_diff(wpe, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "dwpe vs fd(op)");
  Vec wte_d = to_double(wte), wpe_d = to_double(wpe);
  auto L_ref = [&] { return dot(r, ref_embedding(tokens, wte_d, wpe_d, N, T, C)); };
  expect_close(gte, finite_diff(wte_d, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "dwte vs fd(ref)");
  expect_close(gpe, finite_diff(wpe_d, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "dwpe vs fd(ref)");

  const std::vector<float> pre_te = uniform(rng, V * C, -1, 1), pre_pe = uniform(rng, T * C, -1, 1);
  const auto [ate, ape] = backward(pre_te, pre_pe);
  expect_accumulated(ate, pre_te, gte, "dwte +=");
  expect_accumulated(ape, pre_pe, gpe, "dwpe +=");
}

// Many rows share few tokens: every backend adds a token's rows in row order, so dwte is the
// in-order float sum, bit for bit, on every run (the CUDA backend too: no atomics).
TEST_P(Kernels, EmbeddingBackwardAddsRowsInOrder) {
  const int N = 2048, T = 64, C = 96, V = 5;
  const std::vector<int32_t> tokens = random_ints(rng, N, V);
  const std::vector<float> r = uniform(rng, static_cast<size_t>(N) * C, -1, 1);
  std::vector<float> want(static_cast<size_t>(V) * C, 0.0f);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) want[static_cast<size_t>(tokens[n]) * C + c] += r[static_cast<size_t>(n) * C + c];
  auto dtok = to_device(*be, tokens);
  auto dout = to_device(*be, r);
  for (int run = 0; run < 3; ++run) {
    auto dwte = to_device(*be, std::vector<float>(want.size(), 0.0f));
    auto dwpe = to_device(*be, std::vector<float>(static_cast<size_t>(T) * C, 0.0f));
    be->embedding_backward(dwte.data(), dwpe.data(), dout.data(), dtok.data(), N, T, C, 0, V);
    expect_bits_equal(to_host(*be, dwte), want, "dwte");
  }
}

// A reduction over many blocks gives the same bits every time.
TEST_P(Kernels, ReductionsAreDeterministic) {
  const size_t n = 3000017;
  auto dx = to_device(*be, uniform(rng, n, -1, 3));
  const double ss = be->sum_squares(dx.data(), n);
  for (int run = 0; run < 3; ++run) EXPECT_EQ(be->sum_squares(dx.data(), n), ss);
}

// ---------------------------------------------------------------------------------------------
// layernorm
// ---------------------------------------------------------------------------------------------

TEST_P(Kernels, LayerNormForwardBackward) {
  const int N = 3, C = 16;
  std::vector<float> x = uniform(rng, N * C, -1, 1);
  for (int c = 0; c < C; ++c) {  // rows with a mean offset and different spreads
    x[1 * C + c] = 2.0f + 0.3f * x[1 * C + c];
    x[2 * C + c] = -1.0f + 3.0f * x[2 * C + c];
  }
  std::vector<float> w = uniform(rng, C, 0.5f, 1.5f), b = uniform(rng, C, -0.5f, 0.5f);
  const std::vector<float> r = uniform(rng, N * C, -1, 1);

  struct Fwd {
    std::vector<float> y, mean, rstd;
  };
  auto forward = [&] {
    auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, b);
    auto y = to_device(*be, std::vector<float>(N * C, kNaN));
    auto mean = to_device(*be, std::vector<float>(N, kNaN)), rstd = to_device(*be, std::vector<float>(N, kNaN));
    be->layernorm_forward(y.data(), mean.data(), rstd.data(), dx.data(), dw.data(), db.data(), N, C);
    return Fwd{to_host(*be, y), to_host(*be, mean), to_host(*be, rstd)};
  };
  const Fwd f = forward();
  Vec mean_ref(N), rstd_ref(N);
  const Vec y_ref = ref_layernorm(to_double(x), to_double(w), to_double(b), N, C, &mean_ref, &rstd_ref);
  expect_close(f.y, y_ref, kFwdRtol, kFwdAtol, "layernorm out");
  expect_close(f.mean, mean_ref, kFwdRtol, kFwdAtol, "layernorm mean");
  expect_close(f.rstd, rstd_ref, kFwdRtol, kFwdAtol, "layernorm rstd");

  struct Grads {
    std::vector<float> dx, dw, db;
  };
  auto backward = [&](const Grads& pre) {
    auto dx = to_device(*be, pre.dx), dw = to_device(*be, pre.dw), db = to_device(*be, pre.db);
    auto dy = to_device(*be, r), xd = to_device(*be, x), wd = to_device(*be, w);
    auto mean = to_device(*be, f.mean), rstd = to_device(*be, f.rstd);
    be->layernorm_backward(dx.data(), dw.data(), db.data(), dy.data(), xd.data(), wd.data(), mean.data(),
                           rstd.data(), N, C);
    return Grads{to_host(*be, dx), to_host(*be, dw), to_host(*be, db)};
  };
  const Grads g = backward(Grads{std::vector<float>(N * C, 0.0f), std::vector<float>(C, 0.0f),
                                 std::vector<float>(C, 0.0f)});

  auto L_op = [&] { return dot(r, forward().y); };
  expect_close(g.dx, finite_diff(x, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "dx vs fd(op)");
  expect_close(g.dw, finite_diff(w, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "dw vs fd(op)");
  expect_close(g.db, finite_diff(b, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "db vs fd(op)");

  Vec xd = to_double(x), wd = to_double(w), bd = to_double(b);
  auto L_ref = [&] { return dot(r, ref_layernorm(xd, wd, bd, N, C)); };
  expect_close(g.dx, finite_diff(xd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "dx vs fd(ref)");
  expect_close(g.dw, finite_diff(wd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "dw vs fd(ref)");
  expect_close(g.db, finite_diff(bd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "db vs fd(ref)");

  const Grads pre{uniform(rng, N * C, -1, 1), uniform(rng, C, -1, 1), uniform(rng, C, -1, 1)};
  const Grads acc = backward(pre);
  expect_accumulated(acc.dx, pre.dx, g.dx, "dx +=");
  expect_accumulated(acc.dw, pre.dw, g.dw, "dw +=");
  expect_accumulated(acc.db, pre.db, g.db, "db +=");
}

// ---------------------------------------------------------------------------------------------
// bias
// ---------------------------------------------------------------------------------------------

// bias_backward is the gradient of linear_forward's bias term (whose forward
// LinearForwardFoldsBiasAndResidual checks against the reference).
TEST_P(Kernels, BiasBackwardIsTheLinearBiasGradient) {
  const int N = 6, in = 3, C = 9;
  const std::vector<float> x = uniform(rng, N * in, -1, 1), w = uniform(rng, C * in, -1, 1),
                           r = uniform(rng, N * C, -1, 1);
  std::vector<float> bias = uniform(rng, C, -1, 1);

  auto forward = [&] {
    auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, bias);
    DeviceBuffer<float> y(*be, static_cast<size_t>(N) * C);
    be->linear_forward(y.data(), dx.data(), dw.data(), db.data(), nullptr, N, in, C);
    return to_host(*be, y);
  };

  auto backward = [&](const std::vector<float>& pre) {
    auto dbias = to_device(*be, pre), dout = to_device(*be, r);
    be->bias_backward(dbias.data(), dout.data(), N, C);
    return to_host(*be, dbias);
  };
  const std::vector<float> g = backward(std::vector<float>(C, 0.0f));
  Vec col_sum(C, 0.0);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) col_sum[c] += r[n * C + c];
  expect_close(g, col_sum, kFwdRtol, kFwdAtol, "dbias vs column sum");
  expect_close(g, finite_diff(bias, kStepFloat, [&] { return dot(r, forward()); }), kFdOpRtol, kFdOpAtol,
               "dbias vs fd(op)");

  const std::vector<float> pre = uniform(rng, C, -1, 1);
  expect_accumulated(backward(pre), pre, g, "dbias +=");
}

// ---------------------------------------------------------------------------------------------
// GELU
// ---------------------------------------------------------------------------------------------

TEST_P(Kernels, GeluForwardBackward) {
  std::vector<float> x = uniform(rng, 223, -5, 5);  // rows of 77: whole and partial blocks of every level
  x.insert(x.end(), {0.0f, -0.0f, 1e-4f, -1e-4f, 8.0f, -8.0f, 20.0f, -20.0f});
  const size_t n = x.size();
  const std::vector<float> r = uniform(rng, n, -1, 1);

  auto forward = [&] {
    auto dx = to_device(*be, x);
    auto y = to_device(*be, std::vector<float>(n, kNaN));
    be->gelu_forward(y.data(), dx.data(), n);
    return to_host(*be, y);
  };
  Vec want(n);
  for (size_t i = 0; i < n; ++i) want[i] = ref_gelu(x[i]);
  expect_close(forward(), want, kFwdRtol, kFwdAtol, "gelu");

  // dx = gelu'(x) * dout overwrites dx (not +=): pre-fill it with NaN
  const int N = 3, C = static_cast<int>(n) / N;
  ASSERT_EQ(static_cast<size_t>(N * C), n);
  auto dx = to_device(*be, std::vector<float>(n, kNaN)), xd = to_device(*be, x), yd = to_device(*be, forward()),
       dout = to_device(*be, r);
  be->gelu_backward(dx.data(), nullptr, xd.data(), yd.data(), dout.data(), N, C);
  const std::vector<float> g = to_host(*be, dx);

  // with the bias gradient fused: the same dx, and dbias += its column sums
  const std::vector<float> pre = uniform(rng, C, -1, 1);
  auto dx2 = to_device(*be, std::vector<float>(n, kNaN)), db = to_device(*be, pre);
  be->gelu_backward(dx2.data(), db.data(), xd.data(), yd.data(), dout.data(), N, C);
  expect_bits_equal(to_host(*be, dx2), g, "gelu dx with the bias gradient fused");
  Vec colsum(C);
  for (int c = 0; c < C; ++c) {
    colsum[c] = pre[c];
    for (int k = 0; k < N; ++k) colsum[c] += g[k * C + c];
  }
  expect_close(to_host(*be, db), colsum, 1e-6, 1e-6, "dbias += column sums of dx");
  be->gelu_backward(dout.data(), nullptr, xd.data(), yd.data(), dout.data(), N, C);  // in place: dx aliases dout
  expect_bits_equal(to_host(*be, dout), g, "gelu dx in place");

  expect_close(g, finite_diff(x, kStepFloat, [&] { return dot(r, forward()); }), kFdOpRtol, kFdOpAtol,
               "gelu dx vs fd(op)");
  Vec xdbl = to_double(x);
  auto L_ref = [&] {
    double s = 0.0;
    for (size_t i = 0; i < n; ++i) s += r[i] * ref_gelu(xdbl[i]);
    return s;
  };
  expect_close(g, finite_diff(xdbl, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "gelu dx vs fd(ref)");
}

// ---------------------------------------------------------------------------------------------
// causal attention
// ---------------------------------------------------------------------------------------------

// Double reference on packed rows [q (H heads) | k (Hkv) | v (Hkv)] (B*T rows of A + 2 Hkv hd):
// out, lse and, given dout, dqkv. Query head h reads key/value head h / (H / Hkv).
struct RefAttention {
  int B, T, H, Hkv, A;
  int hd() const { return A / H; }
  size_t ld() const { return static_cast<size_t>(A) + 2 * static_cast<size_t>(Hkv) * hd(); }
  size_t qc(int h) const { return static_cast<size_t>(h) * hd(); }
  size_t kc(int h) const { return A + static_cast<size_t>(h / (H / Hkv)) * hd(); }
  size_t vc(int h) const { return kc(h) + static_cast<size_t>(Hkv) * hd(); }
  void forward(const Vec& qkv, Vec& out, Vec& lse) const {
    out.assign(static_cast<size_t>(B) * T * A, 0.0);
    lse.assign(static_cast<size_t>(B) * H * T, 0.0);
    const double alpha = 1.0 / std::sqrt(static_cast<double>(hd()));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
          std::vector<double> s(i + 1);
          double mx = -1e300;
          for (int j = 0; j <= i; ++j) {
            s[j] = alpha * dot_qk(qkv, b, h, i, j);
            mx = std::max(mx, s[j]);
          }
          double z = 0;
          for (int j = 0; j <= i; ++j) z += std::exp(s[j] - mx);
          for (int j = 0; j <= i; ++j)
            for (int d = 0; d < hd(); ++d)
              out[(static_cast<size_t>(b) * T + i) * A + h * hd() + d] += std::exp(s[j] - mx) / z * v(qkv, b, h, j, d);
          lse[(static_cast<size_t>(b) * H + h) * T + i] = mx + std::log(z);
        }
  }
  Vec backward(const Vec& qkv, const Vec& dout) const {
    Vec out, lse, g(qkv.size(), 0.0);
    forward(qkv, out, lse);
    const double alpha = 1.0 / std::sqrt(static_cast<double>(hd()));
    for (int b = 0; b < B; ++b)
      for (int h = 0; h < H; ++h)
        for (int i = 0; i < T; ++i) {
          const size_t o = (static_cast<size_t>(b) * T + i) * A + h * hd();
          double Di = 0;
          for (int d = 0; d < hd(); ++d) Di += dout[o + d] * out[o + d];
          for (int j = 0; j <= i; ++j) {
            const double p = std::exp(alpha * dot_qk(qkv, b, h, i, j) - lse[(static_cast<size_t>(b) * H + h) * T + i]);
            double dp = 0;
            for (int d = 0; d < hd(); ++d) dp += dout[o + d] * v(qkv, b, h, j, d);
            const double ds = p * (dp - Di);
            for (int d = 0; d < hd(); ++d) {
              g[row(b, i) + qc(h) + d] += alpha * ds * qkv[row(b, j) + kc(h) + d];  // dq_i
              g[row(b, j) + kc(h) + d] += alpha * ds * qkv[row(b, i) + qc(h) + d];  // dk_j
              g[row(b, j) + vc(h) + d] += p * dout[o + d];                          // dv_j
            }
          }
        }
    return g;
  }
  size_t row(int b, int t) const { return (static_cast<size_t>(b) * T + t) * ld(); }
  double dot_qk(const Vec& qkv, int b, int h, int i, int j) const {
    double s = 0;
    for (int d = 0; d < hd(); ++d) s += qkv[row(b, i) + qc(h) + d] * qkv[row(b, j) + kc(h) + d];
    return s;
  }
  double v(const Vec& qkv, int b, int h, int j, int d) const { return qkv[row(b, j) + vc(h) + d]; }
};

struct AttentionRun {
  std::vector<float> out, lse, dqkv;
};
AttentionRun run_attention(Backend& be, const std::vector<float>& qkv, const std::vector<float>& dout, int B, int T,
                           int H, int Hkv, int A) {
  auto dq = to_device(be, qkv), dO = to_device(be, dout);
  auto out = to_device(be, std::vector<float>(static_cast<size_t>(B) * T * A, kNaN));
  auto lse = to_device(be, std::vector<float>(static_cast<size_t>(B) * H * T, kNaN));
  auto g = to_device(be, std::vector<float>(qkv.size(), kNaN));  // written, not accumulated
  be.attention_forward(out.data(), lse.data(), dq.data(), B, T, H, Hkv, A);
  be.attention_backward(g.data(), dO.data(), out.data(), lse.data(), dq.data(), B, T, H, Hkv, A);
  return {to_host(be, out), to_host(be, lse), to_host(be, g)};
}

// Random qkv (entries in [-range, range]) and output weights r; the op's out, lse and dqkv (for
// dout = r) against the double reference: forward within (rtol, atol), dqkv within 10x that.
AttentionRun check_attention(Backend& be, std::mt19937& rng, const RefAttention& ref, float range, double rtol,
                             double atol, std::vector<float>& qkv, std::vector<float>& r) {
  const auto [B, T, H, Hkv, A] = ref;
  qkv = uniform(rng, static_cast<size_t>(B) * T * ref.ld(), -range, range);
  r = uniform(rng, static_cast<size_t>(B) * T * A, -1, 1);
  Vec out, lse;
  ref.forward(to_double(qkv), out, lse);
  const AttentionRun got = run_attention(be, qkv, r, B, T, H, Hkv, A);
  const std::string tag = " (T=" + std::to_string(T) + " hd=" + std::to_string(A / H) + " H=" + std::to_string(H) +
                          " Hkv=" + std::to_string(Hkv) + ")";
  expect_close(got.out, out, rtol, atol, ("attention out" + tag).c_str());
  expect_close(got.lse, lse, rtol, atol, ("attention lse" + tag).c_str());
  expect_close(got.dqkv, ref.backward(to_double(qkv), to_double(r)), 10 * rtol, 10 * atol, ("dqkv" + tag).c_str());
  return got;
}

// Small enough for finite differences through every input: a head width that is no multiple of the
// vector width, a sequence shorter than one tile; multi-head, grouped-query (two query heads per
// key/value head) and multi-query (one key/value head).
TEST_P(Kernels, AttentionForwardBackwardFiniteDifferences) {
  for (auto [H, Hkv] : {std::pair{2, 2}, std::pair{4, 2}, std::pair{3, 1}}) {
    const RefAttention ref{2, 5, H, Hkv, 3 * H};
    const auto [B, T, H_, Hkv_, A] = ref;
    std::vector<float> qkv, r;
    const AttentionRun got = check_attention(*be, rng, ref, 1.5f, kFwdRtol, kFwdAtol, qkv, r);
    const std::string tag = " H=" + std::to_string(H) + " Hkv=" + std::to_string(Hkv);

    auto forward = [&] { return run_attention(*be, qkv, r, B, T, H, Hkv, A).out; };
    expect_close(got.dqkv, finite_diff(qkv, kStepFloat, [&] { return dot(r, forward()); }), kFdOpRtol, kFdOpAtol,
                 ("dqkv vs fd(op)" + tag).c_str());
    Vec qd = to_double(qkv);
    auto L_ref = [&] {
      Vec o, l;
      ref.forward(qd, o, l);
      return dot(r, o);
    };
    expect_close(got.dqkv, finite_diff(qd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, ("dqkv vs fd(ref)" + tag).c_str());
  }
}

// Several tiles (T over 2 x 64, the last partial) and head widths on and off the vector width,
// multi-head and grouped-query: against the double reference, and causal (a later position's k
// and v change no earlier output).
TEST_P(Kernels, AttentionTiledMatchesReference) {
  // hd 16 and 24: one register per lane on the GPU; 64 (GPT-2's) two; 80 three of four.
  for (auto [B, T, H, Hkv, hd] : {std::tuple{1, 150, 2, 2, 16}, std::tuple{2, 67, 3, 3, 24}, std::tuple{1, 70, 2, 2, 64},
                                  std::tuple{1, 40, 1, 1, 80}, std::tuple{1, 150, 4, 2, 16}, std::tuple{2, 70, 4, 1, 64}}) {
    const RefAttention ref{B, T, H, Hkv, H * hd};
    std::vector<float> qkv, r;
    const AttentionRun got = check_attention(*be, rng, ref, 2.0f, 1e-5, 1e-6, qkv, r);
    const std::string tag = "T=" + std::to_string(T) + " hd=" + std::to_string(hd) + " Hkv=" + std::to_string(Hkv);

    for (size_t c = ref.A; c < ref.ld(); ++c) qkv[(static_cast<size_t>(T) - 1) * ref.ld() + c] = 1e4f;  // last k, v
    const AttentionRun changed = run_attention(*be, qkv, r, B, T, H, Hkv, ref.A);
    std::vector<float> before(got.out.begin(), got.out.begin() + static_cast<size_t>(T - 1) * ref.A);
    std::vector<float> after(changed.out.begin(), changed.out.begin() + static_cast<size_t>(T - 1) * ref.A);
    expect_bits_equal(after, before, ("causal: earlier rows unchanged " + tag).c_str());
  }
}

// Grouped-query attention is multi-head attention with each key/value head repeated for the query
// heads that share it: the same outputs, and its dk, dv the sums of the repeated heads' gradients.
TEST_P(Kernels, GroupedQueryAttentionIsRepeatedKeyValueHeads) {
  const int B = 1, T = 70, H = 4, Hkv = 2, hd = 16, A = H * hd, G = H / Hkv;
  const RefAttention gqa{B, T, H, Hkv, A};
  const size_t ld = gqa.ld(), ldm = 3 * static_cast<size_t>(A);
  const std::vector<float> qkv = uniform(rng, static_cast<size_t>(B) * T * ld, -2, 2), r = uniform(rng, B * T * A, -1, 1);
  std::vector<float> mha(static_cast<size_t>(B) * T * ldm);
  for (int t = 0; t < B * T; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < hd; ++d) {
        const size_t kv = (h / G) * hd + d;
        mha[t * ldm + h * hd + d] = qkv[t * ld + h * hd + d];
        mha[t * ldm + A + h * hd + d] = qkv[t * ld + A + kv];
        mha[t * ldm + 2 * A + h * hd + d] = qkv[t * ld + A + Hkv * hd + kv];
      }
  const AttentionRun g = run_attention(*be, qkv, r, B, T, H, Hkv, A), m = run_attention(*be, mha, r, B, T, H, H, A);
  expect_close(g.out, to_double(m.out), 1e-6, 1e-7, "gqa out vs repeated heads");
  expect_close(g.lse, to_double(m.lse), 1e-6, 1e-7, "gqa lse vs repeated heads");
  Vec want(g.dqkv.size(), 0.0);
  for (int t = 0; t < B * T; ++t)
    for (int h = 0; h < H; ++h)
      for (int d = 0; d < hd; ++d) {
        const size_t kv = (h / G) * hd + d;
        want[t * ld + h * hd + d] = m.dqkv[t * ldm + h * hd + d];
        want[t * ld + A + kv] += m.dqkv[t * ldm + A + h * hd + d];
        want[t * ld + A + Hkv * hd + kv] += m.dqkv[t * ldm + 2 * A + h * hd + d];
      }
  expect_close(g.dqkv, want, 1e-5, 1e-6, "gqa dqkv vs summed repeated heads");
}

// ---------------------------------------------------------------------------------------------
// the Llama family: RMSNorm, RoPE, SwiGLU
// ---------------------------------------------------------------------------------------------

Vec ref_rmsnorm(const Vec& x, const Vec& w, int N, int C, double eps, Vec* rstd = nullptr) {
  Vec out(x.size());
  for (int n = 0; n < N; ++n) {
    double ss = 0.0;
    for (int c = 0; c < C; ++c) ss += x[n * C + c] * x[n * C + c];
    const double rs = 1.0 / std::sqrt(ss / C + eps);
    for (int c = 0; c < C; ++c) out[n * C + c] = x[n * C + c] * rs * w[c];
    if (rstd) (*rstd)[n] = rs;
  }
  return out;
}

TEST_P(Kernels, RMSNormForwardBackward) {
  const int N = 3, C = 19;  // a tail past every level's vectors
  const float eps = 1e-6f;
  std::vector<float> x = uniform(rng, N * C, -1, 1);
  for (int c = 0; c < C; ++c) x[2 * C + c] = 0.5f + 3.0f * x[2 * C + c];  // an offset, a wider spread
  std::vector<float> w = uniform(rng, C, 0.5f, 1.5f);
  const std::vector<float> r = uniform(rng, N * C, -1, 1);
  struct Fwd {
    std::vector<float> y, rstd;
  };
  auto forward = [&] {
    auto xd = to_device(*be, x), wd = to_device(*be, w);
    auto y = to_device(*be, std::vector<float>(N * C, kNaN)), rstd = to_device(*be, std::vector<float>(N, kNaN));
    be->rmsnorm_forward(y.data(), rstd.data(), xd.data(), wd.data(), N, C, eps);
    return Fwd{to_host(*be, y), to_host(*be, rstd)};
  };
  const Fwd f = forward();
  Vec rstd_ref(N);
  expect_close(f.y, ref_rmsnorm(to_double(x), to_double(w), N, C, eps, &rstd_ref), kFwdRtol, kFwdAtol, "rmsnorm out");
  expect_close(f.rstd, rstd_ref, kFwdRtol, kFwdAtol, "rmsnorm rstd");

  struct Grads {
    std::vector<float> dx, dw;
  };
  auto backward = [&](const Grads& pre) {
    auto dx = to_device(*be, pre.dx), dw = to_device(*be, pre.dw), dy = to_device(*be, r);
    auto xd = to_device(*be, x), wd = to_device(*be, w), rstd = to_device(*be, f.rstd);
    be->rmsnorm_backward(dx.data(), dw.data(), dy.data(), xd.data(), wd.data(), rstd.data(), N, C);
    return Grads{to_host(*be, dx), to_host(*be, dw)};
  };
  const Grads g = backward(Grads{std::vector<float>(N * C, 0.0f), std::vector<float>(C, 0.0f)});
  auto L_op = [&] { return dot(r, forward().y); };
  expect_close(g.dx, finite_diff(x, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "rmsnorm dx vs fd(op)");
  expect_close(g.dw, finite_diff(w, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "rmsnorm dw vs fd(op)");
  Vec xd = to_double(x), wd = to_double(w);
  auto L_ref = [&] { return dot(r, ref_rmsnorm(xd, wd, N, C, eps)); };
  expect_close(g.dx, finite_diff(xd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "rmsnorm dx vs fd(ref)");
  expect_close(g.dw, finite_diff(wd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "rmsnorm dw vs fd(ref)");

  const Grads pre{uniform(rng, N * C, -1, 1), uniform(rng, C, -1, 1)};
  const Grads acc = backward(pre);
  expect_accumulated(acc.dx, pre.dx, g.dx, "rmsnorm dx +=");
  expect_accumulated(acc.dw, pre.dw, g.dw, "rmsnorm dw +=");
}

// RoPE turns the first `heads` heads of each row and leaves the rest of the row alone; against the
// double reference (angles in double), its backward is the gradient of the forward (a rotation's
// transpose), and backward after forward gives the input back. Head widths 6 (a vector's tail
// only) and 550 (275 pairs: whole vectors, the host's 256-pair chunks and a tail).
TEST_P(Kernels, RopeForwardBackward) {
  for (const int hd : {6, 550}) {
    const int T = 5, N = 2 * T, heads = 3, half = hd / 2;
    const long ld = 5 * hd;  // q (2 heads) and k (1) turned, v (2) not
    const double theta = 10000.0;
    const std::vector<float> table = zero3d::math::rope_table(T, hd, theta);
    std::vector<float> x = uniform(rng, N * ld, -1, 1);
    const std::vector<float> r = uniform(rng, N * ld, -1, 1);
    auto run = [&](const std::vector<float>& in, bool backward) {
      auto xd = to_device(*be, in), cs = to_device(*be, table);
      be->rope(xd.data(), cs.data(), N, T, heads, hd, ld, backward);
      return to_host(*be, xd);
    };
    auto ref = [&](const Vec& in, double sign) {
      Vec out = in;
      for (int n = 0; n < N; ++n)
        for (int h = 0; h < heads; ++h)
          for (int i = 0; i < half; ++i) {
            const double a = sign * (n % T) * std::pow(theta, -2.0 * i / hd);
            const size_t p = n * ld + h * hd + i;
            out[p] = in[p] * std::cos(a) - in[p + half] * std::sin(a);
            out[p + half] = in[p + half] * std::cos(a) + in[p] * std::sin(a);
          }
      return out;
    };
    const std::string w = " (head width " + std::to_string(hd) + ")";
    expect_close(run(x, false), ref(to_double(x), 1.0), kFwdRtol, kFwdAtol, ("rope forward" + w).c_str());
    expect_close(run(r, true), ref(to_double(r), -1.0), kFwdRtol, kFwdAtol, ("rope backward turns back" + w).c_str());
    expect_close(run(run(x, false), true), to_double(x), 1e-6, 1e-6, ("rope backward undoes forward" + w).c_str());
    if (hd > 6) continue;  // finite differences on the narrow heads only (their cost is per element)
    const std::vector<float> g = run(r, true);  // d(r . rope(x)) / dx
    expect_close(g, finite_diff(x, kStepFloat, [&] { return dot(r, run(x, false)); }), kFdOpRtol, kFdOpAtol,
                 "rope dx vs fd(op)");
    Vec xd = to_double(x);
    expect_close(g, finite_diff(xd, kStepDouble, [&] { return dot(r, ref(xd, 1.0)); }), kFdRefRtol, kFdRefAtol,
                 "rope dx vs fd(ref)");
  }
}

TEST_P(Kernels, SwiGLUForwardBackward) {
  const int N = 3, F = 71;  // whole and partial blocks of every level (kernels/host: 16-64 floats)
  std::vector<float> h = uniform(rng, N * 2 * F, -4, 4);
  const std::vector<float> r = uniform(rng, N * F, -1, 1);
  auto forward = [&] {
    auto hd = to_device(*be, h), out = to_device(*be, std::vector<float>(N * F, kNaN));
    be->swiglu_forward(out.data(), hd.data(), N, F);
    return to_host(*be, out);
  };
  auto ref = [&](const Vec& in) {
    Vec out(static_cast<size_t>(N) * F);
    for (int n = 0; n < N; ++n)
      for (int c = 0; c < F; ++c) {
        const double g = in[n * 2 * F + c], u = in[n * 2 * F + F + c];
        out[n * F + c] = g / (1.0 + std::exp(-g)) * u;
      }
    return out;
  };
  expect_close(forward(), ref(to_double(h)), kFwdRtol, kFwdAtol, "swiglu out");
  auto hd = to_device(*be, h), dout = to_device(*be, r), dh = to_device(*be, std::vector<float>(N * 2 * F, kNaN));
  be->swiglu_backward(dh.data(), hd.data(), dout.data(), N, F);
  const std::vector<float> g = to_host(*be, dh);
  expect_close(g, finite_diff(h, kStepFloat, [&] { return dot(r, forward()); }), kFdOpRtol, kFdOpAtol,
               "swiglu dh vs fd(op)");
  Vec hdd = to_double(h);
  expect_close(g, finite_diff(hdd, kStepDouble, [&] { return dot(r, ref(hdd)); }), kFdRefRtol, kFdRefAtol,
               "swiglu dh vs fd(ref)");
}

// Outputs from 4 MiB on are written with streaming stores on the host (kernels/host: kStreamBytes):
// a call over many rows gives the same bits as the rows one call at a time (small: cached stores).
// F odd: rows start at every alignment, so the unaligned fallback and the tails run too.
TEST_P(Kernels, SwiGLUStreamedOutputsEqualCachedOnes) {
  const int N = 1024, F = 1031;  // out 4.2 MB, dh 8.4 MB
  const std::vector<float> h = uniform(rng, static_cast<size_t>(N) * 2 * F, -4, 4), r = uniform(rng, N * F, -1, 1);
  auto hd = to_device(*be, h), dout = to_device(*be, r);
  auto out = to_device(*be, std::vector<float>(N * F, kNaN)), dh = to_device(*be, std::vector<float>(N * 2 * F, kNaN));
  be->swiglu_forward(out.data(), hd.data(), N, F);
  be->swiglu_backward(dh.data(), hd.data(), dout.data(), N, F);
  auto out1 = to_device(*be, std::vector<float>(N * F, kNaN)), dh1 = to_device(*be, std::vector<float>(N * 2 * F, kNaN));
  for (int n = 0; n < N; ++n) {
    const size_t o = static_cast<size_t>(n) * F;
    be->swiglu_forward(out1.data() + o, hd.data() + 2 * o, 1, F);
    be->swiglu_backward(dh1.data() + 2 * o, hd.data() + 2 * o, dout.data() + o, 1, F);
  }
  expect_bits_equal(to_host(*be, out), to_host(*be, out1), "swiglu forward: one call against row by row");
  expect_bits_equal(to_host(*be, dh), to_host(*be, dh1), "swiglu backward: one call against row by row");
}

// ---------------------------------------------------------------------------------------------
// cross-entropy
// ---------------------------------------------------------------------------------------------

// Vocab-parallel embedding: two slices of the vocabulary, each looking up only its rows (the other
// rows contribute 0), add up to the whole lookup; their gradients are the rows of the whole one.
TEST_P(Kernels, EmbeddingVocabSlicesAddUpToTheWhole) {
  const int T = 4, C = 3, V = 6, N = 8, split = 4;
  std::vector<int32_t> tokens = random_ints(rng, N, V);
  tokens[0] = 0, tokens[1] = V - 1, tokens[2] = split - 1, tokens[3] = split;  // both edges of both slices
  const std::vector<float> wte = uniform(rng, V * C, -1, 1), wpe = uniform(rng, T * C, -1, 1),
                           r = uniform(rng, N * C, -1, 1);
  auto dtok = to_device(*be, tokens);
  auto dwte = to_device(*be, wte), dwpe = to_device(*be, wpe), dr = to_device(*be, r);
  auto whole = to_device(*be, std::vector<float>(N * C, kNaN)), a = to_device(*be, std::vector<float>(N * C, kNaN)),
       b = to_device(*be, std::vector<float>(N * C, kNaN));
  be->embedding_forward(whole.data(), dtok.data(), dwte.data(), dwpe.data(), N, T, C, 0, V);
  be->embedding_forward(a.data(), dtok.data(), dwte.data(), dwpe.data(), N, T, C, 0, split);  // with positions
  be->embedding_forward(b.data(), dtok.data(), dwte.data() + split * C, nullptr, N, T, C, split, V - split);
  const auto w = to_host(*be, whole), x = to_host(*be, a), y = to_host(*be, b);
  for (int i = 0; i < N * C; ++i) EXPECT_FLOAT_EQ(x[i] + y[i], w[i]) << i;
  auto g_whole = to_device(*be, std::vector<float>(V * C, 0.0f)), g_part = to_device(*be, std::vector<float>(V * C, 0.0f));
  auto gp1 = to_device(*be, std::vector<float>(T * C, 0.0f)), gp2 = to_device(*be, std::vector<float>(T * C, 0.0f));
  be->embedding_backward(g_whole.data(), gp1.data(), dr.data(), dtok.data(), N, T, C, 0, V);
  be->embedding_backward(g_part.data(), gp2.data(), dr.data(), dtok.data(), N, T, C, 0, split);
  be->embedding_backward(g_part.data() + split * C, gp2.data(), dr.data(), dtok.data(), N, T, C, split, V - split);
  EXPECT_EQ(to_host(*be, g_whole), to_host(*be, g_part));
  const auto p1 = to_host(*be, gp1), p2 = to_host(*be, gp2);
  for (int i = 0; i < T * C; ++i) EXPECT_FLOAT_EQ(p2[i], 2 * p1[i]);  // each slice adds the position gradient
}

// Vocab-parallel cross-entropy: the pieces, combined across slices as the all-reduces do, give the
// fused loss and gradient.
TEST_P(Kernels, VocabParallelCrossEntropyMatchesFused) {
  const int N = 5, V = 12, P = 3, Vl = V / P;
  const std::vector<float> z = uniform(rng, N * V, -4, 4);
  std::vector<int32_t> targets = random_ints(rng, N, V);
  auto dz = to_device(*be, z);
  auto dt = to_device(*be, targets);
  auto loss = to_device(*be, std::vector<float>(N)), grad = to_device(*be, std::vector<float>(N * V));
  be->crossentropy(loss.data(), grad.data(), dz.data(), dt.data(), N, V, V, 0.25f);
  const auto want_loss = to_host(*be, loss), want_grad = to_host(*be, grad);
  std::vector<std::vector<float>> slices(P);
  std::vector<float> gmax(N, -INFINITY), gsum(N, 0.0f), gtarget(N, 0.0f);
  for (int p = 0; p < P; ++p) {
    for (int n = 0; n < N; ++n) slices[p].insert(slices[p].end(), z.begin() + n * V + p * Vl, z.begin() + n * V + (p + 1) * Vl);
    auto ds = to_device(*be, slices[p]);
    auto m = to_device(*be, std::vector<float>(N));
    be->vocab_row_max(m.data(), ds.data(), N, Vl, Vl);
    const auto mh = to_host(*be, m);
    for (int n = 0; n < N; ++n) gmax[n] = std::max(gmax[n], mh[n]);
  }
  std::vector<std::vector<float>> grads(P);
  for (int pass = 0; pass < 2; ++pass)
    for (int p = 0; p < P; ++p) {
      auto ds = to_device(*be, slices[p]);
      auto m = to_device(*be, gmax);
      if (pass == 0) {
        auto s = to_device(*be, std::vector<float>(N)), t = to_device(*be, std::vector<float>(N));
        be->vocab_sumexp(s.data(), t.data(), ds.data(), m.data(), dt.data(), p * Vl, N, Vl, Vl);
        const auto sh = to_host(*be, s), th = to_host(*be, t);
        for (int n = 0; n < N; ++n) gsum[n] += sh[n], gtarget[n] += th[n];
      } else {
        auto s = to_device(*be, gsum);
        be->vocab_crossentropy_grad(ds.data(), ds.data(), m.data(), s.data(), dt.data(), p * Vl, N, Vl, Vl, 0.25f);
        grads[p] = to_host(*be, ds);
      }
    }
  for (int n = 0; n < N; ++n) {
    EXPECT_NEAR(std::log(gsum[n]) + (gmax[n] - gtarget[n]), want_loss[n], 1e-5) << n;
    for (int p = 0; p < P; ++p)
      for (int i = 0; i < Vl; ++i) EXPECT_NEAR(grads[p][n * Vl + i], want_grad[n * V + p * Vl + i], 1e-7) << n << "," << i;
  }
}

// Rows wider than a block (the GPU's per-row kernels reduce across several warps and loop over
// columns) and more rows than a grid (rows grid-strided), against double references: LayerNorm
// forward and input gradient, cross-entropy loss and gradient.
TEST_P(Kernels, WideAndManyRowsMatchReferences) {
  for (auto [N, C] : {std::pair{3, 300}, std::pair{70000, 5}}) {
    const std::string tag = " N=" + std::to_string(N) + " C=" + std::to_string(C);
    const size_t NC = static_cast<size_t>(N) * C;
    const std::vector<float> x = uniform(rng, NC, -2, 2), w = uniform(rng, C, 0.5f, 1.5f),
                             b = uniform(rng, C, -0.5f, 0.5f), dy = uniform(rng, NC, -1, 1);
    auto dx_ = to_device(*be, x), dw_ = to_device(*be, w), db_ = to_device(*be, b), ddy = to_device(*be, dy);
    auto y = to_device(*be, std::vector<float>(NC, kNaN));
    auto mean = to_device(*be, std::vector<float>(N, kNaN)), rstd = to_device(*be, std::vector<float>(N, kNaN));
    be->layernorm_forward(y.data(), mean.data(), rstd.data(), dx_.data(), dw_.data(), db_.data(), N, C);
    Vec mean_ref(N), rstd_ref(N);
    const Vec xd = to_double(x);
    expect_close(to_host(*be, y), ref_layernorm(xd, to_double(w), to_double(b), N, C, &mean_ref, &rstd_ref), kFwdRtol,
                 kFwdAtol, ("layernorm out" + tag).c_str());
    // dx = rstd (g - mean(g) - xhat mean(g xhat)), g = dy w, into zeros
    auto gx = to_device(*be, std::vector<float>(NC, 0.0f));
    auto gw = to_device(*be, std::vector<float>(C, 0.0f)), gb = to_device(*be, std::vector<float>(C, 0.0f));
    be->layernorm_backward(gx.data(), gw.data(), gb.data(), ddy.data(), dx_.data(), dw_.data(), mean.data(),
                           rstd.data(), N, C);
    Vec dx_ref(NC);
    for (int n = 0; n < N; ++n) {
      double mg = 0, mgx = 0;
      for (int c = 0; c < C; ++c) {
        const double g = static_cast<double>(dy[n * C + c]) * w[c], xh = (xd[n * C + c] - mean_ref[n]) * rstd_ref[n];
        mg += g / C, mgx += g * xh / C;
      }
      for (int c = 0; c < C; ++c) {
        const double g = static_cast<double>(dy[n * C + c]) * w[c], xh = (xd[n * C + c] - mean_ref[n]) * rstd_ref[n];
        dx_ref[n * C + c] = rstd_ref[n] * (g - mg - xh * mgx);
      }
    }
    expect_close(to_host(*be, gx), dx_ref, 1e-4, 1e-5, ("layernorm dx" + tag).c_str());

    // cross-entropy over rows of C logits: loss and (softmax - onehot) * dloss
    const float dloss = 0.3f;
    const std::vector<int32_t> targets = random_ints(rng, N, C);
    auto dt = to_device(*be, targets);
    auto loss = to_device(*be, std::vector<float>(N, kNaN)), grad = to_device(*be, std::vector<float>(NC, kNaN));
    be->crossentropy(loss.data(), grad.data(), dx_.data(), dt.data(), N, C, C, dloss);
    expect_close(to_host(*be, loss), ref_crossentropy(xd, targets, N, C), kFwdRtol, kFwdAtol, ("loss" + tag).c_str());
    Vec g_ref(NC);
    for (int n = 0; n < N; ++n) {
      double m = -INFINITY, sum = 0;
      for (int c = 0; c < C; ++c) m = std::max(m, xd[n * C + c]);
      for (int c = 0; c < C; ++c) sum += std::exp(xd[n * C + c] - m);
      for (int c = 0; c < C; ++c) g_ref[n * C + c] = dloss * (std::exp(xd[n * C + c] - m) / sum - (c == targets[n]));
    }
    expect_close(to_host(*be, grad), g_ref, kFwdRtol, kFwdAtol, ("dlogits" + tag).c_str());
  }
}

TEST_P(Kernels, CrossEntropyLossAndGradient) {
  const int N = 4, V = 11;
  const float dloss = 0.7f;
  std::vector<float> z = uniform(rng, N * V, -4, 4);
  const std::vector<int32_t> targets = random_ints(rng, N, V);
  auto dtargets = to_device(*be, targets);

  auto losses_of = [&](const std::vector<float>& logits) {
    auto dz = to_device(*be, logits);
    auto loss = to_device(*be, std::vector<float>(N, kNaN));
    be->crossentropy(loss.data(), nullptr, dz.data(), dtargets.data(), N, V, V, dloss);
    return to_host(*be, loss);
  };
  const Vec loss_ref = ref_crossentropy(to_double(z), targets, N, V);
  const std::vector<float> loss_only = losses_of(z);
  expect_close(loss_only, loss_ref, kFwdRtol, kFwdAtol, "loss (no gradient)");

  // with the gradient: dlogits pre-filled with NaN is overwritten; same losses as without
  auto dz = to_device(*be, z), dl = to_device(*be, std::vector<float>(N * V, kNaN));
  auto loss = to_device(*be, std::vector<float>(N, kNaN));
  be->crossentropy(loss.data(), dl.data(), dz.data(), dtargets.data(), N, V, V, dloss);
  expect_bits_equal(to_host(*be, loss), loss_only, "loss (with gradient)");
  const std::vector<float> g = to_host(*be, dl);

  // the gradient is that of dloss * sum_n loss_n (dloss is one scalar for every row)
  auto L_op = [&] {
    double s = 0.0;
    for (float l : losses_of(z)) s += dloss * static_cast<double>(l);
    return s;
  };
  expect_close(g, finite_diff(z, kStepFloat, L_op), kFdOpRtol, kFdOpAtol, "dlogits vs fd(op)");
  Vec zd = to_double(z);
  auto L_ref = [&] {
    double s = 0.0;
    for (double l : ref_crossentropy(zd, targets, N, V)) s += dloss * l;
    return s;
  };
  expect_close(g, finite_diff(zd, kStepDouble, L_ref), kFdRefRtol, kFdRefAtol, "dlogits vs fd(ref)");

  // dlogits may alias logits
  be->crossentropy(loss.data(), dz.data(), dz.data(), dtargets.data(), N, V, V, dloss);
  expect_bits_equal(to_host(*be, dz), g, "dlogits aliasing logits");
  expect_bits_equal(to_host(*be, loss), loss_only, "loss with aliasing");
}

TEST_P(Kernels, CrossEntropyLargeLogitsStayFinite) {
  const int V = 8, N = 4;
  std::vector<float> z(N * V);
  std::vector<float> jitter = uniform(rng, V, -1, 1);
  for (int i = 0; i < V; ++i) {
    z[0 * V + i] = 1000.0f;                              // all equal: loss = log V
    z[1 * V + i] = 1000.0f + jitter[i];                  // large offset, O(1) spread
    z[2 * V + i] = i % 2 ? 1000.0f : -1000.0f;           // target on a -1e3 logit: loss ~ 2000
    z[3 * V + i] = i == 5 ? 1000.0f : -1000.0f;          // one-hot-like: loss ~ 0 at the target
  }
  const std::vector<int32_t> targets = {3, 6, 2, 5};
  auto dz = to_device(*be, z);
  auto dt = to_device(*be, targets);
  auto loss = to_device(*be, std::vector<float>(N, kNaN)), dl = to_device(*be, std::vector<float>(N * V, kNaN));
  be->crossentropy(loss.data(), dl.data(), dz.data(), dt.data(), N, V, V, 1.0f);
  const std::vector<float> got = to_host(*be, loss), g = to_host(*be, dl);
  be->crossentropy(loss.data(), nullptr, dz.data(), dt.data(), N, V, V, 1.0f);  // the loss-only path
  expect_bits_equal(to_host(*be, loss), got, "large-logit loss without gradient");

  for (float l : got) EXPECT_TRUE(std::isfinite(l));
  for (float d : g) EXPECT_TRUE(std::isfinite(d));
  // max - z[target] is formed first (exact), so large logits cost no precision
  expect_close(got, ref_crossentropy(to_double(z), targets, N, V), kFwdRtol, 1e-6, "large-logit loss");
  EXPECT_NEAR(got[0], std::log(static_cast<double>(V)), 1e-6);
  for (int n = 0; n < N; ++n) {  // softmax - onehot sums to zero in every row
    double s = 0.0;
    for (int i = 0; i < V; ++i) s += g[n * V + i];
    EXPECT_NEAR(s, 0.0, 1e-6) << "row " << n;
  }
}

// Logits with padding columns (the vocabulary padded for the GEMM, rows of stride ld > V): the
// losses and the gradient's vocabulary columns are those of the unpadded logits, bit for bit; the
// padding (NaN here) is never read and its gradient is 0. Fused and vocab-parallel alike.
TEST_P(Kernels, CrossEntropySkipsThePaddingAndZeroesItsGradient) {
  const int N = 5, V = 12, ld = 16, P = 3, Vl = V / P, ldl = Vl + 3;
  const std::vector<float> z = uniform(rng, N * V, -4, 4);
  const std::vector<int32_t> targets = random_ints(rng, N, V);
  auto dt = to_device(*be, targets);
  auto padded = [](const std::vector<float>& x, int rows, int cols, int stride, int c0, int total) {
    std::vector<float> out(static_cast<size_t>(rows) * stride, kNaN);
    for (int n = 0; n < rows; ++n)
      for (int c = 0; c < cols; ++c) out[n * stride + c] = x[n * total + c0 + c];
    return out;
  };
  auto dense = to_device(*be, z), loss = to_device(*be, std::vector<float>(N));
  be->crossentropy(loss.data(), dense.data(), dense.data(), dt.data(), N, V, V, 0.25f);
  const std::vector<float> want_loss = to_host(*be, loss), want_grad = to_host(*be, dense);
  auto dz = to_device(*be, padded(z, N, V, ld, 0, V)), loss2 = to_device(*be, std::vector<float>(N));
  be->crossentropy(loss2.data(), dz.data(), dz.data(), dt.data(), N, V, ld, 0.25f);
  expect_bits_equal(to_host(*be, loss2), want_loss, "losses over padded rows");
  std::vector<float> want = padded(want_grad, N, V, ld, 0, V);
  for (int n = 0; n < N; ++n) std::fill(want.begin() + n * ld + V, want.begin() + (n + 1) * ld, 0.0f);
  expect_bits_equal(to_host(*be, dz), want, "gradient over padded rows");
  // vocab-parallel: slice p's rows padded to ldl; its gradient's padding 0
  for (int p = 0; p < P; ++p) {
    auto ds = to_device(*be, padded(z, N, Vl, ldl, p * Vl, V)), plain = to_device(*be, padded(z, N, Vl, Vl, p * Vl, V));
    auto m = to_device(*be, std::vector<float>(N)), m1 = to_device(*be, std::vector<float>(N));
    be->vocab_row_max(m.data(), ds.data(), N, Vl, ldl);
    be->vocab_row_max(m1.data(), plain.data(), N, Vl, Vl);
    expect_bits_equal(to_host(*be, m), to_host(*be, m1), "row max over padded rows");
    auto s = to_device(*be, std::vector<float>(N)), t = to_device(*be, std::vector<float>(N));
    auto s1 = to_device(*be, std::vector<float>(N)), t1 = to_device(*be, std::vector<float>(N));
    be->vocab_sumexp(s.data(), t.data(), ds.data(), m.data(), dt.data(), p * Vl, N, Vl, ldl);
    be->vocab_sumexp(s1.data(), t1.data(), plain.data(), m.data(), dt.data(), p * Vl, N, Vl, Vl);
    expect_bits_equal(to_host(*be, s), to_host(*be, s1), "sum of exp over padded rows");
    expect_bits_equal(to_host(*be, t), to_host(*be, t1), "target logit over padded rows");
    be->vocab_crossentropy_grad(ds.data(), ds.data(), m.data(), s.data(), dt.data(), p * Vl, N, Vl, ldl, 0.25f);
    be->vocab_crossentropy_grad(plain.data(), plain.data(), m.data(), s.data(), dt.data(), p * Vl, N, Vl, Vl, 0.25f);
    std::vector<float> w = padded(to_host(*be, plain), N, Vl, ldl, 0, Vl);
    for (int n = 0; n < N; ++n) std::fill(w.begin() + n * ldl + Vl, w.begin() + (n + 1) * ldl, 0.0f);
    expect_bits_equal(to_host(*be, ds), w, "vocab-parallel gradient over padded rows");
  }
}

// ---------------------------------------------------------------------------------------------
// optimizer and elementwise
// ---------------------------------------------------------------------------------------------

// p -= lr ((m / bc1) / (sqrt(v) / sqrt(bc2) + eps) + wd p), decoupled; or wd p folded into g (L2)
void ref_adam(double& p, double& m, double& v, double g, const zero3d::math::AdamParams& a, double bc1, double bc2) {
  if (!a.decoupled) g += a.weight_decay * p;
  m = a.beta1 * m + (1.0 - a.beta1) * g;
  v = a.beta2 * v + (1.0 - a.beta2) * g * g;
  double update = (m / bc1) / (std::sqrt(v) / std::sqrt(bc2) + a.eps);
  if (a.decoupled) update += a.weight_decay * p;
  p -= a.lr * update;
}

TEST_P(Kernels, AdamStepMatchesFormula) {
  const size_t n = 257;
  for (bool decoupled : {true, false}) {
    std::vector<float> p = uniform(rng, n, -1, 1);
    Vec pr = to_double(p), mr(n, 0.0), vr(n, 0.0);
    auto dp = to_device(*be, p);
    DeviceBuffer<float> dm(*be, n), dv(*be, n);
    for (int t = 1; t <= 3; ++t) {
      const std::vector<float> g = uniform(rng, n, -2, 2);
      // eps large, so that where it enters the denominator shows in p
      const zero3d::math::AdamParams a = zero3d::math::adam_params(5e-2, 0.9, 0.95, 1e-3, 0.1, t, true, decoupled);
      const double bc1 = 1.0 - std::pow(double{a.beta1}, t), bc2 = 1.0 - std::pow(double{a.beta2}, t);
      auto dg = to_device(*be, g);
      be->adam_step(dp.data(), dm.data(), dv.data(), dg.data(), n, a, {});
      for (size_t i = 0; i < n; ++i) ref_adam(pr[i], mr[i], vr[i], g[i], a, bc1, bc2);
    }
    const std::string tag = decoupled ? " (AdamW)" : " (Adam+L2)";
    expect_close(to_host(*be, dp), pr, 1e-5, 1e-7, ("adam p" + tag).c_str());
    expect_close(to_host(*be, dm), mr, 1e-5, 1e-7, ("adam m" + tag).c_str());
    expect_close(to_host(*be, dv), vr, 1e-5, 1e-9, ("adam v" + tag).c_str());
  }
}

// adam_step with 16-bit weights out: p, m and v the bits of the update without them, and the
// weights the rounding of the updated p (bf16 and fp16; p large enough to reach fp16's overflow
// and subnormals), over a length no vector width divides.
TEST_P(Kernels, AdamStepWritesTheRoundedWeights) {
  const size_t n = 1003;
  for (bool fp16 : {false, true}) {
    std::vector<float> p = uniform(rng, n, -1, 1);
    for (size_t i = 0; i < n; i += 7) p[i] *= i % 2 ? 1e5f : 1e-6f;
    const std::vector<float> g = uniform(rng, n, -2, 2);
    const zero3d::math::AdamParams a = zero3d::math::adam_params(5e-2, 0.9, 0.95, 1e-3, 0.1, 2, true, true);
    auto plain = to_device(*be, p), fused = to_device(*be, p), dg = to_device(*be, g);
    DeviceBuffer<float> m1(*be, n), v1(*be, n), m2(*be, n), v2(*be, n);
    auto w16 = to_device(*be, std::vector<uint16_t>(n, 0xffff));
    be->adam_step(plain.data(), m1.data(), v1.data(), dg.data(), n, a, {});
    be->adam_step(fused.data(), m2.data(), v2.data(), dg.data(), n, a, {w16.data(), fp16});
    const std::string tag = fp16 ? " (fp16)" : " (bf16)";
    const std::vector<float> want = to_host(*be, plain);
    expect_bits_equal(to_host(*be, fused), want, ("adam p with weights out" + tag).c_str());
    expect_bits_equal(to_host(*be, m2), to_host(*be, m1), ("adam m with weights out" + tag).c_str());
    expect_bits_equal(to_host(*be, v2), to_host(*be, v1), ("adam v with weights out" + tag).c_str());
    const std::vector<uint16_t> got = to_host(*be, w16);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i) {
      const uint16_t r = fp16 ? zero3d::math::fp16_from_float(want[i]) : zero3d::math::bf16_from_float(want[i]);
      if (got[i] != r && ++wrong <= 5) ADD_FAILURE() << "w16[" << i << "] = " << got[i] << ", want " << r << tag;
    }
    EXPECT_EQ(wrong, 0u) << tag;
  }
}

// adam_steps: 101 runs of one state in one call (more than one CUDA launch's table; lengths from
// 0 to a few chunks, none a multiple of a vector; decay on some, 16-bit weights out on some) give
// the bits of adam_step run by run.
TEST_P(Kernels, AdamStepsOnManyRunsEqualsRunByRun) {
  std::vector<size_t> sizes;
  for (size_t r = 0; r < 101; ++r) sizes.push_back(r % 17 == 3 ? 0 : (r * 389) % 5003 + 1);
  size_t n = 0;
  for (size_t s : sizes) n += s;
  const std::vector<float> p = uniform(rng, n, -1, 1), g = uniform(rng, n, -2, 2);
  const zero3d::math::AdamParams a = zero3d::math::adam_params(5e-2, 0.9, 0.95, 1e-3, 0.0, 3, true, true);
  auto one = to_device(*be, p), all = to_device(*be, p), dg = to_device(*be, g);
  DeviceBuffer<float> m1(*be, n), v1(*be, n), m2(*be, n), v2(*be, n);
  auto w1 = to_device(*be, std::vector<uint16_t>(n, 0xffff)), w2 = to_device(*be, std::vector<uint16_t>(n, 0xffff));
  std::vector<zero3d::AdamRun> runs;
  size_t at = 0;
  for (size_t r = 0; r < sizes.size(); at += sizes[r++]) {
    zero3d::math::AdamParams ar = a;
    ar.weight_decay = r % 3 ? 0.1f : 0.0f;
    const bool out16 = r % 4 == 1;
    be->adam_step(one.data() + at, m1.data() + at, v1.data() + at, dg.data() + at, sizes[r], ar,
                  {out16 ? w1.data() + at : nullptr, false});
    runs.push_back({all.data() + at, m2.data() + at, v2.data() + at, dg.data() + at, sizes[r], ar.weight_decay,
                    out16 ? w2.data() + at : nullptr});
  }
  be->adam_steps(runs.data(), runs.size(), a, false);
  expect_bits_equal(to_host(*be, all), to_host(*be, one), "adam_steps p");
  expect_bits_equal(to_host(*be, m2), to_host(*be, m1), "adam_steps m");
  expect_bits_equal(to_host(*be, v2), to_host(*be, v1), "adam_steps v");
  EXPECT_EQ(to_host(*be, w2), to_host(*be, w1)) << "adam_steps 16-bit weights";
}

// One IEEE operation per element, correctly rounded on any backend: the results are exact.
TEST_P(Kernels, ScaleAccumulateAreExact) {
  const size_t n = 1001;
  const std::vector<float> a = uniform(rng, n, -10, 10), b = uniform(rng, n, -10, 10);
  std::vector<float> want_scale(n), want_acc(n);
  for (size_t i = 0; i < n; ++i) {
    want_scale[i] = static_cast<float>(static_cast<double>(a[i]) * -0.3f);
    want_acc[i] = static_cast<float>(static_cast<double>(b[i]) + a[i]);
  }
  auto da = to_device(*be, a), db = to_device(*be, b);
  be->accumulate(db.data(), da.data(), n);
  expect_bits_equal(to_host(*be, db), want_acc, "accumulate");
  expect_bits_equal(to_host(*be, da), a, "accumulate leaves its input alone");
  be->scale(da.data(), -0.3f, n);
  expect_bits_equal(to_host(*be, da), want_scale, "scale");
}

// ---------------------------------------------------------------------------------------------
// 16-bit casts
// ---------------------------------------------------------------------------------------------

float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// IEEE binary16 decoded by its definition.
double fp16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31)
    v = m ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  else
    v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return s ? -v : v;
}

// Round to nearest, ties to even, by picking the nearer of the two neighbouring representable
// magnitudes (`value(bits)` must be increasing in bits, and finite one step past the largest
// finite value, where IEEE places the overflow threshold). NaN is returned as `nan_bits`.
template <typename Value>
uint16_t round_nearest_even(float f, uint16_t inf_bits, uint16_t nan_bits, Value value) {
  if (std::isnan(f)) return nan_bits;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (std::isinf(f) || a >= value(inf_bits)) return sign | inf_bits;
  uint32_t lo = 0, hi = static_cast<uint32_t>(inf_bits);  // binary search: value(lo) <= a < value(hi)
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    (value(static_cast<uint16_t>(mid)) <= a ? lo : hi) = mid;
  }
  const double dlo = a - value(static_cast<uint16_t>(lo)), dhi = value(static_cast<uint16_t>(hi)) - a;
  const uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint16_t>(sign | pick);
}

uint16_t fp16_ref(float f) {
  // 0x7C00 taken as the next binade's first value, 65536, for the overflow tie at 65520
  return round_nearest_even(f, 0x7C00, 0x7E00, [](uint16_t h) {
    return h == 0x7C00 ? 65536.0 : fp16_value(h);
  });
}
uint16_t bf16_ref(float f) {
  return round_nearest_even(f, 0x7F80, 0x7FC0, [](uint16_t h) {
    const int e = (h >> 7) & 0xFF, m = h & 0x7F;  // e = 255 read as an unbounded exponent: 2^128
    return e == 0 ? std::ldexp(m, -133) : std::ldexp(128 + m, e - 134);
  });
}

bool fp16_is_nan(uint16_t h) { return (h & 0x7C00) == 0x7C00 && (h & 0x3FF); }
bool bf16_is_nan(uint16_t h) { return (h & 0x7F80) == 0x7F80 && (h & 0x7F); }

struct Casts {
  Backend& be;
  std::vector<uint16_t> to16(const std::vector<float>& x, bool fp16) {
    auto dx = to_device(be, x);
    auto h = to_device(be, std::vector<uint16_t>(x.size(), 0x7E7E));
    fp16 ? be.cast_to_fp16(h.data(), dx.data(), x.size()) : be.cast_to_bf16(h.data(), dx.data(), x.size());
    return to_host(be, h);
  }
  std::vector<float> from16(const std::vector<uint16_t>& x, bool fp16) {
    auto dx = to_device(be, x);
    auto f = to_device(be, std::vector<float>(x.size(), kNaN));
    fp16 ? be.cast_from_fp16(f.data(), dx.data(), x.size()) : be.cast_from_bf16(f.data(), dx.data(), x.size());
    return to_host(be, f);
  }
};

// acc = round16(widen(acc) + x), against the composition of the tested casts in double.
TEST_P(Kernels, Accumulate16MatchesWidenAddRound) {
  std::mt19937 gen(21);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  Casts cast{*be};
  for (bool fp16 : {false, true}) {
    std::vector<float> a(1000), x(1000);
    for (auto& v : a) v = nd(gen);
    for (auto& v : x) v = nd(gen);
    x[7] = 1e6f;  // fp16 overflow -> inf
    std::vector<uint16_t> a16 = cast.to16(a, fp16);
    std::vector<float> a_wide = cast.from16(a16, fp16), sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) sum[i] = a_wide[i] + x[i];  // the float sum the op rounds
    std::vector<uint16_t> want = cast.to16(sum, fp16);
    auto acc = to_device(*be, a16);
    auto dx = to_device(*be, x);
    fp16 ? be->accumulate_fp16(acc.data(), dx.data(), x.size()) : be->accumulate_bf16(acc.data(), dx.data(), x.size());
    EXPECT_EQ(to_host(*be, acc), want) << (fp16 ? "fp16" : "bf16");
    if (fp16) {
      EXPECT_EQ(to_host(*be, acc)[7], 0x7C00);
    }
  }
}

TEST_P(Kernels, CastKnownBitPatterns) {
  Casts cast{*be};
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float f;
    uint16_t bits;
  };
  const std::vector<Case> fp16 = {
      {1.0f, 0x3C00},           {-2.0f, 0xC000},         {65504.0f, 0x7BFF},       {65519.0f, 0x7BFF},
      {65520.0f, 0x7C00},       {-65520.0f, 0xFC00},     {1e10f, 0x7C00},          {inf, 0x7C00},
      {-inf, 0xFC00},           {0.0f, 0x0000},          {-0.0f, 0x8000},          {0x1p-24f, 0x0001},
      {0x1p-25f, 0x0000},       {0x1.000002p-25f, 0x0001}, {0x3p-25f, 0x0002},     {0x1p-14f, 0x0400},
      {0x3FFp-24f, 0x03FF},     {0x7FFp-25f, 0x0400},    {1e-10f, 0x0000},         {0x1.002p0f, 0x3C00},
      {0x1.006p0f, 0x3C02},     {0x1.0021p0f, 0x3C01},   {0.1f, 0x2E66},           {-0x1p-24f, 0x8001},
  };
  std::vector<float> in;
  for (const Case& c : fp16) in.push_back(c.f);
  in.push_back(nan);
  in.push_back(bits_to_float(0x7F800001u));  // signalling NaN: must not round to inf
  std::vector<uint16_t> got = cast.to16(in, true);
  for (size_t i = 0; i < fp16.size(); ++i)
    EXPECT_EQ(got[i], fp16[i].bits) << "fp16(" << fp16[i].f << ") = 0x" << std::hex << got[i];
  EXPECT_TRUE(fp16_is_nan(got[fp16.size()])) << std::hex << got[fp16.size()];
  EXPECT_TRUE(fp16_is_nan(got[fp16.size() + 1])) << std::hex << got[fp16.size() + 1];

  const std::vector<Case> bf16 = {
      {1.0f, 0x3F80},  {-1.0f, 0xBF80}, {0.0f, 0x0000},          {-0.0f, 0x8000},
      {inf, 0x7F80},   {-inf, 0xFF80},  {bits_to_float(0x3F808000u), 0x3F80},  // tie, even stays
      {bits_to_float(0x3F818000u), 0x3F82},                                     // tie, odd rounds up
      {bits_to_float(0x3F808001u), 0x3F81},  {bits_to_float(0x3F807FFFu), 0x3F80},
      {bits_to_float(0x7F7FFFFFu), 0x7F80},  // FLT_MAX rounds to inf
      {bits_to_float(0x00000001u), 0x0000},  {bits_to_float(0x00008000u), 0x0000},  // subnormal tie
      {bits_to_float(0x00018000u), 0x0002},
  };
  in.clear();
  for (const Case& c : bf16) in.push_back(c.f);
  in.push_back(nan);
  in.push_back(bits_to_float(0x7F800001u));  // +1 payload bit below the kept bits: naive rounding gives inf
  in.push_back(bits_to_float(0xFFFFFFFFu));  // all-ones NaN: naive rounding carries into the sign
  got = cast.to16(in, false);
  for (size_t i = 0; i < bf16.size(); ++i)
    EXPECT_EQ(got[i], bf16[i].bits) << "bf16(" << bf16[i].f << ") = 0x" << std::hex << got[i];
  for (size_t i = bf16.size(); i < in.size(); ++i) EXPECT_TRUE(bf16_is_nan(got[i])) << std::hex << got[i];

  const std::vector<float> back = cast.from16({0x3C00, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0xFC00}, true);
  EXPECT_EQ(back[0], 1.0f);
  EXPECT_EQ(back[1], 65504.0f);
  EXPECT_EQ(back[2], 0x1p-24f);
  EXPECT_TRUE(back[3] == 0.0f && std::signbit(back[3]));
  EXPECT_EQ(back[4], inf);
  EXPECT_EQ(back[5], -inf);
  EXPECT_EQ(cast.from16({0x3F80}, false)[0], 1.0f);
}

// Every 16-bit pattern decodes to its IEEE value and survives float -> 16 bit unchanged.
TEST_P(Kernels, CastExhaustiveRoundTrip) {
  Casts cast{*be};
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);

  for (bool fp16 : {true, false}) {
    const char* name = fp16 ? "fp16" : "bf16";
    const std::vector<float> f = cast.from16(all, fp16);
    const std::vector<uint16_t> back = cast.to16(f, fp16);
    int misses = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      const uint16_t h = all[i];
      const bool is_nan = fp16 ? fp16_is_nan(h) : bf16_is_nan(h);
      const double want = fp16 ? fp16_value(h) : static_cast<double>(bits_to_float(uint32_t{h} << 16));
      bool ok;
      if (is_nan)
        ok = std::isnan(f[i]) && (fp16 ? fp16_is_nan(back[i]) : bf16_is_nan(back[i]));
      else
        ok = static_cast<double>(f[i]) == want && std::signbit(f[i]) == static_cast<bool>(h & 0x8000) &&
             back[i] == h;
      if (!ok && ++misses <= 8)
        ADD_FAILURE() << name << " 0x" << std::hex << h << " -> " << f[i] << " -> 0x" << back[i];
    }
    EXPECT_EQ(misses, 0) << name;
  }
}

// float -> 16 bit against the nearest-neighbour reference: every tie between adjacent values (and
// one float ulp either side of it) and random floats across the range, both signs.
TEST_P(Kernels, CastRoundsToNearestEven) {
  Casts cast{*be};
  for (bool fp16 : {true, false}) {
    std::vector<float> in;
    auto value = [&](uint16_t h) { return fp16 ? static_cast<float>(fp16_value(h)) : bits_to_float(uint32_t{h} << 16); };
    const uint16_t last = fp16 ? 0x7BFF : 0x7F7F;
    for (uint32_t h = 0; h < last; h += fp16 ? 1 : 37) {
      const float mid = static_cast<float>((static_cast<double>(value(static_cast<uint16_t>(h))) +
                                            value(static_cast<uint16_t>(h + 1))) / 2);
      for (float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        in.push_back(x);
        in.push_back(-x);
      }
    }
    std::uniform_int_distribution<uint32_t> bits(float_to_bits(0x1p-30f), float_to_bits(fp16 ? 0x1p17f : 0x1p127f));
    for (int i = 0; i < 100000; ++i) in.push_back(bits_to_float(bits(rng) | (i % 2 ? 0x80000000u : 0u)));

    const std::vector<uint16_t> got = cast.to16(in, fp16);
    int misses = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      const uint16_t want = fp16 ? fp16_ref(in[i]) : bf16_ref(in[i]);
      if (got[i] != want && ++misses <= 8)
        ADD_FAILURE() << (fp16 ? "fp16(" : "bf16(") << std::hexfloat << in[i] << ") = 0x" << std::hex << got[i]
                      << ", want 0x" << want;
    }
    EXPECT_EQ(misses, 0) << (fp16 ? "fp16" : "bf16") << " of " << in.size();
  }
}

// ---------------------------------------------------------------------------------------------
// reductions
// ---------------------------------------------------------------------------------------------

TEST_P(Kernels, Reductions) {
  const size_t n = 100003;
  std::vector<float> x = uniform(rng, n, -1, 3);
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  auto dx = to_device(*be, x);
  EXPECT_NEAR(be->sum_squares(dx.data(), n), ss, 1e-6 * ss);
  EXPECT_EQ(be->sum_squares(dx.data(), 0), 0.0);

  // The overflow check is a non-finite gradient norm (zero/grad_finish.cpp), so sum_squares must stay
  // finite on finite extremes (squares in double) and turn non-finite on +-inf or a NaN of
  // either sign anywhere, the last element included.
  x[3] = std::numeric_limits<float>::max();
  x[4] = std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(std::isfinite(be->sum_squares(to_device(*be, x).data(), n)));
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<size_t, float>> poisons = {
      {10, inf}, {500, -inf}, {7777, kNaN}, {n - 1, bits_to_float(0xFFC00001u)}};  // the last: a negative NaN
  for (auto [i, v] : poisons) {
    std::vector<float> y = x;
    y[i] = v;
    auto dy = to_device(*be, y);
    EXPECT_FALSE(std::isfinite(be->sum_squares(dy.data(), n))) << "x[" << i << "] = " << v;
    EXPECT_TRUE(std::isfinite(be->sum_squares(dy.data(), i))) << "the prefix before x[" << i << "]";
  }
}

// ---------------------------------------------------------------------------------------------
// host only: the vector exp, thread-count independence, bf16 GEMM
// ---------------------------------------------------------------------------------------------

// simd::vexp at every level this CPU runs (cpu::Kernels::exp): within 2 ulp of exp over its range
// (every 997th float from -87 to 88), exactly 0 below it and for -inf, finite (saturated) above,
// NaN for NaN.
TEST(HostKernels, VectorExpIsAccurate) {
  std::vector<float> x = {0.0f, -100.0f, -std::numeric_limits<float>::infinity(), 1000.0f, kNaN};
  for (uint32_t u = 0; u < 0xffffffffu - 997; u += 997) {
    const float v = bits_to_float(u);
    if (v >= -87.0f && v <= 88.0f) x.push_back(v);
  }
  std::vector<float> y(x.size());
  for (const zero3d::cpu::Kernels* k : zero3d::cpu::runnable()) {
    SCOPED_TRACE(k->isa);
    k->exp(y.data(), x.data(), x.size());
    int worst = 0;
    for (size_t i = 5; i < x.size(); ++i) {
      const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
      worst = std::max(worst, std::abs(static_cast<int>(float_to_bits(y[i])) - static_cast<int>(float_to_bits(want))));
    }
    EXPECT_LE(worst, 2) << "worst error in ulp";
    EXPECT_EQ(y[0], 1.0f);
    EXPECT_EQ(y[1], 0.0f);
    EXPECT_EQ(y[2], 0.0f);
    EXPECT_TRUE(std::isfinite(y[3]));
    EXPECT_TRUE(std::isnan(y[4]));
  }
}

// The fused attention reads no workspace memory it did not write first: the same bits whether its
// workspace (a share for each thread) held zeros or NaN, at every level, for T below, at and across
// the 64-row tile (GQA too), heads of whole vectors (16) and not (18: a vector's tail at every level).
TEST(HostKernels, AttentionIgnoresItsWorkspaceContents) {
  std::mt19937 rng(5);
  const int B = 2, H = 4;
  for (int A : {64, 72}) {
    for (int T : {7, 64, 70}) {
      for (int Hkv : {4, 2}) {
        const int ld = A + 2 * (A / H) * Hkv;
        const std::vector<float> qkv = uniform(rng, static_cast<size_t>(B) * T * ld, -2, 2),
                                 dout = uniform(rng, static_cast<size_t>(B) * T * A, -1, 1);
        for (const zero3d::cpu::Kernels* k : zero3d::cpu::runnable()) {
          SCOPED_TRACE(std::string(k->isa) + " A " + std::to_string(A) + " T " + std::to_string(T) + " Hkv " +
                       std::to_string(Hkv));
          auto run = [&](float fill) {
            std::vector<float> work(zero3d::cpu::attention_work_floats(T, A / H) * zero3d::cpu::threads(), fill), out(dout.size()),
                lse(static_cast<size_t>(B) * H * T), dqkv(qkv.size());
            k->attention_forward(out.data(), lse.data(), qkv.data(), B, T, H, Hkv, A, work.data());
            std::fill(work.begin(), work.end(), fill);
            k->attention_backward(dqkv.data(), dout.data(), out.data(), lse.data(), qkv.data(), B, T, H, Hkv, A, work.data());
            return std::vector<std::vector<float>>{out, lse, dqkv};
          };
          const auto zeros = run(0.0f), nans = run(kNaN);
          for (size_t i = 0; i < zeros.size(); ++i) expect_bits_equal(nans[i], zeros[i], ("output " + std::to_string(i)).c_str());
        }
      }
    }
  }
}

// The host loops give the same bits with 1 and 2 threads: threads split rows and column blocks,
// never the terms of one sum.
TEST(HostKernels, ThreadCountDoesNotChangeBits) {
  std::mt19937 rng(7);
  const int B = 3, T = 70, H = 2, A = 32, N = B * T, C = 96;
  const std::vector<float> qkv = uniform(rng, static_cast<size_t>(N) * 3 * A, -2, 2),
                           dout = uniform(rng, static_cast<size_t>(N) * A, -1, 1),
                           x = uniform(rng, static_cast<size_t>(N) * C, -3, 3),
                           big = uniform(rng, size_t{1} << 20, -1, 1),
                           qkv_gqa = uniform(rng, static_cast<size_t>(N) * 2 * A, -2, 2);  // H = 4, Hkv = 2
  // (the GQA forward runs a task per key/value head at 1 thread, B Hkv >= 4 threads, and a task per
  // query head at 2)
  const std::vector<int32_t> tokens = random_ints(rng, N, 50);
  auto run = [&](int threads) {
    zero3d::cpu::set_threads(threads);
    auto be = zero3d::make_host_backend();
    std::vector<std::vector<float>> r;
    for (const AttentionRun& a : {run_attention(*be, qkv, dout, B, T, H, H, A), run_attention(*be, qkv_gqa, dout, B, T, 4, 2, A)})
      r.push_back(a.out), r.push_back(a.lse), r.push_back(a.dqkv);
    auto dx = to_device(*be, x), w = to_device(*be, std::vector<float>(C, 1.5f)), b = to_device(*be, std::vector<float>(C, 0.25f));
    DeviceBuffer<float> y(*be, x.size()), mean(*be, N), rstd(*be, N), g(*be, x.size()), dw(*be, C), db(*be, C);
    be->layernorm_forward(y.data(), mean.data(), rstd.data(), dx.data(), w.data(), b.data(), N, C);
    be->layernorm_backward(g.data(), dw.data(), db.data(), dx.data(), dx.data(), w.data(), mean.data(), rstd.data(), N, C);
    be->gelu_forward(g.data(), dx.data(), x.size());
    be->gelu_backward(y.data(), db.data(), dx.data(), g.data(), y.data(), N, C);
    be->rmsnorm_forward(y.data(), rstd.data(), dx.data(), w.data(), N, C, 1e-6f);
    be->rmsnorm_backward(g.data(), dw.data(), y.data(), dx.data(), w.data(), rstd.data(), N, C);
    auto tok = to_device(*be, tokens);
    DeviceBuffer<float> dwte(*be, 50 * C), dwpe(*be, static_cast<size_t>(T) * C);
    be->embedding_backward(dwte.data(), dwpe.data(), dx.data(), tok.data(), N, T, C, 0, 50);
    for (auto* buf : {&y, &g, &dw, &db, &dwte, &dwpe}) r.push_back(to_host(*be, *buf));
    auto dbig = to_device(*be, big);
    const double ss = be->sum_squares(dbig.data(), big.size());
    r.push_back({static_cast<float>(ss), static_cast<float>(ss - static_cast<float>(ss))});
    return r;
  };
  const auto one = run(1), two = run(2);
  zero3d::cpu::set_threads(1);
  ASSERT_EQ(one.size(), two.size());
  for (size_t i = 0; i < one.size(); ++i) expect_bits_equal(two[i], one[i], ("output " + std::to_string(i)).c_str());
}

// compute.gemm=auto moves the weight gradients to an OpenBLAS whose kernels match the level only
// when a rank runs one thread: OpenBLAS's own threads contended with oneDNN's (1.3-8x slower steps).
TEST(HostKernels, AutoGemmPlanIsOneDnnWithThreads) {
  const int before = zero3d::cpu::threads();
  zero3d::cpu::set_threads(1);
  const zero3d::GemmPlan one = zero3d::make_gemm_plan("auto", false);
  zero3d::cpu::set_threads(2);
  const zero3d::GemmPlan two = zero3d::make_gemm_plan("auto", false);
  zero3d::cpu::set_threads(before);
  for (auto role : {zero3d::GemmRole::forward, zero3d::GemmRole::input_grad, zero3d::GemmRole::weight_grad})
    EXPECT_EQ(two.for_role(role), zero3d::GemmLibrary::onednn) << two.why;
  if (one.weight_grad != zero3d::GemmLibrary::cblas)
    GTEST_SKIP() << "this CPU's OpenBLAS does not match the level: auto is oneDNN at any thread count (" << one.why << ")";
  EXPECT_NE(two.why.find("2 threads"), std::string::npos) << two.why;
}

// v (times sign) rounded to bf16: a weight's copy as a bf16 run keeps it.
std::vector<uint16_t> bf16_of(const std::vector<float>& v, float sign) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = zero3d::math::bf16_from_float(sign * v[i]);
  return h;
}
std::vector<float> negated(std::vector<float> v) {
  for (float& f : v) f = -f;
  return v;
}

// bf16 compute: A and B rounded to bf16, products accumulated in fp32: against the double
// reference on the rounded inputs, within fp32 accumulation error; the bias and residual in fp32.
// A B that comes with its bf16 copy (GemmWeight) is multiplied as that copy: the bits of rounding
// B, and a copy of -B gives the product with -B.
void check_bf16_gemm(const std::unique_ptr<Backend>& be) {
  std::mt19937 rng(11);
  auto round16 = [](std::vector<float> v) {
    for (float& f : v) f = bits_to_float(static_cast<uint32_t>(zero3d::math::bf16_from_float(f)) << 16);
    return v;
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const int m = 33, n = 47, k = 70;
      long sA = 0, sB = 0;
      Operand A = make_operand(rng, ta, m, k, 2, 1, &sA), B = make_operand(rng, tb, k, n, 3, 1, &sB);
      std::vector<float> C = uniform(rng, static_cast<size_t>(m) * n, -1, 1);
      auto dA = to_device(*be, A.data), dB = to_device(*be, B.data), dC = to_device(*be, C);
      be->gemm(ta, tb, m, n, k, 0.5f, dA.data(), A.ld, dB.data(), B.ld, 1.0f, dC.data(), n);
      const std::vector<float> ra = round16(A.data), rb = round16(B.data);
      std::vector<double> want(C.size()), mag(C.size());
      ref_gemm(ta, tb, m, n, k, 0.5, ra.data(), A.ld, rb.data(), B.ld, 1.0, C.data(), n, want.data(), mag.data());
      const std::vector<float> got = to_host(*be, dC);
      int misses = 0;
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 1e-5 * mag[i] + 1e-7) && ++misses <= 8)
          ADD_FAILURE() << "ta=" << ta << " tb=" << tb << " C[" << i << "] = " << got[i] << ", want " << want[i];
      EXPECT_EQ(misses, 0) << "ta=" << ta << " tb=" << tb;
      auto dBneg = to_device(*be, negated(B.data));
      auto dB16 = to_device(*be, bf16_of(B.data, 1.0f)), dB16neg = to_device(*be, bf16_of(B.data, -1.0f));
      auto product = [&](GemmWeight w) {
        auto dC1 = to_device(*be, C);
        be->gemm(ta, tb, m, n, k, 0.5f, dA.data(), A.ld, w, B.ld, 1.0f, dC1.data(), n);
        return to_host(*be, dC1);
      };
      const std::string tag = " (ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) + ")";
      expect_bits_equal(product({dB.data(), dB16.data()}), got, ("gemm, bf16 copy" + tag).c_str());
      expect_bits_equal(product({dB.data(), dB16neg.data()}), product(dBneg.data()),
                        ("gemm, the copy is what is multiplied" + tag).c_str());
    }
  const int N = 9, in = 40, out = 17;
  const std::vector<float> x = uniform(rng, N * in, -1, 1), w = uniform(rng, out * in, -1, 1),
                           bias = uniform(rng, out, -1, 1), res = uniform(rng, N * out, -1, 1);
  auto dx = to_device(*be, x), dw = to_device(*be, w), db = to_device(*be, bias), dr = to_device(*be, res);
  auto dy = to_device(*be, std::vector<float>(static_cast<size_t>(N) * out, kNaN));
  be->linear_forward(dy.data(), dx.data(), dw.data(), db.data(), dr.data(), N, in, out);
  const std::vector<float> rx = round16(x), rw = round16(w);
  std::vector<double> want(static_cast<size_t>(N) * out), mag(want.size());
  ref_gemm(false, true, N, out, in, 1.0, rx.data(), in, rw.data(), in, 0.0, nullptr, out, want.data(), mag.data());
  const std::vector<float> got = to_host(*be, dy);
  for (size_t i = 0; i < got.size(); ++i) {
    const double wi = want[i] + bias[i % out] + res[i];
    EXPECT_NEAR(got[i], wi, 1e-5 * (mag[i] + 2) + 1e-7) << "y[" << i << "]";
  }
}

// A linear layer's weight that comes with its bf16 copy (GemmWeight: a bf16 run's kept weights) is
// multiplied as that copy, in linear_forward and linear_gelu_forward (gemm: check_bf16_gemm). A
// copy of -W gives the product with -W, so a backend that rounded f32 again instead would fail.
void check_bf16_weight_copy(const std::unique_ptr<Backend>& be) {
  std::mt19937 rng(12);
  const int N = 9, in = 40, out = 24;
  const std::vector<float> x = uniform(rng, N * in, -1, 1), w = uniform(rng, out * in, -1, 1),
                           bias = uniform(rng, out, -1, 1), res = uniform(rng, N * out, -1, 1);
  auto dx = to_device(*be, x), dw = to_device(*be, w), dwneg = to_device(*be, negated(w)), db = to_device(*be, bias),
       dr = to_device(*be, res);
  auto dw16 = to_device(*be, bf16_of(w, 1.0f)), dw16neg = to_device(*be, bf16_of(w, -1.0f));
  auto linear = [&](GemmWeight wt) {
    auto dy = to_device(*be, std::vector<float>(static_cast<size_t>(N) * out, kNaN));
    be->linear_forward(dy.data(), dx.data(), wt, db.data(), dr.data(), N, in, out);
    return to_host(*be, dy);
  };
  auto linear_gelu = [&](GemmWeight wt) {
    auto dout = to_device(*be, std::vector<float>(static_cast<size_t>(N) * out, kNaN));
    auto dpre = to_device(*be, std::vector<float>(static_cast<size_t>(N) * out, kNaN));
    be->linear_gelu_forward(dout.data(), dpre.data(), dx.data(), wt, db.data(), N, in, out);
    std::vector<float> both = to_host(*be, dpre), o = to_host(*be, dout);
    both.insert(both.end(), o.begin(), o.end());
    return both;
  };
  expect_bits_equal(linear({dw.data(), dw16.data()}), linear(dw.data()), "linear_forward, bf16 copy");
  expect_bits_equal(linear({dw.data(), dw16neg.data()}), linear(dwneg.data()), "linear_forward, the copy");
  expect_bits_equal(linear_gelu({dw.data(), dw16.data()}), linear_gelu(dw.data()), "linear_gelu_forward, bf16 copy");
  expect_bits_equal(linear_gelu({dw.data(), dw16neg.data()}), linear_gelu(dwneg.data()),
                    "linear_gelu_forward, the copy");
}

TEST(HostKernels, Bf16GemmRoundsInputsAndAccumulatesInFp32) {
  if (!zero3d::onednn_has_bf16()) GTEST_SKIP() << "oneDNN has no native bf16 GEMM on this CPU";
  zero3d::HostOptions o;
  o.bf16_gemm = true;
  check_bf16_gemm(zero3d::make_host_backend(o));
}

TEST(HostKernels, Bf16GemmTakesTheWeightsBf16Copy) {
  if (!zero3d::onednn_has_bf16()) GTEST_SKIP() << "oneDNN has no native bf16 GEMM on this CPU";
  zero3d::HostOptions o;
  o.bf16_gemm = true;
  check_bf16_weight_copy(zero3d::make_host_backend(o));
}

// ---------------------------------------------------------------------------------------------
// bf16 activations: every op on bf16 views is the same op on fp32 views of the widened values,
// its outputs rounded once (kernels/tensor.h). Inputs are bf16-representable, so both runs read
// the same numbers. The host stages bf16 through its fp32 loops, and Kokkos runs the same fp32 math
// on widened values (templated loads, or staged rows): the bits must be equal. A GPU runs its own
// bf16 kernels (and cuBLASLt's bf16 epilogues): one bf16 ulp apart at most.
// ---------------------------------------------------------------------------------------------

namespace {
// One operand in fp32 storage and in bf16 storage, holding the same bf16-representable values.
struct Twin {
  std::vector<float> host;
  DeviceBuffer<float> f32;
  DeviceBuffer<uint16_t> b16;
  zero3d::View view(bool bf16) {
    return bf16 ? zero3d::View(b16.data(), host.size()) : zero3d::View(f32.data(), host.size());
  }
};
Twin twin(Backend& be, std::vector<float> x) {
  std::vector<uint16_t> bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = zero3d::math::float_from_bf16(bits[i] = zero3d::math::bf16_from_float(x[i]));
  Twin t{x, to_device(be, x), to_device(be, bits)};
  return t;
}
// t.f32 holds the fp32 op's output, t.b16 the bf16 op's: the latter must be the former rounded.
void expect_rounded_once(Backend& be, const Twin& t, bool exact, const std::string& what) {
  const std::vector<float> f = to_host(be, t.f32);
  const std::vector<uint16_t> h = to_host(be, t.b16);
  int bad = 0;
  for (size_t i = 0; i < f.size() && bad < 5; ++i) {
    const uint16_t want = zero3d::math::bf16_from_float(f[i]);
    const float got = zero3d::math::float_from_bf16(h[i]), w = zero3d::math::float_from_bf16(want);
    const bool ok = exact ? h[i] == want : std::fabs(got - w) <= std::ldexp(std::fabs(w), -7) + 1e-30f;
    if (!ok) ++bad, ADD_FAILURE() << what << "[" << i << "]: bf16 " << got << ", fp32 rounded " << w;
  }
}
}  // namespace

TEST_P(Kernels, Bf16ViewsAreFp32MathRoundedOnce) {
  const bool exact = be->kind() == zero3d::BackendKind::host || be->kind() == zero3d::BackendKind::kokkos;
  const int B = 2, T = 5, C = 16, H = 2, Hkv = 1, hd = C / H, QKV = C + 2 * Hkv * hd, F = 12, V = 11;
  const int N = B * T;
  auto u = [&](size_t n, float r = 1.0f) { return uniform(rng, n, -r, r); };
  auto x = twin(*be, u(N * C)), y = twin(*be, u(N * C)), dy = twin(*be, u(N * C)), qkv = twin(*be, u(N * QKV));
  auto h2 = twin(*be, u(2 * N * F, 2.0f)), dF = twin(*be, u(N * F));
  const auto w = to_device(*be, u(C, 2.0f)), b = to_device(*be, u(C)), bF = to_device(*be, u(F));
  const auto W = to_device(*be, u(F * C, 0.5f)), wte = to_device(*be, u(V * C)), wpe = to_device(*be, u(T * C));
  std::vector<int32_t> tok(N);
  for (int n = 0; n < N; ++n) tok[n] = (n * 7) % V;
  const auto tokens = to_device(*be, tok);
  auto stats = [&](size_t n) { return DeviceBuffer<float>(*be, n); };
  auto cs = to_device(*be, zero3d::math::rope_table(T, hd, 10000.0f));

  // Runs `op` on fp32 views, then on bf16 views, of fresh copies of the outputs' start values.
  auto check = [&](const std::string& what, std::vector<Twin*> outs, const std::function<void(bool)>& op) {
    for (Twin* o : outs) *o = twin(*be, o->host);
    op(false);
    op(true);
    for (Twin* o : outs) expect_rounded_once(*be, *o, exact, what);
  };
  // An output read by a later op: both storages given the fp32 run's values, rounded.
  auto settle = [&](Twin& t) { t = twin(*be, to_host(*be, t.f32)); };
  auto out = twin(*be, std::vector<float>(N * C)), outF = twin(*be, std::vector<float>(N * F)),
       preF = twin(*be, std::vector<float>(N * F)), dh2 = twin(*be, std::vector<float>(2 * N * F)),
       dqkv = twin(*be, std::vector<float>(N * QKV)), att = twin(*be, std::vector<float>(N * C));
  auto m = stats(N), r = stats(N), lse = stats(B * H * T), dw = stats(C), db = stats(C);
  check("layernorm_forward", {&out}, [&](bool h) { be->layernorm_forward(out.view(h), m.data(), r.data(), x.view(h), w.data(), b.data(), N, C); });
  out.host = u(N * C);  // backward accumulates into what is there
  check("layernorm_backward", {&out}, [&](bool h) { be->layernorm_backward(out.view(h), dw.data(), db.data(), dy.view(h), x.view(h), w.data(), m.data(), r.data(), N, C); });
  check("rmsnorm_forward", {&out}, [&](bool h) { be->rmsnorm_forward(out.view(h), r.data(), x.view(h), w.data(), N, C, 1e-5f); });
  check("rmsnorm_backward", {&out}, [&](bool h) { be->rmsnorm_backward(out.view(h), dw.data(), dy.view(h), x.view(h), w.data(), r.data(), N, C); });
  check("gelu_forward", {&out}, [&](bool h) { be->gelu_forward(out.view(h), x.view(h), N * C); });
  settle(out);
  check("gelu_backward in place", {&y}, [&](bool h) { be->gelu_backward(y.view(h), db.data(), x.view(h), out.view(h), y.view(h), N, C); });
  check("swiglu_forward", {&outF}, [&](bool h) { be->swiglu_forward(outF.view(h), h2.view(h), N, F); });
  check("swiglu_backward", {&dh2}, [&](bool h) { be->swiglu_backward(dh2.view(h), h2.view(h), dF.view(h), N, F); });
  check("rope, strided, in place", {&qkv}, [&](bool h) { be->rope(qkv.view(h), cs.data(), N, T, H + Hkv, hd, QKV, false); });
  settle(qkv);
  check("attention_forward", {&att}, [&](bool h) { be->attention_forward(att.view(h), lse.data(), qkv.view(h), B, T, H, Hkv, C); });
  settle(att);
  check("attention_backward", {&dqkv}, [&](bool h) { be->attention_backward(dqkv.view(h), dy.view(h), att.view(h), lse.data(), qkv.view(h), B, T, H, Hkv, C); });
  check("embedding_forward", {&out}, [&](bool h) { be->embedding_forward(out.view(h), tokens.data(), wte.data(), wpe.data(), N, T, C, 0, V); });
  check("linear_forward, bias and residual", {&outF}, [&](bool h) { be->linear_forward(outF.view(h), x.view(h), W.data(), bF.data(), dF.view(h), N, C, F); });
  check("linear_gelu_forward", {&outF, &preF}, [&](bool h) { be->linear_gelu_forward(outF.view(h), preF.view(h), x.view(h), W.data(), bF.data(), N, C, F); });
  auto logits = twin(*be, u(N * (V + 5), 4.0f));  // rows of V + 5: the padding's gradient is 0
  auto ce = stats(N);
  check("crossentropy in place, padded rows", {&logits}, [&](bool h) { be->crossentropy(ce.data(), logits.view(h), logits.view(h), tokens.data(), N, V, V + 5, 0.5f); });
  check("vocab_crossentropy_grad in place, padded rows", {&logits}, [&](bool h) {
    be->vocab_row_max(m.data(), logits.view(h), N, V, V + 5);
    be->vocab_sumexp(r.data(), lse.data(), logits.view(h), m.data(), tokens.data(), 0, N, V, V + 5);
    be->vocab_crossentropy_grad(logits.view(h), logits.view(h), m.data(), r.data(), tokens.data(), 0, N, V, V + 5, 0.5f);
  });
  out.host = u(N * C);
  check("gemm, bf16 A and C, beta 1", {&out}, [&](bool h) { be->gemm(false, false, N, C, F, 1.0f, dF.view(h), F, W.data(), C, 1.0f, out.view(h), C); });
  // Reductions over bf16 views into fp32: the same as over the widened values (close on a GPU).
  std::vector<float> ref[3];
  for (const bool h : {false, true}) {
    auto g = stats(F * C), gb = stats(C), ge = stats(V * C);
    be->gemm(true, false, F, C, N, 1.0f, dF.view(h), F, GemmWeight(zero3d::ConstView(x.view(h))), C, 1.0f, g.data(), C);
    be->bias_backward(gb.data(), dy.view(h), N, C);
    be->embedding_backward(ge.data(), nullptr, dy.view(h), tokens.data(), N, T, C, 0, V);
    const std::vector<float> got[3] = {to_host(*be, g), to_host(*be, gb), to_host(*be, ge)};
    for (int k = 0; k < 3; ++k) {
      if (!h) ref[k] = got[k];
      else
        for (size_t i = 0; i < got[k].size(); ++i)
          ASSERT_NEAR(got[k][i], ref[k][i], exact ? 0.0f : 1e-5f * (1 + std::fabs(ref[k][i]))) << "fp32 output " << k << "[" << i << "]";
    }
  }
}

// The CUDA backend's attention in a bf16 run: cuDNN's fused flash attention (kernels/cuda/
// cudnn_attention.h) on the bf16-rounded operands, against the double reference of those same
// operands within bf16's rounding of P and of the outputs; multi-head and grouped-query, a sequence
// that is no multiple of the tiles, head widths 64 and 128. The backward run twice gives the same
// bits. ZERO3D_EXPECT_CUDNN=1 (the GPU check) fails when cuDNN is not what ran.
TEST(CudnnAttention, cuda) {
#if defined(ZERO3D_HAVE_CUDA)
  if (zero3d::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto be = zero3d::make_cuda_backend(0, /*bf16_gemm=*/true);
  const std::string what = be->describe();
  if (what.find("cuDNN") == std::string::npos) {
    const char* e = std::getenv("ZERO3D_EXPECT_CUDNN");
    if (e && std::string(e) == "1") FAIL() << "cuDNN attention expected, the backend runs: " << what;
    GTEST_SKIP() << what;
  }
  std::mt19937 rng(7);
  for (auto [B, T, H, Hkv, hd] : {std::tuple{2, 128, 4, 4, 64}, std::tuple{2, 128, 4, 2, 64},
                                  std::tuple{1, 70, 2, 1, 64}, std::tuple{1, 256, 2, 2, 128}}) {
    const RefAttention ref{B, T, H, Hkv, H * hd};
    std::vector<float> qkv = uniform(rng, static_cast<size_t>(B) * T * ref.ld(), -2, 2);
    std::vector<float> r = uniform(rng, static_cast<size_t>(B) * T * ref.A, -1, 1);
    for (float& x : qkv) x = zero3d::math::float_from_bf16(zero3d::math::bf16_from_float(x));  // exact in bf16
    for (float& x : r) x = zero3d::math::float_from_bf16(zero3d::math::bf16_from_float(x));
    Vec out, lse;
    ref.forward(to_double(qkv), out, lse);
    const AttentionRun got = run_attention(*be, qkv, r, B, T, H, Hkv, ref.A);
    const std::string tag = " (T=" + std::to_string(T) + " hd=" + std::to_string(hd) + " H=" + std::to_string(H) +
                            " Hkv=" + std::to_string(Hkv) + ")";
    expect_close(got.out, out, 2e-2, 2e-2, ("cuDNN attention out" + tag).c_str());
    expect_close(got.lse, lse, 1e-3, 1e-3, ("cuDNN attention lse" + tag).c_str());
    expect_close(got.dqkv, ref.backward(to_double(qkv), to_double(r)), 5e-2, 5e-2, ("cuDNN dqkv" + tag).c_str());
    expect_bits_equal(run_attention(*be, qkv, r, B, T, H, Hkv, ref.A).dqkv, got.dqkv,
                      ("cuDNN dqkv run twice" + tag).c_str());
  }
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

// The CUDA backend's bf16 GEMMs (inputs rounded by its own kernel, then the tensor cores with fp32
// accumulation) and its cuBLASLt linear layer (bias and residual in the epilogue) against the same bound.
TEST(Bf16GemmRoundsInputsAndAccumulatesInFp32, cuda) {
#if defined(ZERO3D_HAVE_CUDA)
  if (zero3d::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  check_bf16_gemm(zero3d::make_cuda_backend(0, /*bf16_gemm=*/true));
  check_bf16_weight_copy(zero3d::make_cuda_backend(0, /*bf16_gemm=*/true));
#else
  GTEST_SKIP() << "built without CUDA";
#endif
}

}  // namespace
