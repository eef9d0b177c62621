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
// zi's layout. With `time_major` (the plain cascade only), u and y (T, B):
// a time-first signal's channels as they lie (see `AllColumns`).
//
// One signal is a chain of dependent multiply-adds whose sections the CPU
// overlaps across samples; a batch advances W signals at once in SIMD lanes.

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "cpu.h"
#include "pages.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

constexpr int kCoefficients = 5;

// A loop compiled as a function of its own, for AVX2 and FMA, where
// inlined into the function that dispatches on the number of sections its
// registers fare worse (a signal's reverse mode, float64: about a third
// slower).
#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_SECTIONS_APART __attribute__((noinline, target("avx2,fma")))
#else
#define RETRAX_SECTIONS_APART inline
#endif

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

// Reverse mode's checkpoints. The forward pass for reverse mode keeps, at
// the start t0 of every block of `block` samples (t0 = 0, block, 2 block,
// ...), every section's last two outputs, h[2 (s + 1)] and h[2 (s + 1) + 1]
// (its output at t0 - 1 and t0 - 2, zero before the start): 2 S values a
// block and signal, in place of every section's output at every sample.
// The adjoint goes through the blocks backwards, each first recomputed
// from its checkpoint into a block-sized scratch (the forward pass's
// arithmetic, so the same values to the bit; a signal on its own
// recomputes W blocks at once in vector lanes), then run backwards from
// there.
// Layout, a signal on its own: (K, 2 S) for K = ceil(T / block) blocks; a
// group of W signals in vector lanes: their rows hold (K, 2 S, W).
inline int64_t Blocks(int64_t samples, int64_t block) {
  return (samples + block - 1) / block;
}

// Where sample t of signal b lies in u or y: batch-major at b * length + t
// (length: the signal's, or the output's with its final state), or with
// kColumns time-major at t * columns + b (see `AllColumns`).
template <bool kColumns>
inline __attribute__((always_inline)) int64_t At(int64_t b, int64_t t,
                                                 int64_t length,
                                                 int64_t columns) {
  return kColumns ? t * columns + b : b * length + t;
}

// Samples t0 .. t1 - 1 of W signals `first ..` through S sections (state
// in c, z, h as `Step` keeps it), the output into y (kColumns: u and y
// time-major, `columns` signals to a row).
template <typename R, int S, int W, bool kColumns>
inline __attribute__((always_inline)) void CascadeSpan(
    const R (&c)[S * kCoefficients][W], const R (&z)[S * 2][W],
    R (&h)[(S + 1) * 2][W], const R* __restrict__ u, R* __restrict__ y,
    int64_t out_length, int64_t samples, int64_t first, int64_t t0,
    int64_t t1, int64_t columns) {
  const int64_t head = t1 < 2 ? t1 : 2;
  R v[W];
  auto load = [&](int64_t t) {
    for (int l = 0; l < W; ++l) {
      v[l] = u[At<kColumns>(first + l, t, samples, columns)];
    }
  };
  auto store = [&](int64_t t) {
    for (int l = 0; l < W; ++l) {
      y[At<kColumns>(first + l, t, out_length, columns)] = v[l];
    }
  };
  int64_t t = t0;
  for (; t < head; ++t) {
    load(t);
    Step<R, S, W, true>(c, z, h, v, static_cast<int>(t));
    store(t);
  }
  for (; t < t1; ++t) {
    load(t);
    Step<R, S, W, false>(c, z, h, v, -1);
    store(t);
  }
}

// The coefficients and initial states of W signals `first .. first + W - 1`
// into lanes (`c[row][l]`, `z[row][l]` for signal first + l): arrays of
// W values a row, or vectors of W lanes.
template <typename R, int S, int W, typename C, typename Z>
inline __attribute__((always_inline)) void LoadGroup(const R* __restrict__ a,
                                                     const R* __restrict__ zi,
                                                     int64_t first, C& c,
                                                     Z& z) {
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
}

// W signals `first .. first + W - 1`, with S sections known at compile
// time, so that the histories stay in registers. With `ck`, also the
// checkpoints of reverse mode (see `Blocks`) into ck, (K, 2 S) a signal.
// kColumns: u and y time-major, `columns` signals to a row (the plain
// cascade only: no checkpoints, no final state).
template <typename R, int S, int W, bool kColumns = false>
inline __attribute__((always_inline)) void Cascade(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, R* __restrict__ ck, int64_t samples, int64_t first,
    bool final_state, int64_t block, int64_t columns = 0) {
  const int64_t out_length = samples + (final_state ? 2 * S : 0);
  R c[S * kCoefficients][W], z[S * 2][W], h[(S + 1) * 2][W];
  LoadGroup<R, S, W>(a, zi, first, c, z);
  for (int l = 0; l < W; ++l) {
    for (int k = 0; k < 2 * (S + 1); ++k) h[k][l] = R(0);
  }
  if (ck == nullptr) {
    CascadeSpan<R, S, W, kColumns>(c, z, h, u, y, out_length, samples, first,
                                   0, samples, columns);
  } else {
    const int64_t blocks = Blocks(samples, block);
    for (int64_t k = 0; k < blocks; ++k) {
      for (int l = 0; l < W; ++l) {
        R* at = ck + ((first + l) * blocks + k) * 2 * S;
        for (int j = 0; j < 2 * S; ++j) at[j] = h[2 + j][l];
      }
      const int64_t t0 = k * block;
      const int64_t t1 = samples - t0 > block ? t0 + block : samples;
      CascadeSpan<R, S, W, kColumns>(c, z, h, u, y, out_length, samples,
                                     first, t0, t1, columns);
    }
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

// One sample t through n sections, for any value type V (a float, or a
// vector of a group's W lanes): coefficient k of section s is c(s, k), the
// initial state's entry j z(s, j), the histories h as `Step` keeps them;
// the input v in, the output out.
template <typename V, typename C, typename Z>
inline __attribute__((always_inline)) V StepThrough(const C& c, const Z& z,
                                                    V* __restrict__ h, V v,
                                                    int64_t n, int64_t t) {
  for (int64_t s = 0; s < n; ++s) {
    V rest = c(s, 1) * h[2 * s] + c(s, 2) * h[2 * s + 1] - c(s, 4) * h[2 * s + 3];
    if (t < 2) rest += z(s, t);
    const V out = (c(s, 0) * v + rest) - c(s, 3) * h[2 * s + 2];
    h[2 * s + 1] = h[2 * s];
    h[2 * s] = v;
    v = out;
  }
  h[2 * n + 1] = h[2 * n];
  h[2 * n] = v;
  return v;
}

// `StepThrough` for a group's W signals in vector lanes, S sections.
template <int S, typename V>
inline __attribute__((always_inline)) V LanesStep(
    const V (&c)[S * kCoefficients], const V (&z)[S * 2], V (&h)[(S + 1) * 2],
    V v, int64_t t) {
  return StepThrough(
      [&](int64_t s, int k) -> const V& { return c[s * kCoefficients + k]; },
      [&](int64_t s, int64_t j) -> const V& { return z[2 * s + j]; }, h, v, S,
      t);
}

// Samples t0 .. t1 - 1 of W = 32 / sizeof(R) signals in vector lanes (the
// inputs at in[l], each value V a vector of their W lanes) through S
// sections: with kScratch every section's output into scratch, laid out
// (t1 - t0, S, W) (one vector store a section and sample), else the output
// into out[l].
template <typename R, int S, bool kScratch, typename V>
inline __attribute__((always_inline)) void LanesSpan(
    const V (&c)[S * kCoefficients], const V (&z)[S * 2], V (&h)[(S + 1) * 2],
    const R* const* in, R* const* out, R* __restrict__ scratch, int64_t t0,
    int64_t t1) {
  constexpr int W = 32 / sizeof(R);
  for (int64_t t = t0; t < t1; ++t) {
    V v;
    for (int l = 0; l < W; ++l) v[l] = in[l][t];
    v = LanesStep<S>(c, z, h, v, t);
    if constexpr (kScratch) {
      R* at = scratch + (t - t0) * S * W;
      for (int s = 0; s < S; ++s) {
        std::memcpy(at + s * W, &h[2 * (s + 1)], sizeof(V));
      }
    } else {
      for (int l = 0; l < W; ++l) out[l][t] = v[l];
    }
  }
}

// A group's coefficients and initial states, lane l signal first + l.
template <typename R, int S, typename V>
inline __attribute__((always_inline)) void LoadLanes(
    const R* __restrict__ a, const R* __restrict__ zi, int64_t first,
    V (&c)[S * kCoefficients], V (&z)[S * 2]) {
  LoadGroup<R, S, 32 / sizeof(R)>(a, zi, first, c, z);
}

// W = 32 / sizeof(R) signals `first .. first + W - 1` at once, each value a
// vector of their W lanes (GCC's vector extension: one AVX register), with
// S sections known at compile time; the same arithmetic as `Cascade`.
// With `ck`, also the checkpoints of reverse mode (see `Blocks`) into the
// group's rows of ck, laid out (K, 2 S, W).
template <typename R, int S>
inline __attribute__((always_inline)) void CascadeLanes(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, R* __restrict__ ck, int64_t samples, int64_t first,
    bool final_state, int64_t block) {
  constexpr int W = 32 / sizeof(R);
  typedef R V __attribute__((vector_size(32)));
  const int64_t out_length = samples + (final_state ? 2 * S : 0);
  V c[S * kCoefficients], z[S * 2], h[(S + 1) * 2];
  LoadLanes<R, S>(a, zi, first, c, z);
  for (int k = 0; k < 2 * (S + 1); ++k) h[k] = V{} * R(0);
  const R* in[W];
  R* out[W];
  for (int l = 0; l < W; ++l) {
    in[l] = u + (first + l) * samples;
    out[l] = y + (first + l) * out_length;
  }
  if (ck == nullptr) {
    LanesSpan<R, S, false>(c, z, h, in, out, nullptr, 0, samples);
  } else {
    const int64_t blocks = Blocks(samples, block);
    R* group = ck + first * blocks * 2 * S;
    for (int64_t k = 0; k < blocks; ++k) {
      std::memcpy(group + k * 2 * S * W, &h[2], 2 * S * sizeof(V));
      const int64_t t0 = k * block;
      const int64_t t1 = samples - t0 > block ? t0 + block : samples;
      LanesSpan<R, S, false>(c, z, h, in, out, nullptr, t0, t1);
    }
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

// `StepThrough` for one signal with `n` sections (coefficients ab, initial
// state zb).
template <typename R>
inline __attribute__((always_inline)) R AnyStep(const R* __restrict__ ab,
                                                const R* __restrict__ zb,
                                                R* __restrict__ h, R v,
                                                int64_t n, int64_t t) {
  return StepThrough(
      [&](int64_t s, int k) { return ab[s * kCoefficients + k]; },
      [&](int64_t s, int64_t j) { return zb[2 * s + j]; }, h, v, n, t);
}

// Samples t0 .. t1 - 1 of one signal with any number of sections `n`
// (coefficients ab, initial state zb, histories h as `Step` keeps them):
// with kScratch every section's output into scratch at
// (s stride + 2 + t - t0), else the output into yb.
template <typename R, bool kScratch>
inline __attribute__((always_inline)) void AnySpan(
    const R* __restrict__ ab, const R* __restrict__ zb, R* __restrict__ h,
    const R* __restrict__ ub, R* __restrict__ yb, R* __restrict__ scratch,
    int64_t stride, int64_t n, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    const R v = AnyStep<R>(ab, zb, h, ub[t], n, t);
    if constexpr (kScratch) {
      for (int64_t s = 0; s < n; ++s) {
        scratch[s * stride + 2 + t - t0] = h[2 * s + 2];
      }
    } else {
      yb[t] = v;
    }
  }
}

// One signal with any number of sections `n` (past those compiled for): the
// same recursion, each sample through every section. With `ck`, also the
// checkpoints of reverse mode (see `Blocks`) into ck, (K, 2 n) a signal.
template <typename R>
inline __attribute__((always_inline)) void CascadeAny(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, R* __restrict__ ck, int64_t samples, int64_t b,
    int64_t n, bool final_state, int64_t block) {
  const int64_t out_length = samples + (final_state ? 2 * n : 0);
  const R* ab = a + b * n * kCoefficients;
  const R* zb = zi + b * n * 2;
  const R* ub = u + b * samples;
  R* yb = y + b * out_length;
  std::vector<R> h(2 * (n + 1), R(0));
  if (ck == nullptr) {
    AnySpan<R, false>(ab, zb, h.data(), ub, yb, nullptr, 0, n, 0, samples);
  } else {
    const int64_t blocks = Blocks(samples, block);
    for (int64_t k = 0; k < blocks; ++k) {
      std::memcpy(ck + (b * blocks + k) * 2 * n, h.data() + 2,
                  2 * n * sizeof(R));
      const int64_t t0 = k * block;
      const int64_t t1 = samples - t0 > block ? t0 + block : samples;
      AnySpan<R, false>(ab, zb, h.data(), ub, yb, nullptr, 0, n, t0, t1);
    }
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

// Reverse mode of the cascade for W signals `first .. first + W - 1` (each
// value a vector of their W lanes), with S sections known at compile time:
// one pass backwards in time that takes every sample's cotangent through
// every section while it is in registers, from the last section to the
// first. With lambda the cotangent of a section's all-pole input (its drive)
// and g that of its output,
//   lambda[t] = g[t] - a1 lambda[t+1] - a2 lambda[t+2]   (zero past the end)
// is the adjoint recursion, and the section's input gets
//   b0 lambda[t] + b1 lambda[t+1] + b2 lambda[t+2],
// the next (earlier) section's g. The coefficients' cotangents are sums of
// products with the section's input x and output y, summed here as they
// pass: b_k gets lambda[t+k] x[t] and a_k gets -lambda[t+k] y[t] (the sums
// over t of lambda[t] x[t-k] and -lambda[t] y[t-k], re-indexed), and the
// initial state (z0, z1) gets (lambda[0], lambda[1]). The sections' outputs
// x and y are recomputed a block at a time, last block first, from the
// forward pass's checkpoints (see `Blocks`).
//
// Operands: a (B, S, 5), u (B, T) the input, zi (B, 2 S), ck the forward
// kernel's checkpoints, ct (B, T) the output's cotangent; result
// (B, T + 7 S): u's cotangent, then a's (S rows of 5), then zi's (2 S, in
// zi's layout).
//
// For a group of W = 32 / sizeof(R) signals in vector lanes, a block's
// outputs recomputed into scratch (block, S, W) by `LanesSpan`. The
// recursion is written so that the cotangent g reaches the next section
// through one add and one multiply-add, the terms of the later samples
// (p, q) computed off that path, as the forward kernel does.
template <typename R, int S>
inline __attribute__((always_inline)) void AdjointLanes(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    const R* __restrict__ ck, const R* __restrict__ ct, R* __restrict__ out,
    R* __restrict__ scratch, int64_t samples, int64_t first, int64_t block) {
  constexpr int W = 32 / sizeof(R);
  typedef R V __attribute__((vector_size(32)));
  const int64_t out_length = samples + 7 * S;
  V c[S * kCoefficients], z[S * 2], acc[S * kCoefficients], l1[S], l2[S],
      p[S], q[S];
  const V zero = V{} * R(0);
  LoadLanes<R, S>(a, zi, first, c, z);
  for (int k = 0; k < S * kCoefficients; ++k) acc[k] = zero;
  for (int s = 0; s < S; ++s) l1[s] = l2[s] = p[s] = q[s] = zero;
  const R* in[W];
  for (int l = 0; l < W; ++l) in[l] = u + (first + l) * samples;
  const int64_t blocks = Blocks(samples, block);
  const R* group = ck + first * blocks * 2 * S;
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const int64_t t0 = k * block;
    const int64_t t1 = samples - t0 > block ? t0 + block : samples;
    V h[(S + 1) * 2];
    for (int l = 0; l < W; ++l) {
      h[0][l] = t0 >= 1 ? in[l][t0 - 1] : R(0);
      h[1][l] = t0 >= 2 ? in[l][t0 - 2] : R(0);
    }
    std::memcpy(&h[2], group + k * 2 * S * W, 2 * S * sizeof(V));
    LanesSpan<R, S, true>(c, z, h, in, nullptr, scratch, t0, t1);
    for (int64_t t = t1 - 1; t >= t0; --t) {
      const R* at = scratch + (t - t0) * S * W;
      V g, y;
      for (int l = 0; l < W; ++l) g[l] = ct[(first + l) * samples + t];
      std::memcpy(&y, at + (S - 1) * W, sizeof(V));
      for (int s = S - 1; s >= 0; --s) {
        V x;
        if (s == 0) {
          for (int l = 0; l < W; ++l) x[l] = in[l][t];
        } else {
          std::memcpy(&x, at + (s - 1) * W, sizeof(V));
        }
        const V* cs = c + s * kCoefficients;
        V* as = acc + s * kCoefficients;
        const V lam = g + p[s];  // g - a1 lambda[t+1] - a2 lambda[t+2]
        g = cs[0] * lam + q[s];  // + b1 lambda[t+1] + b2 lambda[t+2]
        as[0] += lam * x;
        as[1] += l1[s] * x;
        as[2] += l2[s] * x;
        as[3] -= l1[s] * y;
        as[4] -= l2[s] * y;
        p[s] = -(cs[3] * lam + cs[4] * l1[s]);
        q[s] = cs[1] * lam + cs[2] * l1[s];
        l2[s] = l1[s];
        l1[s] = lam;
        y = x;
      }
      for (int l = 0; l < W; ++l) out[(first + l) * out_length + t] = g[l];
    }
  }
  for (int l = 0; l < W; ++l) {
    R* res = out + (first + l) * out_length + samples;
    for (int s = 0; s < S; ++s) {
      for (int k = 0; k < kCoefficients; ++k) {
        res[s * kCoefficients + k] = acc[s * kCoefficients + k][l];
      }
      res[kCoefficients * S + 2 * s] = l1[s][l];
      res[kCoefficients * S + 2 * s + 1] = l2[s][l];
    }
  }
}

// Samples i0 .. i1 - 1 of W = 32 / sizeof(R) blocks of one signal in
// vector lanes, lane l a block starting at its own time (in[l] its input
// from the block's start, h its state there as `LanesSpan` keeps it, c the
// coefficients in every lane): the input and every section's output into
// x, laid out (i + 2, S + 1, W) (one vector store a signal and sample).
// kHead: samples 0 and 1 of the signal's first block, lane 0, whose drive
// the initial state z enters. Lane by lane the arithmetic of `Step`, so
// the same values.
template <typename R, int S, bool kHead, typename V>
inline __attribute__((always_inline)) void BlocksSpan(
    const V (&c)[S * kCoefficients], const R (&z)[S * 2][1],
    V (&h)[(S + 1) * 2], const R* const* in, R* __restrict__ x, int64_t i0,
    int64_t i1) {
  constexpr int W = 32 / sizeof(R);
  for (int64_t i = i0; i < i1; ++i) {
    V v;
    for (int l = 0; l < W; ++l) v[l] = in[l][i];
    R* at = x + (i + 2) * (S + 1) * W;
    std::memcpy(at, &v, sizeof(V));
    for (int s = 0; s < S; ++s) {
      V rest = c[s * kCoefficients + 1] * h[2 * s] +
               c[s * kCoefficients + 2] * h[2 * s + 1] -
               c[s * kCoefficients + 4] * h[2 * s + 3];
      if constexpr (kHead) rest[0] += z[2 * s + i][0];
      const V o = (c[s * kCoefficients] * v + rest) -
                  c[s * kCoefficients + 3] * h[2 * s + 2];
      h[2 * s + 1] = h[2 * s];
      h[2 * s] = v;
      v = o;
      std::memcpy(at + (s + 1) * W, &v, sizeof(V));
    }
    h[2 * S + 1] = h[2 * S];
    h[2 * S] = v;
  }
}

// `BlocksSpan` over samples i0 .. i1 - 1, its first two with kHead where
// lane 0 is the signal's first block (`head`).
template <typename R, int S, typename V>
inline __attribute__((always_inline)) void BlocksRange(
    const V (&c)[S * kCoefficients], const R (&z)[S * 2][1],
    V (&h)[(S + 1) * 2], const R* const* in, R* __restrict__ x, bool head,
    int64_t i0, int64_t i1) {
  if (head && i0 < 2 && i0 < i1) {
    const int64_t i = i1 < 2 ? i1 : 2;
    BlocksSpan<R, S, true>(c, z, h, in, x, i0, i);
    i0 = i;
  }
  BlocksSpan<R, S, false>(c, z, h, in, x, i0, i1);
}

// Blocks first .. first + count - 1 (count <= W = 32 / sizeof(R)) of one
// signal, recomputed at once in vector lanes by `BlocksSpan` from their
// checkpoints: block first + l in lane l of x, (block + 2, S + 1, W), its
// input and its sections' outputs from time t0 - 2 (before the signal's
// start zero). Lanes past count, and a short last block's lane once its
// samples end, hold zeros.
template <typename R, int S>
inline __attribute__((always_inline)) void RecomputeBlocks(
    const R (&c1)[S * kCoefficients][1], const R (&z)[S * 2][1],
    const R* __restrict__ xb, const R* __restrict__ ckb, R* __restrict__ x,
    int64_t samples, int64_t first, int64_t count, int64_t block) {
  constexpr int W = 32 / sizeof(R);
  typedef R V __attribute__((vector_size(32)));
  V c[S * kCoefficients], h[(S + 1) * 2];
  for (int k = 0; k < S * kCoefficients; ++k) {
    for (int l = 0; l < W; ++l) c[k][l] = c1[k][0];
  }
  const R* in[W];
  int64_t length[W];
  for (int l = 0; l < W; ++l) {
    const int64_t k = first + (l < count ? l : 0);
    const int64_t t0 = k * block;
    in[l] = xb + t0;
    length[l] = l >= count ? 0 : samples - t0 < block ? samples - t0 : block;
    h[0][l] = t0 >= 1 ? xb[t0 - 1] : R(0);
    h[1][l] = t0 >= 2 ? xb[t0 - 2] : R(0);
    const R* at = ckb + k * 2 * S;
    for (int j = 0; j < 2 * S; ++j) h[2 + j][l] = at[j];
    for (int s = 0; s <= S; ++s) {
      x[s * W + l] = l < count ? h[2 * s + 1][l] : R(0);
      x[((S + 1) + s) * W + l] = l < count ? h[2 * s][l] : R(0);
    }
  }
  const bool head = first == 0;
  const int64_t shortest = length[count - 1];
  BlocksRange<R, S>(c, z, h, in, x, head, 0, shortest);
  if (count > 1 && shortest < block) {
    // only the signal's last block is short, and the first is whole
    const R* last = in[count - 1];
    in[count - 1] = in[0];
    BlocksRange<R, S>(c, z, h, in, x, head, shortest, block);
    in[count - 1] = last;
  }
  const int64_t end = count > 1 ? block : shortest;
  for (int l = 0; l < W; ++l) {
    for (int64_t i = length[l]; i < end; ++i) {
      for (int s = 0; s <= S; ++s) x[((i + 2) * (S + 1) + s) * W + l] = R(0);
    }
  }
}

// Reverse mode of the cascade for one signal `b` (the recursions of
// `AdjointLanes`): its blocks last first, W = 32 / sizeof(R) at a time
// (the first group short), recomputed from their checkpoints by
// `RecomputeBlocks` in vector lanes into x, so that the recomputation
// costs about 1 / W of the forward pass; then each block backwards through
// the recursions alone, each section's lambda kept in lam, laid out
// (block, S, W) with the block in its lane of x; then the coefficients'
// cotangents, sums over the group's samples of products of lambda with x,
// summed in the W lanes at once.
template <typename R, int S>
RETRAX_SECTIONS_APART void AdjointOne(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    const R* __restrict__ ck, const R* __restrict__ ct, R* __restrict__ out,
    R* __restrict__ scratch, int64_t samples, int64_t b, int64_t block) {
  constexpr int64_t W = 32 / sizeof(R);
  typedef R V __attribute__((vector_size(32)));
  const int64_t out_length = samples + 7 * S;
  R c[S * kCoefficients][1], z[S * 2][1], l1[S], l2[S], p[S], q[S];
  V acc[S * kCoefficients];
  for (int s = 0; s < S; ++s) {
    for (int k = 0; k < kCoefficients; ++k) {
      c[s * kCoefficients + k][0] = a[(b * S + s) * kCoefficients + k];
      acc[s * kCoefficients + k] = V{} * R(0);
    }
    z[2 * s][0] = zi[(b * S + s) * 2];
    z[2 * s + 1][0] = zi[(b * S + s) * 2 + 1];
    l1[s] = l2[s] = p[s] = q[s] = R(0);
  }
  const R* xb = u + b * samples;
  const R* cb = ct + b * samples;
  R* rb = out + b * out_length;
  const int64_t blocks = Blocks(samples, block);
  const R* ckb = ck + b * blocks * 2 * S;
  R* x = scratch;
  R* lam = scratch + (block + 2) * (S + 1) * W;
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const int64_t t0 = k * block;
    const int64_t t1 = samples - t0 > block ? t0 + block : samples;
    const int64_t group = k - k % W, lane = k - group;
    if (k == blocks - 1) {
      const int64_t count = k - group + 1;
      RecomputeBlocks<R, S>(c, z, xb, ckb, x, samples, group, count, block);
      // the lanes with no block or past the short block's end sum nothing
      for (int64_t l = 0; l < W; ++l) {
        const int64_t from = l >= count ? 0 : l == count - 1 ? t1 - t0 : block;
        for (int64_t i = from; i < block; ++i) {
          for (int s = 0; s < S; ++s) lam[(i * S + s) * W + l] = R(0);
        }
      }
    } else if (lane == W - 1) {
      RecomputeBlocks<R, S>(c, z, xb, ckb, x, samples, group, W, block);
    }
    for (int64_t t = t1 - 1; t >= t0; --t) {
      R g = cb[t];
      R* at = lam + (t - t0) * S * W + lane;
      for (int s = S - 1; s >= 0; --s) {
        const R now = g + p[s];
        g = c[s * kCoefficients][0] * now + q[s];
        p[s] = -(c[s * kCoefficients + 3][0] * now +
                 c[s * kCoefficients + 4][0] * l1[s]);
        q[s] = c[s * kCoefficients + 1][0] * now +
               c[s * kCoefficients + 2][0] * l1[s];
        l2[s] = l1[s];
        l1[s] = now;
        at[s * W] = now;
      }
      rb[t] = g;
    }
    if (lane != 0) continue;
    // the group's sums: b_k gets lambda[i] x[i - k], a_k -lambda[i] y[i - k]
    const int64_t end = k == blocks - 1 ? t1 - t0 : block;
    for (int64_t i = 0; i < end; ++i) {
      const R* x0 = x + (i + 2) * (S + 1) * W;
      const R* x1 = x0 - (S + 1) * W;
      const R* x2 = x1 - (S + 1) * W;
      for (int s = 0; s < S; ++s) {
        V l, u0, u1, u2, y1, y2;
        std::memcpy(&l, lam + (i * S + s) * W, sizeof(V));
        std::memcpy(&u0, x0 + s * W, sizeof(V));
        std::memcpy(&u1, x1 + s * W, sizeof(V));
        std::memcpy(&u2, x2 + s * W, sizeof(V));
        std::memcpy(&y1, x1 + (s + 1) * W, sizeof(V));
        std::memcpy(&y2, x2 + (s + 1) * W, sizeof(V));
        V* as = acc + s * kCoefficients;
        as[0] += l * u0;
        as[1] += l * u1;
        as[2] += l * u2;
        as[3] += l * y1;
        as[4] += l * y2;
      }
    }
  }
  for (int s = 0; s < S; ++s) {
    for (int k = 0; k < kCoefficients; ++k) {
      R sum = R(0);
      for (int l = 0; l < W; ++l) sum += acc[s * kCoefficients + k][l];
      rb[samples + s * kCoefficients + k] = k < 3 ? sum : -sum;
    }
    rb[samples + kCoefficients * S + 2 * s] = l1[s];
    rb[samples + kCoefficients * S + 2 * s + 1] = l2[s];
  }
}

// The same for one signal with any number of sections `n`, its blocks
// recomputed by `AnySpan` into scratch (n rows of block + 2).
template <typename R>
void AdjointAny(const R* __restrict__ a, const R* __restrict__ u,
                const R* __restrict__ zi, const R* __restrict__ ck,
                const R* __restrict__ ct, R* __restrict__ out,
                R* __restrict__ scratch, int64_t samples, int64_t b, int64_t n,
                int64_t block) {
  const int64_t out_length = samples + 7 * n;
  const int64_t stride = block + 2;
  const R* ab = a + b * n * kCoefficients;
  const R* zb = zi + b * n * 2;
  const R* xb = u + b * samples;
  R* rb = out + b * out_length;
  std::vector<R> acc(n * kCoefficients, R(0)), l1(n, R(0)), l2(n, R(0));
  std::vector<R> h(2 * (n + 1));
  const int64_t blocks = Blocks(samples, block);
  for (int64_t k = blocks - 1; k >= 0; --k) {
    const int64_t t0 = k * block;
    const int64_t t1 = samples - t0 > block ? t0 + block : samples;
    h[0] = t0 >= 1 ? xb[t0 - 1] : R(0);
    h[1] = t0 >= 2 ? xb[t0 - 2] : R(0);
    std::memcpy(h.data() + 2, ck + (b * blocks + k) * 2 * n, 2 * n * sizeof(R));
    AnySpan<R, true>(ab, zb, h.data(), xb, nullptr, scratch, stride, n, t0, t1);
    for (int64_t t = t1 - 1; t >= t0; --t) {
      R g = ct[b * samples + t];
      R y = scratch[(n - 1) * stride + 2 + t - t0];
      for (int64_t s = n - 1; s >= 0; --s) {
        const R x = s == 0 ? xb[t] : scratch[(s - 1) * stride + 2 + t - t0];
        const R* cs = ab + s * kCoefficients;
        R* as = acc.data() + s * kCoefficients;
        const R lam = (g - cs[3] * l1[s]) - cs[4] * l2[s];
        g = (cs[0] * lam + cs[1] * l1[s]) + cs[2] * l2[s];
        as[0] += lam * x;
        as[1] += l1[s] * x;
        as[2] += l2[s] * x;
        as[3] -= l1[s] * y;
        as[4] -= l2[s] * y;
        l2[s] = l1[s];
        l1[s] = lam;
        y = x;
      }
      rb[t] = g;
    }
  }
  for (int64_t s = 0; s < n; ++s) {
    for (int k = 0; k < kCoefficients; ++k) {
      rb[samples + s * kCoefficients + k] = acc[s * kCoefficients + k];
    }
    rb[samples + kCoefficients * n + 2 * s] = l1[s];
    rb[samples + kCoefficients * n + 2 * s + 1] = l2[s];
  }
}

// ---------------------------------------------------------------- time-major
//
// The plain cascade (no final state, no checkpoints) of a batch stored
// time-major, as a time-first signal's channels lie (`axis=0`, a (T, C)
// array): sample t of signal b at `t * columns + b`, `columns` the whole
// batch's width (a chunk of the batch starts at its own first column). The
// same arithmetic as the batch-major loops, sample by sample, so the same
// values to the bit; only the addresses differ. The signals of a group of W
// lanes are adjacent in memory at every sample: one vector load and store a
// sample; the rest run in `Cascade` with time-major addresses.

// W = 32 / sizeof(R) signals in vector lanes (as `CascadeLanes`).
template <typename R, int S>
inline __attribute__((always_inline)) void LanesColumns(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t samples, int64_t columns, int64_t first) {
  typedef R V __attribute__((vector_size(32)));
  V c[S * kCoefficients], z[S * 2], h[(S + 1) * 2];
  LoadLanes<R, S>(a, zi, first, c, z);
  for (int k = 0; k < 2 * (S + 1); ++k) h[k] = V{} * R(0);
  for (int64_t t = 0; t < samples; ++t) {
    V v;
    std::memcpy(&v, u + t * columns + first, sizeof(V));
    v = LanesStep<S>(c, z, h, v, t);
    std::memcpy(y + t * columns + first, &v, sizeof(V));
  }
}

// One signal b with any number of sections `n` (as `CascadeAny`).
template <typename R>
inline __attribute__((always_inline)) void AnyColumn(
    const R* __restrict__ a, const R* __restrict__ u, const R* __restrict__ zi,
    R* __restrict__ y, int64_t samples, int64_t columns, int64_t b,
    int64_t n) {
  const R* ab = a + b * n * kCoefficients;
  const R* zb = zi + b * n * 2;
  std::vector<R> h_(2 * (n + 1), R(0));
  R* __restrict__ h = h_.data();
  for (int64_t t = 0; t < samples; ++t) {
    y[t * columns + b] = AnyStep<R>(ab, zb, h, u[t * columns + b], n, t);
  }
}

// Every signal of a time-major batch: W at a time in vector lanes, then one
// at a time (`kWide`: the loops for AVX2 and FMA).
template <typename R, int S, bool kWide>
inline __attribute__((always_inline)) void AllColumns(
    const R* a, const R* u, const R* zi, R* y, int64_t samples,
    int64_t columns, int64_t batch) {
  constexpr int W = 32 / sizeof(R);
  int64_t first = 0;
  if constexpr (kWide) {
    for (; batch - first >= W; first += W) {
      LanesColumns<R, S>(a, u, zi, y, samples, columns, first);
    }
  }
  for (; first < batch; ++first) {
    Cascade<R, S, 1, true>(a, u, zi, y, nullptr, samples, first, false, 1,
                           columns);
  }
}

// The operands of one call: the forward cascade (`ct` null; with `ck`, the
// checkpoints of reverse mode, see `Blocks`) or its reverse mode (`ct` the
// output's cotangent, `ck` the checkpoints, `y` the cotangents).
template <typename R>
struct Operands {
  const R* a;
  const R* u;
  const R* zi;
  const R* ct;
  R* ck;
  R* y;
  int64_t samples;
  int64_t batch;
  int64_t n;
  bool final_state;
  int64_t block;
  // > 0: u and y time-major, `columns` signals to a row (see `AllColumns`);
  // the plain forward cascade only
  int64_t columns;
};

// A scratch buffer of at least n values, the calling thread's own, kept
// from call to call: reverse mode's is up to some hundred KiB, which a
// fresh allocation would map and fault in page by page on every call.
template <typename R>
R* Scratch(std::size_t n) {
  static thread_local std::vector<R> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// Every signal of the batch: W at a time in vector lanes, then one at a
// time. Checkpoints: a group of W signals keeps its rows of ck as
// (K, 2 S, W), a signal on its own as (K, 2 S); the reverse mode reads the
// layout the forward pass wrote (both split a batch alike).
template <typename R, int S, bool kWide>
inline __attribute__((always_inline)) void All(const Operands<R>& o) {
  constexpr int W = 32 / sizeof(R);
  int64_t first = 0;
  if constexpr (kWide) {
    if (o.ct != nullptr) {
      const int64_t block = o.block;
      // the lanes' (block, S, W); a signal's W blocks' x and lam (see
      // `AdjointOne`), (block + 2, S + 1, W) and (block, S, W)
      R* scratch = Scratch<R>(((block + 2) * (S + 1) + block * S) * W);
      for (; o.batch - first >= W; first += W) {
        AdjointLanes<R, S>(o.a, o.u, o.zi, o.ck, o.ct, o.y, scratch,
                           o.samples, first, block);
      }
      for (; first < o.batch; ++first) {
        AdjointOne<R, S>(o.a, o.u, o.zi, o.ck, o.ct, o.y, scratch,
                         o.samples, first, block);
      }
      return;
    }
  }
  for (; o.batch - first >= W; first += W) {
    CascadeLanes<R, S>(o.a, o.u, o.zi, o.y, o.ck, o.samples, first,
                       o.final_state, o.block);
  }
  for (; first < o.batch; ++first) {
    Cascade<R, S, 1>(o.a, o.u, o.zi, o.y, o.ck, o.samples, first,
                     o.final_state, o.block);
  }
}

// kWide: the loops for AVX2 and FMA, one per number of sections up to 8.
// Otherwise (a CPU without them) only the plain cascade has those; reverse
// mode and its forward pass run the loops for any number of sections, so
// that the library compiles each specialised loop once.
template <typename R, bool kWide>
inline __attribute__((always_inline)) void Dispatch(const Operands<R>& o) {
  if (o.columns > 0) {
    switch (o.n) {
#define RETRAX_COLUMNS_CASE(K)                                          \
  case K:                                                               \
    return AllColumns<R, K, kWide>(o.a, o.u, o.zi, o.y, o.samples,      \
                                   o.columns, o.batch);
      RETRAX_COLUMNS_CASE(1)
      RETRAX_COLUMNS_CASE(2)
      RETRAX_COLUMNS_CASE(3)
      RETRAX_COLUMNS_CASE(4)
      RETRAX_COLUMNS_CASE(5)
      RETRAX_COLUMNS_CASE(6)
      RETRAX_COLUMNS_CASE(7)
      RETRAX_COLUMNS_CASE(8)
#undef RETRAX_COLUMNS_CASE
    }
    for (int64_t b = 0; b < o.batch; ++b) {
      AnyColumn<R>(o.a, o.u, o.zi, o.y, o.samples, o.columns, b, o.n);
    }
    return;
  }
  const bool generic =
      o.n > 8 || (!kWide && (o.ct != nullptr || o.ck != nullptr));
  if (generic) {
    R* scratch = o.ct != nullptr ? Scratch<R>(o.n * (o.block + 2)) : nullptr;
    for (int64_t b = 0; b < o.batch; ++b) {
      if (o.ct != nullptr) {
        AdjointAny<R>(o.a, o.u, o.zi, o.ck, o.ct, o.y, scratch,
                      o.samples, b, o.n, o.block);
      } else {
        CascadeAny<R>(o.a, o.u, o.zi, o.y, o.ck, o.samples, b, o.n,
                      o.final_state, o.block);
      }
    }
    return;
  }
  switch (o.n) {
#define RETRAX_SECTIONS_CASE(K) \
  case K:                       \
    return All<R, K, kWide>(o);
    RETRAX_SECTIONS_CASE(1)
    RETRAX_SECTIONS_CASE(2)
    RETRAX_SECTIONS_CASE(3)
    RETRAX_SECTIONS_CASE(4)
    RETRAX_SECTIONS_CASE(5)
    RETRAX_SECTIONS_CASE(6)
    RETRAX_SECTIONS_CASE(7)
    RETRAX_SECTIONS_CASE(8)
#undef RETRAX_SECTIONS_CASE
  }
}

// The same loops compiled twice: for x86 CPUs with AVX2 and FMA, and for
// any CPU.
#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_SECTIONS_X86 1
template <typename R>
__attribute__((target("avx2,fma"))) void RunAvx2(const Operands<R>& o) {
  Dispatch<R, true>(o);
}
#endif

template <typename R>
void RunPortable(const Operands<R>& o) {
  Dispatch<R, false>(o);
}

// A batch of more than retrax::kChunk signals (a multiple of every W) is
// split into chunks of signals that the calling thread and XLA's intra-op
// pool run together.
template <typename R>
void Run(ffi::ThreadPool& pool, const Operands<R>& whole,
         std::size_t out_bytes) {
  auto run = RunPortable<R>;
#ifdef RETRAX_SECTIONS_X86
  if (retrax::HasAvx2Fma()) run = RunAvx2<R>;
#endif
  retrax::AdviseHugePages(whole.y, out_bytes);
  const int64_t samples = whole.samples, n = whole.n;
  const bool adjoint = whole.ct != nullptr;
  const int64_t out_length =
      adjoint ? samples + 7 * n : samples + (whole.final_state ? 2 * n : 0);
  const int64_t checkpoints = Blocks(samples, whole.block) * 2 * n;
  retrax::ParallelChunks(pool, whole.batch, [&](int64_t first, int64_t count) {
    Operands<R> o = whole;
    o.a += first * n * kCoefficients;
    o.u += o.columns > 0 ? first : first * samples;
    if (o.zi != nullptr) o.zi += first * 2 * n;
    if (o.ct != nullptr) o.ct += first * samples;
    if (o.ck != nullptr) o.ck += first * checkpoints;
    o.y += o.columns > 0 ? first : first * out_length;
    o.batch = count;
    run(o);
  });
}

template <typename R>
Operands<R> Pointers(const ffi::AnyBuffer& a, const ffi::AnyBuffer& u,
                     const ffi::AnyBuffer& zi, const R* ct, R* ck, R* y,
                     int64_t samples, int64_t batch, int64_t n,
                     bool final_state, int64_t block,
                     int64_t columns = 0) {
  return Operands<R>{static_cast<const R*>(a.untyped_data()),
                     static_cast<const R*>(u.untyped_data()),
                     static_cast<const R*>(zi.untyped_data()),
                     ct,
                     ck,
                     y,
                     samples,
                     batch,
                     n,
                     final_state,
                     block,
                     columns};
}

// The cascade, or with `ck` its forward pass for reverse mode.
template <typename R>
void Forward(ffi::ThreadPool& pool, const ffi::AnyBuffer& a,
             const ffi::AnyBuffer& u, const ffi::AnyBuffer& zi,
             ffi::Result<ffi::AnyBuffer>& y, R* ck, int64_t samples,
             int64_t batch, int64_t n, bool final_state, int64_t block,
             int64_t columns = 0) {
  Run<R>(pool,
         Pointers<R>(a, u, zi, nullptr, ck, static_cast<R*>(y->untyped_data()),
                     samples, batch, n, final_state, block, columns),
         y->size_bytes());
}

// With `time_major`, u and y are (time, batch), and there is no final state.
ffi::Error CheckForward(const ffi::AnyBuffer& a, const ffi::AnyBuffer& u,
                        const ffi::AnyBuffer& zi, const ffi::AnyBuffer& y,
                        bool final_state, bool time_major = false) {
  const auto dims = u.dimensions();
  const auto a_dims = a.dimensions();
  const auto zi_dims = zi.dimensions();
  const auto y_dims = y.dimensions();
  if (dims.size() != 2 || a_dims.size() != 3 || zi_dims.size() != 2 ||
      y_dims.size() != 2 || (time_major && final_state)) {
    return ffi::Error::InvalidArgument(
        "sections: u needs shape (batch, time) (time-major: (time, batch), "
        "without the final state), a (batch, sections, 5), zi (batch, 2 "
        "sections)");
  }
  const int b = time_major ? 1 : 0;
  const int64_t batch = dims[b], samples = dims[1 - b], n = a_dims[1];
  const int64_t out = samples + (final_state ? 2 * n : 0);
  if (a_dims[0] != batch || a_dims[2] != kCoefficients ||
      zi_dims[0] != batch || zi_dims[1] != 2 * n || y_dims[b] != batch ||
      y_dims[1 - b] != out) {
    return ffi::Error::InvalidArgument("sections: operand shapes disagree");
  }
  const auto type = u.element_type();
  if (a.element_type() != type || zi.element_type() != type ||
      y.element_type() != type) {
    return ffi::Error::InvalidArgument("sections: mixed dtypes");
  }
  if (type != ffi::DataType::F32 && type != ffi::DataType::F64) {
    return ffi::Error::InvalidArgument("sections: float32 or float64 only");
  }
  return ffi::Error::Success();
}

// The checkpoints' shape: (batch, K, 2 sections) for blocks of `block`.
ffi::Error CheckCheckpoints(const ffi::AnyBuffer& ck, const ffi::AnyBuffer& u,
                            int64_t n, int64_t block, const char* what) {
  const auto dims = ck.dimensions();
  if (block < 1) {
    return ffi::Error::InvalidArgument(std::string(what) +
                                       ": block must be positive");
  }
  const int64_t batch = u.dimensions()[0], samples = u.dimensions()[1];
  if (dims.size() != 3 || dims[0] != batch ||
      dims[1] != Blocks(samples, block) || dims[2] != 2 * n ||
      ck.element_type() != u.element_type()) {
    return ffi::Error::InvalidArgument(
        std::string(what) +
        ": checkpoints need shape (batch, ceil(time / block), 2 sections)");
  }
  return ffi::Error::Success();
}

ffi::Error Sections(ffi::ThreadPool pool, ffi::AnyBuffer a, ffi::AnyBuffer u,
                    ffi::AnyBuffer zi, ffi::Result<ffi::AnyBuffer> y,
                    bool final_state, bool time_major) {
  ffi::Error error = CheckForward(a, u, zi, *y, final_state, time_major);
  if (error.failure()) return error;
  const int64_t batch = u.dimensions()[time_major ? 1 : 0];
  const int64_t samples = u.dimensions()[time_major ? 0 : 1];
  const int64_t n = a.dimensions()[1];
  const int64_t columns = time_major ? batch : 0;
  if (batch == 0 || y->element_count() == 0) return ffi::Error::Success();
  if (u.element_type() == ffi::DataType::F32) {
    Forward<float>(pool, a, u, zi, y, nullptr, samples, batch, n, final_state,
                   1, columns);
  } else {
    Forward<double>(pool, a, u, zi, y, nullptr, samples, batch, n,
                    final_state, 1, columns);
  }
  return ffi::Error::Success();
}

// The forward pass of reverse mode: the output y (B, T) and the
// checkpoints ck (B, K, 2 S) for blocks of `block` samples in the kernels'
// own layout (see `Blocks` and `All`), which only `SectionsAdjoint` reads.
ffi::Error SectionsSaved(ffi::ThreadPool pool, ffi::AnyBuffer a,
                         ffi::AnyBuffer u, ffi::AnyBuffer zi,
                         ffi::Result<ffi::AnyBuffer> y,
                         ffi::Result<ffi::AnyBuffer> ck, int64_t block) {
  ffi::Error error = CheckForward(a, u, zi, *y, false);
  if (error.failure()) return error;
  const int64_t batch = u.dimensions()[0], samples = u.dimensions()[1];
  const int64_t n = a.dimensions()[1];
  error = CheckCheckpoints(*ck, u, n, block, "sections saved");
  if (error.failure()) return error;
  if (batch == 0 || y->element_count() == 0) return ffi::Error::Success();
  if (u.element_type() == ffi::DataType::F32) {
    Forward<float>(pool, a, u, zi, y, static_cast<float*>(ck->untyped_data()),
                   samples, batch, n, false, block);
  } else {
    Forward<double>(pool, a, u, zi, y,
                    static_cast<double*>(ck->untyped_data()), samples, batch,
                    n, false, block);
  }
  return ffi::Error::Success();
}

template <typename R>
void Backward(ffi::ThreadPool& pool, const ffi::AnyBuffer& a,
              const ffi::AnyBuffer& u, const ffi::AnyBuffer& zi,
              const ffi::AnyBuffer& ck, const ffi::AnyBuffer& ct,
              ffi::Result<ffi::AnyBuffer>& out, int64_t samples, int64_t batch,
              int64_t n, int64_t block) {
  Run<R>(pool,
         Pointers<R>(a, u, zi, static_cast<const R*>(ct.untyped_data()),
                     const_cast<R*>(static_cast<const R*>(ck.untyped_data())),
                     static_cast<R*>(out->untyped_data()), samples, batch, n,
                     false, block),
         out->size_bytes());
}

ffi::Error SectionsAdjoint(ffi::ThreadPool pool, ffi::AnyBuffer a,
                           ffi::AnyBuffer u, ffi::AnyBuffer zi,
                           ffi::AnyBuffer ck, ffi::AnyBuffer ct,
                           ffi::Result<ffi::AnyBuffer> out, int64_t block) {
  const auto dims = u.dimensions();
  const auto a_dims = a.dimensions();
  const auto zi_dims = zi.dimensions();
  const auto ct_dims = ct.dimensions();
  const auto out_dims = out->dimensions();
  if (dims.size() != 2 || a_dims.size() != 3 || zi_dims.size() != 2 ||
      ct_dims.size() != 2 || out_dims.size() != 2) {
    return ffi::Error::InvalidArgument(
        "sections adjoint: u and ct need shape (batch, time), a (batch, "
        "sections, 5), zi (batch, 2 sections)");
  }
  const int64_t batch = dims[0], samples = dims[1], n = a_dims[1];
  if (a_dims[0] != batch || a_dims[2] != kCoefficients ||
      zi_dims[0] != batch || zi_dims[1] != 2 * n || ct_dims[0] != batch ||
      ct_dims[1] != samples || out_dims[0] != batch ||
      out_dims[1] != samples + 7 * n) {
    return ffi::Error::InvalidArgument(
        "sections adjoint: operand shapes disagree");
  }
  ffi::Error error = CheckCheckpoints(ck, u, n, block, "sections adjoint");
  if (error.failure()) return error;
  const auto type = u.element_type();
  if (a.element_type() != type || zi.element_type() != type ||
      ct.element_type() != type || out->element_type() != type) {
    return ffi::Error::InvalidArgument("sections adjoint: mixed dtypes");
  }
  if (batch == 0 || out->element_count() == 0) return ffi::Error::Success();
  switch (type) {
    case ffi::DataType::F32:
      Backward<float>(pool, a, u, zi, ck, ct, out, samples, batch, n, block);
      return ffi::Error::Success();
    case ffi::DataType::F64:
      Backward<double>(pool, a, u, zi, ck, ct, out, samples, batch, n, block);
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(
          "sections adjoint: float32 or float64 only");
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
                                  .Attr<bool>("final_state")
                                  .Attr<bool>("time_major"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxSectionsSaved, SectionsSaved,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("block"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxSectionsAdjoint, SectionsAdjoint,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Attr<int64_t>("block"));
