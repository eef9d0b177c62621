// The switched attack/release recursion of `retrax.ops.ballistics` as an XLA
// FFI kernel for the CPU, for a batch of signals. For every signal:
//
//   c[t] = at if x[t] < y[t-1] else rt,
//   y[t] = fma(c, x[t], (1 - c) y[t-1]),      y[-1] = zi,
//
// with `at` and `rt` one value per signal or one per sample. The rounding is
// that of the `lax.scan` fallback as XLA's CPU compiler builds it (it fuses
// `(1 - c) y + c x` into one multiply-add whose addend is the rounded
// `(1 - c) y`), so the two give the same numbers, bit for bit; the tests
// check it.
//
// The recursion is nonlinear (each step compares the input with the previous
// output), so it has no parallel form in time: one signal costs the latency
// of a multiply, a multiply-add and a select per sample. The batch's signals
// are independent, so on x86 CPUs with AVX2 a group of 8 float32 (4 float64)
// signals advances in the lanes of one SIMD register (with per-signal
// coefficients two groups advance together, so that their chains overlap). The operands arrive in the user's
// layout, `(B, T)` (sample t of signal b at `b * T + t`, per-sample
// coefficients likewise, per-signal ones at `b`), so each block of 8 (4)
// samples of a group is transposed in registers into one register per time
// step, and the outputs transposed back; memory is read and written in the
// order it is stored, once. Other CPUs run a portable loop of the same
// steps, signal by signal.
//
// Only values are computed here: derivatives hold the switch decisions fixed
// and run on retrax's recurrence core.

#include <cmath>
#include <cstdint>

#include "cpu.h"
#include "pages.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RETRAX_X86 1
#define RETRAX_AVX2 __attribute__((target("avx2,fma")))
#endif

namespace ffi = xla::ffi;

namespace {

// One step of one signal. The comparison runs while both candidate updates
// are formed, so a step's dependency chain is a multiply, a multiply-add and
// a select, with no branch to mispredict where attack and release alternate.
template <typename T>
inline T Step(T y, T x, T a, T r) {
  const T attack = std::fma(a, x, (T(1) - a) * y);
  const T release = std::fma(r, x, (T(1) - r) * y);
  return x < y ? attack : release;
}

// Any CPU: a few signals at a time, sample by sample, so their independent
// chains overlap.
template <typename T, bool per_sample, int lanes>
void PortableGroup(const T* __restrict__ x, const T* __restrict__ at,
                   const T* __restrict__ rt, const T* __restrict__ zi,
                   T* __restrict__ y, int64_t length) {
  T state[lanes], a[lanes], r[lanes];
  for (int l = 0; l < lanes; ++l) {
    state[l] = zi[l];
    a[l] = at[l];
    r[l] = rt[l];
  }
  for (int64_t t = 0; t < length; ++t) {
    for (int l = 0; l < lanes; ++l) {
      const int64_t i = l * length + t;
      if (per_sample) {
        a[l] = at[i];
        r[l] = rt[i];
      }
      state[l] = Step(state[l], x[i], a[l], r[l]);
      y[i] = state[l];
    }
  }
}

template <typename T, bool per_sample>
void Portable(const T* x, const T* at, const T* rt, const T* zi, T* y,
              int64_t batch, int64_t length) {
  int64_t first = 0;
  auto group = [&](auto run, int64_t lanes) {
    for (; batch - first >= lanes; first += lanes) {
      const int64_t offset = first * length;
      const int64_t k = per_sample ? offset : first;
      run(x + offset, at + k, rt + k, zi + first, y + offset, length);
    }
  };
  group(PortableGroup<T, per_sample, 4>, 4);
  group(PortableGroup<T, per_sample, 1>, 1);
}

#ifdef RETRAX_X86
// AVX2 registers of W lanes, and the in-register transposes. A block of W
// samples of W signals is loaded as 2 x W/2 registers, each holding half a
// row of signal k in its low 128 bits and the same half row of signal
// k + W/2 in its high 128 bits; a (W/2) x (W/2) transpose within each
// 128-bit lane then leaves one time step of the W signals per register, in
// signal order. The same transpose, stored half by half, undoes it.
struct F32 {
  using T = float;
  using V = __m256;
  static constexpr int W = 8;
  RETRAX_AVX2 static V Set1(T v) { return _mm256_set1_ps(v); }
  RETRAX_AVX2 static V Load(const T* p) { return _mm256_loadu_ps(p); }
  RETRAX_AVX2 static V LoadHalves(const T* lo, const T* hi) {
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(lo)),
                                _mm_loadu_ps(hi), 1);
  }
  RETRAX_AVX2 static void StoreHalves(T* lo, T* hi, V v) {
    _mm_storeu_ps(lo, _mm256_castps256_ps128(v));
    _mm_storeu_ps(hi, _mm256_extractf128_ps(v, 1));
  }
  RETRAX_AVX2 static void Transpose(V* v) {  // 4 x 4 in each 128-bit lane
    const V t0 = _mm256_unpacklo_ps(v[0], v[1]);
    const V t1 = _mm256_unpackhi_ps(v[0], v[1]);
    const V t2 = _mm256_unpacklo_ps(v[2], v[3]);
    const V t3 = _mm256_unpackhi_ps(v[2], v[3]);
    v[0] = _mm256_shuffle_ps(t0, t2, 0x44);
    v[1] = _mm256_shuffle_ps(t0, t2, 0xEE);
    v[2] = _mm256_shuffle_ps(t1, t3, 0x44);
    v[3] = _mm256_shuffle_ps(t1, t3, 0xEE);
  }
  RETRAX_AVX2 static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  RETRAX_AVX2 static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  RETRAX_AVX2 static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  // where x < y (ordered: a NaN input takes the release update), a; else b
  RETRAX_AVX2 static V PickLess(V x, V y, V a, V b) {
    return _mm256_blendv_ps(b, a, _mm256_cmp_ps(x, y, _CMP_LT_OQ));
  }
};

struct F64 {
  using T = double;
  using V = __m256d;
  static constexpr int W = 4;
  RETRAX_AVX2 static V Set1(T v) { return _mm256_set1_pd(v); }
  RETRAX_AVX2 static V Load(const T* p) { return _mm256_loadu_pd(p); }
  RETRAX_AVX2 static V LoadHalves(const T* lo, const T* hi) {
    return _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadu_pd(lo)),
                                _mm_loadu_pd(hi), 1);
  }
  RETRAX_AVX2 static void StoreHalves(T* lo, T* hi, V v) {
    _mm_storeu_pd(lo, _mm256_castpd256_pd128(v));
    _mm_storeu_pd(hi, _mm256_extractf128_pd(v, 1));
  }
  RETRAX_AVX2 static void Transpose(V* v) {  // 2 x 2 in each 128-bit lane
    const V t0 = _mm256_unpacklo_pd(v[0], v[1]);
    const V t1 = _mm256_unpackhi_pd(v[0], v[1]);
    v[0] = t0;
    v[1] = t1;
  }
  RETRAX_AVX2 static V Sub(V a, V b) { return _mm256_sub_pd(a, b); }
  RETRAX_AVX2 static V Mul(V a, V b) { return _mm256_mul_pd(a, b); }
  RETRAX_AVX2 static V Fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  RETRAX_AVX2 static V PickLess(V x, V y, V a, V b) {
    return _mm256_blendv_pd(b, a, _mm256_cmp_pd(x, y, _CMP_LT_OQ));
  }
};

// The rows of one operand for the W signals of a group: signal l's sample t
// at `row[l] + (t & mask[l])`. A group past the end of the batch has rows
// of zeros (mask 0) in its unused lanes, read and written in place of
// signals, so every group runs the same code.
template <typename T, int W>
struct Rows {
  const T* row[W];
  int64_t mask[W];
};

// The transposed block of W samples from `t0`: out[s] holds sample t0 + s of
// the W signals.
template <typename Op>
RETRAX_AVX2 inline __attribute__((always_inline)) void LoadBlock(
    const Rows<typename Op::T, Op::W>& rows, int64_t t0, typename Op::V* out) {
  constexpr int H = Op::W / 2;
  for (int j = 0; j < 2; ++j) {
    for (int k = 0; k < H; ++k) {
      const auto* lo = rows.row[k] + (t0 & rows.mask[k]) + j * H;
      const auto* hi = rows.row[k + H] + (t0 & rows.mask[k + H]) + j * H;
      out[j * H + k] = Op::LoadHalves(lo, hi);
    }
    Op::Transpose(out + j * H);
  }
}

template <typename Op>
RETRAX_AVX2 inline __attribute__((always_inline)) void StoreBlock(
    typename Op::T* const* rows, const int64_t* mask, int64_t t0,
    typename Op::V* in) {
  constexpr int H = Op::W / 2;
  for (int j = 0; j < 2; ++j) {
    Op::Transpose(in + j * H);
    for (int k = 0; k < H; ++k) {
      auto* lo = rows[k] + (t0 & mask[k]) + j * H;
      auto* hi = rows[k + H] + (t0 & mask[k + H]) + j * H;
      Op::StoreHalves(lo, hi, in[j * H + k]);
    }
  }
}

// One group of W signals: where its operands are, and its state.
template <typename Op>
struct Group {
  using T = typename Op::T;
  using V = typename Op::V;
  Rows<T, Op::W> x, at, rt;
  T* y[Op::W];
  V state, a, r, not_a, not_r;  // per-signal coefficients and 1 - them
};

// `steps` (at most W) steps of G groups from sample t0, in lockstep so that
// their dependency chains overlap.
template <typename Op, bool per_sample, int G>
RETRAX_AVX2 inline __attribute__((always_inline)) void Advance(
    Group<Op>* groups, int64_t t0, int steps) {
  using V = typename Op::V;
  constexpr int W = Op::W;
  const V one = Op::Set1(1);
  V x[G][W], a[G][per_sample ? W : 1], r[G][per_sample ? W : 1];
  for (int g = 0; g < G; ++g) {
    LoadBlock<Op>(groups[g].x, t0, x[g]);
    if constexpr (per_sample) {
      LoadBlock<Op>(groups[g].at, t0, a[g]);
      LoadBlock<Op>(groups[g].rt, t0, r[g]);
    }
  }
  for (int s = 0; s < steps; ++s) {
    for (int g = 0; g < G; ++g) {
      Group<Op>& group = groups[g];
      const V xt = x[g][s];
      V at = group.a, rt = group.r, not_a = group.not_a, not_r = group.not_r;
      if constexpr (per_sample) {
        at = a[g][s];
        rt = r[g][s];
        not_a = Op::Sub(one, at);
        not_r = Op::Sub(one, rt);
      }
      const V attack = Op::Fma(at, xt, Op::Mul(not_a, group.state));
      const V release = Op::Fma(rt, xt, Op::Mul(not_r, group.state));
      group.state = Op::PickLess(xt, group.state, attack, release);
      x[g][s] = group.state;
    }
  }
  for (int g = 0; g < G; ++g) {
    StoreBlock<Op>(groups[g].y, groups[g].x.mask, t0, x[g]);
  }
}

// The last `n < W` samples: copied into blocks of zeros, advanced there, and
// the n outputs copied back.
template <typename Op, bool per_sample, int G>
RETRAX_AVX2 void AdvanceTail(Group<Op>* groups, int64_t t0, int n) {
  using T = typename Op::T;
  constexpr int W = Op::W;
  alignas(32) T buffer[G][4][W][W] = {};  // x, at, rt, y
  Group<Op> local[G];
  for (int g = 0; g < G; ++g) {
    local[g] = groups[g];
    const Rows<T, W>* from[3] = {&groups[g].x, &groups[g].at, &groups[g].rt};
    Rows<T, W>* to[3] = {&local[g].x, &local[g].at, &local[g].rt};
    for (int o = 0; o < (per_sample ? 3 : 1); ++o) {
      for (int l = 0; l < W; ++l) {
        const T* row = from[o]->row[l] + (t0 & from[o]->mask[l]);
        for (int i = 0; i < n; ++i) buffer[g][o][l][i] = row[i];
        to[o]->row[l] = buffer[g][o][l];
        to[o]->mask[l] = 0;
      }
    }
    for (int l = 0; l < W; ++l) local[g].y[l] = buffer[g][3][l];
  }
  Advance<Op, per_sample, G>(local, 0, n);
  for (int g = 0; g < G; ++g) {
    groups[g].state = local[g].state;
    for (int l = 0; l < W; ++l) {
      T* row = groups[g].y[l] + (t0 & groups[g].x.mask[l]);
      for (int i = 0; i < n; ++i) row[i] = buffer[g][3][l][i];
    }
  }
}

// A bundle reads and writes 32 rows a few bytes a step (x and y of 16
// signals, or x, at, rt and y of 8): more streams than the CPU's prefetchers
// follow once the batch leaves the caches. So the loop asks for the cache
// line `kAhead` samples ahead in every row as it enters a new line. Measured
// on a 2-core x86 CPU (float32, T = 44,100, B = 64): 1.16 against 1.36 ms
// with per-signal coefficients, 6.4 against 6.9 ms per-sample (and 8.3
// against 13.1 ms when per-sample bundles held two groups); from B = 512 on
// the kernel costs what `x * 2` does either way.
template <typename Op, bool per_sample, int G>
RETRAX_AVX2 inline __attribute__((always_inline)) void Prefetch(
    const Group<Op>* groups, int64_t t) {
  constexpr int W = Op::W;
  for (int g = 0; g < G; ++g) {
    const Group<Op>& group = groups[g];
    for (int l = 0; l < W; ++l) {
      const int64_t at = t & group.x.mask[l];
      __builtin_prefetch(group.x.row[l] + at, 0, 3);
      __builtin_prefetch(group.y[l] + at, 1, 3);
      if constexpr (per_sample) {
        __builtin_prefetch(group.at.row[l] + at, 0, 3);
        __builtin_prefetch(group.rt.row[l] + at, 0, 3);
      }
    }
  }
}

// G groups of W signals from signal `first` on (lanes past `batch` unused).
template <typename Op, bool per_sample, int G>
RETRAX_AVX2 void Bundle(const typename Op::T* x, const typename Op::T* at,
                        const typename Op::T* rt, const typename Op::T* zi,
                        typename Op::T* y, int64_t batch, int64_t length,
                        int64_t first) {
  using T = typename Op::T;
  constexpr int W = Op::W;
  constexpr int64_t kLine = 64 / sizeof(T);  // samples to a cache line
  constexpr int64_t kAhead = 8 * kLine;
  alignas(32) static const T zeros[W] = {};
  alignas(32) T sink[W];  // the unused lanes' outputs
  Group<Op> groups[G];
  for (int g = 0; g < G; ++g) {
    alignas(32) T init[3][W] = {};  // zi, at, rt of each lane
    for (int l = 0; l < W; ++l) {
      const int64_t b = first + g * W + l;
      const bool used = b < batch;
      const int64_t mask = used ? ~int64_t{0} : 0;
      groups[g].x.row[l] = used ? x + b * length : zeros;
      groups[g].y[l] = used ? y + b * length : sink;
      groups[g].x.mask[l] = groups[g].at.mask[l] = groups[g].rt.mask[l] = mask;
      groups[g].at.row[l] = used && per_sample ? at + b * length : zeros;
      groups[g].rt.row[l] = used && per_sample ? rt + b * length : zeros;
      if (used) {
        init[0][l] = zi[b];
        if (!per_sample) {
          init[1][l] = at[b];
          init[2][l] = rt[b];
        }
      }
    }
    const typename Op::V one = Op::Set1(1);
    groups[g].state = Op::Load(init[0]);
    groups[g].a = Op::Load(init[1]);
    groups[g].r = Op::Load(init[2]);
    groups[g].not_a = Op::Sub(one, groups[g].a);
    groups[g].not_r = Op::Sub(one, groups[g].r);
  }
  const int64_t whole = length - length % W;
  for (int64_t t0 = 0; t0 < whole; t0 += W) {
    if (t0 % kLine == 0) Prefetch<Op, per_sample, G>(groups, t0 + kAhead);
    Advance<Op, per_sample, G>(groups, t0, W);
  }
  if (whole < length) {
    AdvanceTail<Op, per_sample, G>(groups, whole, int(length - whole));
  }
}

// Every signal: two groups at a time with per-signal coefficients, one with
// per-sample coefficients (each step then does more work, which covers the
// chain's latency, and three rows a signal are streams enough), and the last
// group's unused lanes cost as much as used ones (a batch of 8k + 1 float32
// signals costs as much as one of 8k + 8).
template <typename Op, bool per_sample>
RETRAX_AVX2 void Avx2(const typename Op::T* x, const typename Op::T* at,
                      const typename Op::T* rt, const typename Op::T* zi,
                      typename Op::T* y, int64_t batch, int64_t length) {
  constexpr int W = Op::W;
  int64_t first = 0;
  for (; !per_sample && batch - first > W; first += 2 * W) {
    Bundle<Op, per_sample, 2>(x, at, rt, zi, y, batch, length, first);
  }
  for (; first < batch; first += W) {
    Bundle<Op, per_sample, 1>(x, at, rt, zi, y, batch, length, first);
  }
}


template <typename T>
struct Lanes;
template <>
struct Lanes<float> {
  using Op = F32;
};
template <>
struct Lanes<double> {
  using Op = F64;
};
#endif

template <typename T, bool per_sample>
void Switched(const T* x, const T* at, const T* rt, const T* zi, T* y,
              int64_t batch, int64_t length) {
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) {
    Avx2<typename Lanes<T>::Op, per_sample>(x, at, rt, zi, y, batch, length);
    return;
  }
#endif
  Portable<T, per_sample>(x, at, rt, zi, y, batch, length);
}

template <typename T>
void Run(ffi::ThreadPool& pool, const ffi::AnyBuffer& x,
         const ffi::AnyBuffer& at, const ffi::AnyBuffer& rt,
         const ffi::AnyBuffer& zi, ffi::Result<ffi::AnyBuffer>& y,
         int64_t batch, int64_t length, bool per_sample) {
  auto run = per_sample ? Switched<T, true> : Switched<T, false>;
  const T* x_ = x.typed_data<T>();
  const T* at_ = at.typed_data<T>();
  const T* rt_ = rt.typed_data<T>();
  const T* zi_ = zi.typed_data<T>();
  T* y_ = y->typed_data<T>();
  retrax::AdviseHugePages(y_, y->size_bytes());
  const int64_t stride = per_sample ? length : 1;
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(x_ + first * length, at_ + first * stride, rt_ + first * stride,
        zi_ + first, y_ + first * length, count, length);
  });
}

ffi::Error Ballistics(ffi::ThreadPool pool, ffi::AnyBuffer x,
                      ffi::AnyBuffer at, ffi::AnyBuffer rt, ffi::AnyBuffer zi,
                      ffi::Result<ffi::AnyBuffer> y) {
  const auto dims = x.dimensions();
  if (dims.size() == 0) {
    return ffi::Error::InvalidArgument("ballistics: x needs a time axis");
  }
  const int64_t length = dims.back();
  const int64_t count = static_cast<int64_t>(x.element_count());
  const int64_t batch = static_cast<int64_t>(zi.element_count());
  const int64_t coefficients = static_cast<int64_t>(at.element_count());
  const bool per_sample = coefficients == count && coefficients != batch;
  if (count != batch * length || (coefficients != batch && !per_sample) ||
      static_cast<int64_t>(rt.element_count()) != coefficients) {
    return ffi::Error::InvalidArgument(
        "ballistics: at and rt need one value per signal or per sample, zi "
        "one per signal");
  }
  const auto type = x.element_type();
  if (at.element_type() != type || rt.element_type() != type ||
      zi.element_type() != type || y->element_type() != type) {
    return ffi::Error::InvalidArgument("ballistics: mixed dtypes");
  }
  if (count == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      Run<float>(pool, x, at, rt, zi, y, batch, length, per_sample);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(pool, x, at, rt, zi, y, batch, length, per_sample);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("ballistics: float32 or float64 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxBallistics, Ballistics,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// The jaxlib whose FFI headers this library was compiled against, reported by
// `retrax.kernels()`. Compatibility with the running jaxlib is XLA's to decide:
// it checks the FFI API version each handler reports when it is registered.
extern "C" const char* RetraxJaxlibVersion() { return RETRAX_JAXLIB_VERSION; }
