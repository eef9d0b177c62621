r"""The linear systems of a factor graph: its Jacobian at a point, dense or
block tridiagonal, with solves, the symmetric part's log-determinant and
positive definiteness, and the diagonal blocks of its inverse.

Every solve is linear in its right-hand side with the matrix held constant,
so JAX transposes it: the adjoint (transposed) solve of the implicit
function theorem comes from the same code.
"""

import abc
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
from jax.scipy.linalg import lu_factor, lu_solve
from jaxtyping import Array, Bool, Float, Int

from ._graph import FactorGraph
from ._solution import RESULTS


LinearSolver = Literal["auto", "dense", "banded"]


def _finite_result(x: Array) -> RESULTS:
    """`singular` unless every entry of a solve's answer is finite: a zero
    pivot (a variable that no factor determines) gives inf or NaN."""
    return RESULTS.where(jnp.all(jnp.isfinite(x)), RESULTS.successful, RESULTS.singular)


class AbstractGraphSystem(eqx.Module):
    """The Jacobian of a graph's gradient at a point, as a linear system: a
    PyTree (its arrays are leaves, the layout static), so a solver can carry
    it from one iteration to the next."""

    @abc.abstractmethod
    def solve(self, rhs: Float[Array, " n"]) -> Float[Array, " n"]:
        """`J^{-1} rhs`."""

    @abc.abstractmethod
    def solve_with_result(self, rhs: Float[Array, " n"]) -> tuple[Array, RESULTS]:
        """`J^{-1} rhs` and the solve's result: lineax's code, or `singular`
        where the answer is not finite (a zero pivot)."""

    @abc.abstractmethod
    def diagonal(self) -> Float[Array, " n"]:
        """The diagonal of `J`, in the graph's flat order."""

    @abc.abstractmethod
    def add_diagonal(self, d: Float[Array, " n"]) -> "AbstractGraphSystem":
        """The system of `J + diag(d)` (`d` in the graph's flat order),
        factorised anew: Levenberg-Marquardt's damped matrix."""

    @abc.abstractmethod
    def or_identity(self, ok: Bool[Array, ""]) -> "AbstractGraphSystem":
        """This system where `ok`, the identity's where not: a solve that
        cannot fail, for the derivatives of a failed solve (NaN elsewhere)."""

    @abc.abstractmethod
    def positive_definite(self) -> Bool[Array, ""]:
        """Whether the symmetric part of `J` is positive definite (its
        Cholesky factorisation, blockwise for a banded system, succeeds)."""

    @abc.abstractmethod
    def symmetric_logdet(self) -> tuple[Bool[Array, ""], Float[Array, ""]]:
        """Whether the symmetric part of `J` is positive definite, and its
        log-determinant (meaningful when it is)."""

    @abc.abstractmethod
    def variable_covariances(self) -> Float[Array, "V d d"]:
        """Per variable, its diagonal block of the inverse of the symmetric
        part of `J`, padded to the largest dimension `d` with zeros."""


class DenseSystem(AbstractGraphSystem):
    """`J` as a dense matrix, solved by LU through lineax."""

    matrix: Float[Array, "n n"]
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, matrix: Float[Array, "n n"], var_start, var_dim):
        self.matrix = matrix
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        op = lx.MatrixLinearOperator(self.matrix)
        sol = lx.linear_solve(op, rhs, lx.LU(), throw=False)
        result = RESULTS.promote(sol.result)
        return sol.value, RESULTS.where(
            result == RESULTS.successful, _finite_result(sol.value), result
        )

    def diagonal(self):
        return jnp.diagonal(self.matrix)

    def add_diagonal(self, d):
        n = self.matrix.shape[0]
        matrix = self.matrix.at[np.arange(n), np.arange(n)].add(d)
        return DenseSystem(matrix, self.var_start, self.var_dim)

    def or_identity(self, ok):
        eye = jnp.eye(self.matrix.shape[0], dtype=self.matrix.dtype)
        matrix = jnp.where(ok, self.matrix, eye)
        return DenseSystem(matrix, self.var_start, self.var_dim)

    def positive_definite(self):
        chol = jnp.linalg.cholesky(self._sym())
        return jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)

    def _sym(self):
        return 0.5 * (self.matrix + self.matrix.T)

    def symmetric_logdet(self):
        sym = self._sym()
        positive = jnp.linalg.eigvalsh(sym)[0] > 0
        return positive, jnp.linalg.slogdet(sym)[1]

    def variable_covariances(self):
        cov = jnp.linalg.inv(self._sym())
        d = max(self.var_dim)
        out = []
        for start, dim in zip(self.var_start, self.var_dim, strict=True):
            block = cov[start : start + dim, start : start + dim]
            out.append(jnp.pad(block, ((0, d - dim), (0, d - dim))))
        return jnp.stack(out)


def _schur(bands):
    """The Schur complements $S_i = D_i - L_i S_{i-1}^{-1} U_{i-1}$ of block
    elimination from the first block, and each one's LU factors (packed, and
    their pivots), so that a solve factorises every block once."""

    def step(prev, blocks):
        lower, diag, upper_prev = blocks
        s = diag - lower @ lu_solve(prev, upper_prev)
        factors = lu_factor(s)
        return factors, (s, *factors)

    first = bands[0, 1]
    factors = lu_factor(first)
    _, (rest, lus, pivots) = jax.lax.scan(
        step, factors, (bands[1:, 0], bands[1:, 1], bands[:-1, 2])
    )
    schur = jnp.concatenate([first[None], rest])
    lus = jnp.concatenate([factors[0][None], lus])
    pivots = jnp.concatenate([factors[1][None], pivots])
    return schur, lus, pivots


class BandedSystem(AbstractGraphSystem):
    """`J` block tridiagonal in the graph's bandwidth-reducing order (see
    `FactorGraph.banded`), solved by block elimination: linear in the number
    of variables for chains and trees. Each Schur complement is LU-factorised
    once (`jax.scipy.linalg.lu_factor`, partial pivoting: `J` need not be
    symmetric) and every solve reuses the factors."""

    bands: Float[Array, "c 3 s s"]
    schur: Float[Array, "c s s"]
    lus: Float[Array, "c s s"]
    pivots: Int[Array, "c s"]
    padded: tuple[int, ...] = eqx.field(static=True)
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(self, bands: Float[Array, "c 3 s s"], padded, var_start, var_dim):
        self.bands = bands
        self.schur, self.lus, self.pivots = _schur(bands)
        self.padded = tuple(int(v) for v in padded)
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        count, _, s, _ = self.bands.shape
        padded = np.asarray(self.padded)
        r = (
            jnp.zeros(count * s, rhs.dtype)
            .at[padded]
            .set(rhs, unique_indices=True)
            .reshape(count, s)
        )
        lower, upper = self.bands[1:, 0], self.bands[:-1, 2]

        def forward(y_prev, blocks):
            lower_i, lu_prev, piv_prev, r_i = blocks
            y = r_i - lower_i @ lu_solve((lu_prev, piv_prev), y_prev)
            return y, y

        _, ys = jax.lax.scan(
            forward, r[0], (lower, self.lus[:-1], self.pivots[:-1], r[1:])
        )
        ys = jnp.concatenate([r[:1], ys])
        last = lu_solve((self.lus[-1], self.pivots[-1]), ys[-1])

        def backward(x_next, blocks):
            lu_i, piv_i, upper_i, y_i = blocks
            x = lu_solve((lu_i, piv_i), y_i - upper_i @ x_next)
            return x, x

        _, xs = jax.lax.scan(
            backward,
            last,
            (self.lus[:-1], self.pivots[:-1], upper, ys[:-1]),
            reverse=True,
        )
        x = jnp.concatenate([xs, last[None]]).reshape(-1)[padded]
        return x, _finite_result(x)

    def diagonal(self):
        diag = jnp.diagonal(self.bands[:, 1], axis1=-2, axis2=-1).reshape(-1)
        return diag[np.asarray(self.padded)]

    def add_diagonal(self, d):
        s = self.bands.shape[-1]
        padded = np.asarray(self.padded)
        bands = self.bands.at[padded // s, 1, padded % s, padded % s].add(d)
        return BandedSystem(bands, self.padded, self.var_start, self.var_dim)

    def or_identity(self, ok):
        eye = jnp.eye(self.bands.shape[-1], dtype=self.bands.dtype)
        identity = jnp.zeros_like(self.bands).at[:, 1].set(eye)
        bands = jnp.where(ok, self.bands, identity)
        return BandedSystem(bands, self.padded, self.var_start, self.var_dim)

    def positive_definite(self):
        schur, _, _ = _schur(self._sym_bands())
        chol = jnp.linalg.cholesky(0.5 * (schur + jnp.swapaxes(schur, -1, -2)))
        return jnp.all(jnp.isfinite(chol)) & jnp.all(
            jnp.diagonal(chol, axis1=-2, axis2=-1) > 0
        )

    def _sym_bands(self):
        b = self.bands
        upper = 0.5 * (b[:-1, 2] + jnp.swapaxes(b[1:, 0], -1, -2))
        diag = 0.5 * (b[:, 1] + jnp.swapaxes(b[:, 1], -1, -2))
        zero = jnp.zeros_like(b[:1, 0])
        lower = jnp.concatenate([zero, jnp.swapaxes(upper, -1, -2)])
        upper = jnp.concatenate([upper, zero])
        return jnp.stack([lower, diag, upper], axis=1)

    def symmetric_logdet(self):
        schur, _, _ = _schur(self._sym_bands())
        schur = 0.5 * (schur + jnp.swapaxes(schur, -1, -2))
        positive = jnp.all(jnp.linalg.eigvalsh(schur)[:, 0] > 0)
        return positive, jnp.sum(jnp.linalg.slogdet(schur)[1])

    def variable_covariances(self):
        bands = self._sym_bands()
        schur, _, _ = _schur(bands)
        inv = jnp.linalg.inv(schur)
        upper = bands[:-1, 2]

        def step(g_next, blocks):
            inv_i, upper_i = blocks
            a = inv_i @ upper_i
            g = inv_i + a @ g_next @ a.T
            return g, g

        _, gs = jax.lax.scan(step, inv[-1], (inv[:-1], upper), reverse=True)
        g = jnp.concatenate([gs, inv[-1:]])
        s = g.shape[-1]
        d = max(self.var_dim)
        out = []
        for start, dim in zip(self.var_start, self.var_dim, strict=True):
            p = self.padded[start]
            b, o = divmod(p, s)
            block = g[b, o : o + dim, o : o + dim]
            out.append(jnp.pad(block, ((0, d - dim), (0, d - dim))))
        return jnp.stack(out)


def choose_solver(graph: FactorGraph, linear_solver: LinearSolver) -> str:
    """`"dense"` or `"banded"`: `"auto"` takes the banded solve when the
    graph's order gives at least four super-blocks."""
    if linear_solver not in ("auto", "dense", "banded"):
        raise ValueError(
            "`linear_solver` must be 'auto', 'dense' or 'banded', got "
            f"{linear_solver!r}."
        )
    if linear_solver != "auto":
        return linear_solver
    return "banded" if graph.banded.count >= 4 else "dense"


def graph_system(
    graph: FactorGraph,
    x: Float[Array, " n"],
    kind: str,
    jacobian_dtype=None,
    rows: str = "jacobian",
) -> AbstractGraphSystem:
    """The graph's Jacobian at `x` as a `kind` (`"dense"`/`"banded"`) system;
    with `rows="belief"`, the rows' Laplace precisions in its place.

    With `jacobian_dtype` (a floating dtype other than `x`'s), the factors are
    evaluated with their floating arrays and `x` cast to it, and the Jacobian
    cast back: the system is factorised in `x`'s dtype."""
    lay = graph.layout
    at = x
    if jacobian_dtype is not None and jnp.dtype(jacobian_dtype) != x.dtype:
        graph = jax.tree.map(
            lambda v: v.astype(jacobian_dtype) if eqx.is_inexact_array(v) else v,
            graph,
        )
        at = x.astype(jacobian_dtype)
    if kind == "dense":
        matrix = graph.dense_jacobian(at, rows).astype(x.dtype)
        return DenseSystem(matrix, lay.var_start, lay.var_dim)
    bands = graph.banded_jacobian(at, rows).astype(x.dtype)
    return BandedSystem(bands, graph.banded.padded, lay.var_start, lay.var_dim)
