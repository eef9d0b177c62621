"""The block Cholesky factorisation and solve of a symmetric block-tridiagonal
matrix (the least-squares steps' linear algebra on banded graphs): the
compiled loop and the `lax.scan`s against a dense solve, every shape from
one block and one unknown up, float32 and float64, `jit`, `vmap`, forward
and reverse derivatives, and a matrix that is not positive definite."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import _native
from retrax.relations import _block_cholesky as bc


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels

_TOL = {jnp.float32: 2e-5, jnp.float64: 1e-12}


def _matrix(c, s, seed=0):
    """A well-conditioned symmetric positive definite block-tridiagonal
    matrix as `(c, 3, s, s)` bands, and densely."""
    rng = np.random.default_rng(seed)
    n = c * s
    root = np.zeros((n, n))
    for i in range(c):
        block = slice(i * s, (i + 1) * s)
        root[block, block] = rng.normal(size=(s, s)) + 6 * np.eye(s)
        if i + 1 < c:
            root[block, (i + 1) * s : (i + 2) * s] = 0.5 * rng.normal(size=(s, s))
    dense = root.T @ root
    bands = np.zeros((c, 3, s, s))
    for i in range(c):
        block = slice(i * s, (i + 1) * s)
        bands[i, 1] = dense[block, block]
        if i > 0:
            bands[i, 0] = dense[block, (i - 1) * s : i * s]
        if i + 1 < c:
            bands[i, 2] = dense[block, (i + 1) * s : (i + 2) * s]
    return bands, dense


def _solve(bands, rhs):
    return bc.block_cholesky_solve(*bc.block_cholesky(bands), rhs)


def _scan_solve(bands, rhs):
    chol, right = bc._scan_factor(bands[:, 1], bands[:-1, 2])
    return bc._scan_solve(chol, right, rhs)[0]


_FULL = pytest.mark.full


@pytest.mark.parametrize(
    "dtype, c, s",
    [
        (jnp.float64, 1, 1),
        (jnp.float64, 7, 5),
        (jnp.float32, 7, 5),
        pytest.param(jnp.float32, 1, 1, marks=_FULL),
        pytest.param(jnp.float64, 1, 4, marks=_FULL),
        pytest.param(jnp.float64, 2, 3, marks=_FULL),
        pytest.param(jnp.float32, 2, 3, marks=_FULL),
        pytest.param(jnp.float64, 40, 2, marks=_FULL),
        pytest.param(jnp.float32, 40, 2, marks=_FULL),
    ],
)
def test_solve_matches_dense(dtype, c, s):
    bands, dense = _matrix(c, s)
    rhs = np.random.default_rng(1).normal(size=(c, s))
    want = np.linalg.solve(dense, rhs.reshape(-1)).reshape(c, s)
    b, r = jnp.asarray(bands, dtype), jnp.asarray(rhs, dtype)
    x = jax.jit(_solve)(b, r)
    assert x.dtype == dtype
    np.testing.assert_allclose(x, want, atol=_TOL[dtype])
    np.testing.assert_allclose(_solve(b, r), want, atol=_TOL[dtype])  # eager
    np.testing.assert_allclose(_scan_solve(b, r), want, atol=_TOL[dtype])
    chol, right = jax.jit(bc.block_cholesky)(b)
    chol_scan, right_scan = bc._scan_factor(b[:, 1], b[:-1, 2])
    np.testing.assert_allclose(chol, chol_scan, atol=_TOL[dtype] * 10)
    np.testing.assert_allclose(right, right_scan, atol=_TOL[dtype] * 10)
    assert np.all(np.triu(np.asarray(chol), 1) == 0)


def test_uses_the_compiled_loop_on_the_cpu():
    bands, _ = _matrix(12, 3)
    text = jax.jit(bc.block_cholesky).lower(jnp.asarray(bands)).as_text()
    assert ("retrax_block_cholesky" in text) == _native.available("graph")
    if not _native.available("graph"):
        assert "while" in text  # the scan


def test_vmap_batches_the_matrices():
    bands, dense = _matrix(6, 3)
    rhs = np.random.default_rng(2).normal(size=(4, 6, 3))
    scales = np.array([1.0, 2.0, 0.5, 3.0])
    batch = jnp.asarray(scales[:, None, None, None, None] * bands)
    x = jax.jit(jax.vmap(_solve))(batch, jnp.asarray(rhs))
    for k in range(4):
        want = np.linalg.solve(scales[k] * dense, rhs[k].reshape(-1))
        np.testing.assert_allclose(x[k].reshape(-1), want, atol=1e-12)
    # one matrix, many right-hand sides (the matrix not batched)
    xs = jax.vmap(_solve, in_axes=(None, 0))(jnp.asarray(bands), jnp.asarray(rhs))
    want = np.linalg.solve(dense, rhs.reshape(4, -1).T).T
    np.testing.assert_allclose(xs.reshape(4, -1), want, atol=1e-12)


def test_derivatives_are_the_scans():
    bands, _ = _matrix(3, 2)
    b = jnp.asarray(bands)
    r = jnp.asarray(np.random.default_rng(3).normal(size=(3, 2)))

    def loss(solve):
        return lambda b, r: jnp.sum(jnp.sin(solve(b, r)))

    grads = jax.jit(jax.grad(loss(_solve), argnums=(0, 1)))(b, r)
    want = jax.jit(jax.grad(loss(_scan_solve), argnums=(0, 1)))(b, r)
    for g, w in zip(grads, want, strict=True):
        np.testing.assert_allclose(g, w, atol=1e-12)
    tangent = jnp.ones_like(b)
    jvp = jax.jit(lambda b, t: jax.jvp(lambda b: _solve(b, r), (b,), (t,))[1])
    jvp_scan = jax.jit(lambda b, t: jax.jvp(lambda b: _scan_solve(b, r), (b,), (t,))[1])
    np.testing.assert_allclose(jvp(b, tangent), jvp_scan(b, tangent), atol=1e-12)


def test_not_positive_definite_is_nan_from_that_block_on():
    bands, _ = _matrix(6, 3)
    bands[3, 1] = -np.eye(3)
    chol, _ = jax.jit(bc.block_cholesky)(jnp.asarray(bands))
    finite = [bool(np.all(np.isfinite(chol[i]))) for i in range(6)]
    assert finite == [True, True, True, False, False, False]
    # NaN in the lower triangle, zeros above it, as jnp.linalg.cholesky
    rows, cols = np.tril_indices(3)
    assert np.all(np.isnan(np.asarray(chol)[3:, rows, cols]))
    assert np.all(np.triu(chol[3:], 1) == 0)
    bands[0, 1, 0, 0] = np.nan
    chol, _ = bc.block_cholesky(jnp.asarray(bands))
    assert np.all(np.isnan(np.diagonal(chol, axis1=-2, axis2=-1)))
