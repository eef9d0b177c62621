// The diagonal and dense recursions of retrax's recurrence core as an XLA FFI
// kernel for the CPU, for a batch of signals, real or complex.
//
// Forward (`adjoint = false`), for every signal b, with states of N values:
//   h[t] = M[t] h[t-1] + u[t],   h[-1] = zi,   t = 0 .. T-1;
// adjoint (`adjoint = true`), the transposed recursion run backwards in time
// with time-shifted coefficients (absent past the end for per-sample ones):
//   w[s] = u[s] + M[s+1]^T w[s+1],   w[T] = zi,   s = T-1 .. 0;
// the transpose without complex conjugation (JAX's linear transpose). M[t] is
// `diag(a[t])` (`dense = false`) or the matrix `A[t]` (`dense = true`), the
// same at every t for constant coefficients.
//
// Every operand is read in the caller's layout, batch-major with the N
// values of a sample innermost: u, y of shape (B, T, N); zi (B, N); a of
// shape (B, N) or (B, T, N) (diagonal), (B, N, N) or (B, T, N, N) (dense).
// A complex value is its real part followed by its imaginary part.
//
// A recursion is a chain of dependent multiply-adds, so the loops advance W
// independent chains at once in SIMD lanes: W channels of one signal, or of
// consecutive signals when a signal has fewer than W (diagonal), or W
// signals (dense). Complex products are written out on real and imaginary
// parts, which the compiler vectorizes (std::complex's operator* calls a
// NaN-checking helper that it does not).

#include <cstdint>
#include <vector>

#include "cpu.h"
#include "pages.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// acc += c * h, on real numbers or complex ones given as (re, im) pairs.
template <typename R, bool C>
inline __attribute__((always_inline)) void MulAdd(R& acc_re, R& acc_im, R c_re,
                                                  R c_im, R h_re, R h_im) {
  if (C) {
    acc_re += c_re * h_re - c_im * h_im;
    acc_im += c_re * h_im + c_im * h_re;
  } else {
    acc_re += c_re * h_re;
  }
}

// R values per element: 2 for a complex one.
template <bool C>
constexpr int64_t kParts = C ? 2 : 1;

// W chains of the diagonal recursion. Chain l is one channel whose samples
// lie at `offset[l] + t * stride` (in elements), and whose state (and
// constant coefficient) at `unit[l]`. `contiguous`: the chains are W
// neighbouring channels of one signal, `offset[l] = offset[0] + l`.
template <typename R, bool C, int W, bool per_sample, bool adjoint,
          bool contiguous>
inline __attribute__((always_inline)) void Diagonal(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t length, int64_t stride,
    const int64_t* __restrict__ offset_, const int64_t* __restrict__ unit_) {
  constexpr int64_t P = kParts<C>;
  int64_t offset[W], unit[W];
  for (int l = 0; l < W; ++l) {
    offset[l] = P * (contiguous ? offset_[0] + l : offset_[l]);
    unit[l] = P * (contiguous ? unit_[0] + l : unit_[l]);
  }
  R h_re[W], h_im[W], c_re[W], c_im[W];
  for (int l = 0; l < W; ++l) {
    h_re[l] = zi[unit[l]];
    h_im[l] = C ? zi[unit[l] + 1] : R(0);
    // the adjoint's per-sample coefficient of row T is absent: zero
    c_re[l] = per_sample ? R(0) : a[unit[l]];
    c_im[l] = per_sample || !C ? R(0) : a[unit[l] + 1];
  }
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = adjoint ? length - 1 - i : i;
    const int64_t at = P * t * stride;
    if (per_sample && !adjoint) {
      for (int l = 0; l < W; ++l) {
        c_re[l] = a[offset[l] + at];
        if (C) c_im[l] = a[offset[l] + at + 1];
      }
    }
    R acc_re[W], acc_im[W];
    for (int l = 0; l < W; ++l) {
      acc_re[l] = u[offset[l] + at];
      acc_im[l] = C ? u[offset[l] + at + 1] : R(0);
      MulAdd<R, C>(acc_re[l], acc_im[l], c_re[l], c_im[l], h_re[l], h_im[l]);
      h_re[l] = acc_re[l];
      h_im[l] = acc_im[l];
      y[offset[l] + at] = acc_re[l];
      if (C) y[offset[l] + at + 1] = acc_im[l];
    }
    if (per_sample && adjoint) {  // row t's coefficient acts on step t - 1
      for (int l = 0; l < W; ++l) {
        c_re[l] = a[offset[l] + at];
        if (C) c_im[l] = a[offset[l] + at + 1];
      }
    }
  }
}

// Every channel of every signal: B * N chains, numbered b * N + n, taken W at
// a time (W neighbouring channels of one signal where they exist, otherwise
// the next W chains across signals), then one at a time.
template <typename R, bool C, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void DiagonalAll(
    const R* a, const R* u, const R* zi, R* y, int64_t length, int64_t batch,
    int64_t n) {
  constexpr int W = 8;
  const int64_t chains = batch * n;
  int64_t first = 0;
  int64_t offset[W], unit[W];
  for (; chains - first >= W; first += W) {
    for (int l = 0; l < W; ++l) {
      const int64_t c = first + l, b = c / n, k = c % n;
      unit[l] = c;
      offset[l] = b * length * n + k;
    }
    if (first % n + W <= n) {
      Diagonal<R, C, W, per_sample, adjoint, true>(a, u, zi, y, length, n,
                                                   offset, unit);
    } else {
      Diagonal<R, C, W, per_sample, adjoint, false>(a, u, zi, y, length, n,
                                                    offset, unit);
    }
  }
  for (; first < chains; ++first) {
    const int64_t b = first / n, k = first % n;
    unit[0] = first;
    offset[0] = b * length * n + k;
    Diagonal<R, C, 1, per_sample, adjoint, true>(a, u, zi, y, length, n, offset,
                                                 unit);
  }
}

// W signals `first .. first + W - 1` of the dense recursion, each with its
// state of N values (K > 0: N at compile time; K == 0: `n` at run time).
template <typename R, bool C, int K, int W, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void Dense(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t length, int64_t first, int64_t n_) {
  constexpr int64_t P = kParts<C>;
  const int64_t n = K > 0 ? K : n_;
  constexpr int kStack = K > 0 ? K : 1;
  // state, next state, constant matrix: [row][col][lane] (re, im)
  R s_h_re[kStack][W], s_h_im[kStack][W], s_g_re[kStack][W],
      s_g_im[kStack][W];
  R s_m_re[kStack * kStack][W], s_m_im[kStack * kStack][W];
  std::vector<R> heap;
  R(*h_re)[W] = s_h_re;
  R(*h_im)[W] = s_h_im;
  R(*g_re)[W] = s_g_re;
  R(*g_im)[W] = s_g_im;
  R(*m_re)[W] = s_m_re;
  R(*m_im)[W] = s_m_im;
  if (K == 0) {
    heap.resize((4 * n + 2 * n * n) * W);
    R* p = heap.data();
    h_re = reinterpret_cast<R(*)[W]>(p);
    h_im = reinterpret_cast<R(*)[W]>(p + n * W);
    g_re = reinterpret_cast<R(*)[W]>(p + 2 * n * W);
    g_im = reinterpret_cast<R(*)[W]>(p + 3 * n * W);
    m_re = reinterpret_cast<R(*)[W]>(p + 4 * n * W);
    m_im = reinterpret_cast<R(*)[W]>(p + (4 * n + n * n) * W);
  }
  for (int l = 0; l < W; ++l) {
    const int64_t b = first + l;
    for (int64_t r = 0; r < n; ++r) {
      h_re[r][l] = zi[P * (b * n + r)];
      h_im[r][l] = C ? zi[P * (b * n + r) + 1] : R(0);
    }
    if (!per_sample) {
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t c = 0; c < n; ++c) {
          // the adjoint multiplies by the transpose: store it transposed
          const int64_t from = P * ((b * n + (adjoint ? c : r)) * n +
                                    (adjoint ? r : c));
          m_re[r * n + c][l] = a[from];
          m_im[r * n + c][l] = C ? a[from + 1] : R(0);
        }
      }
    }
  }
  for (int64_t i = 0; i < length; ++i) {
    const int64_t t = adjoint ? length - 1 - i : i;
    // the matrix acting at step t: A[t] (forward), A[t+1]^T (adjoint)
    const int64_t row = adjoint ? t + 1 : t;
    const bool present = !per_sample || row < length;
    for (int64_t r = 0; r < n; ++r) {
      for (int l = 0; l < W; ++l) {
        const int64_t at = P * (((first + l) * length + t) * n + r);
        g_re[r][l] = u[at];
        g_im[r][l] = C ? u[at + 1] : R(0);
      }
      if (!present) continue;
      for (int64_t c = 0; c < n; ++c) {
        for (int l = 0; l < W; ++l) {
          R mr, mi;
          if (per_sample) {
            const int64_t base = ((first + l) * length + row) * n;
            const int64_t at =
                P * ((base + (adjoint ? c : r)) * n + (adjoint ? r : c));
            mr = a[at];
            mi = C ? a[at + 1] : R(0);
          } else {
            mr = m_re[r * n + c][l];
            mi = m_im[r * n + c][l];
          }
          MulAdd<R, C>(g_re[r][l], g_im[r][l], mr, mi, h_re[c][l], h_im[c][l]);
        }
      }
    }
    for (int64_t r = 0; r < n; ++r) {
      for (int l = 0; l < W; ++l) {
        const int64_t at = P * (((first + l) * length + t) * n + r);
        h_re[r][l] = g_re[r][l];
        h_im[r][l] = g_im[r][l];
        y[at] = g_re[r][l];
        if (C) y[at + 1] = g_im[r][l];
      }
    }
  }
}

template <typename R, bool C, int K, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void DenseAll(const R* a, const R* u,
                                                    const R* zi, R* y,
                                                    int64_t length,
                                                    int64_t batch, int64_t n) {
  int64_t first = 0;
  for (; batch - first >= 8; first += 8) {
    Dense<R, C, K, 8, per_sample, adjoint>(a, u, zi, y, length, first, n);
  }
  for (; first < batch; ++first) {
    Dense<R, C, K, 1, per_sample, adjoint>(a, u, zi, y, length, first, n);
  }
}

template <typename R, bool C, bool per_sample, bool adjoint>
inline __attribute__((always_inline)) void ByStructure(const R* a, const R* u,
                                                       const R* zi, R* y,
                                                       int64_t length,
                                                       int64_t batch, int64_t n,
                                                       bool dense) {
  if (!dense) {
    return DiagonalAll<R, C, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                  n);
  }
  switch (n) {
    case 1:
      return DenseAll<R, C, 1, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                    n);
    case 2:
      return DenseAll<R, C, 2, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                    n);
    case 3:
      return DenseAll<R, C, 3, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                    n);
    case 4:
      return DenseAll<R, C, 4, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                    n);
    default:
      return DenseAll<R, C, 0, per_sample, adjoint>(a, u, zi, y, length, batch,
                                                    n);
  }
}

template <typename R, bool C>
inline __attribute__((always_inline)) void Dispatch(const R* a, const R* u,
                                                    const R* zi, R* y,
                                                    int64_t length,
                                                    int64_t batch, int64_t n,
                                                    bool dense, bool per_sample,
                                                    bool adjoint) {
  if (per_sample) {
    if (adjoint) {
      return ByStructure<R, C, true, true>(a, u, zi, y, length, batch, n,
                                           dense);
    }
    return ByStructure<R, C, true, false>(a, u, zi, y, length, batch, n, dense);
  }
  if (adjoint) {
    return ByStructure<R, C, false, true>(a, u, zi, y, length, batch, n, dense);
  }
  return ByStructure<R, C, false, false>(a, u, zi, y, length, batch, n, dense);
}

// The same loops compiled twice: for x86 CPUs with AVX2 and FMA, and for
// any CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_LINEAR_X86 1
template <typename R, bool C>
__attribute__((target("avx2,fma"))) void RunAvx2(const R* a, const R* u,
                                                 const R* zi, R* y,
                                                 int64_t length, int64_t batch,
                                                 int64_t n, bool dense,
                                                 bool per_sample,
                                                 bool adjoint) {
  Dispatch<R, C>(a, u, zi, y, length, batch, n, dense, per_sample, adjoint);
}

#endif

template <typename R, bool C>
void RunPortable(const R* a, const R* u, const R* zi, R* y, int64_t length,
                 int64_t batch, int64_t n, bool dense, bool per_sample,
                 bool adjoint) {
  Dispatch<R, C>(a, u, zi, y, length, batch, n, dense, per_sample, adjoint);
}

// A batch of more than retrax::kChunk signals is split into chunks of
// signals that the calling thread and XLA's intra-op pool run together.
template <typename R, bool C>
void Run(ffi::ThreadPool& pool, const ffi::AnyBuffer& a,
         const ffi::AnyBuffer& u, const ffi::AnyBuffer& zi,
         ffi::Result<ffi::AnyBuffer>& y, int64_t length, int64_t batch,
         int64_t n, bool dense, bool per_sample, bool adjoint) {
  auto run = RunPortable<R, C>;
#ifdef RETRAX_LINEAR_X86
  if (retrax::HasAvx2Fma()) run = RunAvx2<R, C>;
#endif
  retrax::AdviseHugePages(y->untyped_data(), y->size_bytes());
  const R* a_ = static_cast<const R*>(a.untyped_data());
  const R* u_ = static_cast<const R*>(u.untyped_data());
  const R* zi_ = static_cast<const R*>(zi.untyped_data());
  R* y_ = static_cast<R*>(y->untyped_data());
  // R values per signal of each operand
  const int64_t parts = kParts<C>;
  const int64_t signal = length * n * parts;
  const int64_t state = n * parts;
  const int64_t coefficients =
      (per_sample ? length : 1) * n * (dense ? n : 1) * parts;
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(a_ + first * coefficients, u_ + first * signal, zi_ + first * state,
        y_ + first * signal, length, count, n, dense, per_sample, adjoint);
  });
}

ffi::Error Linear(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer u,
                  ffi::AnyBuffer zi, ffi::Result<ffi::AnyBuffer> y, bool dense,
                  bool adjoint) {
  const auto dims = u.dimensions();
  const auto zi_dims = zi.dimensions();
  if (dims.size() != 3 || zi_dims.size() != 2) {
    return ffi::Error::InvalidArgument(
        "linear: u needs shape (batch, time, state), zi (batch, state)");
  }
  const int64_t batch = dims[0], length = dims[1], n = dims[2];
  const int64_t rank = static_cast<int64_t>(a.dimensions().size());
  const int64_t matrix = dense ? n : 1;
  const bool per_sample = rank == (dense ? 4 : 3);
  const int64_t coefficients = static_cast<int64_t>(a.element_count());
  if (rank != (dense ? 3 : 2) + (per_sample ? 1 : 0) ||
      coefficients != batch * (per_sample ? length : 1) * n * matrix ||
      zi_dims[0] != batch || zi_dims[1] != n) {
    return ffi::Error::InvalidArgument("linear: operand shapes disagree");
  }
  const auto type = u.element_type();
  if (a.element_type() != type || zi.element_type() != type ||
      y->element_type() != type) {
    return ffi::Error::InvalidArgument("linear: mixed dtypes");
  }
  if (length == 0 || batch == 0 || n == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      Run<float, false>(pool, a, u, zi, y, length, batch, n, dense,
                        per_sample, adjoint);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double, false>(pool, a, u, zi, y, length, batch, n, dense,
                         per_sample, adjoint);
      return ffi::Error::Success();
    case ffi::DataType::C64:
      Run<float, true>(pool, a, u, zi, y, length, batch, n, dense,
                       per_sample, adjoint);
      return ffi::Error::Success();
    case ffi::DataType::C128:
      Run<double, true>(pool, a, u, zi, y, length, batch, n, dense,
                        per_sample, adjoint);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "linear: float32, float64, complex64 or complex128 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxLinear, Linear,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("dense")
                                  .Attr<bool>("adjoint"));
