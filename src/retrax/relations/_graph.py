r"""A factor graph: variables with dimensions, and factors over them.

The graph's joint energy is the sum of its factors' rows; its variables,
laid out in one flat vector (families in order, each family's variables in
order), are what the joint solve and belief propagation answer. The layout
and the sparsity (which coordinates each row touches, a bandwidth-reducing
order of the variables) are computed once from the graph's static structure.
"""

import functools
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float

from ._graph_factor import AbstractGraphFactor


class _Layout(NamedTuple):
    n: int  # flat coordinates
    var_start: np.ndarray  # (V,) first flat coordinate of each variable
    var_dim: np.ndarray  # (V,)
    family_var0: dict[str, int]  # the global id of a family's first variable
    coords: tuple[tuple[np.ndarray, ...], ...]  # per factor, per slot: (m, d_s)
    row_vars: tuple[np.ndarray, ...]  # per factor: (m, slots) global ids


class _Banded(NamedTuple):
    """A block-tridiagonal view of the flat coordinates: super-blocks of size
    `size` (`width` variables of the order, padded to the largest dimension),
    `count` of them."""

    size: int
    count: int
    padded: np.ndarray  # (n,) each flat coordinate's padded coordinate
    pads: np.ndarray  # the padded coordinates no flat coordinate uses


def _families(variables: Mapping[str, Any]) -> tuple[tuple[str, int, int, bool], ...]:
    out = []
    if not variables:
        raise ValueError("a factor graph needs at least one variable.")
    for name, spec in variables.items():
        if not isinstance(name, str):
            raise TypeError(f"variable names must be strings, got {name!r}.")
        single = not isinstance(spec, tuple)
        if single:
            count, dim = 1, spec
        elif len(spec) == 2:
            count, dim = spec
        else:
            raise ValueError(
                f"variable {name!r}: give its dimension (`{name!r}: 2`) or a family "
                f"as (count, dimension) (`{name!r}: (100, 2)`), got {spec!r}."
            )
        for what, v in (("count", count), ("dimension", dim)):
            if isinstance(v, bool) or not (isinstance(v, int | np.integer) and v >= 1):
                raise ValueError(
                    f"variable {name!r}: its {what} must be a positive integer, "
                    f"got {v!r}."
                )
        out.append((name, int(count), int(dim), single))
    return tuple(out)


@functools.lru_cache(maxsize=64)
def _layout(families, slots) -> _Layout:
    dims = {name: dim for name, _, dim, _ in families}
    counts = {name: count for name, count, _, _ in families}
    var0, var_dim = {}, []
    for name, count, dim, _ in families:
        var0[name] = len(var_dim)
        var_dim += [dim] * count
    var_dim = np.asarray(var_dim, dtype=np.int64)
    var_start = np.concatenate([[0], np.cumsum(var_dim)[:-1]]).astype(np.int64)
    n = int(var_dim.sum())
    coords, row_vars = [], []
    for k, factor_slots in enumerate(slots):
        rows = max(len(idx) for _, idx in factor_slots)
        per_slot, ids = [], []
        for family, idx in factor_slots:
            if family not in dims:
                raise ValueError(
                    f"factor {k} names the variable {family!r}, which the graph does "
                    f"not have; its variables are {list(dims)}."
                )
            idx = np.broadcast_to(np.asarray(idx, dtype=np.int64), (rows,))
            if idx.min() < 0 or idx.max() >= counts[family]:
                raise ValueError(
                    f"factor {k}: the indices of {family!r} must lie in "
                    f"[0, {counts[family]}), got {idx.min()}..{idx.max()}."
                )
            gid = var0[family] + idx
            ids.append(gid)
            per_slot.append(var_start[gid][:, None] + np.arange(dims[family]))
        coords.append(tuple(per_slot))
        row_vars.append(np.stack(ids, axis=1))
    return _Layout(n, var_start, var_dim, var0, tuple(coords), tuple(row_vars))


def _adjacency(num_vars: int, row_vars: Sequence[np.ndarray]):
    """The variables' neighbours (variables that share a row) as CSR arrays
    `(indptr, indices)`, each variable's neighbours in increasing order."""
    edges = [np.zeros((0, 2), dtype=np.int64)]
    for ids in row_vars:
        slots = ids.shape[1]
        for a in range(slots):
            for b in range(slots):
                if a != b:
                    edges.append(np.stack([ids[:, a], ids[:, b]], axis=1))
    edges = np.concatenate(edges)
    edges = edges[edges[:, 0] != edges[:, 1]]
    key = np.unique(edges[:, 0] * num_vars + edges[:, 1])
    source, target = np.divmod(key, num_vars)
    indptr = np.zeros(num_vars + 1, dtype=np.int64)
    np.cumsum(np.bincount(source, minlength=num_vars), out=indptr[1:])
    return indptr, target


def _order(num_vars: int, row_vars: Sequence[np.ndarray]) -> np.ndarray:
    """A Cuthill–McKee order of the variables (breadth first from a variable of
    least degree, neighbours by increasing degree): a small bandwidth for
    chains and trees of variables. The adjacency is built with numpy; the
    breadth-first walk runs on Python lists (about a microsecond an edge)."""
    indptr, indices = _adjacency(num_vars, row_vars)
    degree = np.diff(indptr)
    # Each variable's neighbours by increasing degree (ties by index).
    source = np.repeat(np.arange(num_vars), degree)
    indices = indices[np.lexsort((indices, degree[indices], source))].tolist()
    indptr, degree = indptr.tolist(), degree.tolist()
    seen = [False] * num_vars
    order = []
    for start in np.argsort(degree, kind="stable").tolist():
        if seen[start]:
            continue
        seen[start] = True
        head = len(order)
        order.append(start)
        while head < len(order):
            v = order[head]
            head += 1
            for u in indices[indptr[v] : indptr[v + 1]]:
                if not seen[u]:
                    seen[u] = True
                    order.append(u)
    return np.asarray(order, dtype=np.int64)


@functools.lru_cache(maxsize=64)
def _banded(families, slots) -> _Banded:
    lay = _layout(families, slots)
    num_vars = len(lay.var_dim)
    order = _order(num_vars, lay.row_vars)
    position = np.empty(num_vars, dtype=np.int64)
    position[order] = np.arange(num_vars)
    width = 1
    for ids in lay.row_vars:
        pos = position[ids]
        width = max(width, int((pos.max(axis=1) - pos.min(axis=1)).max(initial=0)))
    dmax = int(lay.var_dim.max())
    size = width * dmax
    count = -(-num_vars // width)
    var = np.repeat(np.arange(num_vars), lay.var_dim)
    p = position[var]
    within = np.arange(lay.n) - lay.var_start[var]
    padded = (p // width) * size + (p % width) * dmax + within
    pads = np.setdiff1d(np.arange(count * size), padded)
    return _Banded(size, count, padded, pads)


class FactorGraph(eqx.Module):
    r"""Variables and the factors over them.

    The graph's energy is $E(x) = \sum_f \sum_i E_{f,i}(x_{f,i})$, the sum of
    every factor's rows, each over the variables its slots name. Its MAP
    point (a stable root of $\nabla E$) is found by
    [`retrax.relations.solve_graph`][], its beliefs by
    [`retrax.relations.propagate_beliefs`][] (loopy Gaussian belief
    propagation) or [`retrax.relations.graph_laplace`][] (the Laplace
    approximation at the MAP point).

    **Arguments:**

    - `variables`: by name, a variable's dimension (`{"a": 2}`: one
      variable in $\mathbb{R}^2$) or a family's `(count, dimension)`
      (`{"q": (1000, 2)}`: 1,000 variables in $\mathbb{R}^2$, which a
      factor's slot names with one index per row, `("q", range(1000))`).
    - `factors`: the factors ([`retrax.relations.GaussianFactor`][],
      [`retrax.relations.ResidualFactor`][],
      [`retrax.relations.RelationFactor`][], or any
      [`retrax.relations.AbstractGraphFactor`][]). A factor with many rows
      is evaluated in one `vmap`-ed call: give repeated factors as one factor
      with many rows, not as many factors.

    Values of the variables are dicts by name: a variable's value has shape
    `(dimension,)`, a family's `(count, dimension)`.
    """

    variables: tuple[tuple[str, int, int, bool], ...] = eqx.field(static=True)
    factors: tuple[AbstractGraphFactor, ...]

    def __init__(
        self,
        variables: Mapping[str, int | tuple[int, int]],
        factors: Sequence[AbstractGraphFactor],
    ):
        self.variables = _families(variables)
        factors = tuple(factors)
        if not factors:
            raise ValueError("a factor graph needs at least one factor.")
        for k, f in enumerate(factors):
            if not isinstance(f, AbstractGraphFactor):
                raise TypeError(
                    f"factor {k} must be an AbstractGraphFactor (a GaussianFactor, "
                    f"ResidualFactor or RelationFactor), got {type(f).__name__}."
                )
        self.factors = factors
        _ = self.layout  # checks every slot's variable and indices
        dims = {name: dim for name, _, dim, _ in self.variables}
        for k, f in enumerate(factors):
            f.check_sizes(k, tuple(dims[family] for family, _ in f.slots))

    # -- structure ---------------------------------------------------------

    @property
    def layout(self) -> _Layout:
        return _layout(self.variables, tuple(f.slots for f in self.factors))

    @property
    def banded(self) -> _Banded:
        return _banded(self.variables, tuple(f.slots for f in self.factors))

    @property
    def size(self) -> int:
        """The number of flat coordinates (the variables' dimensions summed)."""
        return self.layout.n

    def flatten(
        self, values: Mapping[str, ArrayLike] | None = None, dtype=None
    ) -> Float[Array, " n"]:
        """The flat vector of variables' values (those not given are 0).

        **Arguments:**

        - `values`: by variable name, shape `(dimension,)` for a variable,
          `(count, dimension)` for a family.
        - `dtype`: the vector's dtype; the values' floating dtype, or JAX's
          default float, by default.

        **Returns:**

        The flat vector, shape `(n,)`.
        """
        values = {} if values is None else dict(values)
        unknown = sorted(set(values) - {name for name, *_ in self.variables})
        if unknown:
            raise ValueError(
                f"unknown variables {unknown}; the graph's variables are "
                f"{[name for name, *_ in self.variables]}."
            )
        arrays = {k: jnp.asarray(v) for k, v in values.items()}
        if dtype is None:
            floats = [
                a.dtype
                for a in arrays.values()
                if jnp.issubdtype(a.dtype, jnp.floating)
            ]
            dtype = jnp.result_type(*floats) if floats else jnp.result_type(float)
        parts = []
        for name, count, dim, single in self.variables:
            shape = (dim,) if single else (count, dim)
            if name not in arrays:
                parts.append(jnp.zeros(count * dim, dtype))
                continue
            a = arrays[name]
            if a.shape != shape:
                raise ValueError(
                    f"variable {name!r} has shape {shape}, got a value of shape "
                    f"{a.shape}."
                )
            parts.append(a.astype(dtype).reshape(-1))
        return jnp.concatenate(parts)

    def unflatten(self, x: Float[Array, " n"]) -> dict[str, Array]:
        """The variables' values of a flat vector, by name (the inverse of
        [`retrax.relations.FactorGraph.flatten`][])."""
        out, start = {}, 0
        for name, count, dim, single in self.variables:
            block = x[..., start : start + count * dim]
            out[name] = block.reshape(
                *x.shape[:-1], *((dim,) if single else (count, dim))
            )
            start += count * dim
        return out

    def by_variable(self, per_variable: Array) -> dict[str, Array]:
        """Split an array with one entry per variable (leading axis: every
        family's variables in order, trailing axes padded to the largest
        dimension) by name: a variable's entry, or a family's `(count, ...)`
        stack, with its trailing axes cut to the variable's dimension."""
        out, v0 = {}, 0
        for name, count, dim, single in self.variables:
            block = per_variable[v0 : v0 + count]
            block = block[(slice(None),) + (slice(0, dim),) * (block.ndim - 1)]
            out[name] = block[0] if single else block
            v0 += count
        return out

    # -- evaluation (flat vectors) -----------------------------------------

    def _gather(self, k: int, x: Array) -> tuple[Array, ...]:
        return tuple(x[idx] for idx in self.layout.coords[k])

    def _row_coords(self, k: int) -> np.ndarray:
        return np.concatenate(self.layout.coords[k], axis=1)

    def gradient(self, x: Float[Array, " n"]) -> Float[Array, " n"]:
        r"""$\nabla E(x)$, the joint solve's equations (each factor's rows in
        one `vmap`-ed call)."""
        out = jnp.zeros_like(x)
        for k, f in enumerate(self.factors):
            g = jax.vmap(f.row_gradient)(f.rows(), self._gather(k, x))
            out = out.at[self._row_coords(k)].add(g.astype(x.dtype))
        return out

    def energy(self, x: Float[Array, " n"]) -> Float[Array, ""]:
        """$E(x)$: a `TypeError` when a factor has no energy (a learned,
        non-conservative relation)."""
        total = jnp.zeros((), x.dtype)
        for k, f in enumerate(self.factors):
            e = jax.vmap(f.row_energy)(f.rows(), self._gather(k, x))
            total = total + jnp.sum(e).astype(x.dtype)
        return total

    def row_blocks(self, x: Float[Array, " n"], kind: str = "jacobian"):
        """Per factor, the rows' `(m, d, d)` Jacobians (or local precisions,
        `kind="precision"`, or Laplace precisions, `kind="belief"`) and their
        `(m, d)` flat coordinates."""
        out = []
        for k, f in enumerate(self.factors):
            method = getattr(f, f"row_{kind}")
            blocks = jax.vmap(method)(f.rows(), self._gather(k, x)).astype(x.dtype)
            out.append((blocks, self._row_coords(k)))
        return out

    def dense_jacobian(
        self, x: Float[Array, " n"], kind: str = "jacobian"
    ) -> Float[Array, "n n"]:
        r"""The Jacobian of $\nabla E$ as a dense `(n, n)` matrix (with
        `kind="belief"`, the rows' Laplace precisions in its place)."""
        return self._dense_matrix(self.row_blocks(x, kind), x.dtype)

    def _dense_matrix(self, row_blocks, dtype) -> Float[Array, "n n"]:
        """The rows' `(m, d, d)` blocks at their `(m, d)` flat coordinates
        (`row_blocks`' pairs) summed into a dense `(n, n)` matrix."""
        n = self.size
        mat = jnp.zeros((n, n), dtype)
        for blocks, idx in row_blocks:
            mat = mat.at[idx[:, :, None], idx[:, None, :]].add(blocks)
        return mat

    def banded_jacobian(
        self, x: Float[Array, " n"], kind: str = "jacobian"
    ) -> Float[Array, "c 3 s s"]:
        r"""The Jacobian of $\nabla E$ (or, `kind="belief"`, the rows' Laplace
        precisions) in the block-tridiagonal layout of `banded`:
        `(count, 3, size, size)`, band 0 the block left of the diagonal, 1 the
        diagonal, 2 the block right of it; padding is the identity."""
        return self._banded_matrix(self.row_blocks(x, kind), x.dtype)

    def _banded_matrix(self, row_blocks, dtype) -> Float[Array, "c 3 s s"]:
        """The rows' `(m, d, d)` blocks at their `(m, d)` flat coordinates
        (`row_blocks`' pairs) summed into the bands of `banded_jacobian`."""
        band = self.banded
        s = band.size
        mat = jnp.zeros((band.count, 3, s, s), dtype)
        for blocks, idx in row_blocks:
            p = band.padded[idx]
            pr, pc = p[:, :, None], p[:, None, :]
            br, bc = pr // s, pc // s
            b = np.broadcast_arrays(br, bc - br + 1, pr % s, pc % s)
            mat = mat.at[b[0], b[1], b[2], b[3]].add(blocks)
        pads = band.pads
        return mat.at[pads // s, 1, pads % s, pads % s].add(1)
