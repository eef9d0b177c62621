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
// Time-major (up to `TIME_MAJOR_BATCH` signals in the lowering, one today):
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

// Every signal. A batch stored batch-major runs in blocked groups of 16, 8,
// 4, 2, then 1; one stored time-major (and a single signal, whose layouts
// coincide) in groups of 64, 16, 8, 4, 2, then 1 held in registers, straight
// through its memory.
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
    RETRAX_BLOCKED(16)
    RETRAX_BLOCKED(8)
    RETRAX_BLOCKED(4)
    RETRAX_BLOCKED(2)
    RETRAX_BLOCKED(1)
#undef RETRAX_BLOCKED
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
                                                   int64_t order,
                                                   bool batch_major) {
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
                                                 bool batch_major) {
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint,
              batch_major);
}

bool HasAvx2Fma() {
  static const bool has =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

template <typename T>
void RunPortable(const T* a, const T* u, const T* zi, T* y, int64_t length,
                 int64_t batch, int64_t order, bool per_sample, bool adjoint,
                 bool batch_major) {
  Dispatch<T>(a, u, zi, y, length, batch, order, per_sample, adjoint,
              batch_major);
}

template <typename T>
void Run(const ffi::AnyBuffer& a, const ffi::AnyBuffer& u,
         const ffi::AnyBuffer& zi, ffi::Result<ffi::AnyBuffer>& y,
         int64_t length, int64_t batch, int64_t order, bool per_sample,
         bool adjoint, bool batch_major) {
  auto run = RunPortable<T>;
#ifdef RETRAX_X86
  if (HasAvx2Fma()) run = RunAvx2<T>;
#endif
  run(a.typed_data<T>(), u.typed_data<T>(), zi.typed_data<T>(),
      y->typed_data<T>(), length, batch, order, per_sample, adjoint,
      batch_major);
}

ffi::Error Allpole(ffi::AnyBuffer a, ffi::AnyBuffer u, ffi::AnyBuffer zi,
                   ffi::Result<ffi::AnyBuffer> y, bool adjoint,
                   bool batch_major) {
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
      Run<float>(a, u, zi, y, length, batch, order, per_sample, adjoint,
                 batch_major);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(a, u, zi, y, length, batch, order, per_sample, adjoint,
                  batch_major);
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
                                  .Attr<bool>("adjoint")
                                  .Attr<bool>("batch_major"));
