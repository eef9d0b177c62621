/* The hardware limit of the benchmarked recursion: a plain C loop of the
 * order-2 time-varying all-pole filter
 *
 *     y[t] = x[t] - a1[t] y[t-1] - a2[t] y[t-2],   y[-1], y[-2] from zi,
 *
 * float32, on B signals stored time-major (sample t of signal b at
 * t * B + b, coefficients as two planes of the same layout), so that a group
 * of signals shares SIMD registers (a wide batch advances all its signals
 * one step at a time, reading memory in order). `bench_ops.py` compiles it with
 * `cc -O3 -march=native` and times it on data already in that layout (no
 * conversion), forward only. */

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
  if (first < batch)
    group(x, a1, a2, zi, y, length, batch, first, (int)(batch - first));
}
