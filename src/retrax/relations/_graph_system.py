r"""The linear systems of a factor graph: its Jacobian at a point, dense or
block tridiagonal, with solves, the symmetric part's log-determinant and
positive definiteness (the marginals are `_graph_selected_inverse`'s).

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
from jax.scipy.linalg import cho_solve, lu_factor, lu_solve
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


class DenseSystem(AbstractGraphSystem):
    """`J` as a dense matrix, solved through lineax: by LU, or by Cholesky
    when the system is `symmetric` (a Gauss–Newton matrix)."""

    matrix: Float[Array, "n n"]
    symmetric: bool = eqx.field(static=True)
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self, matrix: Float[Array, "n n"], var_start, var_dim, symmetric=False
    ):
        self.matrix = matrix
        self.symmetric = bool(symmetric)
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def _rebuilt(self, matrix):
        return DenseSystem(matrix, self.var_start, self.var_dim, self.symmetric)

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        if self.symmetric:
            op = lx.MatrixLinearOperator(self.matrix, lx.positive_semidefinite_tag)
            solver = lx.Cholesky()
        else:
            op, solver = lx.MatrixLinearOperator(self.matrix), lx.LU()
        sol = lx.linear_solve(op, rhs, solver, throw=False)
        result = RESULTS.promote(sol.result)
        return sol.value, RESULTS.where(
            result == RESULTS.successful, _finite_result(sol.value), result
        )

    def diagonal(self):
        return jnp.diagonal(self.matrix)

    def add_diagonal(self, d):
        n = self.matrix.shape[0]
        matrix = self.matrix.at[np.arange(n), np.arange(n)].add(d)
        return self._rebuilt(matrix)

    def or_identity(self, ok):
        eye = jnp.eye(self.matrix.shape[0], dtype=self.matrix.dtype)
        return self._rebuilt(jnp.where(ok, self.matrix, eye))

    def positive_definite(self):
        chol = jnp.linalg.cholesky(self._sym())
        return jnp.all(jnp.isfinite(chol)) & jnp.all(jnp.diagonal(chol) > 0)

    def _sym(self):
        return 0.5 * (self.matrix + self.matrix.T)

    def symmetric_logdet(self):
        sym = self._sym()
        positive = jnp.linalg.eigvalsh(sym)[0] > 0
        return positive, jnp.linalg.slogdet(sym)[1]


_UNROLL = 4  # block-elimination steps per loop iteration: less loop overhead


def _block_solve(factors, pivots, rhs, symmetric: bool):
    """`S^{-1} rhs` from one block's factors: Cholesky's lower triangle
    (`symmetric`) or packed LU with its pivots."""
    if symmetric:
        return cho_solve((factors, True), rhs)
    return lu_solve((factors, pivots), rhs)


def _block_factor(block, symmetric: bool):
    """One block's factors: Cholesky (`symmetric`; NaN unless positive
    definite) or LU with partial pivoting (pivots of zeros for Cholesky)."""
    if symmetric:
        chol = jnp.linalg.cholesky(block)
        return chol, jnp.zeros(block.shape[:1], jnp.int32)
    lu, pivots = lu_factor(block)
    return lu, pivots.astype(jnp.int32)


def _eliminate(bands, symmetric: bool):
    r"""Block elimination from the first block: the Schur complements $S_i =
    D_i - L_i S_{i-1}^{-1} U_{i-1}$, each one's factors (see
    `_block_factor`), and the products a solve needs, $W_i = S_i^{-1} U_i$
    and $G_{i+1} = L_{i+1} S_i^{-1}$: a solve is then two recurrences of
    matrix-vector products and one batch of independent block solves."""

    def step(prev, blocks):
        lower, diag, upper_prev = blocks
        w = _block_solve(*prev, upper_prev, symmetric)
        if symmetric:  # L_i = U_{i-1}^T and S symmetric: G_i = W_{i-1}^T
            g = w.T
        else:
            g = lu_solve(prev, lower.T, trans=1).T
        s = diag - lower @ w
        factors = _block_factor(s, symmetric)
        return factors, (s, *factors, w, g)

    first = bands[0, 1]
    factors = _block_factor(first, symmetric)
    _, (rest, lus, pivots, right, left) = jax.lax.scan(
        step,
        factors,
        (bands[1:, 0], bands[1:, 1], bands[:-1, 2]),
        unroll=_UNROLL,
    )
    schur = jnp.concatenate([first[None], rest])
    lus = jnp.concatenate([factors[0][None], lus])
    pivots = jnp.concatenate([factors[1][None], pivots])
    return schur, lus, pivots, right, left


def _schur(bands, symmetric: bool = False):
    """The Schur complements of block elimination and their factors."""
    schur, factors, pivots, _, _ = _eliminate(bands, symmetric)
    return schur, factors, pivots


class BandedSystem(AbstractGraphSystem):
    """`J` block tridiagonal in the graph's bandwidth-reducing order (see
    `FactorGraph.banded`), solved by block elimination: linear in the number
    of variables for chains and trees. Each Schur complement is factorised
    once and every solve reuses the factors: by LU with partial pivoting
    (`jax.scipy.linalg.lu_factor`: `J` need not be symmetric), or by
    Cholesky when the system is `symmetric` (a Gauss–Newton matrix; its
    factors then also say whether it is positive definite). With
    `factorise=False` the system holds its bands alone (a matrix that
    `add_diagonal` damps and factorises)."""

    bands: Float[Array, "c 3 s s"]
    factors: Float[Array, "c s s"] | None
    pivots: Int[Array, "c s"] | None
    right: Float[Array, "c1 s s"] | None
    left: Float[Array, "c1 s s"] | None
    symmetric: bool = eqx.field(static=True)
    padded: tuple[int, ...] = eqx.field(static=True)
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self,
        bands: Float[Array, "c 3 s s"],
        padded,
        var_start,
        var_dim,
        symmetric: bool = False,
        factorise: bool = True,
    ):
        self.bands = bands
        self.symmetric = bool(symmetric)
        if factorise:
            out = _eliminate(bands, self.symmetric)
            _, self.factors, self.pivots, self.right, self.left = out
        else:
            self.factors = self.pivots = self.right = self.left = None
        self.padded = tuple(int(v) for v in padded)
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def _rebuilt(self, bands):
        return BandedSystem(
            bands, self.padded, self.var_start, self.var_dim, self.symmetric
        )

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        if self.factors is None:
            return self._rebuilt(self.bands).solve_with_result(rhs)
        count, _, s, _ = self.bands.shape
        padded = np.asarray(self.padded)
        r = (
            jnp.zeros(count * s, rhs.dtype)
            .at[padded]
            .set(rhs, unique_indices=True)
            .reshape(count, s)
        )

        def forward(y_prev, blocks):
            g_i, r_i = blocks
            y = r_i - g_i @ y_prev
            return y, y

        _, ys = jax.lax.scan(forward, r[0], (self.left, r[1:]), unroll=_UNROLL)
        ys = jnp.concatenate([r[:1], ys])
        zs = jax.vmap(lambda f, p, y: _block_solve(f, p, y, self.symmetric))(
            self.factors, self.pivots, ys
        )

        def backward(x_next, blocks):
            w_i, z_i = blocks
            x = z_i - w_i @ x_next
            return x, x

        _, xs = jax.lax.scan(
            backward, zs[-1], (self.right, zs[:-1]), reverse=True, unroll=_UNROLL
        )
        x = jnp.concatenate([xs, zs[-1:]]).reshape(-1)[padded]
        return x, _finite_result(x)

    def diagonal(self):
        diag = jnp.diagonal(self.bands[:, 1], axis1=-2, axis2=-1).reshape(-1)
        return diag[np.asarray(self.padded)]

    def add_diagonal(self, d):
        s = self.bands.shape[-1]
        padded = np.asarray(self.padded)
        bands = self.bands.at[padded // s, 1, padded % s, padded % s].add(d)
        return self._rebuilt(bands)

    def or_identity(self, ok):
        eye = jnp.eye(self.bands.shape[-1], dtype=self.bands.dtype)
        identity = jnp.zeros_like(self.bands).at[:, 1].set(eye)
        bands = jnp.where(ok, self.bands, identity)
        return self._rebuilt(bands)

    def positive_definite(self):
        if self.symmetric and self.factors is not None:
            chol = self.factors
        else:
            _, chol, _ = _schur(self._sym_bands(), symmetric=True)
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
    factorise: bool = True,
) -> AbstractGraphSystem:
    r"""The graph's Jacobian at `x` as a `kind` (`"dense"`/`"banded"`) system;
    with `rows="belief"`, the rows' Laplace precisions in its place; with
    `rows="precision"`, their local precisions (for residual factors the
    Gauss–Newton matrix $\sum_i J_i^\top J_i$: symmetric, factorised by
    Cholesky).

    With `jacobian_dtype` (a floating dtype other than `x`'s), the factors are
    evaluated with their floating arrays and `x` cast to it, and the Jacobian
    cast back: the system is factorised in `x`'s dtype (when `factorise`;
    otherwise at its first solve, or by `add_diagonal`)."""
    lay = graph.layout
    at = x
    if jacobian_dtype is not None and jnp.dtype(jacobian_dtype) != x.dtype:
        graph = jax.tree.map(
            lambda v: v.astype(jacobian_dtype) if eqx.is_inexact_array(v) else v,
            graph,
        )
        at = x.astype(jacobian_dtype)
    symmetric = rows == "precision"
    if kind == "dense":
        matrix = graph.dense_jacobian(at, rows).astype(x.dtype)
        return DenseSystem(matrix, lay.var_start, lay.var_dim, symmetric)
    bands = graph.banded_jacobian(at, rows).astype(x.dtype)
    padded = graph.banded.padded
    return BandedSystem(bands, padded, lay.var_start, lay.var_dim, symmetric, factorise)
