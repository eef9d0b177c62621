r"""The linear systems of a factor graph: its Jacobian at a point, dense or
block tridiagonal, with solves, the symmetric part's log-determinant and
positive definiteness (the marginals are `_graph_selected_inverse`'s); and
the Gauss–Newton matrix of a residual graph in square-root form, its
whitened rows reduced by QR, for the least-squares steps below float64.

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
from jax.scipy.linalg import lu_factor, lu_solve, solve_triangular
from jaxtyping import Array, Bool, Float, Int

from ._block_cholesky import block_cholesky, block_cholesky_solve
from ._graph import FactorGraph
from ._graph_factor import GaussianFactor, ResidualFactor
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


def _block_factor(block):
    """One block's packed LU with partial pivoting."""
    lu, pivots = lu_factor(block)
    return lu, pivots.astype(jnp.int32)


def _eliminate(bands):
    r"""Block elimination from the first block by LU (a symmetric positive
    definite matrix takes `block_cholesky` instead): the Schur complements
    $S_i = D_i - L_i S_{i-1}^{-1} U_{i-1}$, each one's LU factors, and the
    products a solve needs, $W_i = S_i^{-1} U_i$ and $G_{i+1} = L_{i+1}
    S_i^{-1}$: a solve is then two recurrences of matrix-vector products and
    one batch of independent block solves."""

    def step(prev, blocks):
        lower, diag, upper_prev = blocks
        w = lu_solve(prev, upper_prev)
        g = lu_solve(prev, lower.T, trans=1).T
        s = diag - lower @ w
        factors = _block_factor(s)
        return factors, (s, *factors, w, g)

    first = bands[0, 1]
    factors = _block_factor(first)
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


class BandedSystem(AbstractGraphSystem):
    """`J` block tridiagonal in the graph's bandwidth-reducing order (see
    `FactorGraph.banded`), solved by block elimination: linear in the number
    of variables for chains and trees. Each Schur complement is factorised
    once and every solve reuses the factors: by LU with partial pivoting
    (`jax.scipy.linalg.lu_factor`: `J` need not be symmetric), or by block
    Cholesky (`block_cholesky`, a compiled loop on the CPU) when the system
    is `symmetric` (a Gauss–Newton matrix; its factors then also say whether
    it is positive definite). With
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
        if factorise and self.symmetric:
            self.factors, self.right = block_cholesky(bands)
            # the solve needs the V_i of `right` alone: no pivots, no left
            self.pivots = self.left = None
        elif factorise:
            out = _eliminate(bands)
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
        if self.symmetric:
            x = block_cholesky_solve(self.factors, self.right, r).reshape(-1)[padded]
            return x, _finite_result(x)

        def forward(y_prev, blocks):
            g_i, r_i = blocks
            y = r_i - g_i @ y_prev
            return y, y

        _, ys = jax.lax.scan(forward, r[0], (self.left, r[1:]), unroll=_UNROLL)
        ys = jnp.concatenate([r[:1], ys])
        zs = jax.vmap(lambda f, p, y: lu_solve((f, p), y))(
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
            chol, _ = block_cholesky(self._sym_bands())
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
        schur = _eliminate(self._sym_bands())[0]
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


# -- square-root (QR) Gauss-Newton systems ------------------------------------
#
# The Gauss-Newton matrix H = J^T J of a long chain is as ill-conditioned as
# the square of its whitened Jacobian J (a chain of n poses anchored at one
# end: cond(H) ~ n^2), and so is the gradient J^T r as the step's right-hand
# side. In float32, a 40,000-pose odometry chain (cond(H) ~ 1e9 > 1/eps)
# gets steps from block Cholesky of H that are wrong by their own size: every
# Schur complement cancels (two numbers of the size of a link's precision
# whose difference is the information carried along the chain), and so does
# the gradient's rounding. QR of the rows [J | -r], block by block (the
# square-root information form of the same elimination), passes each block's
# information on as a triangular factor, never as a difference, and solves
# min ||J delta + r|| without forming J^T r: the step's errors are of the
# order of cond(J) ~ n times the rounding.


def _residual_jacobian(factor: ResidualFactor, row, xs):
    """One row's whitened residual `r` (flattened) and its Jacobian with
    respect to the row's slots, concatenated: one forward-mode pass."""

    def r(ys):
        out = jnp.ravel(factor.residual(factor.params, row, *ys))
        return out, out

    blocks, out = jax.jacfwd(r, has_aux=True)(tuple(xs))
    return jnp.concatenate(blocks, axis=1), out


def _whitened_rows(factor, rows, xs) -> Float[Array, "m k e"]:
    """Per row, the Jacobian $W$ of the factor's whitened residual $r$ with
    respect to the row's slots (concatenated), $W^\\top W$ its Gauss–Newton
    precision, and $-r$ as one more column: $P^{1/2}[A \\mid b - Ax]$ for a
    `GaussianFactor` (the precision's square root by its eigendecomposition:
    a zero precision gives zero rows), the residual's Jacobian and value for a
    `ResidualFactor`."""
    if isinstance(factor, GaussianFactor):
        a, b, p = rows
        vals, vecs = jnp.linalg.eigh(p)
        root = jnp.sqrt(jnp.maximum(vals, 0))[..., :, None] * jnp.swapaxes(vecs, -1, -2)
        x = jnp.concatenate(xs, axis=-1)
        minus_r = b - jnp.einsum("mkd,md->mk", a, x)
        return root @ jnp.concatenate([a, minus_r[..., None]], axis=-1)
    if isinstance(factor, ResidualFactor):

        def one(row, *values):
            jac, out = _residual_jacobian(factor, row, values)
            return jnp.concatenate([jac, -out[:, None]], axis=1)

        return jax.vmap(one)(rows, *xs)
    raise TypeError(  # the least-squares methods take residual graphs only
        f"{type(factor).__name__} has no residual: the least-squares methods "
        "need GaussianFactor or ResidualFactor rows."
    )


def _graph_rows(graph: FactorGraph, x, jacobian_dtype):
    """Per factor, its rows' `[W | -r]` (`(m, k, d + 1)`, cast to `x`'s
    dtype) and their `(m, d)` flat coordinates."""
    lay = graph.layout
    at = x
    if jacobian_dtype is not None and jnp.dtype(jacobian_dtype) != x.dtype:
        graph = jax.tree.map(
            lambda v: v.astype(jacobian_dtype) if eqx.is_inexact_array(v) else v,
            graph,
        )
        at = x.astype(jacobian_dtype)
    out = []
    for k, f in enumerate(graph.factors):
        xs = tuple(at[idx] for idx in lay.coords[k])
        w = _whitened_rows(f, f.rows(), xs).astype(x.dtype)
        out.append((w, np.concatenate(lay.coords[k], axis=1)))
    return out


def _ranks(groups: np.ndarray) -> np.ndarray:
    """Each entry's rank among the entries of its group (in order)."""
    order = np.argsort(groups, kind="stable")
    ordered = groups[order]
    rank = np.empty_like(groups)
    rank[order] = np.arange(len(groups)) - np.searchsorted(ordered, ordered)
    return rank


_NARROW = 16  # the widest blocks (2s + 1 columns) merged by `_merge_rows`


def _sorted_triangles(a: Float[Array, "*q m w"]) -> Float[Array, "*q w w"]:
    """QR's triangle by LAPACK (blocked Householder: fast, and wide blocks
    need it) after sorting the rows by decreasing magnitude (Powell and
    Reid's row sorting: a large row pivots before a small one's
    cancellation)."""
    order = jnp.argsort(-jnp.max(jnp.abs(a), axis=-1), axis=-1)
    return jnp.linalg.qr(jnp.take_along_axis(a, order[..., None], axis=-2), mode="r")


def _merge_rows(tri, extra, stop: int):
    """The triangle of `[tri; extra]` over its first `stop` columns (`tri`
    upper triangular `(w, w)`, `extra` `(k, w)`) by Householder reflections
    with row pivoting, written for a chain's carried information: column
    `j`'s reflector acts on `tri`'s row `j` and the extra rows only (`tri`'s
    other rows are zero there) and pivots on the largest of them (Powell and
    Reid's row-wise stable QR). Returns the triangle and what remains of the
    extra rows (zero in the first `stop` columns).

    LAPACK's QR loses what a chain carries at every link: a small pivot (a
    block's carried information, weak against a link to the next block)
    gets the link's coefficient on the next block as `x (1 - tau v^2)`, a
    difference of nearly equal numbers; and the norm `|alpha| sqrt(1 + t)`
    rounds `1 + t` the same way at every link (`t` small, varying slowly),
    a bias that adds up over the chain (a 40,000-pose float32 odometry
    chain: its first step was off by 13% of the answer even with the rows
    sorted, four steps in all; here by 5e-5, three steps). Here the pivot
    row becomes `(alpha top + x^T extra) / beta` (one rounding per product,
    as a Givens rotation's), every other row `extra_i + (x_i / beta) v^T a`
    (pivoting keeps `tau v_i^2 <= 1/2`), and `|beta|` is `|alpha|` plus the
    correction `|alpha| t / (1 + sqrt(1 + t))`."""
    k, w = extra.shape
    cols = jnp.arange(w)
    for j in range(stop):
        top, col = tri[j], extra[:, j]
        # the pivot: tri's row j, or the extra row of largest magnitude
        best = jnp.argmax(jnp.abs(col))
        swap = jnp.abs(col[best]) > jnp.abs(top[j])
        chosen = (jnp.arange(k) == best) & swap
        moved = jnp.sum(jnp.where(chosen[:, None], extra, 0), axis=0)
        extra = jnp.where(chosen[:, None], top[None, :], extra)
        top = jnp.where(swap, moved, top)
        x = extra[:, j]
        alpha = top[j]
        zero = (alpha == 0) | jnp.all(x == 0)  # nothing to reflect
        alpha = jnp.where(alpha == 0, 1, alpha)
        t = jnp.sum((x / alpha) ** 2)
        size = jnp.abs(alpha)
        beta = -jnp.sign(alpha) * (size + size * t / (1 + jnp.sqrt(1 + t)))
        rest = x @ extra
        new_top = (alpha * top + rest) / beta
        vta = top + rest / (alpha - beta)
        new_extra = extra + (x / beta)[:, None] * vta[None, :]
        later = cols > j
        top = jnp.where(zero, top, jnp.where(later, new_top, top).at[j].set(beta))
        extra = jnp.where(zero, extra, jnp.where(later[None, :], new_extra, 0.0))
        tri = tri.at[j].set(top)
    return tri, extra


def _triangles(chunks: Float[Array, "q m w"]) -> Float[Array, "q w w"]:
    """`_sorted_triangles` of each `(rows, width)` chunk (zero rows added
    below where there are fewer rows than columns): each block's own rows,
    where nothing accumulates along a chain."""
    rows, width = chunks.shape[1:]
    if rows < width:
        pad = jnp.zeros((chunks.shape[0], width - rows, width), chunks.dtype)
        chunks = jnp.concatenate([chunks, pad], axis=1)
    return _sorted_triangles(chunks)


def _reduce_rows(chunks, chunk_block: np.ndarray, count: int):
    """One `(width, width)` triangle per block from its rows by QR, in
    chunks of at most `2 width` rows (batched, off any sequential path):
    `chunks` `(q, cap, width)`, chunk `j` a part of block `chunk_block[j]`
    (each block has at least one)."""
    width = chunks.shape[-1]
    cap = 2 * width
    tri = _triangles(chunks)
    while len(chunk_block) > count:
        # the next level: each block's triangles, stacked, in chunks of `cap`
        slot = _ranks(chunk_block)[:, None] * width + np.arange(width)
        parts = np.maximum(1, -(-np.bincount(chunk_block, minlength=count) // 2))
        start = np.concatenate([[0], np.cumsum(parts)[:-1]])
        target = start[chunk_block][:, None] + slot // cap
        chunks = (
            jnp.zeros((int(parts.sum()), cap, width), tri.dtype)
            .at[target, slot % cap]
            .set(tri, unique_indices=True)
        )
        chunk_block = np.repeat(np.arange(count), parts)
        tri = _triangles(chunks)
    return tri


def _banded_rows(graph: FactorGraph, x, jacobian_dtype):
    """The graph's rows `[W | -r]` QR-reduced to one `(2s + 1, 2s + 1)` upper
    triangle per super-block of the banded order: block `c`'s rows are those
    whose first coordinate lies in it (they reach into block `c + 1` at
    most), over its and the next block's padded coordinates and the
    right-hand side; each padding coordinate gets a unit row."""
    band = graph.banded
    s, count = band.size, band.count
    width = 2 * s + 1
    rows = _graph_rows(graph, x, jacobian_dtype)
    # each row's block, its rows' slots among the block's, its local columns
    used = np.zeros(count, np.int64)
    placed = []
    for w, idx in rows:
        k = w.shape[1]
        padded = band.padded[idx]
        block = padded.min(axis=1) // s
        local = np.concatenate(
            [padded - block[:, None] * s, np.full((len(block), 1), 2 * s)], axis=1
        )
        slot = used[block][:, None] + _ranks(block)[:, None] * k + np.arange(k)
        used += np.bincount(block, minlength=count) * k
        placed.append((block, slot, local))
    pad_block = band.pads // s
    pad_slot = used[pad_block] + _ranks(pad_block)
    used += np.bincount(pad_block, minlength=count)
    # chunks of at most 2 (2s + 1) rows (one per block when they fit)
    cap = int(min(2 * width, max(1, used.max())))
    parts = np.maximum(1, -(-used // cap))
    start = np.concatenate([[0], np.cumsum(parts)[:-1]])
    chunks = jnp.zeros((int(parts.sum()), cap, width), x.dtype)
    for (w, _), (block, slot, local) in zip(rows, placed, strict=True):
        chunk = start[block][:, None] + slot // cap  # (m, k)
        chunks = chunks.at[
            chunk[:, :, None], (slot % cap)[:, :, None], local[:, None, :]
        ].add(w)
    chunk = start[pad_block] + pad_slot // cap
    chunks = chunks.at[chunk, pad_slot % cap, band.pads % s].set(1)
    return _reduce_rows(chunks, np.repeat(np.arange(count), parts), count)


def _dense_rows(graph: FactorGraph, x, jacobian_dtype):
    """The graph's rows `[W | -r]` stacked densely and QR-reduced to one
    `(n + 1, n + 1)` triangle (in chunks, as `_banded_rows`)."""
    n = graph.size
    parts = []
    for w, idx in _graph_rows(graph, x, jacobian_dtype):
        m, k, _ = w.shape
        cols = np.concatenate([idx, np.full((m, 1), n)], axis=1)
        dense = jnp.zeros((m, k, n + 1), x.dtype)
        dense = dense.at[
            np.arange(m)[:, None, None], np.arange(k)[None, :, None], cols[:, None, :]
        ].add(w)
        parts.append(dense.reshape(m * k, n + 1))
    stacked = jnp.concatenate(parts)
    cap = min(2 * (n + 1), stacked.shape[0])
    count = -(-stacked.shape[0] // cap)
    pad = jnp.zeros((count * cap - stacked.shape[0], n + 1), x.dtype)
    chunks = jnp.concatenate([stacked, pad]).reshape(count, cap, n + 1)
    return _reduce_rows(chunks, np.zeros(count, np.int64), 1)[0]


def _nonsingular(diagonals: Float[Array, "..."]) -> Bool[Array, ""]:
    """Whether triangular factors with these diagonals are finite and
    nonsingular (`R^T R` positive definite)."""
    return jnp.all(jnp.isfinite(diagonals)) & jnp.all(diagonals != 0)


class AbstractSquareRootSystem(AbstractGraphSystem):
    r"""A Gauss–Newton matrix $J^\top J$ plus a nonnegative diagonal $D^2$,
    held as QR-reduced rows $[J \mid -r]$ of the graph's whitened residuals
    $r$ at a point and $D$, and factorised as $R^\top R$ by QR (the
    square-root information form; see the comment above `_whitened_rows`).
    `step` is the damped Gauss–Newton step from the residuals themselves,
    $\arg\min_\delta \lVert J\delta + r\rVert^2 + \lVert D\delta\rVert^2$;
    `solve` takes any right-hand side through $R^\top R$. Positive definite
    when $R$'s diagonal is nonzero."""

    @abc.abstractmethod
    def step(self) -> tuple[Float[Array, " n"], RESULTS]:
        r"""The damped Gauss–Newton step and the solve's result (`singular`
        where it is not finite)."""


class BandedSquareRootSystem(AbstractSquareRootSystem):
    """The banded square-root system: one reduced `(2s + 1, 2s + 1)`
    triangle of rows per super-block (`rows`), the damping's square root
    per padded coordinate (`damping`), and once factorised by block QR from
    the first super-block, $R$'s diagonal blocks, $W_c = R_{cc}^{-1}
    R_{c,c+1}$ and $R_{cc}^{-1}$ times the reduced right-hand side."""

    rows: Float[Array, "c w w"]
    damping: Float[Array, "c s"]
    diag_blocks: Float[Array, "c s s"] | None
    right: Float[Array, "c s s"] | None
    shifts: Float[Array, "c s"] | None
    padded: tuple[int, ...] = eqx.field(static=True)
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self,
        rows: Float[Array, "c w w"],
        damping: Float[Array, "c s"],
        padded,
        var_start,
        var_dim,
        factorise: bool = True,
    ):
        self.rows = rows
        self.damping = damping
        if factorise:
            self.diag_blocks, self.right, self.shifts = _square_root_eliminate(
                rows, damping
            )
        else:
            self.diag_blocks = self.right = self.shifts = None
        self.padded = tuple(int(v) for v in padded)
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def _rebuilt(self, rows, damping):
        return BandedSquareRootSystem(
            rows, damping, self.padded, self.var_start, self.var_dim
        )

    def _factorised(self) -> "BandedSquareRootSystem":
        if self.diag_blocks is not None:
            return self
        return self._rebuilt(self.rows, self.damping)

    def _back_substitute(self, zs):
        """`x` from `R x = y` given `z_c = R_cc^{-1} y_c`:
        `x_c = z_c - W_c x_{c+1}`, in the graph's flat order."""

        def backward(x_next, blocks):
            w_i, z_i = blocks
            x = z_i - w_i @ x_next
            return x, x

        _, xs = jax.lax.scan(
            backward, zs[-1], (self.right[:-1], zs[:-1]), reverse=True, unroll=_UNROLL
        )
        x = jnp.concatenate([xs, zs[-1:]]).reshape(-1)[np.asarray(self.padded)]
        return x, _finite_result(x)

    def step(self):
        sys = self._factorised()
        return sys._back_substitute(sys.shifts)

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        sys = self._factorised()
        count, s = sys.damping.shape
        r = (
            jnp.zeros(count * s, rhs.dtype)
            .at[np.asarray(self.padded)]
            .set(rhs, unique_indices=True)
            .reshape(count, s)
        )

        # R^T y = r, as u_c = R_cc^T y_c = r_c - W_{c-1}^T u_{c-1}
        def forward(u_prev, blocks):
            w_prev, r_i = blocks
            u = r_i - w_prev.T @ u_prev
            return u, u

        _, us = jax.lax.scan(forward, r[0], (sys.right[:-1], r[1:]), unroll=_UNROLL)
        us = jnp.concatenate([r[:1], us])
        ys = jax.vmap(lambda a, b: solve_triangular(a, b, trans=1))(sys.diag_blocks, us)
        zs = jax.vmap(solve_triangular)(sys.diag_blocks, ys)
        return sys._back_substitute(zs)

    def diagonal(self):
        # J^T J's diagonal: its columns' squared norms, which QR keeps
        count, s = self.damping.shape
        sq = jnp.sum(self.rows * self.rows, axis=1)[:, : 2 * s]
        before = jnp.concatenate([jnp.zeros_like(sq[:1, s:]), sq[:-1, s:]])
        diag = sq[:, :s] + before + self.damping**2
        return diag.reshape(-1)[np.asarray(self.padded)]

    def add_diagonal(self, d):
        """The system of `J^T J + diag(d)`, factorised; `d` must be
        nonnegative (negative entries count as 0)."""
        count, s = self.damping.shape
        extra = (
            jnp.zeros(count * s, self.rows.dtype)
            .at[np.asarray(self.padded)]
            .set(jnp.maximum(d, 0).astype(self.rows.dtype), unique_indices=True)
        )
        damping = jnp.sqrt(self.damping**2 + extra.reshape(count, s))
        return self._rebuilt(self.rows, damping)

    def or_identity(self, ok):
        s = self.damping.shape[1]
        eye = jnp.zeros_like(self.rows).at[:, np.arange(s), np.arange(s)].set(1)
        rows = jnp.where(ok, self.rows, eye)
        damping = jnp.where(ok, self.damping, jnp.zeros_like(self.damping))
        return self._rebuilt(rows, damping)

    def _diagonals(self):
        return jnp.diagonal(self._factorised().diag_blocks, axis1=-2, axis2=-1)

    def positive_definite(self):
        return _nonsingular(self._diagonals())

    def symmetric_logdet(self):
        diagonals = self._diagonals()
        return _nonsingular(diagonals), 2 * jnp.sum(jnp.log(jnp.abs(diagonals)))


def _square_root_eliminate(rows, damping):
    r"""Block QR from the first super-block: block `c`'s reduced rows, the
    carried rows $[Z_c \mid z_c]$ (the earlier blocks' information on it)
    and its damping rows, QR-factorised over its and the next block's
    coordinates and the right-hand side, give $R_{cc}$, $R_{c,c+1}$, the
    reduced right-hand side $d_c$ and the next carry: by `_merge_rows` (the
    carried and damping rows merged into the block's triangle) for narrow
    blocks (chains, where the carry crosses the most blocks), by
    `_sorted_triangles` for wide ones. Returns $R_{cc}$,
    $W_c = R_{cc}^{-1}R_{c,c+1}$ and $R_{cc}^{-1}d_c$ (the triangular
    solves batched, off the sequential path)."""
    s = damping.shape[1]
    dtype = rows.dtype
    zero = jnp.zeros((s, s), dtype)

    def step(carry, blocks):
        tri, d = blocks
        extra = jnp.concatenate(
            [
                jnp.concatenate([carry[:, :s], zero, carry[:, s:]], axis=1),
                jnp.zeros((s, 2 * s + 1), dtype).at[:, :s].set(jnp.diag(d)),
            ]
        )
        if 2 * s + 1 <= _NARROW:
            tri, _ = _merge_rows(tri, extra, 2 * s)
        else:
            tri = _sorted_triangles(jnp.concatenate([extra, tri]))
        return tri[s : 2 * s, s:], (tri[:s, :s], tri[:s, s : 2 * s], tri[:s, 2 * s])

    first = jnp.zeros((s, s + 1), dtype)
    _, (diag_blocks, upper, rhs) = jax.lax.scan(step, first, (rows, damping))
    solve = jax.vmap(solve_triangular)
    return diag_blocks, solve(diag_blocks, upper), solve(diag_blocks, rhs)


class DenseSquareRootSystem(AbstractSquareRootSystem):
    """The dense square-root system: the rows `[J | -r]` reduced to one
    `(n + 1, n + 1)` triangle, the damping's square root per coordinate,
    and once factorised, $R$ with its reduced right-hand side."""

    rows: Float[Array, "n1 n1"]
    damping: Float[Array, " n"]
    upper: Float[Array, "n1 n1"] | None
    var_start: tuple[int, ...] = eqx.field(static=True)
    var_dim: tuple[int, ...] = eqx.field(static=True)

    def __init__(
        self,
        rows: Float[Array, "n1 n1"],
        damping: Float[Array, " n"],
        var_start,
        var_dim,
        factorise: bool = True,
    ):
        self.rows = rows
        self.damping = damping
        if factorise:
            n = damping.shape[0]
            diag = jnp.zeros((n, n + 1), rows.dtype).at[:, :n].set(jnp.diag(damping))
            self.upper = _triangles(jnp.concatenate([rows, diag])[None])[0]
        else:
            self.upper = None
        self.var_start = tuple(int(v) for v in var_start)
        self.var_dim = tuple(int(v) for v in var_dim)

    def _rebuilt(self, rows, damping):
        return DenseSquareRootSystem(rows, damping, self.var_start, self.var_dim)

    def _factor(self):
        """`R` and the reduced right-hand side."""
        upper = self.upper
        if upper is None:
            upper = self._rebuilt(self.rows, self.damping).upper
        return upper[:-1, :-1], upper[:-1, -1]

    def step(self):
        upper, rhs = self._factor()
        x = solve_triangular(upper, rhs)
        return x, _finite_result(x)

    def solve(self, rhs):
        return self.solve_with_result(rhs)[0]

    def solve_with_result(self, rhs):
        upper, _ = self._factor()
        x = solve_triangular(upper, solve_triangular(upper, rhs, trans=1))
        return x, _finite_result(x)

    def diagonal(self):
        return jnp.sum(self.rows[:, :-1] ** 2, axis=0) + self.damping**2

    def add_diagonal(self, d):
        """The system of `J^T J + diag(d)`, factorised; `d` must be
        nonnegative (negative entries count as 0)."""
        extra = jnp.maximum(d, 0).astype(self.rows.dtype)
        return self._rebuilt(self.rows, jnp.sqrt(self.damping**2 + extra))

    def or_identity(self, ok):
        eye = jnp.eye(self.rows.shape[0], dtype=self.rows.dtype).at[-1, -1].set(0)
        damping = jnp.where(ok, self.damping, jnp.zeros_like(self.damping))
        return self._rebuilt(jnp.where(ok, self.rows, eye), damping)

    def _diagonals(self):
        return jnp.diagonal(self._factor()[0])

    def positive_definite(self):
        return _nonsingular(self._diagonals())

    def symmetric_logdet(self):
        diagonals = self._diagonals()
        return _nonsingular(diagonals), 2 * jnp.sum(jnp.log(jnp.abs(diagonals)))


def _gauss_newton_row(factor, row, *xs):
    r"""One row's gradient $J^\top r$ and Gauss–Newton precision $J^\top J$
    from one linearisation of its residual (a `GaussianFactor`'s in closed
    form)."""
    if isinstance(factor, GaussianFactor):
        return factor.row_gradient(row, xs), factor.row_precision(row, xs)
    if isinstance(factor, ResidualFactor):
        jac, out = _residual_jacobian(factor, row, xs)
        return jac.T @ out, jac.T @ jac
    raise TypeError(  # the least-squares methods take residual graphs only
        f"{type(factor).__name__} has no residual: the least-squares methods "
        "need GaussianFactor or ResidualFactor rows."
    )


def gauss_newton_linearisation(
    graph: FactorGraph, x: Float[Array, " n"], kind: str
) -> tuple[Float[Array, " n"], AbstractGraphSystem]:
    r"""The gradient $\nabla E = \sum_i J_i^\top r_i$ and the Gauss–Newton
    matrix $\sum_i J_i^\top J_i$ (a `kind` system, not yet factorised) at
    `x`, both from one evaluation of each factor's rows and their Jacobians
    (`graph.gradient` and `gauss_newton_system` evaluate them twice, once in
    reverse and once in forward mode)."""
    lay = graph.layout
    gradient = jnp.zeros_like(x)
    blocks = []
    for k, f in enumerate(graph.factors):
        g, p = jax.vmap(lambda row, *xs, f=f: _gauss_newton_row(f, row, *xs))(
            f.rows(), *graph._gather(k, x)
        )
        idx = graph._row_coords(k)
        gradient = gradient.at[idx].add(g.astype(x.dtype))
        blocks.append((p.astype(x.dtype), idx))
    if kind == "dense":
        matrix = graph._dense_matrix(blocks, x.dtype)
        return gradient, DenseSystem(matrix, lay.var_start, lay.var_dim, True)
    bands = graph._banded_matrix(blocks, x.dtype)
    system = BandedSystem(
        bands, graph.banded.padded, lay.var_start, lay.var_dim, True, False
    )
    return gradient, system


def square_root_wanted(dtype) -> bool:
    """Whether the least-squares steps of a solve in `dtype` take the
    square-root (QR) form: below float64, where forming $J^\\top J$ and
    $J^\\top r$ loses what the step needs."""
    return jnp.finfo(dtype).bits < 64


def gauss_newton_system(
    graph: FactorGraph,
    x: Float[Array, " n"],
    kind: str,
    jacobian_dtype=None,
    square_root: bool | None = None,
) -> AbstractGraphSystem:
    r"""The graph's Gauss–Newton matrix $J^\top J$ at `x` as a `kind` system,
    not yet factorised (`add_diagonal` factorises): the matrix itself (block
    Cholesky when damped), or with `square_root` the rows $[J \mid -r]$
    reduced by QR (an `AbstractSquareRootSystem`), whose factorisation and
    step do not square $J$'s condition number; `square_root` is
    `square_root_wanted(x.dtype)` by default (below float64)."""
    if square_root is None:
        square_root = square_root_wanted(x.dtype)
    if not square_root:
        return graph_system(
            graph, x, kind, jacobian_dtype, rows="precision", factorise=False
        )
    lay = graph.layout
    if kind == "dense":
        rows = _dense_rows(graph, x, jacobian_dtype)
        damping = jnp.zeros(graph.size, x.dtype)
        return DenseSquareRootSystem(rows, damping, lay.var_start, lay.var_dim, False)
    band = graph.banded
    rows = _banded_rows(graph, x, jacobian_dtype)
    damping = jnp.zeros((band.count, band.size), x.dtype)
    return BandedSquareRootSystem(
        rows, damping, band.padded, lay.var_start, lay.var_dim, False
    )


def gauss_newton_step(
    system: AbstractGraphSystem, gradient: Float[Array, " n"]
) -> tuple[Float[Array, " n"], RESULTS]:
    r"""The (damped) Gauss–Newton step of a factorised system and its
    solve's result: from the residuals for a square-root system, else
    $-$`system`$^{-1}\nabla E$."""
    if isinstance(system, AbstractSquareRootSystem):
        return system.step()
    return system.solve_with_result(-gradient)
