// The all-pole recursion of retrax's recurrence core as an XLA FFI kernel for
// the CPU, for a batch of signals advanced together.
//
// Forward (`adjoint = false`), for every signal b:
//   y[t] = u[t] - sum_k a[t, k] y[t-k-1],   y[-k-1] = zi[k],   t = 0 .. T-1.
// Adjoint (`adjoint = true`), the transposed recursion run backwards in time
// with time-shifted coefficients (zero past the end for time-varying `a`):
//   w[s] = u[s] - sum_k a[s+k+1, k] w[s+k+1],   w[T+k] = zi[k],   s = T-1 .. 0.
// With constant coefficients `a[t, k] = a[k]` in both.
//
// The operands arrive in one of two layouts, as the attribute `batch_major`
// says. Batch-major (the user's `(B, T)`, which the lowering hands over for a
// batch, since XLA's transposes of it cost more than the filter): sample t
// of signal b at `b * T + t`, per-sample coefficients at
// `(b * T + t) * K + k`, constant coefficients and states at `b * K + k`.
// Time-major (in the lowering, a single signal, whose layouts coincide, or
// with the attribute `time_major` the channels of a time-first array, with
// constant coefficients): sample t of signal b at `t * B + b`, per-sample
// coefficients at `(t * K + k) * B + b`, constant coefficients and states at
// `k * B + b`.
// The recursion of one signal is a chain of dependent multiply-adds; the
// loop advances a group of W signals per step, so the W chains share SIMD
// registers and the step costs about what one signal's does. On x86 CPUs
// with AVX2, a batch-major batch of order 1 to 4 takes the tiled path below
// (register tiles transposed in place); one of order 5 to 8 runs signal by
// signal with its lags in registers; a float32 one of order 9 to 64 with
// per-sample coefficients the rows path, forward and adjoint (each signal's
// coefficients of a sample as registers); other batches and orders, and
// other CPUs, the blocked and grouped loops.

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "cpu.h"
#include "pages.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// complex64 and complex128 as XLA stores them (real, then imaginary part),
// with the products written out: std::complex's operator* checks for NaNs
// and infinities (Annex G) on every product, which would dominate the loop.
// The recursion and its adjoint are complex-linear (the transposed
// recursion does not conjugate, as JAX's transposes do not).
template <typename R>
struct Complex {
  R re, im;
  Complex() = default;
  constexpr Complex(R r, R i = R(0)) : re(r), im(i) {}
  Complex& operator-=(const Complex& o) {
    re -= o.re;
    im -= o.im;
    return *this;
  }
  Complex operator-() const { return {-re, -im}; }
  friend Complex operator*(const Complex& a, const Complex& b) {
    return {a.re * b.re - a.im * b.im, a.re * b.im + a.im * b.re};
  }
};

// One group of W signals starting at lane `first` of a batch of `batch`
// stored time-major (K > 0: the order at compile time; K == 0: `order` at
// run time).
template <typename T, int K, int W, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Group(
    const T* __restrict__ a, const T* __restrict__ u, const T* __restrict__ zi,
    T* __restrict__ y, int64_t length, int64_t batch, int64_t first,
    int64_t order_) {
  const int64_t order = K > 0 ? K : order_;
  constexpr int kStack = K > 0 ? K : 1;
  T stack_state[kStack][W];
  T stack_coeff[kStack][W];
  std::vector<T> heap_state, heap_coeff;
  T(*state)[W] = stack_state;
  T(*coeff)[W] = stack_coeff;
  if (K == 0) {
    heap_state.resize(order * W);
    heap_coeff.resize(order * W);
    state = reinterpret_cast<T(*)[W]>(heap_state.data());
    coeff = reinterpret_cast<T(*)[W]>(heap_coeff.data());
  }
  for (int64_t k = 0; k < order; ++k) {
    for (int l = 0; l < W; ++l) {
      state[k][l] = zi[k * batch + first + l];
      if (!per_sample) coeff[k][l] = a[k * batch + first + l];
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = adjoint ? length - 1 - i : i;
    const T* ut = u + t * batch + first;
    T acc[W];
    for (int l = 0; l < W; ++l) acc[l] = ut[l];
    // The oldest lag first: only the last multiply-add waits on y[t-1].
    for (int64_t k = order - 1; k >= 0; --k) {
      if (per_sample) {
        const int64_t row = adjoint ? t + k + 1 : t;
        if (adjoint && row >= length) continue;  // zero past the end
        const T* at = a + (row * order + k) * batch + first;
        for (int l = 0; l < W; ++l) acc[l] -= at[l] * state[k][l];
      } else {
        for (int l = 0; l < W; ++l) acc[l] -= coeff[k][l] * state[k][l];
      }
    }
    for (int64_t k = order - 1; k > 0; --k) {
      for (int l = 0; l < W; ++l) state[k][l] = state[k - 1][l];
    }
    T* yt = y + t * batch + first;
    for (int l = 0; l < W; ++l) {
      state[0][l] = acc[l];
      yt[l] = acc[l];
    }
  }
}

// A group of W signals of a batch stored batch-major, as the operands arrive
// (signal b's sample t at `b * length + t`): each block of kBlock samples of
// the W signals is copied into a small time-major buffer that stays in the L1
// cache, filtered there with the W chains in SIMD lanes, and copied back.
// Every signal is read and written in the order it is stored, once, so no
// transposed copy of the batch is ever made (XLA's transposes of a large
// batch cost several times the filter).
constexpr int64_t kBlock = 128;

template <typename T, int K, int W, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Blocked(
    const T* __restrict__ a, const T* __restrict__ u, const T* __restrict__ zi,
    T* __restrict__ y, int64_t length, int64_t first, int64_t order_) {
  const int64_t order = K > 0 ? K : order_;
  constexpr int kStack = K > 0 ? K : 1;
  T stack_state[kStack][W];
  T stack_coeff[kStack][W];
  std::vector<T> heap_state, heap_coeff;
  T(*state)[W] = stack_state;
  T(*coeff)[W] = stack_coeff;
  if (K == 0) {
    heap_state.resize(order * W);
    heap_coeff.resize(order * W);
    state = reinterpret_cast<T(*)[W]>(heap_state.data());
    coeff = reinterpret_cast<T(*)[W]>(heap_coeff.data());
  }
  for (int64_t k = 0; k < order; ++k) {
    for (int l = 0; l < W; ++l) {
      state[k][l] = zi[(first + l) * order + k];
      if (!per_sample) coeff[k][l] = a[(first + l) * order + k];
    }
  }
  alignas(64) T signal[kBlock][W];
  // per-sample coefficients of rows t0 .. t0 + kBlock + order - 1 (the
  // adjoint reads up to `order` rows past the block), zero past the end
  std::vector<T> rows_(per_sample ? (kBlock + order) * order * W : 0);
  T* __restrict__ rows = rows_.data();
  const int64_t blocks = (length + kBlock - 1) / kBlock;
  for (int64_t j = 0; j < blocks; ++j) {
    const int64_t t0 = (adjoint ? blocks - 1 - j : j) * kBlock;
    const int64_t n = length - t0 < kBlock ? length - t0 : kBlock;
    for (int l = 0; l < W; ++l) {
      const T* __restrict__ from = u + (first + l) * length + t0;
      for (int64_t i = 0; i < n; ++i) signal[i][l] = from[i];
    }
    if (per_sample) {
      const int64_t needed = adjoint ? n + order : n;
      const int64_t held = length - t0 < needed ? length - t0 : needed;
      for (int l = 0; l < W; ++l) {
        const T* __restrict__ from = a + ((first + l) * length + t0) * order;
        for (int64_t r = 0; r < held; ++r) {
          for (int64_t k = 0; k < order; ++k) {
            rows[(r * order + k) * W + l] = from[r * order + k];
          }
        }
        for (int64_t r = held; r < needed; ++r) {
          for (int64_t k = 0; k < order; ++k) rows[(r * order + k) * W + l] = 0;
        }
      }
    }
    for (int64_t ii = 0; ii < n; ++ii) {
      const int64_t i = adjoint ? n - 1 - ii : ii;
      T acc[W];
      for (int l = 0; l < W; ++l) acc[l] = signal[i][l];
      // The oldest lag first: only the last multiply-add waits on y[t-1].
      for (int64_t k = order - 1; k >= 0; --k) {
        if (per_sample) {
          const int64_t r = adjoint ? i + k + 1 : i;
          const T* __restrict__ c = rows + (r * order + k) * W;
          for (int l = 0; l < W; ++l) acc[l] -= c[l] * state[k][l];
        } else {
          for (int l = 0; l < W; ++l) acc[l] -= coeff[k][l] * state[k][l];
        }
      }
      for (int64_t k = order - 1; k > 0; --k) {
        for (int l = 0; l < W; ++l) state[k][l] = state[k - 1][l];
      }
      for (int l = 0; l < W; ++l) {
        state[0][l] = acc[l];
        signal[i][l] = acc[l];
      }
    }
    for (int l = 0; l < W; ++l) {
      T* __restrict__ to = y + (first + l) * length + t0;
      for (int64_t i = 0; i < n; ++i) to[i] = signal[i][l];
    }
  }
}

// Every signal of a batch stored time-major (a single signal, or the
// channels of a time-first array, sample t of signal b at t * batch + b):
// with constant real coefficients (the only time-major batches the
// lowering hands over), groups of 4, then 2 adjacent signals in SIMD lanes,
// whose values of a sample lie side by side (stereo of order 4, float64,
// 4.4M samples: 26 ms one signal after another, 16 ms so, as for the same
// samples stored batch-major); then, and otherwise, one signal at a time.
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void TimeMajorGroups(
    const T* a, const T* u, const T* zi, T* y, int64_t length, int64_t batch,
    int64_t order) {
  int64_t first = 0;
#define RETRAX_GROUPS(W)                                                   \
  for (; batch - first >= W; first += W) {                                 \
    Group<T, K, W, per_sample, adjoint>(a, u, zi, y, length, batch, first, \
                                        order);                            \
  }
  if constexpr (!per_sample && std::is_floating_point_v<T>) {
    RETRAX_GROUPS(4)
    RETRAX_GROUPS(2)
  }
  RETRAX_GROUPS(1)
#undef RETRAX_GROUPS
}

// Every signal. A batch stored batch-major runs in blocked groups of 8, 4,
// then 1; one stored time-major (a single signal, or a time-first array's
// channels) in `TimeMajorGroups`, straight through its memory.
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Batch(const T* a, const T* u,
                                                 const T* zi, T* y,
                                                 int64_t length, int64_t batch,
                                                 int64_t order,
                                                 bool batch_major) {
  int64_t first = 0;
  if (batch_major && batch > 1) {
#define RETRAX_BLOCKED(W)                                                     \
  for (; batch - first >= W; first += W) {                                    \
    Blocked<T, K, W, per_sample, adjoint>(a, u, zi, y, length, first, order); \
  }
    RETRAX_BLOCKED(8)
    RETRAX_BLOCKED(4)
    RETRAX_BLOCKED(1)
#undef RETRAX_BLOCKED
    return;
  }
  TimeMajorGroups<T, K, per_sample, adjoint>(a, u, zi, y, length, batch,
                                             order);
}

// One signal (or a time-major batch) of order 3 to 8, its lags held in
// registers: with the order known only at run time they live in memory, and
// every sample waits on storing and reloading them (order 4, T = 44,100,
// float32, one signal: 0.68 against 0.08 ms on a 2-core x86 CPU).
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Singles(const T* a, const T* u,
                                                   const T* zi, T* y,
                                                   int64_t length,
                                                   int64_t batch) {
  TimeMajorGroups<T, K, per_sample, adjoint>(a, u, zi, y, length, batch, K);
}

// A batch-major batch of order 5 to 8 (no tiled path), one signal after
// another, each with its lags in registers (signal b's samples, coefficients
// and state are contiguous: a batch of one). The blocked groups' lags,
// with the order known only at run time, live in memory: order 8, float64,
// (8, 44,100), 4.4 ms blocked against 2.6 ms signal by signal (jitted
// lfilter, benchmarks/bench_scipy.py).
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void SinglesBatchMajor(
    const T* a, const T* u, const T* zi, T* y, int64_t length, int64_t batch) {
  const int64_t coeffs = per_sample ? length * K : K;
  for (int64_t b = 0; b < batch; ++b) {
    Group<T, K, 1, per_sample, adjoint>(a + b * coeffs, u + b * length,
                                        zi + b * K, y + b * length, length, 1,
                                        0, K);
  }
}

template <typename T, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void ByOrder(const T* a, const T* u,
                                                   const T* zi, T* y,
                                                   int64_t length,
                                                   int64_t batch,
                                                   int64_t order,
                                                   bool batch_major) {
  // Orders 3 to 8 with their lags in registers: one signal (or a time-major
  // batch) always; a batch-major batch from order 5 (below, the tiled and
  // blocked loops advance several signals at once).
  const bool batched = batch_major && batch > 1;
  switch (order) {
#define RETRAX_SINGLES(K)                                                     \
  case K:                                                                     \
    if (!batched) {                                                           \
      return Singles<T, K, per_sample, adjoint>(a, u, zi, y, length, batch);  \
    }                                                                         \
    if constexpr (K >= 5) {                                                   \
      return SinglesBatchMajor<T, K, per_sample, adjoint>(a, u, zi, y, length, \
                                                          batch);             \
    }                                                                         \
    break;
    RETRAX_SINGLES(3)
    RETRAX_SINGLES(4)
    RETRAX_SINGLES(5)
    RETRAX_SINGLES(6)
    RETRAX_SINGLES(7)
    RETRAX_SINGLES(8)
#undef RETRAX_SINGLES
    default:
      break;
  }
  switch (order) {
    case 1:
      return Batch<T, 1, per_sample, adjoint>(a, u, zi, y, length, batch, 1,
                                              batch_major);
    case 2:
      return Batch<T, 2, per_sample, adjoint>(a, u, zi, y, length, batch, 2,
                                              batch_major);
    default:
      return Batch<T, 0, per_sample, adjoint>(a, u, zi, y, length, batch,
                                              order, batch_major);
  }
}

template <typename T>
inline __attribute__((always_inline)) void Dispatch(const T* a, const T* u,
                                                    const T* zi, T* y,
                                                    int64_t length,
                                                    int64_t batch,
                                                    int64_t order,
                                                    bool per_sample,
                                                    bool adjoint,
                                                    bool batch_major) {
  if (per_sample) {
    if (adjoint) {
      return ByOrder<T, true, true>(a, u, zi, y, length, batch, order,
                                    batch_major);
    }
    return ByOrder<T, true, false>(a, u, zi, y, length, batch, order,
                                   batch_major);
  }
  if (adjoint) {
    return ByOrder<T, false, true>(a, u, zi, y, length, batch, order,
                                   batch_major);
  }
  return ByOrder<T, false, false>(a, u, zi, y, length, batch, order,
                                  batch_major);
}

// ---------------------------------------------------------------- AVX2 path
//
// A batch stored batch-major, on x86 CPUs with AVX2 and FMA, orders 1 to 4:
// W signals (8 float32 or 4 float64, a register's lanes) advance together.
// Each step of W samples loads W consecutive samples of each signal, one
// register per signal, and transposes the W x W tile in registers, so that
// register i holds sample t0 + i of every signal; per-sample coefficients
// (K per sample, stored sample after sample) are K such tiles, after which
// register i * K + k holds coefficient k of sample t0 + i. W steps of the
// recursion then run with the W chains in the lanes, one fused
// multiply-subtract per lag, and the outputs are transposed back and stored
// in place. Every operand is read and written once, in the order it is
// stored, with no copy of the batch. A last group of fewer than W signals
// repeats its last signal in the spare lanes and stores only its own; the
// last T mod W samples of every signal run one lane at a time.
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define RETRAX_AVX2 \
  inline __attribute__((always_inline, target("avx2,fma")))

template <typename T>
struct Avx2;

template <>
struct Avx2<float> {
  using V = __m256;
  static constexpr int W = 8;
  RETRAX_AVX2 static V Load(const float* p) { return _mm256_loadu_ps(p); }
  RETRAX_AVX2 static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  // c - a * b, rounded once
  RETRAX_AVX2 static V MulSub(V a, V b, V c) { return _mm256_fnmadd_ps(a, b, c); }
  RETRAX_AVX2 static void Transpose(V* r) {
    const V t0 = _mm256_unpacklo_ps(r[0], r[1]);
    const V t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const V t2 = _mm256_unpacklo_ps(r[2], r[3]);
    const V t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const V t4 = _mm256_unpacklo_ps(r[4], r[5]);
    const V t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const V t6 = _mm256_unpacklo_ps(r[6], r[7]);
    const V t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const V s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
    const V s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
    const V s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
    const V s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
    const V s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
    const V s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
    const V s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
    const V s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20);
    r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
  }
};

template <>
struct Avx2<double> {
  using V = __m256d;
  static constexpr int W = 4;
  RETRAX_AVX2 static V Load(const double* p) { return _mm256_loadu_pd(p); }
  RETRAX_AVX2 static void Store(double* p, V v) { _mm256_storeu_pd(p, v); }
  RETRAX_AVX2 static V MulSub(V a, V b, V c) { return _mm256_fnmadd_pd(a, b, c); }
  RETRAX_AVX2 static void Transpose(V* r) {
    const V t0 = _mm256_unpacklo_pd(r[0], r[1]);
    const V t1 = _mm256_unpackhi_pd(r[0], r[1]);
    const V t2 = _mm256_unpacklo_pd(r[2], r[3]);
    const V t3 = _mm256_unpackhi_pd(r[2], r[3]);
    r[0] = _mm256_permute2f128_pd(t0, t2, 0x20);
    r[1] = _mm256_permute2f128_pd(t1, t3, 0x20);
    r[2] = _mm256_permute2f128_pd(t0, t2, 0x31);
    r[3] = _mm256_permute2f128_pd(t1, t3, 0x31);
  }
};

// Samples [begin, end) of one signal, one at a time, from and into `state`
// (the K lags, newest first), forward or (adjoint) backwards; the same
// operations in the same order as the vector steps, so the lanes and the
// tail round alike.
template <typename T, int K, bool per_sample, bool adjoint>
RETRAX_AVX2 void Lane(const T* __restrict__ a, const T* __restrict__ u,
                      T* __restrict__ y, int64_t length, int64_t begin,
                      int64_t end, T* __restrict__ state,
                      const T* __restrict__ coeff) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t t = adjoint ? end - 1 - (i - begin) : i;
    T acc = u[t];
#pragma GCC unroll 4
    for (int k = K - 1; k >= 0; --k) {
      T c = coeff[k];
      if (per_sample) {
        const int64_t row = adjoint ? t + k + 1 : t;
        c = row < length ? a[row * K + k] : T(0);
      }
      acc = __builtin_fma(-c, state[k], acc);
    }
#pragma GCC unroll 4
    for (int k = K - 1; k > 0; --k) state[k] = state[k - 1];
    state[0] = acc;
    y[t] = acc;
  }
}

// The samples past the last whole tile, [full, length), one lane at a time
// (`state` and `coeff` hold each lane's values, W to a row).
template <typename T, int K, bool per_sample, bool adjoint>
RETRAX_AVX2 void TailLanes(const T* a, const T* u, T* y, int64_t length,
                           int64_t full, int lanes, const int64_t* signal,
                           T (*state)[Avx2<T>::W], T (*coeff)[Avx2<T>::W]) {
  for (int l = 0; l < lanes; ++l) {
    T s[K], c[K];
    for (int k = 0; k < K; ++k) {
      s[k] = state[k][l];
      c[k] = coeff[k][l];
    }
    const int64_t b = signal[l];
    Lane<T, K, per_sample, adjoint>(per_sample ? a + b * length * K : a,
                                    u + b * length, y + b * length, length,
                                    full, length, s, c);
    for (int k = 0; k < K; ++k) state[k][l] = s[k];
  }
}

// A wide batch streams from memory, 3 + K rows of a tile's W signals at a
// time: more streams than the hardware prefetcher follows, so each tile asks
// for the cache lines it will read (and write) kPrefetchAhead samples later.
// In the cache (`stream` false) the requests would only cost.
inline constexpr int64_t kPrefetchAhead = 64;

template <typename T, int K, bool per_sample, bool adjoint>
RETRAX_AVX2 void Prefetch(const T* a, const T* u, T* y, int64_t length,
                          int64_t t0, const int64_t* signal) {
  const int64_t t = adjoint ? t0 - kPrefetchAhead : t0 + kPrefetchAhead;
  if (t < 0 || t >= length) return;
  constexpr int W = Avx2<T>::W;
  constexpr int kLine = 64;
  // a row of a tile need not start a cache line: ask for its last byte's too
  constexpr int x_last = W * static_cast<int>(sizeof(T)) - 1;
  constexpr int a_last = K * W * static_cast<int>(sizeof(T)) - 1;
#pragma GCC unroll 8
  for (int l = 0; l < W; ++l) {
    const char* x = reinterpret_cast<const char*>(u + signal[l] * length + t);
    const char* out = reinterpret_cast<const char*>(y + signal[l] * length + t);
    __builtin_prefetch(x, 0, 0);
    __builtin_prefetch(x + x_last, 0, 0);
    __builtin_prefetch(out, 1, 0);
    __builtin_prefetch(out + x_last, 1, 0);
    if (per_sample) {
      const char* row = reinterpret_cast<const char*>(
          a + (signal[l] * length + t) * K);
#pragma GCC unroll 4
      for (int b = 0; b < a_last; b += kLine) __builtin_prefetch(row + b, 0, 0);
      __builtin_prefetch(row + a_last, 0, 0);
    }
  }
}

template <typename T, int K, bool per_sample, bool adjoint>
RETRAX_AVX2 void Tiles(const T* a, const T* u, const T* zi, T* y,
                       int64_t length, int64_t batch, int64_t first,
                       bool stream) {
  using A = Avx2<T>;
  using V = typename A::V;
  constexpr int W = A::W;
  const int lanes = batch - first < W ? static_cast<int>(batch - first) : W;
  int64_t signal[W];
  for (int l = 0; l < W; ++l) signal[l] = first + (l < lanes ? l : lanes - 1);
  // The state and constant coefficients, lane by lane. The adjoint with
  // per-sample coefficients reads no state (they are zero past the end):
  // zeros, so that a non-finite state cannot leak in as 0 * inf.
  alignas(32) T state[K][W];
  alignas(32) T coeff[K][W];
  for (int k = 0; k < K; ++k) {
    for (int l = 0; l < W; ++l) {
      state[k][l] = per_sample && adjoint ? T(0) : zi[signal[l] * K + k];
      coeff[k][l] = per_sample ? T(0) : a[signal[l] * K + k];
    }
  }
  const int64_t full = length / W * W;
  if (adjoint) {
    TailLanes<T, K, per_sample, adjoint>(a, u, y, length, full, lanes, signal,
                                        state, coeff);
  }
  V s[K], c[K];
  for (int k = 0; k < K; ++k) {
    s[k] = A::Load(state[k]);
    c[k] = A::Load(coeff[k]);
  }
  // The adjoint's per-sample coefficients of the K rows after a tile
  // (`next[r][k]`: row t0 + W + r), zero past the end.
  V next[K > 0 ? K : 1][K];
  if (per_sample && adjoint) {
    alignas(32) T rows[K][K][W];
    for (int r = 0; r < K; ++r) {
      for (int k = 0; k < K; ++k) {
        for (int l = 0; l < W; ++l) {
          const int64_t row = full + r;
          rows[r][k][l] =
              row < length ? a[(signal[l] * length + row) * K + k] : T(0);
        }
      }
    }
    for (int r = 0; r < K; ++r) {
      for (int k = 0; k < K; ++k) next[r][k] = A::Load(rows[r][k]);
    }
  }
  const int64_t tiles = full / W;
  for (int64_t j = 0; j < tiles; ++j) {
    const int64_t t0 = (adjoint ? tiles - 1 - j : j) * W;
    if (stream) {
      Prefetch<T, K, per_sample, adjoint>(a, u, y, length, t0, signal);
    }
    V x[W];
#pragma GCC unroll 8
    for (int l = 0; l < W; ++l) x[l] = A::Load(u + signal[l] * length + t0);
    A::Transpose(x);
    V rows[per_sample ? K * W : 1];
    if (per_sample) {
#pragma GCC unroll 4
      for (int p = 0; p < K; ++p) {
        V* tile = rows + p * W;
#pragma GCC unroll 8
        for (int l = 0; l < W; ++l) {
          tile[l] = A::Load(a + (signal[l] * length + t0) * K + p * W);
        }
        A::Transpose(tile);
      }
    }
#pragma GCC unroll 8
    for (int ii = 0; ii < W; ++ii) {
      const int i = adjoint ? W - 1 - ii : ii;
      V acc = x[i];
#pragma GCC unroll 4
      for (int k = K - 1; k >= 0; --k) {
        V ck = c[k];
        if (per_sample) {
          const int r = adjoint ? i + k + 1 : i;
          ck = r < W ? rows[r * K + k] : next[r - W][k];
        }
        acc = A::MulSub(ck, s[k], acc);
      }
#pragma GCC unroll 4
      for (int k = K - 1; k > 0; --k) s[k] = s[k - 1];
      s[0] = acc;
      x[i] = acc;
    }
    if (per_sample && adjoint) {
#pragma GCC unroll 4
      for (int r = 0; r < K; ++r) {
#pragma GCC unroll 4
        for (int k = 0; k < K; ++k) next[r][k] = rows[r * K + k];
      }
    }
    A::Transpose(x);
    for (int l = 0; l < lanes; ++l) A::Store(y + signal[l] * length + t0, x[l]);
  }
  for (int k = 0; k < K; ++k) A::Store(state[k], s[k]);
  if (!adjoint) {
    TailLanes<T, K, per_sample, adjoint>(a, u, y, length, full, lanes, signal,
                                        state, coeff);
  }
}

template <typename T, int K, bool per_sample, bool adjoint>
RETRAX_AVX2 void TiledBatch(const T* a, const T* u, const T* zi, T* y,
                            int64_t length, int64_t batch, bool stream) {
  for (int64_t first = 0; first < batch; first += Avx2<T>::W) {
    Tiles<T, K, per_sample, adjoint>(a, u, zi, y, length, batch, first, stream);
  }
}

template <typename T, bool per_sample, bool adjoint>
RETRAX_AVX2 bool TiledByOrder(const T* a, const T* u, const T* zi, T* y,
                              int64_t length, int64_t batch, int64_t order,
                              bool stream) {
  switch (order) {
    case 1:
      TiledBatch<T, 1, per_sample, adjoint>(a, u, zi, y, length, batch, stream);
      return true;
    case 2:
      TiledBatch<T, 2, per_sample, adjoint>(a, u, zi, y, length, batch, stream);
      return true;
    case 3:
      TiledBatch<T, 3, per_sample, adjoint>(a, u, zi, y, length, batch, stream);
      return true;
    case 4:
      TiledBatch<T, 4, per_sample, adjoint>(a, u, zi, y, length, batch, stream);
      return true;
    default:
      return false;
  }
}

// The tiled path for a batch-major batch of order 1 to 4; false if it does
// not apply (the general loops then run).
template <typename T>
__attribute__((target("avx2,fma"))) bool Tiled(const T* a, const T* u,
                                               const T* zi, T* y,
                                               int64_t length, int64_t batch,
                                               int64_t order, bool per_sample,
                                               bool adjoint, bool stream) {
  if (per_sample) {
    return adjoint ? TiledByOrder<T, true, true>(a, u, zi, y, length, batch,
                                                 order, stream)
                   : TiledByOrder<T, true, false>(a, u, zi, y, length, batch,
                                                  order, stream);
  }
  return adjoint ? TiledByOrder<T, false, true>(a, u, zi, y, length, batch,
                                                order, stream)
                 : TiledByOrder<T, false, false>(a, u, zi, y, length, batch,
                                                 order, stream);
}

// ---------------------------------------------------------------- AVX2 rows
//
// A batch-major float32 batch with per-sample coefficients of order 9 to 64
// (LPC at speech orders), on x86 CPUs with AVX2 and FMA (its adjoint:
// below). The order is too high for the tiles above (K tiles of W x W
// coefficients to transpose per W samples) and the blocked loops copy every
// coefficient into a time-major buffer, one value at a time. Here each
// signal's K coefficients of a sample, contiguous in memory, are read as
// R = ceil(K/8) registers and multiplied by the signal's last K outputs, held
// newest first in R registers (its window); the 8 signals of a group are in
// flight together, so that the 8 dot products' horizontal sums reduce in one
// tree (one output of each signal in each lane) and their latencies overlap.
// Each new output is then shifted into its signal's window. The inputs and
// outputs move in 8 x 8 tiles (8 samples of the 8 signals) transposed in
// registers, as the tiles above do. Each dot product is summed in float64
// (see RowsStep). Orders 16 to 32, T = 24,000, jitted `jax.vmap(allpole)`
// (bench_ops.py, one CPU of a 2-core x86 machine): B = 8, 1.0 to 1.9 ms
// against 6.7 to 14 ms in the blocked loops; B = 32, where the coefficients
// stream from memory, 8 to 23 ms against 26 to 49 ms.

// x - (the sum of p[l]'s lanes) in lane l, rounded to float32 once
RETRAX_AVX2 __m256 SubtractSums(__m256 x, const __m256d* p) {
  const __m256d h01 = _mm256_hadd_pd(p[0], p[1]);
  const __m256d h23 = _mm256_hadd_pd(p[2], p[3]);
  const __m256d h45 = _mm256_hadd_pd(p[4], p[5]);
  const __m256d h67 = _mm256_hadd_pd(p[6], p[7]);
  const __m256d s03 = _mm256_add_pd(_mm256_permute2f128_pd(h01, h23, 0x20),
                                    _mm256_permute2f128_pd(h01, h23, 0x31));
  const __m256d s47 = _mm256_add_pd(_mm256_permute2f128_pd(h45, h67, 0x20),
                                    _mm256_permute2f128_pd(h45, h67, 0x31));
  const __m256d x03 = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
  const __m256d x47 = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
  return _mm256_set_m128(_mm256_cvtpd_ps(_mm256_sub_pd(x47, s47)),
                         _mm256_cvtpd_ps(_mm256_sub_pd(x03, s03)));
}

// One sample t of the 8 signals: x holds their inputs (lane l: signal l),
// the result their outputs. `rows[l]` is signal l's coefficients, `mask`
// the lanes of the last register that hold coefficients (kTail: K is not a
// multiple of 8; the windows' lanes past the order are kept at zero, so that
// a non-finite old output cannot enter as 0 * inf). The products of two
// float32 values are exact in float64, and the sums are float64 too, so an
// output is rounded once: a resonant filter of high order sums terms far
// larger than its output, whose float32 rounding (in any order) the
// recursion then amplifies (bench_ops.py's filters of order 16 to 32, 8 x
// 24,000 samples: within 3.2e-7 of the peak from the float64 recursion,
// against 3e-6 to 1.9e-5 summed in float32 by the blocked loops).
template <int R, bool kTail>
RETRAX_AVX2 __m256 RowsStep(__m256 (*window)[R], const float* const* rows,
                            int64_t t, int64_t order, __m256 x, __m256i mask) {
  __m256d p[8];
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    const float* row = rows[l] + t * order;
    __m256d acc = _mm256_setzero_pd();
#pragma GCC unroll 8
    for (int r = R - 1; r >= 0; --r) {  // the oldest lags first
      const __m256 c = kTail && r == R - 1
                           ? _mm256_maskload_ps(row + 8 * r, mask)
                           : _mm256_loadu_ps(row + 8 * r);
      const __m256 w = window[l][r];
      acc = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(c, 1)),
                            _mm256_cvtps_pd(_mm256_extractf128_ps(w, 1)), acc);
      acc = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(c)),
                            _mm256_cvtps_pd(_mm256_castps256_ps128(w)), acc);
    }
    p[l] = acc;
  }
  const __m256 y = SubtractSums(x, p);
  const __m256i rotate = _mm256_setr_epi32(7, 0, 1, 2, 3, 4, 5, 6);
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    // lane 0 of each register takes lane 7 of the one before (the newest
    // output for the first)
    __m256 carry = _mm256_permutevar8x32_ps(y, _mm256_set1_epi32(l));
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m256 rotated = _mm256_permutevar8x32_ps(window[l][r], rotate);
      window[l][r] = _mm256_blend_ps(rotated, carry, 1);
      carry = rotated;
    }
    if (kTail) {
      window[l][R - 1] =
          _mm256_and_ps(window[l][R - 1], _mm256_castsi256_ps(mask));
    }
  }
  return y;
}

// The lanes of the last of R registers of coefficients that hold one.
template <int R>
RETRAX_AVX2 __m256i RowsMask(int64_t order) {
  alignas(32) int32_t bits[8];
  for (int j = 0; j < 8; ++j) bits[j] = j < order - (R - 1) * 8 ? -1 : 0;
  return _mm256_load_si256(reinterpret_cast<__m256i*>(bits));
}

// Samples t0..t0+8 of the 8 signals `signal` as 8 registers, one a sample
// (the 8 x 8 tile transposed).
RETRAX_AVX2 void LoadTile(const float* u, const int64_t* signal,
                          int64_t length, int64_t t0, __m256* x) {
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    x[l] = _mm256_loadu_ps(u + signal[l] * length + t0);
  }
  Avx2<float>::Transpose(x);
}

// The tile of `LoadTile`'s layout back to the first `lanes` signals.
RETRAX_AVX2 void StoreTile(float* y, const int64_t* signal, int lanes,
                           int64_t length, int64_t t0, __m256* x) {
  Avx2<float>::Transpose(x);
  for (int l = 0; l < lanes; ++l) {
    _mm256_storeu_ps(y + signal[l] * length + t0, x[l]);
  }
}

// The 8 signals `signal[0..8)` of a batch-major batch (a last group of fewer
// repeats its last signal in the spare lanes and stores only its own).
template <int R, bool kTail>
RETRAX_AVX2 void RowsGroup(const float* a, const float* u, const float* zi,
                           float* y, int64_t length, int64_t order,
                           const int64_t* signal, int lanes) {
  __m256 window[8][R];
  alignas(32) float lags[R * 8];
  for (int l = 0; l < 8; ++l) {
    for (int j = 0; j < R * 8; ++j) {
      lags[j] = j < order ? zi[signal[l] * order + j] : 0.0f;
    }
    for (int r = 0; r < R; ++r) window[l][r] = _mm256_load_ps(lags + 8 * r);
  }
  const __m256i mask = RowsMask<R>(order);
  const float* rows[8];
  for (int l = 0; l < 8; ++l) rows[l] = a + signal[l] * length * order;
  const int64_t full = length / 8 * 8;
  for (int64_t t0 = 0; t0 < full; t0 += 8) {
    __m256 x[8];
    LoadTile(u, signal, length, t0, x);
#pragma GCC unroll 1
    for (int i = 0; i < 8; ++i) {
      x[i] = RowsStep<R, kTail>(window, rows, t0 + i, order, x[i], mask);
    }
    StoreTile(y, signal, lanes, length, t0, x);
  }
  for (int64_t t = full; t < length; ++t) {
    alignas(32) float samples[8];
    for (int l = 0; l < 8; ++l) samples[l] = u[signal[l] * length + t];
    const __m256 out = RowsStep<R, kTail>(window, rows, t, order,
                                          _mm256_load_ps(samples), mask);
    _mm256_store_ps(samples, out);
    for (int l = 0; l < lanes; ++l) y[signal[l] * length + t] = samples[l];
  }
}

// The adjoint of the rows path: w[s] = u[s] - sum_k a[s+k+1, k] w[s+k+1],
// backwards in time, in the transposed (scatter) form. Each signal's window
// holds, in lane j, what the outputs already computed contribute to its
// sample s - j; output w[s] is the input plus lane 0, after which the window
// moves down by one sample (a zero enters at the top, lane K - 1) and takes
// -a[s, k] w[s] in lane k: row s of the coefficients, as it lies in memory,
// times the broadcast output. Each contribution is added in float32, as the
// blocked loops' adjoint does, in the same order (the furthest first). The
// per-sample adjoint reads no state (its coefficients are zero past the
// end).
template <int R, bool kTail>
RETRAX_AVX2 __m256 RowsAdjointStep(__m256 (*window)[R],
                                   const float* const* rows, int64_t t,
                                   int64_t order, __m256 x, __m256i mask) {
  // lane 0 of each signal's window, signal l in lane l
  const __m256 t01 = _mm256_unpacklo_ps(window[0][0], window[1][0]);
  const __m256 t23 = _mm256_unpacklo_ps(window[2][0], window[3][0]);
  const __m256 t45 = _mm256_unpacklo_ps(window[4][0], window[5][0]);
  const __m256 t67 = _mm256_unpacklo_ps(window[6][0], window[7][0]);
  const __m256 s03 = _mm256_shuffle_ps(t01, t23, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 s47 = _mm256_shuffle_ps(t45, t67, _MM_SHUFFLE(1, 0, 1, 0));
  const __m256 w = _mm256_add_ps(x, _mm256_permute2f128_ps(s03, s47, 0x20));
  const __m256i down = _mm256_setr_epi32(1, 2, 3, 4, 5, 6, 7, 0);
#pragma GCC unroll 8
  for (int l = 0; l < 8; ++l) {
    const float* row = rows[l] + t * order;
    const __m256 wl = _mm256_permutevar8x32_ps(w, _mm256_set1_epi32(l));
    __m256 rotated[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      rotated[r] = _mm256_permutevar8x32_ps(window[l][r], down);
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      // lane 7 takes lane 0 of the register after (zero past the last)
      const __m256 above = r + 1 < R ? rotated[r + 1] : _mm256_setzero_ps();
      const __m256 moved = _mm256_blend_ps(rotated[r], above, 0x80);
      const __m256 c = kTail && r == R - 1
                           ? _mm256_maskload_ps(row + 8 * r, mask)
                           : _mm256_loadu_ps(row + 8 * r);
      window[l][r] = _mm256_fnmadd_ps(c, wl, moved);
    }
    if (kTail) {  // the lanes past the order stay zero (0 * inf would not)
      window[l][R - 1] =
          _mm256_and_ps(window[l][R - 1], _mm256_castsi256_ps(mask));
    }
  }
  return w;
}

template <int R, bool kTail>
RETRAX_AVX2 void RowsAdjointGroup(const float* a, const float* u, float* y,
                                  int64_t length, int64_t order,
                                  const int64_t* signal, int lanes) {
  __m256 window[8][R];
  for (int l = 0; l < 8; ++l) {
    for (int r = 0; r < R; ++r) window[l][r] = _mm256_setzero_ps();
  }
  const __m256i mask = RowsMask<R>(order);
  const float* rows[8];
  for (int l = 0; l < 8; ++l) rows[l] = a + signal[l] * length * order;
  const int64_t full = length / 8 * 8;
  for (int64_t t = length - 1; t >= full; --t) {
    alignas(32) float samples[8];
    for (int l = 0; l < 8; ++l) samples[l] = u[signal[l] * length + t];
    const __m256 out = RowsAdjointStep<R, kTail>(window, rows, t, order,
                                                 _mm256_load_ps(samples), mask);
    _mm256_store_ps(samples, out);
    for (int l = 0; l < lanes; ++l) y[signal[l] * length + t] = samples[l];
  }
  for (int64_t t0 = full - 8; t0 >= 0; t0 -= 8) {
    __m256 x[8];
    LoadTile(u, signal, length, t0, x);
#pragma GCC unroll 1
    for (int i = 7; i >= 0; --i) {
      x[i] = RowsAdjointStep<R, kTail>(window, rows, t0 + i, order, x[i], mask);
    }
    StoreTile(y, signal, lanes, length, t0, x);
  }
}

template <int R, bool kTail>
RETRAX_AVX2 void RowsBatch(const float* a, const float* u, const float* zi,
                           float* y, int64_t length, int64_t batch,
                           int64_t order, bool adjoint) {
  for (int64_t first = 0; first < batch; first += 8) {
    const int lanes = batch - first < 8 ? static_cast<int>(batch - first) : 8;
    int64_t signal[8];
    for (int l = 0; l < 8; ++l) signal[l] = first + (l < lanes ? l : lanes - 1);
    if (adjoint) {
      RowsAdjointGroup<R, kTail>(a, u, y, length, order, signal, lanes);
    } else {
      RowsGroup<R, kTail>(a, u, zi, y, length, order, signal, lanes);
    }
  }
}

// The rows path (see above) for a batch-major float32 batch; false if it
// does not apply.
inline constexpr int64_t kRowsFrom = 9;
inline constexpr int64_t kRowsTo = 64;

__attribute__((target("avx2,fma"))) bool Rows(const float* a, const float* u,
                                              const float* zi, float* y,
                                              int64_t length, int64_t batch,
                                              int64_t order, bool adjoint) {
  if (order < kRowsFrom || order > kRowsTo) return false;
  const bool tail = order % 8 != 0;
  switch ((order + 7) / 8) {
#define RETRAX_ROWS(R)                                                  \
  case R:                                                               \
    if (tail) {                                                         \
      RowsBatch<R, true>(a, u, zi, y, length, batch, order, adjoint);   \
    } else {                                                            \
      RowsBatch<R, false>(a, u, zi, y, length, batch, order, adjoint);  \
    }                                                                   \
    return true;
    RETRAX_ROWS(2)
    RETRAX_ROWS(3)
    RETRAX_ROWS(4)
    RETRAX_ROWS(5)
    RETRAX_ROWS(6)
    RETRAX_ROWS(7)
    RETRAX_ROWS(8)
#undef RETRAX_ROWS
    default:
      return false;
  }
}
#endif

// The same loops compiled twice: for x86 CPUs with AVX2 and FMA (8 float32
// lanes to a register, one fused multiply-add per lag) and for any CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_X86 1
template <typename T>
__attribute__((target("avx2,fma"))) void RunAvx2(const T* a, const T* u,
                                                 const T* zi, T* y,
                                                 int64_t length,
                                                 int64_t batch, int64_t order,
                                                 bool per_sample,
                                                 bool adjoint,
                                                 bool batch_major,
                                                 bool stream) {
  if constexpr (std::is_same_v<T, float>) {
    if (per_sample && batch_major && batch > 1 &&
        Rows(a, u, zi, y, length, batch, order, adjoint)) {
      return;
    }
  }
  if constexpr (std::is_floating_point_v<T>) {
    if (batch_major && batch > 1 &&
        Tiled<T>(a, u, zi, y, length, batch, order, per_sample, adjoint,
                 stream)) {
      return;
    }
  }
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint,
              batch_major);
}

#endif

template <typename T>
void RunPortable(const T* a, const T* u, const T* zi, T* y, int64_t length,
                 int64_t batch, int64_t order, bool per_sample, bool adjoint,
                 bool batch_major, bool /*stream*/) {
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint,
              batch_major);
}

template <typename T>
void Run(ffi::ThreadPool& pool, const ffi::AnyBuffer& a,
         const ffi::AnyBuffer& u, const ffi::AnyBuffer& zi,
         ffi::Result<ffi::AnyBuffer>& y, int64_t length, int64_t batch,
         int64_t order, bool per_sample, bool adjoint, bool batch_major) {
  auto run = RunPortable<T>;
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) run = RunAvx2<T>;
#endif
  const T* a_ = static_cast<const T*>(a.untyped_data());
  const T* u_ = static_cast<const T*>(u.untyped_data());
  const T* zi_ = static_cast<const T*>(zi.untyped_data());
  T* y_ = static_cast<T*>(y->untyped_data());
  retrax::AdviseHugePages(y_, y->size_bytes());
  if (!batch_major) {  // time-major: one signal, or a few channels
    run(a_, u_, zi_, y_, length, batch, order, per_sample, adjoint, false,
        false);
    return;
  }
  const bool stream =
      a.size_bytes() + u.size_bytes() + y->size_bytes() > retrax::kStreamFrom;
  const int64_t a_stride = per_sample ? length * order : order;
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(a_ + first * a_stride, u_ + first * length, zi_ + first * order,
        y_ + first * length, length, count, order, per_sample, adjoint, true,
        stream);
  });
}

ffi::Error Allpole(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer u,
                   ffi::AnyBuffer zi, ffi::Result<ffi::AnyBuffer> y,
                   bool adjoint, bool batch_major, bool time_major) {
  const auto dims = u.dimensions();
  const auto zi_dims = zi.dimensions();
  if (dims.size() == 0 || zi_dims.size() == 0) {
    return ffi::Error::InvalidArgument("allpole: u needs a time axis");
  }
  // time-major: u and y (T, B), constant a and zi (K, B), in the layout the
  // loops call time-major (see the top of this file)
  if (time_major &&
      (batch_major || dims.size() != 2 || zi_dims.size() != 2 ||
       a.dimensions().size() != 2)) {
    return ffi::Error::InvalidArgument(
        "allpole (time-major): u (T, B), a and zi (K, B) only");
  }
  const int64_t length = time_major ? dims[0] : dims.back();
  const int64_t order = time_major ? zi_dims[0] : zi_dims.back();
  const int64_t count = static_cast<int64_t>(u.element_count());
  const int64_t batch =
      length == 0 ? static_cast<int64_t>(zi.element_count()) / order
                  : count / length;
  const int64_t coefficients = static_cast<int64_t>(a.element_count());
  const bool per_sample = coefficients == batch * length * order &&
                          a.dimensions().size() == dims.size() + 1;
  if ((!per_sample && coefficients != batch * order) ||
      static_cast<int64_t>(zi.element_count()) != batch * order) {
    return ffi::Error::InvalidArgument(
        "allpole: a needs K values per signal or per sample, zi K per signal");
  }
  const auto type = u.element_type();
  if (a.element_type() != type || zi.element_type() != type ||
      y->element_type() != type) {
    return ffi::Error::InvalidArgument("allpole: mixed dtypes");
  }
  if (length == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      Run<float>(pool, a, u, zi, y, length, batch, order, per_sample, adjoint,
                 batch_major);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(pool, a, u, zi, y, length, batch, order, per_sample, adjoint,
                  batch_major);
      return ffi::Error::Success();
    case ffi::DataType::C64:
      Run<Complex<float>>(pool, a, u, zi, y, length, batch, order, per_sample,
                          adjoint, batch_major);
      return ffi::Error::Success();
    case ffi::DataType::C128:
      Run<Complex<double>>(pool, a, u, zi, y, length, batch, order, per_sample,
                           adjoint, batch_major);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "allpole: float32, float64, complex64 or complex128 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxAllpole, Allpole,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("adjoint")
                                  .Attr<bool>("batch_major")
                                  .Attr<bool>("time_major"));

// ---------------------------------------------------------------- lags
//
// The coefficients' cotangent of the all-pole recursion, one value per
// sample and lag (`retrax.ops._allpole_lags`): for every signal b,
//   g[t, k] = -p[t] q[t-k-1],   q[-j-1] = s[j],
// with p and q of shape (B, T), s of shape (B, K) and g of shape (B, T, K),
// batch-major. No recursion: a product of shifted copies, written in the
// order g is stored (XLA's CPU backend interleaves the K shifted copies with
// scalar index arithmetic, several times slower).

namespace {

template <typename T, int K>
inline __attribute__((always_inline)) void LagsOf(const T* __restrict__ p,
                                                  const T* __restrict__ q,
                                                  const T* __restrict__ s,
                                                  T* __restrict__ g,
                                                  int64_t length,
                                                  int64_t order_) {
  const int64_t order = K > 0 ? K : order_;
  const int64_t head = length < order ? length : order;
  for (int64_t t = 0; t < head; ++t) {
    for (int64_t k = 0; k < order; ++k) {
      const int64_t lag = t - k - 1;
      g[t * order + k] = -p[t] * (lag >= 0 ? q[lag] : s[-lag - 1]);
    }
  }
  if (length <= head) return;
  // Row t reads q[t-1], q[t-2], ..., backwards: from a reversed copy of q
  // (r[j] = q[length-1-j], so q[t-k-1] = r[length-t+k]) every row is a
  // contiguous read and a contiguous write, which vectorise (order 32,
  // float64, T = 44,100: 1.57 ms before, against 0.41 ms for XLA to write
  // a broadcast product of the same size).
  std::vector<T> reversed_(length);
  T* __restrict__ r = reversed_.data();
  for (int64_t j = 0; j < length; ++j) r[j] = q[length - 1 - j];
  for (int64_t t = head; t < length; ++t) {
    const T pt = -p[t];
    const T* __restrict__ from = r + (length - t);
    T* __restrict__ to = g + t * order;
    for (int64_t k = 0; k < order; ++k) to[k] = pt * from[k];
  }
}

template <typename T>
inline __attribute__((always_inline)) void LagsBatch(const T* p, const T* q,
                                                     const T* s, T* g,
                                                     int64_t length,
                                                     int64_t batch,
                                                     int64_t order) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* pb = p + b * length;
    const T* qb = q + b * length;
    const T* sb = s + b * order;
    T* gb = g + b * length * order;
    switch (order) {
      case 1:
        LagsOf<T, 1>(pb, qb, sb, gb, length, 1);
        break;
      case 2:
        LagsOf<T, 2>(pb, qb, sb, gb, length, 2);
        break;
      case 3:
        LagsOf<T, 3>(pb, qb, sb, gb, length, 3);
        break;
      case 4:
        LagsOf<T, 4>(pb, qb, sb, gb, length, 4);
        break;
      default:
        LagsOf<T, 0>(pb, qb, sb, gb, length, order);
    }
  }
}

#ifdef RETRAX_X86
template <typename T>
__attribute__((target("avx2,fma"))) void LagsAvx2(const T* p, const T* q,
                                                  const T* s, T* g,
                                                  int64_t length,
                                                  int64_t batch,
                                                  int64_t order) {
  LagsBatch<T>(p, q, s, g, length, batch, order);
}
#endif

template <typename T>
void LagsPortable(const T* p, const T* q, const T* s, T* g, int64_t length,
                  int64_t batch, int64_t order) {
  LagsBatch<T>(p, q, s, g, length, batch, order);
}

template <typename T>
void RunLags(ffi::ThreadPool& pool, const ffi::AnyBuffer& p,
             const ffi::AnyBuffer& q, const ffi::AnyBuffer& s,
             ffi::Result<ffi::AnyBuffer>& g, int64_t length, int64_t batch,
             int64_t order) {
  auto run = LagsPortable<T>;
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) run = LagsAvx2<T>;
#endif
  const T* p_ = static_cast<const T*>(p.untyped_data());
  const T* q_ = static_cast<const T*>(q.untyped_data());
  const T* s_ = static_cast<const T*>(s.untyped_data());
  T* g_ = static_cast<T*>(g->untyped_data());
  retrax::AdviseHugePages(g_, g->size_bytes());
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(p_ + first * length, q_ + first * length, s_ + first * order,
        g_ + first * length * order, length, count, order);
  });
}

ffi::Error AllpoleLags(ffi::ThreadPool pool, ffi::AnyBuffer p,
                       ffi::AnyBuffer q, ffi::AnyBuffer s,
                       ffi::Result<ffi::AnyBuffer> g) {
  const auto dims = p.dimensions();
  const auto s_dims = s.dimensions();
  if (dims.size() == 0 || s_dims.size() == 0) {
    return ffi::Error::InvalidArgument("allpole lags: p needs a time axis");
  }
  const int64_t length = dims.back();
  const int64_t order = s_dims.back();
  const int64_t batch = static_cast<int64_t>(s.element_count()) /
                        (order > 0 ? order : 1);
  if (static_cast<int64_t>(p.element_count()) != batch * length ||
      static_cast<int64_t>(q.element_count()) != batch * length ||
      static_cast<int64_t>(g->element_count()) != batch * length * order) {
    return ffi::Error::InvalidArgument(
        "allpole lags: p, q (B, T), s (B, K) and g (B, T, K) disagree");
  }
  const auto type = p.element_type();
  if (q.element_type() != type || s.element_type() != type ||
      g->element_type() != type) {
    return ffi::Error::InvalidArgument("allpole lags: mixed dtypes");
  }
  if (length == 0 || order == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      RunLags<float>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      RunLags<double>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    case ffi::DataType::C64:
      RunLags<Complex<float>>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    case ffi::DataType::C128:
      RunLags<Complex<double>>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "allpole lags: float32, float64, complex64 or complex128 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxAllpoleLags, AllpoleLags,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// The coefficients' cotangent of the all-pole recursion with constant
// coefficients: one value per lag,
//   g[b, k] = -sum_t p[b, t] q[b, t - k - 1],   q[b, -j - 1] = s[b, j],
// the sums over time of the lagged products `RetraxAllpoleLags` writes one
// per sample. Each lag is a dot product of two signals, summed in vector
// registers (two accumulators of a vector's lanes each) where XLA's CPU
// reductions of shifted operands run a scalar loop, a pass per lag.
//
// Operands: p, q (B, T), s (B, K); result g (B, K). Real dtypes.

namespace {

template <typename T>
inline __attribute__((always_inline)) T Dot(const T* __restrict__ x,
                                            const T* __restrict__ y,
                                            int64_t n) {
  typedef T V __attribute__((vector_size(32)));
  constexpr int64_t W = 32 / sizeof(T);
  V a0 = {}, a1 = {};
  int64_t i = 0;
  for (; i + 2 * W <= n; i += 2 * W) {
    V x0, x1, y0, y1;
    std::memcpy(&x0, x + i, sizeof(V));
    std::memcpy(&x1, x + i + W, sizeof(V));
    std::memcpy(&y0, y + i, sizeof(V));
    std::memcpy(&y1, y + i + W, sizeof(V));
    a0 += x0 * y0;
    a1 += x1 * y1;
  }
  a0 += a1;
  T r = T(0);
  for (int64_t l = 0; l < W; ++l) r += a0[l];
  for (; i < n; ++i) r += x[i] * y[i];
  return r;
}

template <typename T>
inline __attribute__((always_inline)) void LagDotBatch(
    const T* p, const T* q, const T* s, T* g, int64_t length, int64_t batch,
    int64_t order) {
  for (int64_t b = 0; b < batch; ++b) {
    const T* pb = p + b * length;
    const T* qb = q + b * length;
    const T* sb = s + b * order;
    for (int64_t k = 0; k < order; ++k) {
      // t >= k + 1 reads the signal, t <= k the state
      T sum = length > k + 1 ? Dot<T>(pb + k + 1, qb, length - k - 1) : T(0);
      for (int64_t t = 0; t <= k && t < length; ++t) sum += pb[t] * sb[k - t];
      g[b * order + k] = -sum;
    }
  }
}

#ifdef RETRAX_X86
template <typename T>
__attribute__((target("avx2,fma"))) void LagDotAvx2(const T* p, const T* q,
                                                    const T* s, T* g,
                                                    int64_t length,
                                                    int64_t batch,
                                                    int64_t order) {
  LagDotBatch<T>(p, q, s, g, length, batch, order);
}
#endif

template <typename T>
void LagDotPortable(const T* p, const T* q, const T* s, T* g, int64_t length,
                    int64_t batch, int64_t order) {
  LagDotBatch<T>(p, q, s, g, length, batch, order);
}

template <typename T>
void RunLagDot(ffi::ThreadPool& pool, const ffi::AnyBuffer& p,
               const ffi::AnyBuffer& q, const ffi::AnyBuffer& s,
               ffi::Result<ffi::AnyBuffer>& g, int64_t length, int64_t batch,
               int64_t order) {
  auto run = LagDotPortable<T>;
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) run = LagDotAvx2<T>;
#endif
  const T* p_ = static_cast<const T*>(p.untyped_data());
  const T* q_ = static_cast<const T*>(q.untyped_data());
  const T* s_ = static_cast<const T*>(s.untyped_data());
  T* g_ = static_cast<T*>(g->untyped_data());
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(p_ + first * length, q_ + first * length, s_ + first * order,
        g_ + first * order, length, count, order);
  });
}

ffi::Error AllpoleLagDot(ffi::ThreadPool pool, ffi::AnyBuffer p,
                         ffi::AnyBuffer q, ffi::AnyBuffer s,
                         ffi::Result<ffi::AnyBuffer> g) {
  const auto dims = p.dimensions();
  const auto s_dims = s.dimensions();
  if (dims.size() != 2 || s_dims.size() != 2) {
    return ffi::Error::InvalidArgument(
        "allpole lag dot: p, q need shape (B, T), s (B, K)");
  }
  const int64_t batch = dims[0], length = dims[1], order = s_dims[1];
  if (s_dims[0] != batch ||
      static_cast<int64_t>(q.element_count()) != batch * length ||
      static_cast<int64_t>(g->element_count()) != batch * order) {
    return ffi::Error::InvalidArgument(
        "allpole lag dot: p, q (B, T), s (B, K) and g (B, K) disagree");
  }
  const auto type = p.element_type();
  if (q.element_type() != type || s.element_type() != type ||
      g->element_type() != type) {
    return ffi::Error::InvalidArgument("allpole lag dot: mixed dtypes");
  }
  if (batch == 0 || order == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      RunLagDot<float>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      RunLagDot<double>(pool, p, q, s, g, length, batch, order);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "allpole lag dot: float32 or float64 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxAllpoleLagDot, AllpoleLagDot,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
