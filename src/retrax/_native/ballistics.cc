// The switched attack/release recursion of `retrax.ops.ballistics` as an XLA
// FFI kernel for the CPU. The recursion is nonlinear (each step compares the
// input with the previous output), so it has no parallel form, and the cost
// of one step is the latency of its multiply-add and select. XLA's while
// loop adds several nanoseconds of bookkeeping to every iteration; this loop
// does not. Only values are computed here: derivatives hold the switch
// decisions fixed and run on retrax's recurrence core.

#include <cmath>
#include <cstdint>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define RETRAX_X86 1
#define RETRAX_TARGET __attribute__((target("avx,fma")))
#endif

namespace ffi = xla::ffi;

namespace {

// One step for every signal of a group of `lanes`:
//   y[t] = (1 - c) y[t-1] + c x[t],  c = at if x[t] < y[t-1] else rt,
// with both candidate updates formed as fma(1 - c, y[t-1], c x[t]) while the
// comparison runs, so the dependency chain of a step is one multiply-add and
// a select. Signals are stored one after another (`length` samples each);
// `at` and `rt` hold one value per signal or, if `per_sample`, one per
// sample. Advancing several signals together overlaps their chains.
template <typename T, bool per_sample, int lanes>
void SwitchedPortable(const T* __restrict__ x, const T* __restrict__ at,
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
      const T xt = x[i];
      if (per_sample) {
        a[l] = at[i];
        r[l] = rt[i];
      }
      const T attack = std::fma(T(1) - a[l], state[l], a[l] * xt);
      const T release = std::fma(T(1) - r[l], state[l], r[l] * xt);
      state[l] = xt < state[l] ? attack : release;
      y[i] = state[l];
    }
  }
}

#ifdef RETRAX_X86
// The same loop in AVX scalar instructions, bit for bit the same numbers.
// Compilers turn the conditional above into a branch, which real signals
// (attack and release alternating at random) mispredict often; here the
// comparison gives a mask and a blend picks the update, off the chain.
template <typename T>
struct X86;

template <>
struct X86<float> {
  using V = __m128;
  RETRAX_TARGET static V Load(const float* p) { return _mm_load_ss(p); }
  RETRAX_TARGET static void Store(float* p, V v) { _mm_store_ss(p, v); }
  RETRAX_TARGET static V Mul(V a, V b) { return _mm_mul_ss(a, b); }
  RETRAX_TARGET static V Sub(V a, V b) { return _mm_sub_ss(a, b); }
  RETRAX_TARGET static V Fma(V a, V b, V c) { return _mm_fmadd_ss(a, b, c); }
  RETRAX_TARGET static V PickLess(V x, V y, V a, V b) {
    return _mm_blendv_ps(b, a, _mm_cmplt_ss(x, y));
  }
};

template <>
struct X86<double> {
  using V = __m128d;
  RETRAX_TARGET static V Load(const double* p) { return _mm_load_sd(p); }
  RETRAX_TARGET static void Store(double* p, V v) { _mm_store_sd(p, v); }
  RETRAX_TARGET static V Mul(V a, V b) { return _mm_mul_sd(a, b); }
  RETRAX_TARGET static V Sub(V a, V b) { return _mm_sub_sd(a, b); }
  RETRAX_TARGET static V Fma(V a, V b, V c) { return _mm_fmadd_sd(a, b, c); }
  RETRAX_TARGET static V PickLess(V x, V y, V a, V b) {
    return _mm_blendv_pd(b, a, _mm_cmplt_sd(x, y));
  }
};

template <typename T, bool per_sample, int lanes>
RETRAX_TARGET void SwitchedX86(const T* __restrict__ x,
                               const T* __restrict__ at,
                               const T* __restrict__ rt,
                               const T* __restrict__ zi, T* __restrict__ y,
                               int64_t length) {
  using Op = X86<T>;
  using V = typename Op::V;
  const T unit = 1;
  const V one = Op::Load(&unit);
  V state[lanes], a[lanes], r[lanes];
  for (int l = 0; l < lanes; ++l) {
    state[l] = Op::Load(zi + l);
    a[l] = Op::Load(at + l);
    r[l] = Op::Load(rt + l);
  }
  for (int64_t t = 0; t < length; ++t) {
    for (int l = 0; l < lanes; ++l) {
      const int64_t i = l * length + t;
      const V xt = Op::Load(x + i);
      if (per_sample) {
        a[l] = Op::Load(at + i);
        r[l] = Op::Load(rt + i);
      }
      const V attack =
          Op::Fma(Op::Sub(one, a[l]), state[l], Op::Mul(a[l], xt));
      const V release =
          Op::Fma(Op::Sub(one, r[l]), state[l], Op::Mul(r[l], xt));
      state[l] = Op::PickLess(xt, state[l], attack, release);
      Op::Store(y + i, state[l]);
    }
  }
}

bool HasAvxFma() {
  static const bool has =
      __builtin_cpu_supports("avx") && __builtin_cpu_supports("fma");
  return has;
}
#endif

template <typename T, bool per_sample, int lanes>
void Switched(const T* x, const T* at, const T* rt, const T* zi, T* y,
              int64_t length) {
#ifdef RETRAX_X86
  if (HasAvxFma()) {
    SwitchedX86<T, per_sample, lanes>(x, at, rt, zi, y, length);
    return;
  }
#endif
  SwitchedPortable<T, per_sample, lanes>(x, at, rt, zi, y, length);
}

// All `batch` signals: eight at a time, then the rest in smaller groups.
template <typename T, bool per_sample>
void SwitchedBatch(const T* x, const T* at, const T* rt, const T* zi, T* y,
                   int64_t batch, int64_t length) {
  int64_t first = 0;
  auto group = [&](auto run, int64_t lanes) {
    for (; batch - first >= lanes; first += lanes) {
      const int64_t offset = first * length;
      const int64_t k = per_sample ? offset : first;
      run(x + offset, at + k, rt + k, zi + first, y + offset, length);
    }
  };
  group(Switched<T, per_sample, 8>, 8);
  group(Switched<T, per_sample, 4>, 4);
  group(Switched<T, per_sample, 2>, 2);
  group(Switched<T, per_sample, 1>, 1);
}

template <typename T>
void Run(const ffi::AnyBuffer& x, const ffi::AnyBuffer& at,
         const ffi::AnyBuffer& rt, const ffi::AnyBuffer& zi,
         ffi::Result<ffi::AnyBuffer>& y, int64_t batch, int64_t length,
         bool per_sample) {
  auto run = per_sample ? SwitchedBatch<T, true> : SwitchedBatch<T, false>;
  run(x.typed_data<T>(), at.typed_data<T>(), rt.typed_data<T>(),
      zi.typed_data<T>(), y->typed_data<T>(), batch, length);
}

ffi::Error Ballistics(ffi::AnyBuffer x, ffi::AnyBuffer at, ffi::AnyBuffer rt,
                      ffi::AnyBuffer zi, ffi::Result<ffi::AnyBuffer> y) {
  const auto dims = x.dimensions();
  if (dims.size() == 0) {
    return ffi::Error::InvalidArgument("ballistics: x needs a time axis");
  }
  const int64_t length = dims.back();
  const int64_t count = static_cast<int64_t>(x.element_count());
  const int64_t batch = length == 0 ? 0 : count / length;
  const int64_t coefficients = static_cast<int64_t>(at.element_count());
  const bool per_sample = coefficients == count;
  if ((coefficients != batch && !per_sample) ||
      static_cast<int64_t>(rt.element_count()) != coefficients ||
      static_cast<int64_t>(zi.element_count()) != batch) {
    return ffi::Error::InvalidArgument(
        "ballistics: at and rt need one value per signal or per sample, zi "
        "one per signal");
  }
  const auto type = x.element_type();
  if (at.element_type() != type || rt.element_type() != type ||
      zi.element_type() != type || y->element_type() != type) {
    return ffi::Error::InvalidArgument("ballistics: mixed dtypes");
  }
  switch (type) {
    case ffi::DataType::F32:
      Run<float>(x, at, rt, zi, y, batch, length, per_sample);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(x, at, rt, zi, y, batch, length, per_sample);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("ballistics: float32 or float64 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxBallistics, Ballistics,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

// The jaxlib whose FFI headers this library was compiled against, reported by
// `retrax.kernels()`. Compatibility with the running jaxlib is XLA's to decide:
// it checks the FFI API version each handler reports when it is registered.
extern "C" const char* RetraxJaxlibVersion() { return RETRAX_JAXLIB_VERSION; }
