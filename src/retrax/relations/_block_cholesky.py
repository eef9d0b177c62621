r"""Block Cholesky of a symmetric block-tridiagonal matrix and its solve:
the linear algebra of a least-squares step on a banded graph.

The matrix has `c` diagonal blocks $D_i$ (each `s x s`) and blocks $U_i$
right of the diagonal (row `i`, column `i + 1`; left of it their
transposes). Its Cholesky factor is block bidiagonal,

$$C_0 C_0^\top = D_0,\quad V_{i-1} = C_{i-1}^{-1} U_{i-1},\quad
C_i C_i^\top = D_i - V_{i-1}^\top V_{i-1},$$

and `block_cholesky` returns the lower triangular $C_i$ (NaN from the first
Schur complement that is not positive definite on) and the $V_i$;
`block_cholesky_solve` solves the matrix for a right-hand side with a
forward and a backward recurrence of triangular solves.

Each is a primitive: on the CPU, for float32 and float64, a compiled loop
(`RetraxBlockCholesky`, `RetraxBlockCholeskySolve` in
`src/retrax/_native/graph.cc`), elsewhere (and without the compiled kernels)
the same recurrences as `lax.scan`s. The blocks of a pose graph are tens of
unknowns: a scan pays XLA's price of a LAPACK call per block (about 30 µs
for a 15 x 15 triangular solve, where the arithmetic takes a few hundred
nanoseconds), the loop does not. Derivatives are the scans'; under `vmap`
the batch goes to the loop as leading axes.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jax.scipy.linalg import solve_triangular
from jaxtyping import Array, Float

from .. import _native


_UNROLL = 4  # elimination steps per loop iteration of the scans
_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def _leading(fn, core: int):
    """`fn` over arrays whose leading axes (beyond `core` trailing ones of
    the first argument) are a batch."""

    def run(*args):
        if args[0].ndim == core:
            return fn(*args)
        return jax.vmap(run)(*args)

    return run


def _scan_factor(diag, upper):
    def step(prev, blocks):
        d, up = blocks
        v = solve_triangular(prev, up, lower=True)
        chol = jnp.linalg.cholesky(d - v.T @ v)
        return chol, (chol, v)

    first = jnp.linalg.cholesky(diag[0])
    _, (rest, right) = jax.lax.scan(step, first, (diag[1:], upper), unroll=_UNROLL)
    return jnp.concatenate([first[None], rest]), right


def _scan_solve(chol, right, rhs):
    def forward(prev, blocks):
        c, v, r = blocks
        z = solve_triangular(c, r - v.T @ prev, lower=True)
        return z, z

    first = solve_triangular(chol[0], rhs[0], lower=True)
    _, zs = jax.lax.scan(forward, first, (chol[1:], right, rhs[1:]), unroll=_UNROLL)
    zs = jnp.concatenate([first[None], zs])

    def backward(nxt, blocks):
        c, v, z = blocks
        x = solve_triangular(c, z - v @ nxt, lower=True, trans="T")
        return x, x

    last = solve_triangular(chol[-1], zs[-1], lower=True, trans="T")
    _, xs = jax.lax.scan(
        backward, last, (chol[:-1], right, zs[:-1]), reverse=True, unroll=_UNROLL
    )
    return (jnp.concatenate([xs, last[None]]),)


_PURE = {
    "factor": _leading(_scan_factor, 3),
    "solve": _leading(_scan_solve, 3),
}


def _primitive(name: str, target: str, pure, shapes):
    prim = Primitive(name)
    prim.multiple_results = True

    @functools.cache
    def compiled():
        return jax.jit(lambda *args: prim.bind(*args))

    prim.def_impl(lambda *args: compiled()(*args))
    prim.def_abstract_eval(
        lambda *avals: [
            avals[0].update(shape=shape, weak_type=False) for shape in shapes(*avals)
        ]
    )
    scan_lowering = mlir.lower_fun(lambda *a: list(pure(*a)), multiple_results=True)
    kernel_lowering = jax.ffi.ffi_lowering(target)

    def cpu_lowering(ctx, *args):
        if ctx.avals_in[0].dtype in _DTYPES and _native.available("graph"):
            return kernel_lowering(ctx, *args)
        return scan_lowering(ctx, *args)

    mlir.register_lowering(prim, scan_lowering)
    mlir.register_lowering(prim, cpu_lowering, platform="cpu")

    def jvp(primals, tangents):
        tangents = [ad.instantiate_zeros(t) for t in tangents]
        out, dout = jax.jvp(lambda *a: list(pure(*a)), list(primals), tangents)
        return out, dout

    ad.primitive_jvps[prim] = jvp

    def batch(args, dims):
        pairs = zip(args, dims, strict=True)
        size = next(a.shape[d] for a, d in pairs if d is not None)
        args = [
            jnp.broadcast_to(a, (size, *a.shape))
            if d is None
            else jnp.moveaxis(a, d, 0)
            for a, d in zip(args, dims, strict=True)
        ]
        return prim.bind(*args), [0] * len(shapes(*args))

    batching.primitive_batchers[prim] = batch
    return prim


_factor_p = _primitive(
    "retrax_block_cholesky",
    _native.BLOCK_CHOLESKY,
    _PURE["factor"],
    lambda diag, upper: (diag.shape, upper.shape),
)
_solve_p = _primitive(
    "retrax_block_cholesky_solve",
    _native.BLOCK_CHOLESKY_SOLVE,
    _PURE["solve"],
    lambda chol, right, rhs: (rhs.shape,),
)


def block_cholesky(
    bands: Float[Array, "c 3 s s"],
) -> tuple[Float[Array, "c s s"], Float[Array, "c1 s s"]]:
    """The block Cholesky factor of a symmetric block-tridiagonal matrix
    given as `(c, 3, s, s)` bands (left, diagonal, right; the left band is
    not read): the diagonal blocks $C_i$ and the $V_i = C_i^{-1} U_i$."""
    chol, right = _factor_p.bind(bands[:, 1], bands[:-1, 2])
    return chol, right


def block_cholesky_solve(
    chol: Float[Array, "c s s"], right: Float[Array, "c1 s s"], rhs: Float[Array, "c s"]
) -> Float[Array, "c s"]:
    """The solution of the matrix `block_cholesky` factorised for `rhs`."""
    return _solve_p.bind(chol, right, rhs)[0]
