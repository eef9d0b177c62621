// A cascade of second-order sections (scipy.signal.sosfilt) as an XLA FFI
// kernel for the CPU, for a batch of real signals, in one pass over memory.
//
// Every sample goes through every section while it is in registers. A
// section with coefficients [b0, b1, b2, a1, a2] (a0 = 1) and scipy's
// transposed-direct-form-II state (z0, z1) before the first sample computes
//   y[t] = b0 x[t] + b1 x[t-1] + b2 x[t-2] + c[t] - a1 y[t-1] - a2 y[t-2],
// with x and y zero before the start and c = (z0, z1, 0, 0, ...): the
// transposed form's output, written in direct form I so that the only
// dependency from one sample to the next is one multiply-add (y[t-1] to
// y[t]; the transposed form has two), and y is the next section's x, whose
// history it shares. The final state is the transposed form's, from the
// last inputs and outputs (scipy.signal.lfiltic's map), as scipy returns it.
// Running the sections one after the other instead reads and writes the
// whole signal once per section.
//
// Operands, in the caller's batch-major layout: a (B, S, 5), u (B, T),
// zi (B, 2 S) (section s's state at 2 s, 2 s + 1), y (B, T), or with
// `final_state` y (B, T + 2 S): the output followed by the final state, in
// zi's layout.
//
// One signal is a chain of dependent multiply-adds whose sections the CPU
// overlaps across samples; a batch advances W signals at once in SIMD lanes.

#include <cstdint>
#include <vector>

#include "cpu.h"
#include "pages.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kCoefficients = 5;

// One sample of W signals through S sections. h[k]: the last two values
// of the signal between sections k - 1 and k (h[0]: the input, h[S]: the
// output), newest first; `head` >= 0: the sample is one of the first two,
// whose drive the initial state z[2 s + head] enters.
template <typename R, int S, int W, bool kHead>
inline __attribute__((always_inline)) void Step(
    const R (&c)[S * kCoefficients][W], const R (&z)[S * 2][W],
    R (&h)[(S + 1) * 2][W], R (&v)[W], int head) {
  for (int s = 0; s < S; ++s) {
    for (int l = 0; l < W; ++l) {
      R rest = c[s * kCoefficients + 1][l] * h[2 * s][l] +
               c[s * kCoefficients + 2][l] * h[2 * s + 1][l] -
               c[s * kCoefficients + 4][l] * h[2 * s + 3][l];
      if (kHead) rest += z[2 * s + head][l];
      const R out = (c[s * kCoefficients][l] * v[l] + rest) -
                    c[s * kCoefficients + 3][l] * h[2 * s + 2][l];
      h[2 * s + 1][l] = h[2 * s][l];
      h[2 * s][l] = v[l];
      v[l] = out;
    }
  }
  for (int l = 0; l < W; ++l) {
    h[2 * S + 1][l] = h[2 * S][l];
    h[2 * S][l] = v[l];
  }
}

// W signals `first .. first + W - 1`, with S sections known at compile
// time, so that the histories stay in registers.
template <typename R, int S, int W>
inline __attribute__((always_inline)) void Cascade(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t samples, int64_t first, bool final_state) {
  const int64_t out_length = samples + (final_state ? 2 * S : 0);
  R c[S * kCoefficients][W], z[S * 2][W], h[(S + 1) * 2][W];
  for (int l = 0; l < W; ++l) {
    const int64_t b = first + l;
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < kCoefficients; ++k) {
        c[s * kCoefficients + k][l] = a[(b * S + s) * kCoefficients + k];
      }
      z[2 * s][l] = zi[(b * S + s) * 2];
      z[2 * s + 1][l] = zi[(b * S + s) * 2 + 1];
    }
    for (int k = 0; k < 2 * (S + 1); ++k) h[k][l] = R(0);
  }
  const int64_t head = samples < 2 ? samples : 2;
  R v[W];
  for (int64_t t = 0; t < head; ++t) {
    for (int l = 0; l < W; ++l) v[l] = u[(first + l) * samples + t];
    Step<R, S, W, true>(c, z, h, v, static_cast<int>(t));
    for (int l = 0; l < W; ++l) y[(first + l) * out_length + t] = v[l];
  }
  for (int64_t t = head; t < samples; ++t) {
    for (int l = 0; l < W; ++l) v[l] = u[(first + l) * samples + t];
    Step<R, S, W, false>(c, z, h, v, -1);
    for (int l = 0; l < W; ++l) y[(first + l) * out_length + t] = v[l];
  }
  if (!final_state) return;
  for (int l = 0; l < W; ++l) {
    R* at = y + (first + l) * out_length + samples;
    for (int s = 0; s < S; ++s) {
      const R b1 = c[s * kCoefficients + 1][l], b2 = c[s * kCoefficients + 2][l];
      const R a1 = c[s * kCoefficients + 3][l], a2 = c[s * kCoefficients + 4][l];
      const R x1 = h[2 * s][l], x2 = h[2 * s + 1][l];
      const R y1 = h[2 * s + 2][l], y2 = h[2 * s + 3][l];
      R z0 = b1 * x1 + b2 * x2 - a1 * y1 - a2 * y2;
      R z1 = b2 * x1 - a2 * y1;
      // the part of the initial state not yet shifted out
      if (samples == 0) {
        z0 += z[2 * s][l];
        z1 += z[2 * s + 1][l];
      } else if (samples == 1) {
        z0 += z[2 * s + 1][l];
      }
      at[2 * s] = z0;
      at[2 * s + 1] = z1;
    }
  }
}

// W = 32 / sizeof(R) signals `first .. first + W - 1` at once, each value a
// vector of their W lanes (GCC's vector extension: one AVX register), with
// S sections known at compile time; the same arithmetic as `Cascade`.
template <typename R, int S>
inline __attribute__((always_inline)) void CascadeLanes(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t samples, int64_t first, bool final_state) {
  constexpr int W = 32 / sizeof(R);
  typedef R V __attribute__((vector_size(32)));
  const int64_t out_length = samples + (final_state ? 2 * S : 0);
  V c[S * kCoefficients], z[S * 2], h[(S + 1) * 2];
  for (int l = 0; l < W; ++l) {
    const int64_t b = first + l;
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < kCoefficients; ++k) {
        c[s * kCoefficients + k][l] = a[(b * S + s) * kCoefficients + k];
      }
      z[2 * s][l] = zi[(b * S + s) * 2];
      z[2 * s + 1][l] = zi[(b * S + s) * 2 + 1];
    }
  }
  for (int k = 0; k < 2 * (S + 1); ++k) h[k] = V{} * R(0);
  const R* in[W];
  R* out[W];
  for (int l = 0; l < W; ++l) {
    in[l] = u + (first + l) * samples;
    out[l] = y + (first + l) * out_length;
  }
  for (int64_t t = 0; t < samples; ++t) {
    V v;
    for (int l = 0; l < W; ++l) v[l] = in[l][t];
    for (int s = 0; s < S; ++s) {
      V rest = c[s * kCoefficients + 1] * h[2 * s] +
               c[s * kCoefficients + 2] * h[2 * s + 1] -
               c[s * kCoefficients + 4] * h[2 * s + 3];
      if (t < 2) rest += z[2 * s + t];
      const V o = (c[s * kCoefficients] * v + rest) -
                  c[s * kCoefficients + 3] * h[2 * s + 2];
      h[2 * s + 1] = h[2 * s];
      h[2 * s] = v;
      v = o;
    }
    h[2 * S + 1] = h[2 * S];
    h[2 * S] = v;
    for (int l = 0; l < W; ++l) out[l][t] = v[l];
  }
  if (!final_state) return;
  for (int s = 0; s < S; ++s) {
    const V b1 = c[s * kCoefficients + 1], b2 = c[s * kCoefficients + 2];
    const V a1 = c[s * kCoefficients + 3], a2 = c[s * kCoefficients + 4];
    V z0 = b1 * h[2 * s] + b2 * h[2 * s + 1] - a1 * h[2 * s + 2] -
           a2 * h[2 * s + 3];
    V z1 = b2 * h[2 * s] - a2 * h[2 * s + 2];
    // the part of the initial state not yet shifted out
    if (samples == 0) {
      z0 += z[2 * s];
      z1 += z[2 * s + 1];
    } else if (samples == 1) {
      z0 += z[2 * s + 1];
    }
    for (int l = 0; l < W; ++l) {
      out[l][samples + 2 * s] = z0[l];
      out[l][samples + 2 * s + 1] = z1[l];
    }
  }
}

// One signal with any number of sections `n` (past those compiled for): the
// same recursion, section by section on a block of samples at a time.
template <typename R>
inline __attribute__((always_inline)) void CascadeAny(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t samples, int64_t b, int64_t n,
    bool final_state) {
  const int64_t out_length = samples + (final_state ? 2 * n : 0);
  const R* ab = a + b * n * kCoefficients;
  const R* zb = zi + b * n * 2;
  R* yb = y + b * out_length;
  std::vector<R> h(2 * (n + 1), R(0));
  for (int64_t t = 0; t < samples; ++t) {
    R v = u[b * samples + t];
    for (int64_t s = 0; s < n; ++s) {
      const R* cs = ab + s * kCoefficients;
      R rest = cs[1] * h[2 * s] + cs[2] * h[2 * s + 1] - cs[4] * h[2 * s + 3];
      if (t < 2) rest += zb[2 * s + t];
      const R out = (cs[0] * v + rest) - cs[3] * h[2 * s + 2];
      h[2 * s + 1] = h[2 * s];
      h[2 * s] = v;
      v = out;
    }
    h[2 * n + 1] = h[2 * n];
    h[2 * n] = v;
    yb[t] = v;
  }
  if (!final_state) return;
  for (int64_t s = 0; s < n; ++s) {
    const R* cs = ab + s * kCoefficients;
    const R x1 = h[2 * s], x2 = h[2 * s + 1], y1 = h[2 * s + 2],
            y2 = h[2 * s + 3];
    R z0 = cs[1] * x1 + cs[2] * x2 - cs[3] * y1 - cs[4] * y2;
    R z1 = cs[2] * x1 - cs[4] * y1;
    if (samples == 0) {
      z0 += zb[2 * s];
      z1 += zb[2 * s + 1];
    } else if (samples == 1) {
      z0 += zb[2 * s + 1];
    }
    yb[samples + 2 * s] = z0;
    yb[samples + 2 * s + 1] = z1;
  }
}

// Every signal of the batch: W at a time, then one at a time.
template <typename R, int S>
inline __attribute__((always_inline)) void CascadeAll(
    const R* a, const R* u, const R* zi, R* y, int64_t samples, int64_t batch,
    bool final_state) {
  // one vector register of lanes (AVX2: 4 doubles or 8 floats)
  constexpr int W = 32 / sizeof(R);
  int64_t first = 0;
  for (; batch - first >= W; first += W) {
    CascadeLanes<R, S>(a, u, zi, y, samples, first, final_state);
  }
  for (; first < batch; ++first) {
    Cascade<R, S, 1>(a, u, zi, y, samples, first, final_state);
  }
}

template <typename R>
inline __attribute__((always_inline)) void Dispatch(
    const R* a, const R* u, const R* zi, R* y, int64_t samples, int64_t batch,
    int64_t n, bool final_state) {
  switch (n) {
#define RETRAX_SECTIONS_CASE(K)                                           \
  case K:                                                                 \
    return CascadeAll<R, K>(a, u, zi, y, samples, batch, final_state);
    RETRAX_SECTIONS_CASE(1)
    RETRAX_SECTIONS_CASE(2)
    RETRAX_SECTIONS_CASE(3)
    RETRAX_SECTIONS_CASE(4)
    RETRAX_SECTIONS_CASE(5)
    RETRAX_SECTIONS_CASE(6)
    RETRAX_SECTIONS_CASE(7)
    RETRAX_SECTIONS_CASE(8)
#undef RETRAX_SECTIONS_CASE
    default:
      for (int64_t b = 0; b < batch; ++b) {
        CascadeAny<R>(a, u, zi, y, samples, b, n, final_state);
      }
      return;
  }
}

// The same loops compiled twice: for x86 CPUs with AVX2 and FMA, and for
// any CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_SECTIONS_X86 1
template <typename R>
__attribute__((target("avx2,fma"))) void RunAvx2(
    const R* a, const R* u, const R* zi, R* y, int64_t samples, int64_t batch,
    int64_t n, bool final_state) {
  Dispatch<R>(a, u, zi, y, samples, batch, n, final_state);
}

#endif

template <typename R>
void RunPortable(const R* a, const R* u, const R* zi, R* y, int64_t samples,
                 int64_t batch, int64_t n, bool final_state) {
  Dispatch<R>(a, u, zi, y, samples, batch, n, final_state);
}

// A batch of more than retrax::kChunk signals is split into chunks of
// signals that the calling thread and XLA's intra-op pool run together.
template <typename R>
void Run(ffi::ThreadPool& pool, const ffi::AnyBuffer& a,
         const ffi::AnyBuffer& u, const ffi::AnyBuffer& zi,
         ffi::Result<ffi::AnyBuffer>& y, int64_t samples, int64_t batch,
         int64_t n, bool final_state) {
  auto run = RunPortable<R>;
#ifdef RETRAX_SECTIONS_X86
  if (retrax::HasAvx2Fma()) run = RunAvx2<R>;
#endif
  retrax::AdviseHugePages(y->untyped_data(), y->size_bytes());
  const R* a_ = static_cast<const R*>(a.untyped_data());
  const R* u_ = static_cast<const R*>(u.untyped_data());
  const R* zi_ = static_cast<const R*>(zi.untyped_data());
  R* y_ = static_cast<R*>(y->untyped_data());
  const int64_t out_length = samples + (final_state ? 2 * n : 0);
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    run(a_ + first * n * kCoefficients, u_ + first * samples,
        zi_ + first * 2 * n, y_ + first * out_length, samples, count, n,
        final_state);
  });
}

ffi::Error Sections(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer u,
                    ffi::AnyBuffer zi, ffi::Result<ffi::AnyBuffer> y,
                    bool final_state) {
  const auto dims = u.dimensions();
  const auto a_dims = a.dimensions();
  const auto zi_dims = zi.dimensions();
  const auto y_dims = y->dimensions();
  if (dims.size() != 2 || a_dims.size() != 3 || zi_dims.size() != 2 ||
      y_dims.size() != 2) {
    return ffi::Error::InvalidArgument(
        "sections: u needs shape (batch, time), a (batch, sections, 5), zi "
        "(batch, 2 sections)");
  }
  const int64_t batch = dims[0], samples = dims[1], n = a_dims[1];
  if (a_dims[0] != batch || a_dims[2] != kCoefficients ||
      zi_dims[0] != batch || zi_dims[1] != 2 * n || y_dims[0] != batch ||
      y_dims[1] != samples + (final_state ? 2 * n : 0)) {
    return ffi::Error::InvalidArgument("sections: operand shapes disagree");
  }
  const auto type = u.element_type();
  if (a.element_type() != type || zi.element_type() != type ||
      y->element_type() != type) {
    return ffi::Error::InvalidArgument("sections: mixed dtypes");
  }
  if (batch == 0 || y_dims[1] == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      Run<float>(pool, a, u, zi, y, samples, batch, n, final_state);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Run<double>(pool, a, u, zi, y, samples, batch, n, final_state);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument("sections: float32 or float64 only");
  }
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxSections, Sections,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<bool>("final_state"));
