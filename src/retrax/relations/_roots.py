"""Multi-start inference: every stable answer of a query that several starts reach."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray

from .._deprecated import deprecated_property, renamed_argument
from .._errors import error_if, filter_jit
from .._solution import AbstractSolution, throw_if_failed
from .._state import as_state
from .._validate import check_positive_int
from ._abstract_relation import AbstractImplicitRelation, clamp_mask
from ._implicit_energy import implicit_energy
from ._infer import _check_query, _check_solver, _infer, adjoint_linear_solver
from ._solution import RESULTS
from ._solver import GuardedNewton


class ImplicitRoots(AbstractSolution):
    """The distinct stable answers of a query, from several starts.

    Fixed size (one slot per start), so it is produced under `jit`: the
    `count` valid, distinct answers come first, in order of first discovery.

    **Attributes:**

    - `value`: the answers, shape `(slots, n)`; invalid slots hold the
      duplicate or failed solves. `z` is its old name, deprecated (with a
      `DeprecationWarning`).
    - `valid`: which slots hold a distinct, converged and stable answer.
    - `count`: the number of valid slots.
    - `converged`, `stable`, `result`, `clamp_load`, `off_data`,
      `support_ratio`: per slot, as in [`retrax.relations.ImplicitSolution`][].
    - `stats`: `{"num_steps": ...}`, the solver steps of every slot, shape
      `(slots,)` (see [`retrax.diffusion.AbstractSolution`][]). `steps` is a
      deprecated, read-only name for `stats["num_steps"]` (with a
      `DeprecationWarning`).
    """

    value: Float[Array, "starts n"]
    valid: Bool[Array, " starts"]
    count: Int[Array, ""]
    converged: Bool[Array, " starts"]
    stable: Bool[Array, " starts"]
    result: RESULTS
    clamp_load: Float[Array, " starts"]
    off_data: Bool[Array, " starts"]
    support_ratio: Float[Array, " starts"]
    stats: dict[str, Array]

    z = deprecated_property("ImplicitRoots.z", ".value", lambda s: s.value)
    steps = deprecated_property(
        "ImplicitRoots.steps", '.stats["num_steps"]', lambda s: s.stats["num_steps"]
    )


@renamed_argument("model", "relation")
@filter_jit
def implicit_roots(
    relation: AbstractImplicitRelation,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    key: PRNGKeyArray | None = None,
    n_starts: int = 16,
    spread: float = 1.0,
    unique_tol: float = 1e-3,
    *,
    solver: GuardedNewton | None = None,
    starts: Float[ArrayLike, "..."] | None = None,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 200,
    matrix_free: bool | None = None,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    symmetric: bool | None = None,
    off_data_tol: float | None = None,
    throw: bool = True,
    adjoint: optx.AbstractAdjoint | None = None,
) -> ImplicitRoots:
    r"""All the stable answers of a query that several starts reach.

    The first start is always the query's own: `z_init`, or `z0` (the start
    [`retrax.relations.implicit_infer`][] would use), so the answer
    `implicit_infer` gives is among the roots. The others are the rows of
    `starts` when given, and otherwise `n_starts - 1` random starts
    `z0 + spread * N(0, I)` drawn with `key`. Clamped coordinates of every
    start are ignored (they are held at `z0`). The solves run as one `vmap`
    of `implicit_infer` with the same solver options. Converged, stable
    answers are kept and deduplicated: an answer within
    `unique_tol * (1 + max|z|)` (max-norm) of an earlier kept one is dropped.

    Every slot carries the derivatives of its own solve, as in
    `implicit_infer`: a duplicate (or a converged but unstable) slot is a root
    of the query, and its derivatives are that root's (finite, and equal to
    those of the valid slot it duplicates). A slot whose solve did not
    converge is never silent: with `throw=True` (the default) the call
    raises with the slot's result; with `throw=False` the derivatives of
    its `z` are NaN and `result` says why. Reverse mode cannot tell a
    masked-out slot from a used one, so with `throw=False` a gradient
    through `z` is NaN whenever any slot failed, even if that slot is masked
    out: check `result` (or raise `max_steps`) before differentiating.

    **Arguments:**

    - `relation`: the implicit field.
    - `z0`, `rho`: the query, as in `implicit_infer`.
    - `key`: a PRNG key for random starts; pass either `key` or `starts`.
    - `n_starts`: the number of slots with random starts, the query's own
      start included (so `n_starts - 1` random ones).
    - `spread`: the standard deviation of the random starts around `z0`.
    - `unique_tol`: the relative distance below which answers are the same.
    - `starts`: explicit starts, shape `(m, n)` with `m >= 1`, solved after
      the query's own start (`1 + m` slots); `key`, `n_starts` and `spread`
      are then unused.
    - `z_init`: the query's own start, as in `implicit_infer`; `z0` by
      default.
    - `solver`: the root finder of every start, a
      [`retrax.relations.GuardedNewton`][], as in `implicit_infer`; `tol`
      and `matrix_free` are its shorthands there, and not together with it.
    - `tol`, `max_steps`, `matrix_free`, `adjoint_solver`, `symmetric`,
      `off_data_tol`, `adjoint`: as in `implicit_infer`, for every start.
    - `throw`: whether a slot whose solve did not converge raises.

    **Returns:**

    An [`retrax.relations.ImplicitRoots`][].
    """
    _check_solver(solver, tol, matrix_free)
    adjoint_solver = adjoint_linear_solver(adjoint, adjoint_solver)
    z0, rho, own = _check_query(relation, z0, rho, z_init)
    dtype = z0.dtype
    n = z0.shape[0]
    if starts is None:
        if key is None:
            raise ValueError(
                "`implicit_roots` needs a PRNG `key` for random starts, or "
                "explicit `starts` of shape (m, n)."
            )
        check_positive_int("n_starts", n_starts)
        noise = jax.random.normal(key, (n_starts, n), dtype)
        others = (z0 + jnp.asarray(spread, dtype) * noise)[1:]
    else:
        if key is not None:
            raise ValueError(
                "pass either `key` (random starts) or `starts` (explicit ones) "
                "to `implicit_roots`, not both."
            )
        others = as_state("starts", starts)
        if others.ndim != 2 or others.shape[0] < 1 or others.shape[1] != n:
            raise ValueError(
                f"`starts` must have shape (m, {n}) with m >= 1 (one start per "
                f"row, as long as `z0`), got shape {others.shape}."
            )
        others = others.astype(dtype)
        others = error_if(
            others,
            jnp.any(~jnp.isfinite(others) & ~clamp_mask(rho)),
            "`starts` must be finite on the coordinates that are not clamped.",
        )
    inits = jnp.concatenate([own[None], others])
    slots = inits.shape[0]

    def one(start, q, r):
        return _infer(
            relation,
            q,
            r,
            start,
            solver,
            tol,
            max_steps,
            matrix_free,
            adjoint_solver,
            False,
            symmetric,
            off_data_tol,
        )

    # z0 and rho are tiled rather than broadcast by vmap: transposing lineax's
    # solve under vmap fails for an unbatched right-hand-side input (equinox
    # 0.13.8) when a derivative is taken with respect to z0.
    tile = (slots, n)
    sols = jax.vmap(one)(inits, jnp.broadcast_to(z0, tile), jnp.broadcast_to(rho, tile))
    ok = sols.converged & sols.stable
    z = sols.value
    zs = jax.lax.stop_gradient(z)
    scale = 1 + jnp.max(jnp.abs(zs), axis=1)
    dist = jnp.max(jnp.abs(zs[:, None, :] - zs[None, :, :]), axis=-1)
    close = dist <= unique_tol * jnp.maximum(scale[:, None], scale[None, :])

    def body(i, keep):
        earlier = jnp.arange(slots) < i
        dup = jnp.any(keep & earlier & close[i])
        return keep.at[i].set(ok[i] & ~dup)

    keep = jax.lax.fori_loop(0, slots, body, jnp.zeros((slots,), bool))
    order = jnp.argsort(~keep, stable=True)
    steps = sols.stats["num_steps"][order]
    out = ImplicitRoots(
        value=z[order],
        valid=keep[order],
        count=jnp.sum(keep),
        converged=sols.converged[order],
        stable=sols.stable[order],
        result=jax.tree.map(lambda x: x[order], sols.result),
        clamp_load=sols.clamp_load[order],
        off_data=sols.off_data[order],
        support_ratio=sols.support_ratio[order],
        stats={"num_steps": steps},
    )
    result = out.result
    failed = (result != RESULTS.successful) & (result != RESULTS.unstable_root)
    return throw_if_failed(out, throw, failed)


class RootsByEnergy(AbstractSolution):
    """The answers of a query ordered by energy, from
    [`retrax.relations.roots_by_energy`][].

    Unpacks as the pair `(roots, energy)`, the form `roots_by_energy`
    returned before it returned this object.

    **Attributes:**

    - `value`: the answers, shape `(slots, n)`, the lowest energy first
      (`roots.value`).
    - `energy`: each slot's energy, `inf` for invalid slots, shape
      `(slots,)`.
    - `roots`: the reordered [`retrax.relations.ImplicitRoots`][].
    - `result`, `stats`: the reordered roots' (per slot).
    """

    value: Float[Array, "starts n"]
    energy: Float[Array, " starts"]
    roots: ImplicitRoots
    result: RESULTS
    stats: dict[str, Array]

    def __iter__(self):
        return iter((self.roots, self.energy))


@renamed_argument("model", "relation")
def roots_by_energy(
    relation: AbstractImplicitRelation,
    roots: ImplicitRoots,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
) -> RootsByEnergy:
    r"""Order the answers of a query by energy, the most probable first.

    For a conservative relation (see
    [`retrax.relations.implicit_energy`][]) the valid answers of
    [`retrax.relations.implicit_roots`][] are sorted by the query's potential
    $U(z) + \tfrac12\sum_F\rho_i^2(z_i - z_{0,i})^2$, lowest first (the
    deepest mode of the learned density given the query); invalid slots
    follow. Jittable; derivatives pass through the reordered answers.

    **Arguments:**

    - `relation`: the conservative relation the query was solved with.
    - `roots`: the query's answers.
    - `z0`, `rho`: the query.

    **Returns:**

    A [`retrax.relations.RootsByEnergy`][]: the reordered answers (`value`),
    each slot's energy (`energy`, `inf` for invalid slots) and the reordered
    [`retrax.relations.ImplicitRoots`][] (`roots`). It unpacks as
    `roots, energy = ...`.
    """
    dtype = roots.value.dtype
    z0 = relation.check_point("z0", z0).astype(dtype)
    rho = relation.check_point("rho", rho).astype(dtype)
    energy = jax.vmap(lambda z: implicit_energy(relation, z, z0, rho))(
        jax.lax.stop_gradient(roots.value)
    )
    energy = jnp.where(roots.valid, energy, jnp.array(jnp.inf, dtype))
    order = jnp.argsort(energy, stable=True)
    ordered = jax.tree.map(
        lambda x: x[order] if eqx.is_array(x) and x.ndim >= 1 else x, roots
    )
    return RootsByEnergy(
        value=ordered.value,
        energy=energy[order],
        roots=ordered,
        result=ordered.result,
        stats=ordered.stats,
    )
