"""Implicit inference: answer a query as a stable root of the field, and
differentiate the answer by the implicit function theorem."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float, PyTree

from .._deprecated import renamed_argument
from .._errors import error_if, errors_if, filter_jit
from .._never_silent import nan_derivatives_unless, nan_unless, never_silent
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_tol
from ._abstract_relation import (
    AbstractImplicitRelation,
    clamp_mask,
    coupling_term,
    soft_stiffness,
)
from ._batched_adjoint import BatchedImplicitAdjoint
from ._solution import RESULTS, ImplicitSolution
from ._solver import GuardedNewton


def _query_residual(y, args):
    relation, z0, rho, coupling = args
    return relation.implicit_residual(y, z0, rho, coupling)


def _symmetric_residual(y, args):
    # The field is read at the clamped values z0_C rather than at y_C: equal at
    # every iterate (the solver never moves clamped coordinates off z0_C), but
    # the Jacobian is then blockdiag(I, J_FF), symmetric when the field is a
    # gradient, and the clamped inputs' cotangent J_FC^T mu flows through z0.
    relation, z0, rho, coupling = args
    clamped = clamp_mask(rho)
    diff = y - z0
    free_rows = (
        relation.prior_field(jnp.where(clamped, z0, y)) + soft_stiffness(rho) * diff
    )
    if coupling is not None:
        free_rows = free_rows + coupling_term(coupling, clamped, diff)
    return jnp.where(clamped, diff, free_rows)


# The clamp load beyond which a query of a relation not calibrated for its
# clamps is flagged off the data.
_UNCALIBRATED_TOL = 3.0


def default_tol(dtype) -> float:
    """`1e-9` in float64 and `1e-5` in float32 (and lower precisions)."""
    return 1e-9 if jnp.finfo(dtype).bits >= 64 else 1e-5


def _query_shapes(relation, z0, rho, z_init):
    if not isinstance(relation, AbstractImplicitRelation):
        raise TypeError(
            "`relation` must be a relation (an AbstractImplicitRelation such as "
            f"ImplicitDiffusion or ProductRelation), got {type(relation).__name__}."
        )
    z0 = relation.check_point("z0", z0)
    dtype = z0.dtype
    rho = relation.check_point("rho", rho).astype(dtype)
    z_init = z0 if z_init is None else relation.check_point("z_init", z_init)
    z_init = z_init.astype(dtype)
    return z0, rho, z_init


def _check_coupling(relation, coupling, dtype):
    """A coupling matrix's shape and dtype (`None` passes)."""
    if coupling is None:
        return None
    coupling = jnp.asarray(coupling)
    if not jnp.issubdtype(coupling.dtype, jnp.floating):
        raise TypeError(f"`coupling` must be a real matrix, got {coupling.dtype}.")
    n = relation.dim
    if coupling.shape != (n, n):
        raise ValueError(
            f"`coupling` must be an ({n}, {n}) matrix (the relation's joint "
            f"dimension), got shape {coupling.shape}."
        )
    return coupling.astype(dtype)


def _bad_coupling(coupling, rho) -> Bool[Array, ""]:
    if coupling is None:
        return jnp.asarray(False)
    clamped = clamp_mask(rho)
    both = ~clamped[:, None] & ~clamped[None, :]
    k = jnp.where(both, coupling, 0)
    finite = jnp.all(jnp.isfinite(k))
    safe = jnp.where(finite, k, 0)
    tol = jnp.sqrt(jnp.finfo(k.dtype).eps) * jnp.max(jnp.abs(safe))
    return ~finite | jnp.any(jnp.abs(safe - safe.T) > tol)


def _invalid_query(z0, rho, z_init) -> Bool[Array, ""]:
    """Whether a query's values fail the checks of `_check_query`."""
    clamped = clamp_mask(rho)
    return (
        jnp.any(jnp.isnan(rho) | (rho < 0))
        | jnp.all(clamped)
        | jnp.any(~jnp.isfinite(z0))
        | jnp.any(~jnp.isfinite(z_init) & ~clamped)
    )


def _screen_query(relation, z0, rho, z_init, throw, coupling=None):
    """The query checked (`throw`), or with its bad values replaced.

    With `throw=False` a query whose values are not valid is not an error but
    this query's failure: the returned flag `bad` marks it, and its values are
    replaced by a harmless query (every coordinate free, starting at 0), so that
    its solve stops as quickly as a good one and, under `vmap`, cannot hold the
    other queries' loop; the caller reports it as `RESULTS.invalid_query` with
    a NaN answer.
    """
    if throw:
        z0, rho, z_init = _check_query(relation, z0, rho, z_init)
        coupling = _check_coupling(relation, coupling, z0.dtype)
        if coupling is not None:
            coupling = error_if(
                coupling,
                _bad_coupling(coupling, rho),
                "`coupling` must be finite and symmetric on the coordinates "
                "that are not clamped.",
            )
        return z0, rho, z_init, coupling, jnp.asarray(False)
    z0, rho, z_init = _query_shapes(relation, z0, rho, z_init)
    coupling = _check_coupling(relation, coupling, z0.dtype)
    bad = _invalid_query(z0, rho, z_init) | _bad_coupling(coupling, rho)
    zero = jnp.zeros((), z0.dtype)
    z0, rho, z_init = (jnp.where(bad, zero, v) for v in (z0, rho, z_init))
    if coupling is not None:
        coupling = jnp.where(bad, zero, coupling)
    return z0, rho, z_init, coupling, bad


def _check_query(relation, z0, rho, z_init):
    z0, rho, z_init = _query_shapes(relation, z0, rho, z_init)
    clamped = clamp_mask(rho)
    # one staged check (one host callback) for the four, the first failing
    # one's message raised
    z0, rho, z_init = errors_if(
        (z0, rho, z_init),
        (
            jnp.any(jnp.isnan(rho) | (rho < 0)),
            jnp.all(clamped),
            jnp.any(~jnp.isfinite(z0)),
            jnp.any(~jnp.isfinite(z_init) & ~clamped),
        ),
        (
            "`rho` must be nonnegative stiffnesses (0 free, inf clamped); it holds "
            "a NaN or a negative value.",
            "every coordinate is clamped (`rho = inf` everywhere): nothing to "
            "infer. Leave at least one coordinate free (`rho = 0`) or soft "
            "(finite `rho`).",
            "`z0` must be finite (it holds inf or NaN).",
            "`z_init` must be finite on the coordinates that are not clamped.",
        ),
    )
    return z0, rho, z_init


def _krylov(tol: float, dtype) -> lx.GMRES:
    # A hundredth of the nonlinear tolerance, but not below what the dtype can
    # resolve: lineax's GMRES reports breakdown when asked for the impossible.
    inner = max(0.01 * tol, 1e3 * float(jnp.finfo(dtype).eps))
    return lx.GMRES(rtol=inner, atol=inner, restart=40)


def _solver(tol: float, matrix_free: bool, dtype) -> GuardedNewton:
    if matrix_free:
        return GuardedNewton(
            rtol=tol, atol=tol, matrix_free=True, linear_solver=_krylov(tol, dtype)
        )
    return GuardedNewton(rtol=tol, atol=tol)


def _check_solver(solver, tol, matrix_free) -> None:
    """`solver` is a `GuardedNewton`, given alone or not at all."""
    if solver is None:
        return
    if tol is not None or matrix_free is not None:
        given = ", ".join(
            f"`{name}`"
            for name, v in (("tol", tol), ("matrix_free", matrix_free))
            if v is not None
        )
        raise ValueError(
            f"pass either `solver` or {given}, not both: `tol` and "
            "`matrix_free` are shorthands that build the solver "
            "(`GuardedNewton(rtol=tol, atol=tol, matrix_free=...)`). Set the "
            "tolerances on the `GuardedNewton` you pass instead."
        )
    if not isinstance(solver, GuardedNewton):
        raise TypeError(
            "`solver` must be a `retrax.relations.GuardedNewton` (its state "
            "reports the convergence and stability a query's answer carries), "
            f"got {type(solver).__name__}."
        )


def _query_solver(solver, tol, matrix_free, dtype) -> GuardedNewton:
    """The solver of a query: `solver`, or the one `tol` and `matrix_free`
    build (the dtype's default tolerance when `tol` is None)."""
    if solver is not None:
        return solver
    tol = default_tol(dtype) if tol is None else tol
    return _solver(tol, bool(matrix_free), dtype)


@renamed_argument("model", "relation")
@filter_jit
def implicit_infer(
    relation: AbstractImplicitRelation,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    *,
    solver: GuardedNewton | None = None,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 200,
    matrix_free: bool | None = None,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    symmetric: bool | None = None,
    off_data_tol: float | None = None,
    throw: bool = True,
    coupling: Float[ArrayLike, "n n"] | None = None,
    batch_chunk: int | None = None,
    adjoint: optx.AbstractAdjoint | None = None,
) -> ImplicitSolution:
    r"""Answer a query: the stable root of the clamped residual nearest the start.

    Solves $r(z) = 0$ for the residual of
    [`retrax.relations.AbstractImplicitRelation.implicit_residual`][] with the
    guarded Newton method [`retrax.relations.GuardedNewton`][] through
    `optimistix.root_find`, so that derivatives of the answer with respect to
    the relation's parameters, `z0` and `rho` are given by the implicit function
    theorem (`optx.ImplicitAdjoint`): one transposed linear solve
    $J_{FF}^\top\mu = -\bar z_F$, never a pass back through the iterations.
    See [`retrax.relations.implicit_pullback`][] for the same numbers as
    explicit formulas.

    Derivatives through a solve that did not converge are never silent:
    with `throw=True` the solve itself raises; with `throw=False` every
    derivative of `z` is NaN. A converged but unstable root (the solver could
    not leave a saddle within `max_steps`) is reported by
    `result = RESULTS.unstable_root` and `stable = False`, never raised; its
    derivatives are those of that root.

    **Arguments:**

    - `relation`: the implicit field.
    - `z0`: the query values, shape `(n,)`: clamped inputs, soft targets and
      anchors, and the start of the free coordinates.
    - `rho`: the stiffnesses, shape `(n,)`: `inf` clamped, finite positive soft
      or anchor, 0 free.
    - `solver`: the root finder, a [`retrax.relations.GuardedNewton`][]
      configured as in optimistix (`root_find(fn, solver, y0, ...)`): its
      `rtol`/`atol` are the tolerance of
      $\max|r_F| \le \mathrm{tol}(1 + \max|z|)$, its `matrix_free` chooses
      Newton–Krylov steps (GMRES on Jacobian-vector products) and a Lanczos
      stability test instead of a dense Jacobian, for larger joint spaces.
      By default the one `tol` and `matrix_free` build.
    - `z_init`: a full-length start vector; its clamped entries are ignored.
      `z0` by default.
    - `tol`: shorthand for `solver=GuardedNewton(rtol=tol, atol=tol)`;
      `1e-9` in float64 and `1e-5` in float32 by default. Not together with
      `solver` (a `ValueError`).
    - `max_steps`: the most solver iterations.
    - `matrix_free`: shorthand for a matrix-free `solver`
      (`GuardedNewton(rtol=tol, atol=tol, matrix_free=True,
      linear_solver=lx.GMRES(...))`, GMRES at a hundredth of `tol`); the
      adjoint solve is then GMRES on vector-Jacobian products. Not together
      with `solver` (a `ValueError`).
    - `adjoint_solver`: the lineax solver of the adjoint (transposed) solve; LU
      on the dense Jacobian by default, GMRES when the solver is matrix-free.
    - `adjoint`: the same as optimistix takes it,
      `optx.ImplicitAdjoint(linear_solver=...)` (the only adjoint: answers are
      differentiated by the implicit function theorem); not together with
      `adjoint_solver` (a `ValueError`).
    - `symmetric`: whether the field is a gradient (a conservative relation:
      `EnergyNetwork` and `GaussianMixtureEps` models, and products and
      restrictions of those), so that the query's Jacobian is symmetric and
      the adjoint solve uses $J$ itself, tagged `lineax.symmetric_tag`, instead
      of its transpose. `None` (the default) detects it from
      `relation.conservative`. For a symmetric field a symmetric solver such as
      `lineax.Cholesky()` may be passed as `adjoint_solver` (stable roots only:
      the free block is then positive definite).
    - `off_data_tol`: `None` (the default): a relation calibrated by
      [`retrax.relations.calibrate_off_data`][] for the query's clamps flags
      the solution `off_data` when its `support_ratio` exceeds 1, and
      otherwise when its `clamp_load` exceeds 3. A float: flagged when
      `clamp_load` exceeds it, calibrated or not (see
      [`retrax.relations.ImplicitSolution`][]).
    - `throw`: whether a solve that did not converge, or a query that is not
      valid, raises.
    - `coupling`: `None`, or a symmetric `(n, n)` matrix $K$ of stiffness
      between non-clamped coordinates, added to the residual's free rows as
      $K(z - z_0)$ (see
      [`retrax.relations.AbstractImplicitRelation.implicit_residual`][]): the
      off-diagonal part of a full precision, as
      [`retrax.relations.Factor.query_coupled`][] builds it from an
      [`retrax.relations.Unobserved`][] channel with a precision matrix. Its
      rows and columns on clamped coordinates are ignored; derivatives with
      respect to it come by the implicit function theorem like the others.
    - `batch_chunk`: under `jax.vmap`, how many queries the solver's loop
      runs at once: the batch is solved `batch_chunk` queries at a time, one
      chunk after another, each chunk's loop ending with its own slowest
      query. `None` (the default) chooses 16 on CPU, where a whole batch's
      node evaluations outgrow the cache (1,024 queries of a K = 128 field
      run about 4x slower in one loop), and the whole batch in one loop on
      other platforms (as does any `batch_chunk` at least the batch size).
      Answers, steps, result codes and derivatives do not depend on it.
      Ignored for a query that is not vmapped.

    A query that is not valid (a non-finite `z0` or `z_init` entry where it
    is read, a NaN or negative `rho`, every coordinate clamped) raises with a
    message that names the check when `throw=True`; with `throw=False` it is
    that query's failure only: `result = RESULTS.invalid_query`, a NaN `z`,
    `residual` and `clamp_load`, NaN derivatives, and nothing solved. Under
    `jax.vmap` every other query of the batch is then answered as it would
    be without it. With `throw=True` a failed query in a `vmap` batch raises
    for the whole batch (equinox's run-time errors are raised once per
    program), with the failed check's message; a vmapped query does not know
    its index in the batch, so the message cannot name it: to find the
    failed queries, solve with `throw=False` and read
    `jnp.flatnonzero(sol.result != RESULTS.successful)`.

    **Returns:**

    An [`retrax.relations.ImplicitSolution`][].
    """
    return _infer(
        relation,
        z0,
        rho,
        z_init,
        solver,
        tol,
        max_steps,
        matrix_free,
        adjoint_linear_solver(adjoint, adjoint_solver),
        throw,
        symmetric,
        off_data_tol,
        coupling,
        batch_chunk,
    )


# Queries solved at once under vmap on CPU: 16 keeps a chunk's node
# evaluations of a K = 128 field in cache; more buys nothing measurable.
_CPU_CHUNK = 16


def adjoint_linear_solver(
    adjoint: optx.AbstractAdjoint | None,
    adjoint_solver: lx.AbstractLinearSolver | None,
) -> lx.AbstractLinearSolver | None:
    """The lineax solver of a query's adjoint solve, given as optimistix
    takes it (`adjoint=optx.ImplicitAdjoint(linear_solver=...)`) or as
    `adjoint_solver` (not both); `None` for the default."""
    if adjoint is None:
        return adjoint_solver
    if not isinstance(adjoint, optx.ImplicitAdjoint):
        raise TypeError(
            "`adjoint` must be an `optimistix.ImplicitAdjoint` (answers are "
            "differentiated by the implicit function theorem, never through "
            f"the iterations), got {type(adjoint).__name__}."
        )
    if adjoint_solver is not None:
        raise ValueError(
            "pass the adjoint's linear solver once: `adjoint=` or "
            "`adjoint_solver=`, not both."
        )
    return adjoint.linear_solver


def _adjoint(linear_solver, batch_chunk):
    if batch_chunk is None:
        if jax.default_backend() != "cpu":
            return optx.ImplicitAdjoint(linear_solver=linear_solver)
        batch_chunk = _CPU_CHUNK
    return BatchedImplicitAdjoint(linear_solver, batch_chunk)


def _infer(
    relation,
    z0,
    rho,
    z_init,
    solver,
    tol,
    max_steps,
    matrix_free,
    adjoint_solver,
    throw,
    symmetric=None,
    off_data_tol=None,
    coupling=None,
    batch_chunk=None,
):
    _check_solver(solver, tol, matrix_free)
    tol = check_tol(tol)
    check_positive_int("max_steps", max_steps)
    if batch_chunk is not None:
        check_positive_int("batch_chunk", batch_chunk)
    if off_data_tol is not None and (
        isinstance(off_data_tol, bool) or not isinstance(off_data_tol, int | float)
    ):
        raise TypeError(
            f"`off_data_tol` must be a float or None, got {off_data_tol!r}."
        )
    given = (z0, rho, z_init, coupling)
    z0, rho, z_init, coupling, bad = _screen_query(
        relation, z0, rho, z_init, throw, coupling
    )
    if symmetric is None:
        symmetric = relation.conservative
    elif symmetric and not relation.conservative:
        raise ValueError(
            f"`symmetric=True` needs a conservative relation, and "
            f"{type(relation).__name__} does not declare one (`conservative` is "
            "False): its Jacobian is not symmetric, and the adjoint solve would "
            "return wrong gradients. Leave `symmetric=None`."
        )
    dtype = z0.dtype
    solver = _query_solver(solver, tol, matrix_free, dtype)
    clamped = clamp_mask(rho)
    y0 = jnp.where(clamped, z0, z_init)
    if adjoint_solver is None:
        adjoint_solver = _krylov(solver.rtol, dtype) if solver.matrix_free else lx.LU()
    if symmetric:
        fn, tags = _symmetric_residual, frozenset({lx.symmetric_tag})
        if isinstance(adjoint_solver, lx.Cholesky):
            tags = tags | {lx.positive_semidefinite_tag}
    else:
        fn, tags = _query_residual, frozenset()
    sol = optx.root_find(
        fn,
        solver,
        y0,
        args=(relation, z0, rho, coupling),
        options={"fixed": clamped, "keep_last": True},
        max_steps=max_steps,
        adjoint=_adjoint(adjoint_solver, batch_chunk),
        throw=False,
        tags=tags,
    )
    state = sol.state
    converged = state.converged & ~bad
    stable = state.stable & ~bad
    result = RESULTS.where(
        sol.result == optx.RESULTS.successful,
        RESULTS.successful,
        RESULTS.where(
            converged & ~stable, RESULTS.unstable_root, RESULTS.promote(sol.result)
        ),
    )
    result = RESULTS.where(bad, RESULTS.invalid_query, result)
    value = jnp.where(bad, jnp.asarray(jnp.nan, dtype), sol.value)
    z = never_silent(value, (relation, z0, rho, coupling), converged)
    if not throw:
        # the replaced inputs carry no derivative: NaN from the given ones
        z = nan_derivatives_unless(z, given, ~bad)
    # Recomputed from the answer rather than read off the solver's state (whose
    # tangent is zero): a function of `z`, `z0`, `rho` and the relation, so its
    # derivatives are those of the residual at the answer.
    residual = relation.implicit_residual(z, z0, rho, coupling)
    residual = jnp.where(clamped, jnp.zeros((), dtype), residual)
    # What the hard clamps hold against, in noise standard deviations.
    load = jnp.abs(relation.prior_field(jax.lax.stop_gradient(z)))
    unit = relation.field_unit(dtype)
    load = jnp.where(clamped & (unit != 0), load / jnp.where(unit != 0, unit, 1), 0)
    clamp_load = jnp.where(bad, jnp.asarray(jnp.nan, dtype), jnp.max(load))
    nan = jnp.asarray(jnp.nan, dtype)
    ratio = relation.support_ratio(jax.lax.stop_gradient(z0), clamped)
    ratio = jnp.where(bad, nan, ratio)
    if off_data_tol is None:
        off_data = jnp.where(
            jnp.isnan(ratio), clamp_load > _UNCALIBRATED_TOL, ratio > 1
        )
    else:
        off_data = clamp_load > off_data_tol
    steps = jnp.asarray(sol.stats["num_steps"])
    out = ImplicitSolution(
        value=z,
        residual=residual,
        converged=converged,
        stable=stable,
        result=result,
        clamp_load=clamp_load,
        off_data=off_data,
        support_ratio=ratio,
        stats={"num_steps": steps},
    )
    failed = (result != RESULTS.successful) & (result != RESULTS.unstable_root)
    return throw_if_failed(out, throw, failed)


class ImplicitPullback(AbstractSolution):
    """The cotangents of a query's inputs, from
    [`retrax.relations.implicit_pullback`][].

    Its answer, `value`, is the tuple `(model_bar, z0_bar, rho_bar)`, and it
    unpacks as that tuple, the form `implicit_pullback` returned before it
    returned this object.

    **Attributes:**

    - `model_bar`: a pytree shaped like the relation with the cotangent at every
      floating-point leaf (`None` elsewhere).
    - `z0_bar`, `rho_bar`: the cotangents of `z0` and `rho`, shape `(n,)`.
    - `result`: a [`retrax.relations.RESULTS`][] code: `successful` when the
      cotangents are numbers; the query's own `sol.result` when it did not
      converge; lineax's failure (`singular`) when the adjoint solve failed.
      The cotangents are NaN whenever it is not `successful`.
    - `stats`: `{"num_steps": 0}`: one LU solve, no iterations (see
      [`retrax.diffusion.AbstractSolution`][]).
    """

    model_bar: PyTree
    z0_bar: Float[Array, " n"]
    rho_bar: Float[Array, " n"]
    result: RESULTS
    stats: dict[str, Array]

    @property
    def value(self) -> tuple[PyTree, Float[Array, " n"], Float[Array, " n"]]:
        """The answer: `(model_bar, z0_bar, rho_bar)`."""
        return self.model_bar, self.z0_bar, self.rho_bar

    def __iter__(self):
        return iter(self.value)


@renamed_argument("model", "relation")
def implicit_pullback(
    relation: AbstractImplicitRelation,
    sol: ImplicitSolution,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    zbar: Float[ArrayLike, " n"],
    *,
    throw: bool = True,
) -> ImplicitPullback:
    r"""The cotangents of a query's inputs, by the adjoint formulas.

    With $J_{FF} = \partial g/\partial z_{FF} + \mathrm{diag}(\rho_F^2)$ at the
    answer $z^*$ and the adjoint vector $\mu$ solving the *transposed* system
    $J_{FF}^\top\mu = -\bar z_F$ (the learned field is not a gradient, so $J$
    is not symmetric):

    - relation parameters: $\sum_k w_k\lambda_k(\partial\hat\epsilon_k/
      \partial\theta)^\top\mu$ (one VJP of the vmapped field);
    - clamped inputs: $\bar z_C + J_{FC}^\top\mu$;
    - soft targets and anchors: $-\rho_F^2\mu$;
    - stiffnesses: $2\rho_F(z^*_F - z_{0,F})\mu$, and 0 for clamped ones.

    These are the numbers `jax.grad` through
    [`retrax.relations.implicit_infer`][] returns. NaN when the solve did not
    converge. The adjoint solve is a lineax LU solve whose result is
    checked: a singular $J_{FF}$ (no unique adjoint, e.g. a flat field with
    free coordinates) raises with lineax's message when `throw=True`, and
    gives NaN cotangents when `throw=False`; the returned `result` says
    which of the two made them NaN.

    **Arguments:**

    - `relation`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `z0`, `rho`: the query, solved without a `coupling` matrix (for a
      coupled query, differentiate `implicit_infer` with `jax.grad`).
    - `zbar`: the cotangent of the answer `sol.value`, shape `(n,)`.
    - `throw`: whether a singular Jacobian raises (otherwise NaN).

    **Returns:**

    A [`retrax.relations.ImplicitPullback`][]: `model_bar` (a pytree shaped
    like `relation` with the cotangent at every floating-point leaf, `None`
    elsewhere), `z0_bar` and `rho_bar` (two `(n,)` vectors), `result` and
    `stats`. It unpacks as `model_bar, z0_bar, rho_bar = ...`.
    """
    return _pullback(relation, sol, z0, rho, zbar, throw)


@filter_jit
def _pullback(relation, sol, z0, rho, zbar, throw):
    z0, rho, _ = _check_query(relation, z0, rho, None)
    dtype = z0.dtype
    z = jax.lax.stop_gradient(sol.value).astype(dtype)
    zbar = relation.check_point("zbar", zbar).astype(dtype)
    clamped = clamp_mask(rho)
    jac = jax.jacfwd(lambda y: relation.implicit_residual(y, z0, rho))(z)
    adjoint = lx.linear_solve(
        lx.MatrixLinearOperator(jac.T), -zbar, lx.LU(), throw=False
    )
    if throw:
        mu = adjoint.result.error_if(
            adjoint.value, adjoint.result != lx.RESULTS.successful
        )
    else:
        mu = adjoint.value
    solved = adjoint.result == lx.RESULTS.successful
    mu = jnp.where(clamped, jnp.zeros((), dtype), mu)
    _, vjp = eqx.filter_vjp(lambda m: m.prior_field(z), relation)
    (model_bar,) = vjp(mu)
    rho_sq = soft_stiffness(rho)
    safe_rho = jnp.where(clamped, jnp.zeros((), dtype), rho)
    z0_bar = jnp.where(clamped, zbar + jac.T @ mu, -rho_sq * mu)
    rho_bar = jnp.where(clamped, jnp.zeros((), dtype), 2 * safe_rho * (z - z0) * mu)
    good = sol.converged & solved
    model_bar, z0_bar, rho_bar = nan_unless(good, (model_bar, z0_bar, rho_bar))
    result = RESULTS.where(
        sol.converged,
        RESULTS.where(solved, RESULTS.successful, RESULTS.promote(adjoint.result)),
        sol.result,
    )
    stats = {"num_steps": jnp.zeros((), jnp.int32)}
    return ImplicitPullback(model_bar, z0_bar, rho_bar, result, stats)
