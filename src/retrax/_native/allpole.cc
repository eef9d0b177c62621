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
// The operands arrive time-major (the lowering asks XLA for that layout):
// sample t of signal b at `t * B + b`, per-sample coefficients at
// `(t * K + k) * B + b`, constant coefficients and states at `k * B + b`.
// The recursion of one signal is a chain of dependent multiply-adds; the
// loop advances a group of W signals per step, so the W chains share SIMD
// registers and the step costs about what one signal's does.

#include <cstdint>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// One group of W signals starting at lane `first` of a batch of `batch`
// (K > 0: the order at compile time; K == 0: `order` at run time).
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

// A wide batch: `width` signals advanced one time step at a time, their
// states in a buffer that stays in the L1 cache, so that memory is read in
// the order it is stored (a narrow group striding over a long batch misses
// the TLB on nearly every step). The lanes' chains are independent, so the
// step is bound by throughput, not latency.
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Wide(
    const T* __restrict__ a, const T* __restrict__ u, const T* __restrict__ zi,
    T* __restrict__ y, int64_t length, int64_t batch, int64_t first,
    int64_t width, int64_t order_) {
  const int64_t order = K > 0 ? K : order_;
  std::vector<T> state_(order * width), coeff_(per_sample ? 0 : order * width);
  T* __restrict__ state = state_.data();
  T* __restrict__ coeff = coeff_.data();
  for (int64_t k = 0; k < order; ++k) {
    for (int64_t l = 0; l < width; ++l) {
      state[k * width + l] = zi[k * batch + first + l];
      if (!per_sample) coeff[k * width + l] = a[k * batch + first + l];
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = adjoint ? length - 1 - i : i;
    const T* __restrict__ ut = u + t * batch + first;
    T* __restrict__ yt = y + t * batch + first;
    for (int64_t l = 0; l < width; ++l) yt[l] = ut[l];
    for (int64_t k = order - 1; k >= 0; --k) {
      const T* __restrict__ s = state + k * width;
      if (per_sample) {
        const int64_t row = adjoint ? t + k + 1 : t;
        if (adjoint && row >= length) continue;  // zero past the end
        const T* __restrict__ at = a + (row * order + k) * batch + first;
        for (int64_t l = 0; l < width; ++l) yt[l] -= at[l] * s[l];
      } else {
        const T* __restrict__ c = coeff + k * width;
        for (int64_t l = 0; l < width; ++l) yt[l] -= c[l] * s[l];
      }
    }
    for (int64_t k = order - 1; k > 0; --k) {
      T* __restrict__ to = state + k * width;
      const T* __restrict__ from = state + (k - 1) * width;
      for (int64_t l = 0; l < width; ++l) to[l] = from[l];
    }
    for (int64_t l = 0; l < width; ++l) state[l] = yt[l];
  }
}

// Every signal: a wide batch in blocks of up to 1024 lanes; a narrow one in
// groups of 64, 16, 8, 4, 2, then 1 held in registers.
template <typename T, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Batch(const T* a, const T* u,
                                                 const T* zi, T* y,
                                                 int64_t length, int64_t batch,
                                                 int64_t order) {
  int64_t first = 0;
  if (batch > 64) {
    constexpr int64_t kBlock = 1024;
    for (; first < batch; first += kBlock) {
      const int64_t width = batch - first < kBlock ? batch - first : kBlock;
      Wide<T, K, per_sample, adjoint>(a, u, zi, y, length, batch, first, width,
                                      order);
    }
    return;
  }
#define RETRAX_GROUPS(W)                                                   \
  for (; batch - first >= W; first += W) {                                 \
    Group<T, K, W, per_sample, adjoint>(a, u, zi, y, length, batch, first, \
                                        order);                            \
  }
  RETRAX_GROUPS(64)
  RETRAX_GROUPS(16)
  RETRAX_GROUPS(8)
  RETRAX_GROUPS(4)
  RETRAX_GROUPS(2)
  RETRAX_GROUPS(1)
#undef RETRAX_GROUPS
}

template <typename T, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void ByOrder(const T* a, const T* u,
                                                   const T* zi, T* y,
                                                   int64_t length,
                                                   int64_t batch,
                                                   int64_t order) {
  switch (order) {
    case 1:
      return Batch<T, 1, per_sample, adjoint>(a, u, zi, y, length, batch, 1);
    case 2:
      return Batch<T, 2, per_sample, adjoint>(a, u, zi, y, length, batch, 2);
    default:
      return Batch<T, 0, per_sample, adjoint>(a, u, zi, y, length, batch,
                                              order);
  }
}

template <typename T>
inline __attribute__((always_inline)) void Dispatch(const T* a, const T* u,
                                                    const T* zi, T* y,
                                                    int64_t length,
                                                    int64_t batch,
                                                    int64_t order,
                                                    bool per_sample,
                                                    bool adjoint) {
  if (per_sample) {
    if (adjoint) return ByOrder<T, true, true>(a, u, zi, y, length, batch, order);
    return ByOrder<T, true, false>(a, u, zi, y, length, batch, order);
  }
  if (adjoint) return ByOrder<T, false, true>(a, u, zi, y, length, batch, order);
  return ByOrder<T, false, false>(a, u, zi, y, length, batch, order);
}

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
                                                 bool adjoint) {
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint);
}

bool HasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

template <typename T>
void RunPortable(const T* a, const T* u, const T* zi, T* y, int64_t length,
                 int64_t batch, int64_t order, bool per_sample, bool adjoint) {
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint);
}

template <typename T>
void Run(const ffi::AnyBuffer& a, const ffi::AnyBuffer& u,
         const ffi::AnyBuffer& zi, ffi::Result<ffi::AnyBuffer>& y,
         int64_t length, int64_t batch, int64_t order, bool per_sample,
         bool adjoint) {
  auto run = RunPortable<T>;
#ifdef RETRAX_X86
  if (HasAvx2Fma()) run = RunAvx2<T>;
#endif
  run(a.typed_data<T>(), u.typed_data<T>(), zi.typed_data<T>(),
      y->typed_data<T>(), length, batch, order, per_sample, adjoint);
}

ffi::Error Allpole(ffi::AnyBuffer a, ffi::AnyBuffer u, ffi::AnyBuffer zi,
                   ffi::Result<ffi::AnyBuffer> y, bool adjoint) {
  const auto dims = u.dimensions();
  const auto zi_dims = zi.dimensions();
  if (dims.size() == 0 || zi_dims.size() == 0) {
    return ffi::Error::InvalidArgument("allpole: u needs a time axis");
  }
  const int64_t length = dims.back();
  const int64_t order = zi_dims.back();
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
      Run<float>(a, u, zi, y, length, batch, order, per_sample, adjoint);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(a, u, zi, y, length, batch, order, per_sample, adjoint);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("allpole: float32 or float64 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxAllpole, Allpole,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("adjoint"));
