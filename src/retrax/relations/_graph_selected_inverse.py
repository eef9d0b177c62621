r"""Selected inversion: the diagonal blocks of the inverse of a graph's
symmetric precision, from its Cholesky factorisation, without a Python loop
over variables.

For a symmetric block-tridiagonal matrix with diagonal blocks $D_i$ and
blocks $U_i$ right of the diagonal ($U_i^\top$ left of it), block Cholesky
elimination from the first block gives the Schur complements
$S_i = D_i - F_{i-1}^\top F_{i-1} = C_i C_i^\top$ with
$F_i = C_i^{-1} U_i$ (one `lax.scan` forward). The diagonal blocks of the
inverse follow by Takahashi's recurrence (the Rauch–Tung–Striebel smoother's
backward pass) in a second scan:

$$\Sigma_i = S_i^{-1} + S_i^{-1} U_i \Sigma_{i+1} U_i^\top S_i^{-1}
= C_i^{-\top}\left(I + F_i \Sigma_{i+1} F_i^\top\right) C_i^{-1},$$

from $\Sigma_{c-1} = S_{c-1}^{-1}$ (Takahashi, Fagan and Chen, 1973). Both
passes cost $O(c\,s^3)$ for $c$ super-blocks of size $s$: linear in the
number of variables. Each variable's block is then gathered from its
super-block with index arrays computed once in numpy, so the compiled program
is the same for any number of variables.

The same factorisations give the log-determinant,
$\log\det = 2\sum_i \sum_k \log (C_i)_{kk}$.

A precision that is not positive definite has no Cholesky factor (XLA's
returns NaN); the blocks and the log-determinant are then NaN and `ok` is
false.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import cho_solve, solve_triangular
from jaxtyping import Array, Bool, Float


def _symmetric_bands(bands: Float[Array, "c 3 s s"]):
    """The diagonal blocks and the blocks right of the diagonal of the
    symmetric part of a block-tridiagonal matrix; the last upper block 0."""
    diag = 0.5 * (bands[:, 1] + jnp.swapaxes(bands[:, 1], -1, -2))
    upper = 0.5 * (bands[:-1, 2] + jnp.swapaxes(bands[1:, 0], -1, -2))
    upper = jnp.concatenate([upper, jnp.zeros_like(bands[:1, 2])])
    return diag, upper


def _block_cholesky(diag, upper):
    """Per super-block, the Cholesky factor $C_i$ of the Schur complement and
    $F_i = C_i^{-1} U_i$."""

    def step(f_prev, blocks):
        d, u = blocks
        s = d - f_prev.T @ f_prev
        c = jnp.linalg.cholesky(0.5 * (s + s.T))
        f = solve_triangular(c, u, lower=True)
        return f, (c, f)

    _, (chol, f) = jax.lax.scan(step, jnp.zeros_like(diag[0]), (diag, upper))
    return chol, f


def _takahashi(chol, f):
    r"""The diagonal blocks $\Sigma_i$ of the inverse, by the backward pass."""
    eye = jnp.eye(chol.shape[-1], dtype=chol.dtype)

    def step(sigma_next, blocks):
        c, f_i = blocks
        m = eye + f_i @ sigma_next @ f_i.T
        half = solve_triangular(c, m, lower=True, trans="T")
        sigma = solve_triangular(c, half.T, lower=True, trans="T")
        sigma = 0.5 * (sigma + sigma.T)
        return sigma, sigma

    _, sigmas = jax.lax.scan(step, jnp.zeros_like(chol[0]), (chol, f), reverse=True)
    return sigmas


@functools.lru_cache(maxsize=64)
def _gather_index(first: bytes, dims: bytes, block: int, bound: int):
    """Static numpy indices of each variable's `(d, d)` block (padded to the
    largest dimension `d`): its super-block, rows and columns (clipped below
    `bound`), and the mask of its own entries."""
    first = np.frombuffer(first, dtype=np.int64)
    dims = np.frombuffer(dims, dtype=np.int64)
    d = int(dims.max())
    which, offset = np.divmod(first, block)
    span = np.arange(d)
    rows = offset[:, None, None] + span[None, :, None]
    cols = offset[:, None, None] + span[None, None, :]
    mask = (span[None, :, None] < dims[:, None, None]) & (
        span[None, None, :] < dims[:, None, None]
    )
    rows, cols = np.minimum(rows, bound - 1), np.minimum(cols, bound - 1)
    return which[:, None, None], rows, cols, mask


def _index(first, dims, block, bound):
    first = np.ascontiguousarray(first, dtype=np.int64)
    dims = np.ascontiguousarray(dims, dtype=np.int64)
    return _gather_index(first.tobytes(), dims.tobytes(), int(block), int(bound))


def banded_marginals(
    bands: Float[Array, "c 3 s s"],
    padded: np.ndarray,
    var_start: np.ndarray,
    var_dim: np.ndarray,
) -> tuple[Float[Array, "V d d"], Bool[Array, ""]]:
    """Per variable, its diagonal block of the inverse of the symmetric part
    of a block-tridiagonal matrix.

    **Arguments:**

    - `bands`: the matrix as `(count, 3, size, size)` (band 0 left of the
      diagonal, 1 the diagonal, 2 right of it; `FactorGraph.banded_jacobian`'s
      layout), padding the identity.
    - `padded`: each flat coordinate's padded coordinate (numpy).
    - `var_start`, `var_dim`: each variable's first flat coordinate and
      dimension (numpy).

    **Returns:**

    The blocks, `(V, d, d)` padded to the largest dimension `d` with zeros,
    and whether the symmetric part is positive definite (the blocks are NaN
    where it is not).
    """
    diag, upper = _symmetric_bands(bands)
    chol, f = _block_cholesky(diag, upper)
    ok = jnp.all(jnp.isfinite(chol))
    sigmas = _takahashi(chol, f)
    size = bands.shape[-1]
    which, rows, cols, mask = _index(
        np.asarray(padded)[np.asarray(var_start)], var_dim, size, size
    )
    blocks = sigmas[which, rows, cols]
    return jnp.where(mask, blocks, jnp.zeros((), blocks.dtype)), ok


def dense_marginals(
    matrix: Float[Array, "n n"], var_start: np.ndarray, var_dim: np.ndarray
) -> tuple[Float[Array, "V d d"], Bool[Array, ""]]:
    """Per variable, its diagonal block of the inverse of the symmetric part
    of a dense matrix, by its Cholesky factorisation.

    **Arguments:**

    - `matrix`: the `(n, n)` matrix.
    - `var_start`, `var_dim`: each variable's first coordinate and dimension
      (numpy).

    **Returns:**

    The blocks, `(V, d, d)` padded to the largest dimension `d` with zeros,
    and whether the symmetric part is positive definite (the blocks are NaN
    where it is not).
    """
    n = matrix.shape[-1]
    chol = jnp.linalg.cholesky(0.5 * (matrix + matrix.T))
    ok = jnp.all(jnp.isfinite(chol))
    cov = cho_solve((chol, True), jnp.eye(n, dtype=matrix.dtype))
    cov = 0.5 * (cov + cov.T)
    _, rows, cols, mask = _index(np.asarray(var_start), var_dim, n + 1, n)
    blocks = cov[rows, cols]
    return jnp.where(mask, blocks, jnp.zeros((), blocks.dtype)), ok


def banded_logdet(
    bands: Float[Array, "c 3 s s"],
) -> tuple[Float[Array, ""], Bool[Array, ""]]:
    """The log-determinant of the symmetric part of a block-tridiagonal matrix
    (`banded_marginals`' layout, padding the identity), and whether it is
    positive definite (the log-determinant is NaN where it is not)."""
    chol, _ = _block_cholesky(*_symmetric_bands(bands))
    ok = jnp.all(jnp.isfinite(chol))
    diagonal = jnp.diagonal(chol, axis1=-2, axis2=-1)
    return 2 * jnp.sum(jnp.log(diagonal)), ok


def dense_logdet(
    matrix: Float[Array, "n n"],
) -> tuple[Float[Array, ""], Bool[Array, ""]]:
    """The log-determinant of the symmetric part of a dense matrix, and whether
    it is positive definite (the log-determinant is NaN where it is not)."""
    chol = jnp.linalg.cholesky(0.5 * (matrix + matrix.T))
    ok = jnp.all(jnp.isfinite(chol))
    return 2 * jnp.sum(jnp.log(jnp.diagonal(chol))), ok
