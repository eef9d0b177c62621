/* The hardware limit of `ballistics`: a plain C loop of the switched
 * attack/release recursion
 *
 *     c[t] = at if x[t] < y[t-1] else rt,   y[t] = (1 - c) y[t-1] + c x[t],
 *
 * y[-1] = zi, float32, on B signals stored time-major (sample t of signal b
 * at t * B + b; per-sample coefficients in the same layout, per-signal ones
 * at b), so that a group of 8 signals shares SIMD registers. Meant to be
 * compiled with `cc -O3 -march=native` and timed on data already in that
 * layout (no conversion), like `allpole_loop.c`. `ballistics2` is its entry
 * point. */

#include <stdint.h>

#define LANES 8

static void group(const float *restrict x, const float *restrict at,
                  const float *restrict rt, const float *restrict zi,
                  float *restrict y, int64_t length, int64_t batch,
                  int64_t first, int lanes, int per_sample) {
  float s[LANES], a[LANES], r[LANES];
  for (int l = 0; l < lanes; ++l) {
    s[l] = zi[first + l];
    a[l] = per_sample ? 0.0f : at[first + l];
    r[l] = per_sample ? 0.0f : rt[first + l];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    for (int l = 0; l < lanes; ++l) {
      const float xt = x[i + l];
      const float aa = per_sample ? at[i + l] : a[l];
      const float rr = per_sample ? rt[i + l] : r[l];
      const float c = xt < s[l] ? aa : rr;
      s[l] = (1.0f - c) * s[l] + c * xt;
      y[i + l] = s[l];
    }
  }
}

static void group8(const float *restrict x, const float *restrict at,
                   const float *restrict rt, const float *restrict zi,
                   float *restrict y, int64_t length, int64_t batch,
                   int64_t first) {
  float s[LANES], a[LANES], r[LANES];
  for (int l = 0; l < LANES; ++l) {
    s[l] = zi[first + l];
    a[l] = at[first + l];
    r[l] = rt[first + l];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    /* kept a loop, which GCC vectorizes into one step of the 8 lanes */
#pragma GCC unroll 1
    for (int l = 0; l < LANES; ++l) {
      const float xt = x[i + l];
      const float c = xt < s[l] ? a[l] : r[l];
      s[l] = (1.0f - c) * s[l] + c * xt;
      y[i + l] = s[l];
    }
  }
}

static void group8_per_sample(const float *restrict x,
                              const float *restrict at,
                              const float *restrict rt,
                              const float *restrict zi, float *restrict y,
                              int64_t length, int64_t batch, int64_t first) {
  float s[LANES];
  for (int l = 0; l < LANES; ++l) s[l] = zi[first + l];
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    /* kept a loop, which GCC vectorizes into one step of the 8 lanes */
#pragma GCC unroll 1
    for (int l = 0; l < LANES; ++l) {
      const float xt = x[i + l];
      const float c = xt < s[l] ? at[i + l] : rt[i + l];
      s[l] = (1.0f - c) * s[l] + c * xt;
      y[i + l] = s[l];
    }
  }
}

/* `at`, `rt`: one value per signal (B,) or, if `per_sample`, per sample. */
void ballistics2(const float *x, const float *at, const float *rt,
                 const float *zi, float *y, int64_t batch, int64_t length,
                 int per_sample) {
  int64_t first = 0;
  for (; batch - first >= LANES; first += LANES) {
    if (per_sample)
      group8_per_sample(x, at, rt, zi, y, length, batch, first);
    else
      group8(x, at, rt, zi, y, length, batch, first);
  }
  if (first < batch)
    group(x, at, rt, zi, y, length, batch, first, (int)(batch - first),
          per_sample);
}
