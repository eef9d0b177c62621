/* The hardware limit of the benchmarked recursions: plain C loops of the
 * order-2 time-varying all-pole filter (`allpole2`) and of the switched
 * attack/release one-pole (`ballistics`, at the end of this file). The first,
 *
 *     y[t] = x[t] - a1[t] y[t-1] - a2[t] y[t-2],   y[-1], y[-2] from zi,
 *
 * float32, on B signals stored time-major (sample t of signal b at
 * t * B + b, coefficients as two planes of the same layout), so that a group
 * of signals shares SIMD registers (a wide batch advances all its signals
 * one step at a time, reading memory in order). `bench_ops.py` compiles this file
 * with `cc -O3 -march=native` and times both loops on data already in that
 * layout (no conversion), forward only. */

#include <math.h>
#include <stdint.h>

#define LANES 8

static void group(const float *restrict x, const float *restrict a1,
                  const float *restrict a2, const float *restrict zi,
                  float *restrict y, int64_t length, int64_t batch,
                  int64_t first, int lanes) {
  float s1[LANES], s2[LANES];
  for (int l = 0; l < lanes; ++l) {
    s1[l] = zi[2 * (first + l)];
    s2[l] = zi[2 * (first + l) + 1];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    for (int l = 0; l < lanes; ++l) {
      const float v = x[i + l] - a2[i + l] * s2[l] - a1[i + l] * s1[l];
      s2[l] = s1[l];
      s1[l] = v;
      y[i + l] = v;
    }
  }
}

static void group8(const float *restrict x, const float *restrict a1,
                   const float *restrict a2, const float *restrict zi,
                   float *restrict y, int64_t length, int64_t batch,
                   int64_t first) {
  float s1[LANES], s2[LANES];
  for (int l = 0; l < LANES; ++l) {
    s1[l] = zi[2 * (first + l)];
    s2[l] = zi[2 * (first + l) + 1];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    for (int l = 0; l < LANES; ++l) {
      const float v = x[i + l] - a2[i + l] * s2[l] - a1[i + l] * s1[l];
      s2[l] = s1[l];
      s1[l] = v;
      y[i + l] = v;
    }
  }
}

static void wide(const float *restrict x, const float *restrict a1,
                 const float *restrict a2, const float *restrict zi,
                 float *restrict y, int64_t length, int64_t batch,
                 float *restrict s1, float *restrict s2) {
  for (int64_t b = 0; b < batch; ++b) {
    s1[b] = zi[2 * b];
    s2[b] = zi[2 * b + 1];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch;
    for (int64_t b = 0; b < batch; ++b) {
      const float v = x[i + b] - a2[i + b] * s2[b] - a1[i + b] * s1[b];
      s2[b] = s1[b];
      s1[b] = v;
      y[i + b] = v;
    }
  }
}

/* One signal: the state in two scalars (registers), no lane arrays. */
static void single(const float *restrict x, const float *restrict a1,
                   const float *restrict a2, const float *restrict zi,
                   float *restrict y, int64_t length, int64_t batch,
                   int64_t first) {
  float s1 = zi[2 * first], s2 = zi[2 * first + 1];
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    const float v = x[i] - a2[i] * s2 - a1[i] * s1;
    s2 = s1;
    s1 = v;
    y[i] = v;
  }
}

void allpole2(const float *x, const float *a1, const float *a2,
              const float *zi, float *y, int64_t batch, int64_t length) {
  if (batch > 64 && batch <= 4096) {
    float s1[4096], s2[4096];
    wide(x, a1, a2, zi, y, length, batch, s1, s2);
    return;
  }
  int64_t first = 0;
  for (; batch - first >= LANES; first += LANES)
    group8(x, a1, a2, zi, y, length, batch, first);
  if (batch - first == 1)
    single(x, a1, a2, zi, y, length, batch, first);
  else if (first < batch)
    group(x, a1, a2, zi, y, length, batch, first, (int)(batch - first));
}

/* The switched one-pole of `retrax.ops.ballistics` (torchcomp's
 * `compressor_core`), float32, B signals time-major (sample t of signal b at
 * t * B + b), one attack and one release coefficient per signal:
 *
 *     c = at if x[t] < y[t-1] else rt,   y[t] = fma(1 - c, y[t-1], c x[t]),
 *
 * y[-1] = zi. Choosing c first and forming one fma gives the same float as
 * forming both candidate updates and choosing one (retrax's kernel). For a
 * group of signals in SIMD lanes the loops choose c first (a compare and a
 * blend, then one fma: the faster of the two forms there, measured with
 * gcc -O3 -march=native on a 2-core x86 CPU); for one signal they form both
 * candidates, which takes the compare off the loop-carried dependency. */

static void ballistics_lanes(const float *restrict x, const float *restrict at,
                             const float *restrict rt, const float *restrict zi,
                             float *restrict y, int64_t length, int64_t batch,
                             int64_t first, int lanes) {
  float s[LANES], a[LANES], r[LANES];
  for (int l = 0; l < lanes; ++l) {
    s[l] = zi[first + l];
    a[l] = at[first + l];
    r[l] = rt[first + l];
  }
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    for (int l = 0; l < lanes; ++l) {
      const float xt = x[i + l];
      const float c = xt < s[l] ? a[l] : r[l];
      s[l] = fmaf(1.0f - c, s[l], c * xt);
      y[i + l] = s[l];
    }
  }
}

static void ballistics8(const float *restrict x, const float *restrict at,
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
    for (int l = 0; l < LANES; ++l) {
      const float xt = x[i + l];
      const float c = xt < s[l] ? a[l] : r[l];
      s[l] = fmaf(1.0f - c, s[l], c * xt);
      y[i + l] = s[l];
    }
  }
}

static void ballistics_wide(const float *restrict x, const float *restrict at,
                            const float *restrict rt, const float *restrict zi,
                            float *restrict y, int64_t length, int64_t batch,
                            float *restrict s) {
  for (int64_t b = 0; b < batch; ++b) s[b] = zi[b];
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch;
    for (int64_t b = 0; b < batch; ++b) {
      const float xt = x[i + b];
      const float c = xt < s[b] ? at[b] : rt[b];
      s[b] = fmaf(1.0f - c, s[b], c * xt);
      y[i + b] = s[b];
    }
  }
}

static void ballistics1(const float *restrict x, float at, float rt, float zi,
                        float *restrict y, int64_t length, int64_t batch,
                        int64_t first) {
  float s = zi;
  for (int64_t t = 0; t < length; ++t) {
    const int64_t i = t * batch + first;
    const float xt = x[i];
    const float attack = fmaf(1.0f - at, s, at * xt);
    const float release = fmaf(1.0f - rt, s, rt * xt);
    s = xt < s ? attack : release;
    y[i] = s;
  }
}

void ballistics(const float *x, const float *at, const float *rt,
                const float *zi, float *y, int64_t batch, int64_t length) {
  if (batch > 64 && batch <= 4096) {
    float s[4096];
    ballistics_wide(x, at, rt, zi, y, length, batch, s);
    return;
  }
  int64_t first = 0;
  for (; batch - first >= LANES; first += LANES)
    ballistics8(x, at, rt, zi, y, length, batch, first);
  if (batch - first == 1)
    ballistics1(x, at[first], rt[first], zi[first], y, length, batch, first);
  else if (first < batch)
    ballistics_lanes(x, at, rt, zi, y, length, batch, first,
                     (int)(batch - first));
}
