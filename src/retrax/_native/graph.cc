// Block Cholesky of a symmetric block-tridiagonal matrix, and its solve: the
// linear algebra of a factor graph's Gauss-Newton (Levenberg-Marquardt) step
// in its bandwidth-reducing order (src/retrax/relations/_graph_system.py).
//
// The matrix has diagonal blocks D_i (c of them, each s x s) and blocks U_i
// right of the diagonal (row i, column i + 1; left of it, their transposes).
// Its Cholesky factor is block bidiagonal:
//
//   C_0 C_0^T = D_0,  V_{i-1} = C_{i-1}^{-1} U_{i-1},
//   C_i C_i^T = D_i - V_{i-1}^T V_{i-1},
//
// and `RetraxBlockCholesky` returns the lower triangular C_i (of the
// symmetric part of each Schur complement, as LAPACK's potrf after JAX's
// symmetrisation; a block that is not positive definite, or not finite, is
// NaN, and so is everything eliminated after it) and the V_i.
// `RetraxBlockCholeskySolve` then solves the system for one right-hand side:
//
//   z_0 = C_0^{-1} r_0,  z_i = C_i^{-1} (r_i - V_{i-1}^T z_{i-1}),
//   x_{c-1} = C_{c-1}^{-T} z_{c-1},  x_i = C_i^{-T} (z_i - V_i x_{i+1}).
//
// These are the recurrences of the pure-JAX `lax.scan`s in
// src/retrax/relations/_block_cholesky.py, whose blocks (tens of unknowns)
// cost XLA a LAPACK call each, dominated by the call; here each block is a
// few loops, compiled twice (AVX2 and FMA where the CPU has them, and plain).
// Leading dimensions of the operands are a batch (`vmap`), run in parallel
// chunks.

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "cpu.h"
#include "parallel.h"
#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define RETRAX_X86 1
#define RETRAX_AVX2 __attribute__((target("avx2,fma")))
#endif
#define RETRAX_INLINE inline __attribute__((always_inline))

namespace ffi = xla::ffi;

namespace {

// The lower Cholesky factor of the symmetric part of `a` (s x s, row major)
// into `l` (zeros above the diagonal); its lower triangle NaN when a pivot is
// not positive (or not finite).
template <typename T>
RETRAX_INLINE void Cholesky(const T* a, T* l, int64_t s) {
  for (int64_t i = 0; i < s * s; ++i) l[i] = T(0);
  for (int64_t j = 0; j < s; ++j) {
    T d = a[j * s + j];
    for (int64_t k = 0; k < j; ++k) d -= l[j * s + k] * l[j * s + k];
    if (!(d > T(0)) || !std::isfinite(d)) {  // NaN, as jnp.linalg.cholesky
      for (int64_t i = 0; i < s; ++i) {
        for (int64_t k = 0; k <= i; ++k) {
          l[i * s + k] = std::numeric_limits<T>::quiet_NaN();
        }
      }
      return;
    }
    const T root = std::sqrt(d);
    l[j * s + j] = root;
    const T inv = T(1) / root;
    for (int64_t i = j + 1; i < s; ++i) {
      T v = T(0.5) * (a[i * s + j] + a[j * s + i]);
      for (int64_t k = 0; k < j; ++k) v -= l[i * s + k] * l[j * s + k];
      l[i * s + j] = v * inv;
    }
  }
}

// b <- l^{-1} b for `cols` columns of b (s x cols, row major).
template <typename T>
RETRAX_INLINE void Forward(const T* l, T* b, int64_t s, int64_t cols) {
  for (int64_t r = 0; r < s; ++r) {
    T* row = b + r * cols;
    for (int64_t k = 0; k < r; ++k) {
      const T f = l[r * s + k];
      const T* other = b + k * cols;
      for (int64_t c = 0; c < cols; ++c) row[c] -= f * other[c];
    }
    const T inv = T(1) / l[r * s + r];
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
  }
}

// x <- l^{-T} x for one vector x (s).
template <typename T>
RETRAX_INLINE void Backward(const T* l, T* x, int64_t s) {
  for (int64_t r = s - 1; r >= 0; --r) {
    T v = x[r];
    for (int64_t k = r + 1; k < s; ++k) v -= l[k * s + r] * x[k];
    x[r] = v / l[r * s + r];
  }
}

// One matrix of the batch: diag (c, s, s), upper (c-1, s, s) -> chol
// (c, s, s), right (c-1, s, s) holding the V_i; `work` holds s * s.
template <typename T>
RETRAX_INLINE void FactorOne(const T* diag, const T* upper, T* chol, T* right,
                             T* work, int64_t c, int64_t s) {
  const int64_t block = s * s;
  Cholesky(diag, chol, s);
  for (int64_t i = 1; i < c; ++i) {
    T* v = right + (i - 1) * block;
    const T* u = upper + (i - 1) * block;
    for (int64_t k = 0; k < block; ++k) v[k] = u[k];
    Forward(chol + (i - 1) * block, v, s, s);
    // D_i - V^T V, row by row: work[r, :] -= V[k, r] V[k, :]
    const T* d = diag + i * block;
    for (int64_t k = 0; k < block; ++k) work[k] = d[k];
    for (int64_t k = 0; k < s; ++k) {
      const T* vk = v + k * s;
      for (int64_t r = 0; r < s; ++r) {
        const T f = vk[r];
        T* out = work + r * s;
        for (int64_t j = 0; j < s; ++j) out[j] -= f * vk[j];
      }
    }
    Cholesky(work, chol + i * block, s);
  }
}

// One right-hand side of the batch: chol (c, s, s), right (c-1, s, s),
// rhs (c, s) -> x (c, s).
template <typename T>
RETRAX_INLINE void SolveOne(const T* chol, const T* right, const T* rhs, T* x,
                            int64_t c, int64_t s) {
  const int64_t block = s * s;
  for (int64_t k = 0; k < c * s; ++k) x[k] = rhs[k];
  Forward(chol, x, s, 1);
  for (int64_t i = 1; i < c; ++i) {  // z_i = C_i^{-1} (r_i - V^T z_{i-1})
    const T* v = right + (i - 1) * block;
    const T* prev = x + (i - 1) * s;
    T* z = x + i * s;
    for (int64_t k = 0; k < s; ++k) {
      const T f = prev[k];
      const T* vk = v + k * s;
      for (int64_t j = 0; j < s; ++j) z[j] -= vk[j] * f;
    }
    Forward(chol + i * block, z, s, 1);
  }
  Backward(chol + (c - 1) * block, x + (c - 1) * s, s);
  for (int64_t i = c - 2; i >= 0; --i) {  // x_i = C_i^{-T} (z_i - V_i x_{i+1})
    const T* v = right + i * block;
    const T* next = x + (i + 1) * s;
    T* z = x + i * s;
    for (int64_t r = 0; r < s; ++r) {
      T acc = T(0);
      for (int64_t k = 0; k < s; ++k) acc += v[r * s + k] * next[k];
      z[r] -= acc;
    }
    Backward(chol + i * block, z, s);
  }
}

template <typename T>
void FactorPlain(const T* diag, const T* upper, T* chol, T* right, T* work,
                 int64_t c, int64_t s) {
  FactorOne(diag, upper, chol, right, work, c, s);
}

template <typename T>
void SolvePlain(const T* chol, const T* right, const T* rhs, T* x, int64_t c,
                int64_t s) {
  SolveOne(chol, right, rhs, x, c, s);
}

#ifdef RETRAX_X86
template <typename T>
RETRAX_AVX2 void FactorAvx2(const T* diag, const T* upper, T* chol, T* right,
                            T* work, int64_t c, int64_t s) {
  FactorOne(diag, upper, chol, right, work, c, s);
}

template <typename T>
RETRAX_AVX2 void SolveAvx2(const T* chol, const T* right, const T* rhs, T* x,
                           int64_t c, int64_t s) {
  SolveOne(chol, right, rhs, x, c, s);
}
#endif

template <typename T>
void Factor(const T* diag, const T* upper, T* chol, T* right, T* work,
            int64_t c, int64_t s) {
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) {
    FactorAvx2(diag, upper, chol, right, work, c, s);
    return;
  }
#endif
  FactorPlain(diag, upper, chol, right, work, c, s);
}

template <typename T>
void Solve(const T* chol, const T* right, const T* rhs, T* x, int64_t c,
           int64_t s) {
#ifdef RETRAX_X86
  if (retrax::HasAvx2Fma()) {
    SolveAvx2(chol, right, rhs, x, c, s);
    return;
  }
#endif
  SolvePlain(chol, right, rhs, x, c, s);
}

// The trailing (c, s, s) of `diag` give c and s; the leading dimensions are
// the batch.
bool Shape(const ffi::AnyBuffer& diag, int64_t* batch, int64_t* c, int64_t* s) {
  const auto dims = diag.dimensions();
  if (dims.size() < 3 || dims[dims.size() - 1] != dims[dims.size() - 2]) {
    return false;
  }
  *s = dims[dims.size() - 1];
  *c = dims[dims.size() - 3];
  *batch = 1;
  for (size_t k = 0; k + 3 < dims.size(); ++k) *batch *= dims[k];
  return true;
}

// `run(T{})` with T the dtype `type` names: float32 or float64 only.
template <typename F>
ffi::Error ForRealDtype(ffi::DataType type, const char* what, F&& run) {
  switch (type) {
    case ffi::DataType::F32:
      run(float{});
      return ffi::Error::Success();
    case ffi::DataType::F64:
      run(double{});
      return ffi::Error::Success();
    default:
      return ffi::Error::InvalidArgument(std::string(what) +
                                         ": float32 or float64 only");
  }
}

template <typename T>
void RunFactor(ffi::ThreadPool& pool, const ffi::AnyBuffer& diag,
               const ffi::AnyBuffer& upper,
               ffi::Result<ffi::AnyBuffer>& chol,
               ffi::Result<ffi::AnyBuffer>& right, int64_t batch, int64_t c,
               int64_t s) {
  const int64_t block = s * s;
  const int64_t off = c > 0 ? (c - 1) * block : 0;
  const T* d = diag.typed_data<T>();
  const T* up = upper.typed_data<T>();
  T* ch = chol->typed_data<T>();
  T* w = right->typed_data<T>();
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    T* work = new T[block];
    for (int64_t b = first; b < first + count; ++b) {
      Factor(d + b * c * block, up + b * off, ch + b * c * block, w + b * off,
             work, c, s);
    }
    delete[] work;
  });
}

ffi::Error BlockCholesky(ffi::ThreadPool pool, ffi::AnyBuffer diag,
                         ffi::AnyBuffer upper,
                         ffi::Result<ffi::AnyBuffer> chol,
                         ffi::Result<ffi::AnyBuffer> right) {
  int64_t batch, c, s;
  if (!Shape(diag, &batch, &c, &s)) {
    return ffi::Error::InvalidArgument(
        "block_cholesky: diag must be (..., c, s, s)");
  }
  const int64_t off = c > 0 ? (c - 1) * s * s : 0;
  if (static_cast<int64_t>(upper.element_count()) != batch * off ||
      static_cast<int64_t>(right->element_count()) != batch * off ||
      chol->element_count() != diag.element_count()) {
    return ffi::Error::InvalidArgument(
        "block_cholesky: upper and right must be (..., c - 1, s, s)");
  }
  const auto type = diag.element_type();
  if (upper.element_type() != type || chol->element_type() != type ||
      right->element_type() != type) {
    return ffi::Error::InvalidArgument("block_cholesky: mixed dtypes");
  }
  if (batch * c * s == 0) return ffi::Error::Success();
  return ForRealDtype(type, "block_cholesky", [&](auto zero) {
    using T = decltype(zero);
    RunFactor<T>(pool, diag, upper, chol, right, batch, c, s);
  });
}

template <typename T>
void RunSolve(ffi::ThreadPool& pool, const ffi::AnyBuffer& chol,
              const ffi::AnyBuffer& right, const ffi::AnyBuffer& rhs,
              ffi::Result<ffi::AnyBuffer>& x, int64_t batch, int64_t c,
              int64_t s) {
  const int64_t block = s * s;
  const int64_t off = c > 0 ? (c - 1) * block : 0;
  const T* ch = chol.typed_data<T>();
  const T* w = right.typed_data<T>();
  const T* r = rhs.typed_data<T>();
  T* out = x->typed_data<T>();
  retrax::ParallelChunks(pool, batch, [&](int64_t first, int64_t count) {
    for (int64_t b = first; b < first + count; ++b) {
      Solve(ch + b * c * block, w + b * off, r + b * c * s, out + b * c * s, c,
            s);
    }
  });
}

ffi::Error BlockCholeskySolve(ffi::ThreadPool pool, ffi::AnyBuffer chol,
                              ffi::AnyBuffer right, ffi::AnyBuffer rhs,
                              ffi::Result<ffi::AnyBuffer> x) {
  int64_t batch, c, s;
  if (!Shape(chol, &batch, &c, &s)) {
    return ffi::Error::InvalidArgument(
        "block_cholesky_solve: chol must be (..., c, s, s)");
  }
  const int64_t off = c > 0 ? (c - 1) * s * s : 0;
  if (static_cast<int64_t>(right.element_count()) != batch * off ||
      static_cast<int64_t>(rhs.element_count()) != batch * c * s ||
      x->element_count() != rhs.element_count()) {
    return ffi::Error::InvalidArgument(
        "block_cholesky_solve: right must be (..., c - 1, s, s) and rhs "
        "(..., c, s)");
  }
  const auto type = chol.element_type();
  if (right.element_type() != type || rhs.element_type() != type ||
      x->element_type() != type) {
    return ffi::Error::InvalidArgument("block_cholesky_solve: mixed dtypes");
  }
  if (batch * c * s == 0) return ffi::Error::Success();
  return ForRealDtype(type, "block_cholesky_solve", [&](auto zero) {
    using T = decltype(zero);
    RunSolve<T>(pool, chol, right, rhs, x, batch, c, s);
  });
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxBlockCholesky, BlockCholesky,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(RetraxBlockCholeskySolve, BlockCholeskySolve,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Arg<ffi::AnyBuffer>()
                                  .Ret<ffi::AnyBuffer>());
