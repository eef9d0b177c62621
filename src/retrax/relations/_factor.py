"""Factors: a relation whose joint state is named channels, each observed,
unobserved (soft, with a precision) or latent (free)."""

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Bool, Float, PyTree

from .._solution import AbstractSolution
from .._validate import check_positive_int, check_tol
from ._abstract_relation import AbstractImplicitRelation
from ._channel import AbstractChannel, Latent
from ._infer import implicit_infer, implicit_pullback
from ._solution import RESULTS, ImplicitSolution
from ._solver import GuardedNewton


def blockranges(blocks: Mapping[str, int]) -> dict[str, range]:
    """The coordinate ranges of named variable blocks in a joint state.

    Blocks are laid out in the mapping's order: `{"x": 1, "y": 2, "z": 1}`
    gives `{"x": range(0, 1), "y": range(1, 3), "z": range(3, 4)}`.

    **Arguments:**

    - `blocks`: the variables' names and sizes (positive integers), in order.

    **Returns:**

    A dict from each name to its `range` of joint coordinates.
    """
    out, start = {}, 0
    for name, size in blocks.items():
        if not (isinstance(size, (int, np.integer)) and size >= 1):
            raise ValueError(
                f"block {name!r} must have a positive integer size, got {size!r}."
            )
        out[name] = range(start, start + int(size))
        start += int(size)
    return out


def assemble_state(
    blocks: Mapping[str, int], values: Mapping[str, ArrayLike], fill: float = 0.0
) -> Float[Array, " n"]:
    """Lay out named variable values as one joint state vector.

    **Arguments:**

    - `blocks`: the variables' names and sizes, as in
      [`retrax.relations.blockranges`][].
    - `values`: values for some of the variables (a scalar or a vector of the
      block's size each); unknown names are an error.
    - `fill`: the value of the coordinates of variables not in `values` (e.g.
      `0.0` for a start, `jnp.inf` for a stiffness that clamps).

    **Returns:**

    The joint state, shape `(n,)` with `n = sum(blocks.values())`.
    """
    ranges = blockranges(blocks)
    unknown = set(values) - set(ranges)
    if unknown:
        raise ValueError(
            f"unknown variables {sorted(unknown)}; the blocks are {list(ranges)}."
        )
    leaves = [jnp.asarray(v) for v in values.values()]
    dtype = (
        jnp.result_type(
            *[v.dtype for v in leaves if jnp.issubdtype(v.dtype, jnp.inexact)]
        )
        if any(jnp.issubdtype(v.dtype, jnp.inexact) for v in leaves)
        else jnp.asarray(1.0).dtype
    )
    n = sum(len(r) for r in ranges.values())
    state = jnp.full((n,), fill, dtype)
    for name, value in values.items():
        r = ranges[name]
        value = jnp.asarray(value).astype(dtype)
        if value.shape not in ((), (len(r),)):
            raise ValueError(
                f"variable {name!r} has size {len(r)}, got a value of shape "
                f"{value.shape}."
            )
        state = state.at[r.start : r.stop].set(value)
    return state


def query_dtype(dtype: DTypeLike | None) -> np.dtype:
    """A query's dtype: a real floating dtype, JAX's default float for `None`."""
    if dtype is None:
        return jnp.result_type(float)
    try:
        dtype = jnp.dtype(dtype)
    except TypeError as err:
        raise TypeError(
            f"`dtype` must be a real floating dtype, got {dtype!r}."
        ) from err
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(
            f"`dtype` must be a real floating dtype (the query's values and "
            f"stiffnesses, which may be infinite), got {dtype}."
        )
    return dtype


class Factor(AbstractImplicitRelation):
    r"""A relation whose joint state is named channels.

    The joint coordinates are the `channels`' blocks in order (as in
    [`retrax.relations.blockranges`][]). A query marks each channel
    [`retrax.relations.Observed`][], [`retrax.relations.Unobserved`][] or
    [`retrax.relations.Latent`][] (the default for channels not named), and
    [`retrax.relations.Factor.query`][] turns the marks into the clamp and
    stiffness vectors of [`retrax.relations.implicit_infer`][]. A factor is a
    relation itself (its field is the member's), so every query function
    takes it; [`retrax.relations.factor_infer`][] and
    [`retrax.relations.factor_pullback`][] speak in channels.

    **Arguments:**

    - `relation`: the relation, of dimension `sum(channels.values())`.
    - `channels`: the channels' names and sizes, in order.
    """

    relation: AbstractImplicitRelation
    channels: tuple[tuple[str, int], ...] = eqx.field(static=True)

    def __init__(self, relation: AbstractImplicitRelation, channels: Mapping[str, int]):
        if not isinstance(relation, AbstractImplicitRelation):
            raise TypeError(
                "`relation` must be an AbstractImplicitRelation (e.g. an "
                f"ImplicitDiffusion), got {type(relation).__name__}."
            )
        ranges = blockranges(channels)
        n = sum(len(r) for r in ranges.values())
        if n != relation.dim:
            raise ValueError(
                f"the channels {dict(channels)} have {n} coordinates in all, but "
                f"the relation has dimension {relation.dim}."
            )
        self.relation = relation
        self.channels = tuple((str(k), int(v)) for k, v in channels.items())

    @property
    def ranges(self) -> dict[str, range]:
        """Each channel's `range` of joint coordinates."""
        return blockranges(dict(self.channels))

    @property
    def dim(self) -> int:
        return self.relation.dim

    def prior_field(self, z: Float[ArrayLike, " n"]) -> Float[Array, " n"]:
        """The member relation's field."""
        return self.relation.prior_field(self.check_point("z", z))

    @property
    def conservative(self) -> bool:
        return self.relation.conservative

    def energy(self, z: Float[ArrayLike, " n"]) -> Float[Array, ""]:
        """The member relation's potential."""
        return self.relation.energy(self.check_point("z", z))

    def effective_lambda(self, dtype) -> Float[Array, ""]:
        return self.relation.effective_lambda(dtype)

    def belief_precision(self, z: Float[ArrayLike, " n"]) -> Float[Array, "n n"]:
        """The member relation's belief precision."""
        return self.relation.belief_precision(self.check_point("z", z))

    def field_unit(self, dtype) -> Float[Array, " n"]:
        return self.relation.field_unit(dtype)

    def support_ratio(
        self, z: Float[Array, " n"], clamped: Bool[Array, " n"]
    ) -> Float[Array, ""]:
        """The member relation's calibrated off-data test."""
        return self.relation.support_ratio(z, clamped)

    def _check_marks(self, marks: Mapping[str, AbstractChannel]) -> None:
        names = dict(self.channels)
        unknown = sorted(set(marks) - set(names))
        if unknown:
            raise ValueError(
                f"unknown channels {unknown}; the factor's channels are {list(names)}."
            )
        for name, mark in marks.items():
            if not isinstance(mark, AbstractChannel):
                raise TypeError(
                    f"channel {name!r} must be marked Observed, Unobserved or "
                    f"Latent, got {type(mark).__name__}."
                )

    def query(
        self, marks: Mapping[str, AbstractChannel], dtype=None, *, check: bool = True
    ) -> tuple[Float[Array, " n"], Float[Array, " n"]]:
        """The query vectors `(z0, rho)` of marked channels.

        **Arguments:**

        - `marks`: a mapping from channel names to
          [`retrax.relations.Observed`][], [`retrax.relations.Unobserved`][]
          or [`retrax.relations.Latent`][]; channels not named are latent
          (starting at 0).
        - `dtype`: the query's dtype, a real floating dtype (a `TypeError`
          otherwise); JAX's default float by default.
        - `check`: whether every mark's values are checked here (finite values
          and starts, positive finite precisions), raising a message that names
          the channel. Unchecked, a bad value enters `z0` or `rho` as a
          non-finite number (a bad precision as a NaN stiffness), which
          [`retrax.relations.implicit_infer`][] reports per query with
          `throw=False`.

        **Returns:**

        A tuple `(z0, rho)` of `(n,)` vectors for
        [`retrax.relations.implicit_infer`][].
        """
        z0, rho, blocks = self._query(marks, dtype, check)
        if blocks:
            raise ValueError(
                f"the channels {sorted(blocks)} have a precision matrix, whose "
                "off-diagonal stiffness `(z0, rho)` cannot hold: use "
                "`factor.query_coupled(marks)` and pass its `coupling` to "
                "`implicit_infer`, or query with `factor_infer`."
            )
        return z0, rho

    def query_coupled(
        self, marks: Mapping[str, AbstractChannel], dtype=None, *, check: bool = True
    ) -> tuple[Float[Array, " n"], Float[Array, " n"], Float[Array, "n n"] | None]:
        r"""The query vectors `(z0, rho)` and the coupling matrix of marked
        channels.

        As [`retrax.relations.Factor.query`][], and also for
        [`retrax.relations.Unobserved`][] channels with a precision matrix
        $P$: `rho` holds $\sqrt{\lambda_{\mathrm{eff}} P_{ii}}$ and the
        coupling matrix $\lambda_{\mathrm{eff}}(P - \mathrm{diag}(P))$ on
        the channel's block (0 elsewhere), so that the query adds
        $\tfrac12\,(z - v)^\top P (z - v)$ in data units, as a vector
        precision does on the diagonal. For the `coupling` of
        [`retrax.relations.implicit_infer`][] and
        [`retrax.relations.laplace_belief`][].

        **Arguments:**

        - `marks`, `dtype`, `check`: as in [`retrax.relations.Factor.query`][].

        **Returns:**

        A tuple `(z0, rho, coupling)`: two `(n,)` vectors and an `(n, n)`
        matrix, or `None` when no channel has a precision matrix.
        """
        z0, rho, blocks = self._query(marks, dtype, check)
        if not blocks:
            return z0, rho, None
        coupling = jnp.zeros((self.dim, self.dim), z0.dtype)
        for name, block in blocks.items():
            r = self.ranges[name]
            coupling = coupling.at[r.start : r.stop, r.start : r.stop].set(block)
        return z0, rho, coupling

    def _query(self, marks, dtype, check):
        self._check_marks(marks)
        dtype = query_dtype(dtype)
        lam_eff = self.effective_lambda(dtype)
        z0, rho, blocks = [], [], {}
        for name, size in self.channels:
            mark = marks.get(name, Latent())
            v, r = mark.query(name, size, dtype, lam_eff, check)
            z0.append(v)
            rho.append(r)
            block = mark.coupling(name, size, dtype, lam_eff, check)
            if block is not None:
                blocks[name] = block
        return jnp.concatenate(z0), jnp.concatenate(rho), blocks

    def coords(self, *names: str) -> tuple[int, ...]:
        """The joint coordinates of the named channels, in the order given.

        **Arguments:**

        - `*names`: channel names.

        **Returns:**

        The coordinates, e.g. for the `coords` of
        [`retrax.relations.laplace_belief`][].
        """
        ranges = self.ranges
        missing = [n for n in names if n not in ranges]
        if missing or not names:
            raise ValueError(
                f"`coords` needs channel names among {list(ranges)}, got {list(names)}."
            )
        return tuple(i for n in names for i in ranges[n])

    def split(self, z: Float[ArrayLike, " n"]) -> dict[str, Float[Array, " size"]]:
        """A joint vector's blocks, by channel name.

        **Arguments:**

        - `z`: a joint vector, shape `(n,)`.

        **Returns:**

        A dict from each channel name to its block of `z`.
        """
        z = self.check_point("z", z)
        return {name: z[r.start : r.stop] for name, r in self.ranges.items()}

    def join(
        self, blocks: Mapping[str, ArrayLike], fill: float = 0.0
    ) -> Float[Array, " n"]:
        """The joint vector of some channels' blocks (others `fill`).

        **Arguments:**

        - `blocks`: values by channel name, as in
          [`retrax.relations.assemble_state`][].
        - `fill`: the value of the channels not given.

        **Returns:**

        The joint vector, shape `(n,)`.
        """
        return assemble_state(dict(self.channels), blocks, fill)


def factor_infer(
    factor: Factor,
    marks: Mapping[str, AbstractChannel],
    *,
    dtype: DTypeLike | None = None,
    solver: GuardedNewton | None = None,
    z_init: Float[ArrayLike, " n"] | None = None,
    # Wider than the values accepted: a traced `tol` and a non-integer
    # `max_steps` are refused below by name, not by the type checker.
    tol: float | ArrayLike | None = None,
    max_steps: int | float = 200,
    matrix_free: bool | None = None,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    symmetric: bool | None = None,
    off_data_tol: float | None = None,
    batch_chunk: int | None = None,
    throw: bool = True,
    adjoint: optx.AbstractAdjoint | None = None,
) -> ImplicitSolution:
    """Answer a query on a factor whose channels are marked.

    [`retrax.relations.implicit_infer`][] on `factor.query(marks)`:
    differentiable with respect to the relation's parameters and to every
    mark's values and precisions (a gradient with respect to `marks` is a
    mapping of marks holding the cotangents; see
    [`retrax.relations.factor_pullback`][]).

    **Arguments:**

    - `factor`: the factor.
    - `marks`: channel names to [`retrax.relations.Observed`][],
      [`retrax.relations.Unobserved`][] or [`retrax.relations.Latent`][]
      (channels not named are latent).
    - `dtype`: the query's dtype, a real floating dtype (a `TypeError`
      otherwise); JAX's default float by default.
    - `solver`, `z_init`, `tol`, `max_steps`, `matrix_free`,
      `adjoint_solver`, `symmetric`, `off_data_tol`, `batch_chunk`,
      `adjoint`: the options of [`retrax.relations.implicit_infer`][], with
      its defaults.
      The solve starts at the latent channels' starts (and the unobserved
      channels' values) unless `z_init` is given. A `tol`
      that is not a positive, finite Python float, or a `max_steps` that is
      not a positive integer, raises a `ValueError` naming it (a traced
      `tol` a `TypeError`: it is fixed when the program is traced). With
      the default `off_data_tol=None`, a factor whose relation is
      calibrated by [`retrax.relations.calibrate_off_data`][] for the
      observed channels' coordinates flags the answer `off_data` by the
      calibrated test.
    - `throw`: whether a solve that did not converge, or a query (a mark)
      that is not valid, raises; with `throw=False` a bad mark is this
      query's failure (`RESULTS.invalid_query`), as in `implicit_infer`.

    **Returns:**

    An [`retrax.relations.ImplicitSolution`][]; `factor.split(sol.value)` gives
    the answer by channel.
    """
    if not isinstance(factor, Factor):
        raise TypeError(f"`factor` must be a Factor, got {type(factor).__name__}.")
    # checked here too, before the solve's own annotations see them
    check_tol(tol)
    check_positive_int("max_steps", max_steps)
    # With `throw=False` a bad mark is the query's failure, not the batch's:
    # it is left to `implicit_infer`, which reports it in `result`.
    z0, rho, coupling = factor.query_coupled(marks, dtype, check=throw)
    return implicit_infer(
        factor,
        z0,
        rho,
        solver=solver,
        z_init=z_init,
        tol=tol,
        max_steps=max_steps,
        matrix_free=matrix_free,
        adjoint_solver=adjoint_solver,
        symmetric=symmetric,
        off_data_tol=off_data_tol,
        throw=throw,
        coupling=coupling,
        batch_chunk=batch_chunk,
        adjoint=adjoint,
    )


class FactorPullback(AbstractSolution):
    """The cotangents of a factor query's relation and marks, from
    [`retrax.relations.factor_pullback`][].

    Its answer, `value`, is the pair `(factor_bar, marks_bar)`, and it
    unpacks as that pair, the form `factor_pullback` returned before it
    returned this object.

    **Attributes:**

    - `factor_bar`: a pytree shaped like the factor with the cotangent at
      every floating-point leaf (`None` elsewhere).
    - `marks_bar`: a dict from each channel of the marks to a mark of the
      same kind holding its cotangents (`value`, `precision` or `start`).
    - `result`: the [`retrax.relations.RESULTS`][] code of the adjoint, as
      in [`retrax.relations.ImplicitPullback`][]: the cotangents are NaN
      whenever it is not `successful`.
    - `stats`: `{"num_steps": 0}`: one LU solve, no iterations.
    """

    factor_bar: PyTree
    marks_bar: dict[str, AbstractChannel]
    result: RESULTS
    stats: dict[str, Array]

    @property
    def value(self) -> tuple[PyTree, dict[str, AbstractChannel]]:
        """The answer: `(factor_bar, marks_bar)`."""
        return self.factor_bar, self.marks_bar

    def __iter__(self):
        return iter(self.value)


def factor_pullback(
    factor: Factor,
    sol: ImplicitSolution,
    marks: Mapping[str, AbstractChannel],
    zbar: Mapping[str, ArrayLike] | Float[ArrayLike, " n"],
    *,
    throw: bool = True,
) -> FactorPullback:
    r"""The cotangents of a factor query's relation and of each channel's mark.

    The adjoint formulas of [`retrax.relations.implicit_pullback`][],
    carried back through [`retrax.relations.Factor.query`][]: an observed
    channel's value gets $\bar z_C + J_{FC}^\top\mu$, an unobserved
    channel's value $-\rho^2\mu$ and its precision
    $\bar\rho\,\partial\rho/\partial\,\mathrm{precision}$ with
    $\bar\rho = 2\rho(z^* - z_0)\mu$, and a latent channel's start 0. The
    numbers equal `jax.grad` through [`retrax.relations.factor_infer`][]
    (the relation's part includes what reaches it through
    $\lambda_{\mathrm{eff}}$ in the stiffness). NaN when the solve did not
    converge.

    **Arguments:**

    - `factor`: the factor the query was solved on.
    - `sol`: the query's solution.
    - `marks`: the query's marks.
    - `zbar`: the cotangent of the answer: a mapping from channel names to
      the cotangents of their blocks (channels not named get 0), or a joint
      `(n,)` vector.
    - `throw`: whether a singular adjoint system raises (otherwise NaN).

    Marks with a precision matrix are refused (a `ValueError`): `jax.grad`
    through `factor_infer` differentiates them.

    **Returns:**

    A [`retrax.relations.FactorPullback`][]: `factor_bar`, a pytree shaped
    like `factor` with the cotangent at every floating-point leaf, and
    `marks_bar`, a dict from each channel of `marks` to a mark of the same
    kind holding its cotangents (`value`, `precision` or `start`), with the
    adjoint's `result`. It unpacks as `factor_bar, marks_bar = ...`.
    """
    if not isinstance(factor, Factor):
        raise TypeError(f"`factor` must be a Factor, got {type(factor).__name__}.")
    dtype = sol.value.dtype
    if factor.query_coupled(marks, dtype)[2] is not None:
        raise ValueError(
            "`factor_pullback` takes marks with scalar or vector precisions "
            "only; a precision matrix's cotangent has no explicit formula here. "
            "Differentiate `factor_infer` with `jax.grad` instead (its "
            "derivatives come by the implicit function theorem)."
        )
    if isinstance(zbar, Mapping):
        zbar = factor.join({k: jnp.asarray(v, dtype) for k, v in zbar.items()}).astype(
            dtype
        )
    marks = dict(marks)
    factor._check_marks(marks)
    params, static = eqx.partition((factor, marks), eqx.is_inexact_array)

    def query(p):
        f, m = eqx.combine(p, static)
        return f.query(m, dtype)

    (z0, rho), vjp = jax.vjp(query, params)
    pullback = implicit_pullback(factor, sol, z0, rho, zbar, throw=throw)
    factor_bar, z0_bar, rho_bar = pullback
    # An infinite stiffness has derivative 0 (and its cotangent is 0 already).
    rho_bar = jnp.where(jnp.isposinf(rho), jnp.zeros((), dtype), rho_bar)
    (through,) = vjp((z0_bar, rho_bar))
    through_factor, marks_bar = through
    factor_bar = jax.tree.map(
        lambda a, b: a if b is None else (b if a is None else a + b),
        factor_bar,
        through_factor,
        is_leaf=lambda x: x is None,
    )
    return FactorPullback(factor_bar, marks_bar, pullback.result, pullback.stats)
