r"""The factors of a factor graph: each a batch of rows that share one
function, connected to the graph's variables through slots.

A factor contributes an energy $E(x_{s_1}, \dots, x_{s_k})$ over the
variables its slots name (in data units: $E = -\log\phi$ up to a constant).
The graph needs three things of every row: the gradient of its energy with
respect to its slots' values (the joint solve's equations), their Jacobian
(the Newton matrix, and the implicit function theorem's), and a symmetric
positive semidefinite local precision (belief propagation's quadratic model
of the row). Rows of one factor are evaluated in one `vmap`-ed call.
"""

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree

from .._errors import error_if
from .._validate import check_dtype
from ._channel import Observed
from ._factor import Factor
from ._gaussian import _square_checked


Slot = tuple[str, tuple[int, ...]]
# values a user writes: arrays, numbers or nested lists of them
Values = ArrayLike | Sequence[Any]


def _slot(spec: Any) -> Slot:
    """A slot `(family, indices)` from `"name"` (a single variable) or
    `("name", indices)` (one variable of a family per row)."""
    if isinstance(spec, str):
        return (spec, (0,))
    if (
        isinstance(spec, tuple)
        and len(spec) == 2
        and isinstance(spec[0], str)
        and not isinstance(spec[1], str)
    ):
        idx = np.asarray(spec[1])
        if idx.ndim == 0:
            idx = idx[None]
        if idx.ndim != 1 or idx.size == 0 or not np.issubdtype(idx.dtype, np.integer):
            raise ValueError(
                f"slot {spec[0]!r}: its indices must be a non-empty 1-d sequence of "
                f"integers, got {spec[1]!r}."
            )
        return (spec[0], tuple(int(i) for i in idx))
    raise ValueError(
        "a slot is a variable's name (`'a'`) or a family's name with one index "
        f"per row (`('q', range(n))`), got {spec!r}."
    )


def _rows(slots: Sequence[Slot]) -> int:
    sizes = {len(idx) for _, idx in slots} - {1}
    if len(sizes) > 1:
        raise ValueError(
            "the slots of a factor must name the same number of rows (or one, "
            f"shared by every row), got {[len(i) for _, i in slots]}."
        )
    return sizes.pop() if sizes else 1


def _real(name: str, value: "Values") -> Array:
    """`value` as an array; a `TypeError` naming `name` if it is complex (a
    factor's energy is real: an imaginary part would be dropped) or not
    numeric."""
    check_dtype(name, value)
    value = jnp.asarray(value)
    if jnp.issubdtype(value.dtype, jnp.complexfloating):
        raise TypeError(
            f"`{name}` must be real, got dtype {value.dtype}: a factor's energy "
            "is real, and its imaginary part would be dropped. Split a complex "
            "quantity into its real and imaginary parts as two coordinates."
        )
    return value


def _host_or_traced(value: Array):
    """`(xp, value)`: NumPy and the host copy of a concrete `value`, or
    `jax.numpy` and `value` itself when it is traced (a factor built inside
    the user's `jit`). Concrete factors are shaped and checked in NumPy: the
    same operations as `jax.numpy`'s eagerly, without compiling a program for
    each (a graph's constructors compiled dozens)."""
    if isinstance(value, jax.core.Tracer):
        return jnp, value
    return np, np.asarray(value)


def _per_row(name: str, value: "Values", rows: int, shape: tuple[int, ...]) -> Array:
    """`value` of one row's `shape`, or of `(rows, *shape)`, as `(rows, *shape)`."""
    xp, value = _host_or_traced(_real(name, value))
    if not jnp.issubdtype(value.dtype, jnp.floating):
        value = value.astype(jnp.result_type(float))
    # (`device_put`, not `jnp.asarray`, which compiles a program for each
    # shape of a host array)
    if value.shape == shape:
        value = xp.broadcast_to(value, (rows, *shape))
        return value if xp is jnp else jax.device_put(np.ascontiguousarray(value))
    if value.shape == (rows, *shape):
        return value if xp is jnp else jax.device_put(value)
    raise ValueError(
        f"`{name}` must have shape {shape} (every row) or {(rows, *shape)} (one "
        f"per row), got {value.shape}."
    )


def _as_precision(name: str, precision: "Values", size: int, rows: int) -> Array:
    """A precision given as a scalar, a diagonal or a matrix (each for every row
    or one per row), as `(rows, size, size)`, checked symmetric PSD.

    Where shapes coincide (`rows == size`), a `(size,)` array is a diagonal
    and a `(size, size)` array a matrix, both for every row."""
    xp, p = _host_or_traced(_real(name, precision))
    if not jnp.issubdtype(p.dtype, jnp.floating):
        p = p.astype(jnp.result_type(float))
    eye = xp.eye(size, dtype=p.dtype)
    if p.shape == () or (p.shape == (rows,) and rows != size):
        p = p[..., None, None] * eye
    elif p.shape == (size,) or (p.shape == (rows, size) and p.shape != (size, size)):
        p = p[..., :, None] * eye
    p = _per_row(name, p, rows, (size, size))
    # every row at once: a graph built inside the user's `jit` has traced
    # precisions, checked at run time with the same messages (a concrete
    # precision's flag is decided on the host, without a program)
    p = error_if(p, ~xp.all(xp.isfinite(p)), f"`{name}` must be finite.")
    return _square_checked(name, p, psd=True)


def _check_distinct(first: Slot, second: Slot) -> None:
    """A `ValueError` when a row of a `between` factor names one variable in
    both slots (its difference with itself is 0: the factor would constrain
    nothing)."""
    (fa, ia), (fb, ib) = first, second
    rows = _rows((first, second))
    a = np.broadcast_to(np.asarray(ia), (rows,))
    b = np.broadcast_to(np.asarray(ib), (rows,))
    same = np.flatnonzero(a == b) if fa == fb else []
    if len(same):
        row = int(same[0])
        raise ValueError(
            f"`between`: `first` and `second` name the same variable ({fa!r}, "
            f"index {int(a[row])}, in row {row}): a variable's difference with "
            "itself is 0, so the factor would constrain nothing. Name two "
            "different variables."
        )


class AbstractGraphFactor(eqx.Module):
    r"""A factor of a [`retrax.relations.FactorGraph`][]: rows of one energy.

    Every row $i$ connects the variables its slots name at index $i$ and
    contributes an energy $E_i$ (data units, $-\log\phi_i$ up to a
    constant). Subclasses are final and give the gradient of one row's
    energy with respect to the concatenation of its slots' values
    (`row_gradient`), its Jacobian (`row_jacobian`; `jacobian_by_jacfwd`
    takes one `jax.jacfwd`), the matrix whose symmetric part is the row's
    Laplace precision (`row_belief`; often the Jacobian), the local
    precision of belief propagation (`row_precision`; `positive_part` of the
    symmetric `row_belief`), the energy (`row_energy`, for the free energy;
    `TypeError` when there is none) and the check against their variables'
    sizes (`check_sizes`).

    **Attributes:**

    - `slots`: one `(family, indices)` pair per slot: the variable family
      and, per row, the index of the variable within it (one index is shared
      by every row).
    """

    slots: eqx.AbstractVar[tuple[Slot, ...]]

    @property
    def num_rows(self) -> int:
        """The number of rows."""
        return _rows(self.slots)

    @abc.abstractmethod
    def check_sizes(self, index: int, sizes: tuple[int, ...]) -> None:
        """Check the factor against its slots' variables' dimensions `sizes`
        (a `ValueError` naming factor `index` of the graph)."""

    @abc.abstractmethod
    def rows(self) -> PyTree:
        """The per-row data: a PyTree whose arrays have a leading axis of
        `num_rows`, given to the row methods one row at a time."""

    @abc.abstractmethod
    def row_gradient(
        self, row: PyTree, xs: tuple[Float[Array, " _"], ...]
    ) -> Float[Array, " d"]:
        r"""$\partial E_i/\partial x$ for one row, at its slots' values `xs` (one
        vector per slot), as one vector: the slots' blocks concatenated."""

    @abc.abstractmethod
    def row_jacobian(
        self, row: PyTree, xs: tuple[Float[Array, " _"], ...]
    ) -> Float[Array, "d d"]:
        """The Jacobian of `row_gradient` with respect to the concatenated
        slots' values (not symmetric for a learned field)."""

    @abc.abstractmethod
    def row_belief(
        self, row: PyTree, xs: tuple[Float[Array, " _"], ...]
    ) -> Float[Array, "d d"]:
        """The matrix whose symmetric part is the row's Laplace precision at
        `xs` (`graph_laplace`'s and belief propagation's curvature): the
        Jacobian, or a relation's `belief_precision` (deblurred if the
        relation is) for a `RelationFactor`."""

    @abc.abstractmethod
    def row_precision(
        self, row: PyTree, xs: tuple[Float[Array, " _"], ...]
    ) -> Float[Array, "d d"]:
        """A symmetric positive semidefinite local precision at `xs`, belief
        propagation's curvature of the row."""

    @abc.abstractmethod
    def row_energy(
        self, row: PyTree, xs: tuple[Float[Array, " _"], ...]
    ) -> Float[Array, ""]:
        """The row's energy; a `TypeError` for a factor without one."""


def jacobian_by_jacfwd(
    factor: AbstractGraphFactor, row: PyTree, xs: tuple[Float[Array, " _"], ...]
) -> Float[Array, "d d"]:
    """`factor.row_jacobian(row, xs)` by one `jax.jacfwd` of `row_gradient`,
    its slots' blocks concatenated."""
    blocks = jax.jacfwd(lambda ys: factor.row_gradient(row, ys))(tuple(xs))
    return jnp.concatenate(blocks, axis=1)


def positive_part(matrix: Float[Array, "d d"]) -> Float[Array, "d d"]:
    """The symmetric part of `matrix` with its negative eigenvalues set to 0:
    belief propagation's local precision from a row's `row_belief`."""
    vals, vecs = jnp.linalg.eigh(0.5 * (matrix + matrix.T))
    return (vecs * jnp.maximum(vals, 0)) @ vecs.T


class GaussianFactor(AbstractGraphFactor):
    r"""Linear-Gaussian rows: $E_i = \tfrac12 (A_i x - b_i)^\top P_i
    (A_i x - b_i)$ for the concatenation $x$ of the row's slots.

    Priors ([`retrax.relations.GaussianFactor.prior`][]), smoothness or
    odometry between two variables
    ([`retrax.relations.GaussianFactor.between`][]) and linear measurements
    are all of this form; a graph of them alone is a Gaussian, which the
    joint solve and belief propagation answer exactly.

    **Arguments:**

    - `slots`: the slots (a variable's name, or `(family, indices)`).
    - `matrix`: $A$, shape `(k, d)` or `(rows, k, d)` with `d` the slots'
      total dimension (known only in a graph: checked there).
    - `target`: $b$, shape `(k,)` or `(rows, k)`.
    - `precision`: $P$ of the `k` measured values: a scalar, a `(k,)`
      diagonal or a `(k, k)` symmetric positive semidefinite matrix, for
      every row, or one per row. A precision that is not finite, symmetric
      and positive semidefinite raises a `ValueError` naming `precision`;
      one built inside your `jax.jit` raises at run time.
    """

    slots: tuple[Slot, ...] = eqx.field(static=True)
    matrix: Float[Array, "rows k d"]
    target: Float[Array, "rows k"]
    precision: Float[Array, "rows k k"]

    def __init__(
        self,
        slots: Sequence[Any],
        matrix: Values,
        target: Values,
        precision: Values,
    ):
        self.slots = tuple(_slot(s) for s in slots)
        if not self.slots:
            raise ValueError("a factor needs at least one slot.")
        rows = _rows(self.slots)
        matrix = _real("matrix", matrix)
        if matrix.ndim not in (2, 3):
            raise ValueError(
                f"`matrix` must have shape (k, d) or (rows, k, d), got {matrix.shape}."
            )
        k, d = matrix.shape[-2:]
        self.matrix = _per_row("matrix", matrix, rows, (k, d))
        self.target = _per_row("target", target, rows, (k,))
        self.precision = _as_precision("precision", precision, k, rows)

    @classmethod
    def prior(
        cls,
        slot: Any,
        mean: Values,
        precision: Values,
    ) -> "GaussianFactor":
        r"""A Gaussian prior $x \sim N(\mathrm{mean}, P^{-1})$ on one slot.

        **Arguments:**

        - `slot`: the variable (a name, or `(family, indices)` for one prior
          per row).
        - `mean`: shape `(d,)` or `(rows, d)`.
        - `precision`: a scalar, a `(d,)` diagonal or a `(d, d)` matrix (or one
          per row).

        **Returns:**

        A [`retrax.relations.GaussianFactor`][].
        """
        mean = _real("mean", mean)
        mean = mean[None] if mean.ndim == 0 else mean
        eye = jnp.eye(mean.shape[-1], dtype=_float(mean))
        return cls([slot], eye, mean, precision)

    @classmethod
    def between(
        cls,
        first: Any,
        second: Any,
        precision: Values,
        offset: Values | None = None,
        *,
        dim: int | None = None,
    ) -> "GaussianFactor":
        r"""A Gaussian on the difference of two slots of one dimension:
        $x_2 - x_1 \sim N(\mathrm{offset}, P^{-1})$ (smoothness, odometry).

        **Arguments:**

        - `first`, `second`: the two slots.
        - `precision`: a scalar, a `(d,)` diagonal or a `(d, d)` matrix (or one
          per row).
        - `offset`: the expected difference, shape `(d,)` or `(rows, d)`; 0 by
          default.
        - `dim`: the slots' dimension `d`, needed when neither `offset` nor a
          vector or matrix `precision` gives it.

        **Returns:**

        A [`retrax.relations.GaussianFactor`][].
        """
        _check_distinct(_slot(first), _slot(second))
        p = _real("precision", precision)
        if offset is not None:
            offset = _real("offset", offset)
            d = jnp.shape(offset)[-1]
        elif dim is not None:
            d = int(dim)
        elif p.ndim >= 1:
            d = p.shape[-1]
        else:
            raise ValueError(
                "`between` needs the slots' dimension: give `dim`, an `offset` or "
                "a vector or matrix `precision`."
            )
        dtype = _float(p) if offset is None else _float(jnp.asarray(offset))
        eye = jnp.eye(d, dtype=dtype)
        offset = jnp.zeros((d,), dtype) if offset is None else offset
        return cls([first, second], jnp.concatenate([-eye, eye], axis=1), offset, p)

    def check_sizes(self, index, sizes):
        if self.matrix.shape[-1] != sum(sizes):
            raise ValueError(
                f"factor {index} (GaussianFactor): its `matrix` has "
                f"{self.matrix.shape[-1]} columns, but its slots' variables have "
                f"{sum(sizes)} coordinates in all ({list(sizes)})."
            )

    def rows(self) -> PyTree:
        return (self.matrix, self.target, self.precision)

    def row_gradient(self, row, xs):
        a, b, p = row
        return a.T @ (p @ (a @ jnp.concatenate(xs) - b))

    def row_jacobian(self, row, xs):
        a, _, p = row
        return a.T @ p @ a

    def row_belief(self, row, xs):
        return self.row_jacobian(row, xs)

    def row_precision(self, row, xs):
        return self.row_jacobian(row, xs)

    def row_energy(self, row, xs):
        a, b, p = row
        r = a @ jnp.concatenate(xs) - b
        return 0.5 * r @ (p @ r)


class ResidualFactor(AbstractGraphFactor):
    r"""Rows of a user's residual: $E_i = \tfrac12\lVert r(\theta, d_i,
    x)\rVert^2$ with $r$ whitened (divided by its noise standard deviation).

    The joint solve uses the exact Jacobian of the gradient $J_r^\top r$;
    belief propagation the Gauss–Newton precision $J_r^\top J_r$.

    **Arguments:**

    - `slots`: the slots.
    - `residual`: `residual(params, data, *values) -> r`, one row's whitened
      residual vector from the shared parameters, the row's data and one
      value per slot.
    - `params`: the shared parameters (any PyTree; its floating arrays are
      differentiable by the implicit function theorem).
    - `data`: per-row data, a PyTree whose arrays have a leading axis of the
      number of rows (or `None`).
    """

    slots: tuple[Slot, ...] = eqx.field(static=True)
    residual: Callable = eqx.field(static=True)
    params: PyTree
    data: PyTree

    def __init__(
        self,
        slots: Sequence[Any],
        residual: Callable,
        params: PyTree = None,
        data: PyTree = None,
    ):
        self.slots = tuple(_slot(s) for s in slots)
        if not self.slots:
            raise ValueError("a factor needs at least one slot.")
        if not callable(residual):
            raise TypeError(f"`residual` must be callable, got {residual!r}.")
        rows = _rows(self.slots)
        for leaf in jax.tree.leaves(data):
            if jnp.shape(leaf)[:1] != (rows,):
                raise ValueError(
                    f"every array of `data` needs a leading axis of {rows} (the "
                    f"factor's rows), got shape {jnp.shape(leaf)}."
                )
        self.residual = residual
        self.params = params
        self.data = data

    def check_sizes(self, index, sizes):
        # Nothing to check here: the user's residual receives the slots'
        # values with their variables' sizes, whatever they are.
        del index, sizes

    def rows(self) -> PyTree:
        return self.data

    def _r(self, row, xs):
        return jnp.ravel(self.residual(self.params, row, *xs))

    def row_gradient(self, row, xs):
        r, vjp = jax.vjp(lambda ys: self._r(row, ys), tuple(xs))
        return jnp.concatenate(vjp(r)[0])

    def row_jacobian(self, row, xs):
        return jacobian_by_jacfwd(self, row, xs)

    def row_belief(self, row, xs):
        return self.row_jacobian(row, xs)

    def row_precision(self, row, xs):
        blocks = jax.jacfwd(lambda ys: self._r(row, ys))(tuple(xs))
        jac = jnp.concatenate(blocks, axis=1)
        return jac.T @ jac

    def row_energy(self, row, xs):
        r = self._r(row, xs)
        return 0.5 * r @ r


class RelationFactor(AbstractGraphFactor):
    r"""Rows of a learned relation: a [`retrax.relations.Factor`][] whose
    channels are connected to the graph's variables or observed.

    Its energy is the relation's negative log density in data units: the
    gradient is the relation's field divided by its
    $\lambda_{\mathrm{eff}}$ (`prior_field(z) / effective_lambda`), at the
    joint state of the connected variables' values and the observed
    channels' values, restricted to the connected channels. For a learned
    (non-conservative) field it is not the gradient of any energy: the joint
    solve finds the graph's stable root, and the free energy needs a
    conservative relation.

    **Arguments:**

    - `factor`: the relation with its named channels.
    - `connect`: each connected channel's slot (a variable's name, or
      `(family, indices)`), by channel name; the variable must have the
      channel's size.
    - `observed`: each observed channel's value, shape `(size,)` (every row)
      or `(rows, size)`, by channel name (or
      [`retrax.relations.Observed`][] marks). Every channel is connected or
      observed.
    """

    factor: Factor
    slots: tuple[Slot, ...] = eqx.field(static=True)
    connected: tuple[str, ...] = eqx.field(static=True)
    observed: dict[str, Float[Array, "rows size"]]

    def __init__(
        self,
        factor: Factor,
        connect: Mapping[str, Any],
        observed: Mapping[str, Values | Observed] | None = None,
    ):
        if not isinstance(factor, Factor):
            raise TypeError(
                f"`factor` must be a retrax.relations.Factor, got "
                f"{type(factor).__name__}."
            )
        observed = {} if observed is None else dict(observed)
        names = dict(factor.channels)
        unknown = sorted((set(connect) | set(observed)) - set(names))
        if unknown:
            raise ValueError(
                f"unknown channels {unknown}; the factor's channels are {list(names)}."
            )
        both = sorted(set(connect) & set(observed))
        if both:
            raise ValueError(f"channels {both} are both connected and observed.")
        missing = [n for n in names if n not in connect and n not in observed]
        if missing:
            raise ValueError(
                f"channels {missing} are neither connected nor observed: in a "
                "graph every channel of a relation is a variable or a value."
            )
        if not connect:
            raise ValueError("a RelationFactor connects at least one channel.")
        self.factor = factor
        self.connected = tuple(n for n in names if n in connect)
        self.slots = tuple(_slot(connect[n]) for n in self.connected)
        rows = _rows(self.slots)
        values = {}
        for n in names:
            if n in observed:
                v = observed[n]
                v = jnp.asarray(v.value if isinstance(v, Observed) else v)
                v = _per_row(f"observed[{n!r}]", jnp.atleast_1d(v), rows, (names[n],))
                if not isinstance(v, jax.core.Tracer) and not bool(
                    jnp.all(jnp.isfinite(v))
                ):
                    raise ValueError(f"`observed[{n!r}]` must be finite.")
                values[n] = v
        self.observed = values

    def check_sizes(self, index, sizes):
        channels = dict(self.factor.channels)
        for name, size in zip(self.connected, sizes, strict=True):
            if channels[name] != size:
                raise ValueError(
                    f"factor {index} (RelationFactor): channel {name!r} has size "
                    f"{channels[name]}, but its variable has dimension {size}."
                )

    def rows(self) -> PyTree:
        return self.observed

    def _state(self, row, xs):
        parts = dict(zip(self.connected, xs, strict=True))
        dtype = xs[0].dtype
        return jnp.concatenate(
            [
                parts[n] if n in parts else row[n].astype(dtype)
                for n, _ in self.factor.channels
            ]
        )

    def _coords(self) -> np.ndarray:
        return np.asarray(self.factor.coords(*self.connected))

    def row_gradient(self, row, xs):
        z = self._state(row, xs)
        field = self.factor.prior_field(z) / self.factor.effective_lambda(z.dtype)
        return field[self._coords()]

    def row_jacobian(self, row, xs):
        return jacobian_by_jacfwd(self, row, xs)

    def row_belief(self, row, xs):
        z = self._state(row, xs)
        idx = self._coords()
        return self.factor.belief_precision(z)[np.ix_(idx, idx)]

    def row_precision(self, row, xs):
        return positive_part(self.row_belief(row, xs))

    def row_energy(self, row, xs):
        if not self.factor.conservative:
            raise TypeError(
                "the relation of this RelationFactor "
                f"({type(self.factor.relation).__name__}) is not conservative: "
                "its field is not the gradient of a known energy, so the graph "
                "has no free energy. Use a conservative relation (an "
                "EnergyNetwork), or the Laplace covariances alone "
                "(`graph_laplace`)."
            )
        z = self._state(row, xs)
        return self.factor.energy(z) / self.factor.effective_lambda(z.dtype)


def _float(x: Array):
    return x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.result_type(float)
