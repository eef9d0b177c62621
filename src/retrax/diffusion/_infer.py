"""Implicit inference: answer a query as a stable root of the field, and
differentiate the answer by the implicit function theorem."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float, Int, PRNGKeyArray, PyTree

from .._errors import error_if
from .._misc import check_positive_int, static_float
from ._field import AbstractImplicitRelation, clamp_mask, soft_stiffness
from ._never_silent import never_silent
from ._predictor import as_state
from ._solution import RESULTS, ImplicitSolution
from ._solver import GuardedNewton


def _query_residual(y, args):
    model, z0, rho = args
    return model.implicit_residual(y, z0, rho)


def _symmetric_residual(y, args):
    # The field is read at the clamped values z0_C rather than at y_C: equal at
    # every iterate (the solver never moves clamped coordinates off z0_C), but
    # the Jacobian is then blockdiag(I, J_FF), symmetric when the field is a
    # gradient, and the clamped inputs' cotangent J_FC^T mu flows through z0.
    model, z0, rho = args
    clamped = clamp_mask(rho)
    diff = y - z0
    free_rows = (
        model.prior_field(jnp.where(clamped, z0, y)) + soft_stiffness(rho) * diff
    )
    return jnp.where(clamped, diff, free_rows)


def default_tol(dtype) -> float:
    """`1e-9` in float64 and `1e-5` in float32 (and lower precisions)."""
    return 1e-9 if jnp.finfo(dtype).bits >= 64 else 1e-5


def _check_query(model, z0, rho, z_init):
    if not isinstance(model, AbstractImplicitRelation):
        raise TypeError(
            "`model` must be a relation (an AbstractImplicitRelation such as "
            f"ImplicitDiffusion or ProductRelation), got {type(model).__name__}."
        )
    z0 = model.check_point("z0", z0)
    dtype = z0.dtype
    rho = model.check_point("rho", rho).astype(dtype)
    z_init = z0 if z_init is None else model.check_point("z_init", z_init)
    z_init = z_init.astype(dtype)
    rho = error_if(
        rho,
        jnp.any(jnp.isnan(rho) | (rho < 0)),
        "`rho` must be nonnegative stiffnesses (0 free, inf clamped); it holds "
        "a NaN or a negative value.",
    )
    rho = error_if(
        rho,
        jnp.all(clamp_mask(rho)),
        "every coordinate is clamped (`rho = inf` everywhere): nothing to infer. "
        "Leave at least one coordinate free (`rho = 0`) or soft (finite `rho`).",
    )
    z0 = error_if(
        z0, jnp.any(~jnp.isfinite(z0)), "`z0` must be finite (it holds inf or NaN)."
    )
    z_init = error_if(
        z_init,
        jnp.any(~jnp.isfinite(z_init) & ~clamp_mask(rho)),
        "`z_init` must be finite on the coordinates that are not clamped.",
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


@eqx.filter_jit
def implicit_infer(
    model: AbstractImplicitRelation,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    *,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 200,
    matrix_free: bool = False,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    symmetric: bool | None = None,
    off_data_tol: float = 3.0,
    throw: bool = True,
) -> ImplicitSolution:
    r"""Answer a query: the stable root of the clamped residual nearest the start.

    Solves $r(z) = 0$ for the residual of
    [`retrax.diffusion.AbstractImplicitRelation.implicit_residual`][] with the
    guarded Newton method [`retrax.diffusion.GuardedNewton`][] through
    `optimistix.root_find`, so that derivatives of the answer with respect to
    the model's parameters, `z0` and `rho` are given by the implicit function
    theorem (`optx.ImplicitAdjoint`): one transposed linear solve
    $J_{FF}^\top\mu = -\bar z_F$, never a pass back through the iterations.
    See [`retrax.diffusion.implicit_pullback`][] for the same numbers as
    explicit formulas.

    Derivatives through a solve that did not converge are never silent:
    with `throw=True` the solve itself raises; with `throw=False` every
    derivative of `z` is NaN. A converged but unstable root (the solver could
    not leave a saddle within `max_steps`) is reported by
    `result = RESULTS.unstable_root` and `stable = False`, never raised; its
    derivatives are those of that root.

    **Arguments:**

    - `model`: the implicit field.
    - `z0`: the query values, shape `(n,)`: clamped inputs, soft targets and
      anchors, and the start of the free coordinates.
    - `rho`: the stiffnesses, shape `(n,)`: `inf` clamped, finite positive soft
      or anchor, 0 free.
    - `z_init`: a full-length start vector; its clamped entries are ignored.
      `z0` by default.
    - `tol`: the tolerance of $\max|r_F| \le \mathrm{tol}(1 + \max|z|)$;
      `1e-9` in float64 and `1e-5` in float32 by default.
    - `max_steps`: the most solver iterations.
    - `matrix_free`: Newton–Krylov steps (GMRES on Jacobian-vector products) and
      a Lanczos stability test instead of a dense Jacobian, for larger joint
      spaces; the adjoint solve is then GMRES on vector-Jacobian products.
    - `adjoint_solver`: the lineax solver of the adjoint (transposed) solve; LU
      on the dense Jacobian by default, GMRES when `matrix_free`.
    - `symmetric`: whether the field is a gradient (a conservative relation:
      `EnergyNetwork` and `GaussianMixtureEps` models, and products and
      restrictions of those), so that the query's Jacobian is symmetric and
      the adjoint solve uses $J$ itself, tagged `lineax.symmetric_tag`, instead
      of its transpose. `None` (the default) detects it from
      `model.conservative`. For a symmetric field a symmetric solver such as
      `lineax.Cholesky()` may be passed as `adjoint_solver` (stable roots only:
      the free block is then positive definite).
    - `off_data_tol`: the `clamp_load` beyond which the solution is flagged
      `off_data` (see [`retrax.diffusion.ImplicitSolution`][]).
    - `throw`: whether a solve that did not converge raises.

    **Returns:**

    An [`retrax.diffusion.ImplicitSolution`][].
    """
    return _infer(
        model,
        z0,
        rho,
        z_init,
        tol,
        max_steps,
        matrix_free,
        adjoint_solver,
        throw,
        symmetric,
        off_data_tol,
    )


def _infer(
    model,
    z0,
    rho,
    z_init,
    tol,
    max_steps,
    matrix_free,
    adjoint_solver,
    throw,
    symmetric=None,
    off_data_tol=3.0,
):
    z0, rho, z_init = _check_query(model, z0, rho, z_init)
    if symmetric is None:
        symmetric = model.conservative
    elif symmetric and not model.conservative:
        raise ValueError(
            f"`symmetric=True` needs a conservative relation, and "
            f"{type(model).__name__} does not declare one (`conservative` is "
            "False): its Jacobian is not symmetric, and the adjoint solve would "
            "return wrong gradients. Leave `symmetric=None`."
        )
    dtype = z0.dtype
    tol = default_tol(dtype) if tol is None else static_float("tol", tol)
    clamped = clamp_mask(rho)
    y0 = jnp.where(clamped, z0, z_init)
    if adjoint_solver is None:
        adjoint_solver = _krylov(tol, dtype) if matrix_free else lx.LU()
    if symmetric:
        fn, tags = _symmetric_residual, frozenset({lx.symmetric_tag})
        if isinstance(adjoint_solver, lx.Cholesky):
            tags = tags | {lx.positive_semidefinite_tag}
    else:
        fn, tags = _query_residual, frozenset()
    sol = optx.root_find(
        fn,
        _solver(tol, matrix_free, dtype),
        y0,
        args=(model, z0, rho),
        options={"fixed": clamped, "keep_last": True},
        max_steps=max_steps,
        adjoint=optx.ImplicitAdjoint(linear_solver=adjoint_solver),
        throw=False,
        tags=tags,
    )
    state = sol.state
    converged = state.converged
    stable = state.stable
    result = RESULTS.where(
        sol.result == optx.RESULTS.successful,
        RESULTS.successful,
        RESULTS.where(
            converged & ~stable, RESULTS.unstable_root, RESULTS.promote(sol.result)
        ),
    )
    z = never_silent(sol.value, (model, z0, rho), converged)
    # Recomputed from the answer rather than read off the solver's state (whose
    # tangent is zero): a function of `z`, `z0`, `rho` and the model, so its
    # derivatives are those of the residual at the answer.
    residual = model.implicit_residual(z, z0, rho)
    residual = jnp.where(clamped, jnp.zeros((), dtype), residual)
    # What the hard clamps hold against, in noise standard deviations.
    load = jnp.abs(model.prior_field(jax.lax.stop_gradient(z)))
    unit = model.field_unit(dtype)
    load = jnp.where(clamped & (unit != 0), load / jnp.where(unit != 0, unit, 1), 0)
    clamp_load = jnp.max(load)
    out = ImplicitSolution(
        z=z,
        residual=residual,
        steps=jnp.asarray(sol.stats["num_steps"]),
        converged=converged,
        stable=stable,
        result=result,
        clamp_load=clamp_load,
        off_data=clamp_load > off_data_tol,
    )
    if throw:
        failed = (result != RESULTS.successful) & (result != RESULTS.unstable_root)
        out = result.error_if(out, failed)
    return out


@eqx.filter_jit
def implicit_pullback(
    model: AbstractImplicitRelation,
    sol: ImplicitSolution,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    zbar: Float[ArrayLike, " n"],
    *,
    throw: bool = True,
    return_result: bool = False,
) -> (
    tuple[PyTree, Float[Array, " n"], Float[Array, " n"]]
    | tuple[PyTree, Float[Array, " n"], Float[Array, " n"], RESULTS]
):
    r"""The cotangents of a query's inputs, by the adjoint formulas.

    With $J_{FF} = \partial g/\partial z_{FF} + \mathrm{diag}(\rho_F^2)$ at the
    answer $z^*$ and the adjoint vector $\mu$ solving the *transposed* system
    $J_{FF}^\top\mu = -\bar z_F$ (the learned field is not a gradient, so $J$
    is not symmetric):

    - model parameters: $\sum_k w_k\lambda_k(\partial\hat\epsilon_k/
      \partial\theta)^\top\mu$ (one VJP of the vmapped field);
    - clamped inputs: $\bar z_C + J_{FC}^\top\mu$;
    - soft targets and anchors: $-\rho_F^2\mu$;
    - stiffnesses: $2\rho_F(z^*_F - z_{0,F})\mu$, and 0 for clamped ones.

    These are the numbers `jax.grad` through
    [`retrax.diffusion.implicit_infer`][] returns. NaN when the solve did not
    converge. The adjoint solve is a lineax LU solve whose result is
    checked: a singular $J_{FF}$ (no unique adjoint, e.g. a flat field with
    free coordinates) raises with lineax's message when `throw=True`, and
    gives NaN cotangents when `throw=False`; `return_result=True` says which
    of the two made them NaN.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `z0`, `rho`: the query.
    - `zbar`: the cotangent of the answer `sol.z`, shape `(n,)`.
    - `throw`: whether a singular Jacobian raises (otherwise NaN).
    - `return_result`: also return a [`retrax.diffusion.RESULTS`][] code.

    **Returns:**

    A tuple `(model_bar, z0_bar, rho_bar)`: a pytree shaped like `model` with
    the cotangent at every floating-point leaf (`None` elsewhere), and two
    `(n,)` vectors. With `return_result=True`, a fourth entry: `successful`
    when the cotangents are numbers; `sol.result` when the query did not
    converge; lineax's failure (`singular`) when the adjoint solve failed.
    """
    z0, rho, _ = _check_query(model, z0, rho, None)
    dtype = z0.dtype
    z = jax.lax.stop_gradient(sol.z).astype(dtype)
    zbar = model.check_point("zbar", zbar).astype(dtype)
    clamped = clamp_mask(rho)
    jac = jax.jacfwd(lambda y: model.implicit_residual(y, z0, rho))(z)
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
    _, vjp = eqx.filter_vjp(lambda m: m.prior_field(z), model)
    (model_bar,) = vjp(mu)
    rho_sq = soft_stiffness(rho)
    safe_rho = jnp.where(clamped, jnp.zeros((), dtype), rho)
    z0_bar = jnp.where(clamped, zbar + jac.T @ mu, -rho_sq * mu)
    rho_bar = jnp.where(clamped, jnp.zeros((), dtype), 2 * safe_rho * (z - z0) * mu)
    good = sol.converged & solved
    scale = jnp.where(good, jnp.ones((), dtype), jnp.array(jnp.nan, dtype))
    model_bar = jax.tree.map(lambda x: x * scale.astype(x.dtype), model_bar)
    if not return_result:
        return model_bar, z0_bar * scale, rho_bar * scale
    result = RESULTS.where(
        sol.converged,
        RESULTS.where(solved, RESULTS.successful, RESULTS.promote(adjoint.result)),
        sol.result,
    )
    return model_bar, z0_bar * scale, rho_bar * scale, result


class ImplicitRoots(eqx.Module):
    """The distinct stable answers of a query, from several starts.

    Fixed size (one slot per start), so it is produced under `jit`: the
    `count` valid, distinct answers come first, in order of first discovery.

    **Attributes:**

    - `z`: the answers, shape `(slots, n)`; invalid slots hold the
      duplicate or failed solves.
    - `valid`: which slots hold a distinct, converged and stable answer.
    - `count`: the number of valid slots.
    - `converged`, `stable`, `steps`, `result`, `clamp_load`, `off_data`: per
      slot, as in [`retrax.diffusion.ImplicitSolution`][].
    """

    z: Float[Array, "starts n"]
    valid: Bool[Array, " starts"]
    count: Int[Array, ""]
    converged: Bool[Array, " starts"]
    stable: Bool[Array, " starts"]
    steps: Int[Array, " starts"]
    result: RESULTS
    clamp_load: Float[Array, " starts"]
    off_data: Bool[Array, " starts"]


@eqx.filter_jit
def implicit_roots(
    model: AbstractImplicitRelation,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    key: PRNGKeyArray | None = None,
    n_starts: int = 16,
    spread: float = 1.0,
    unique_tol: float = 1e-3,
    *,
    starts: Float[ArrayLike, "..."] | None = None,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 200,
    matrix_free: bool = False,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    symmetric: bool | None = None,
    off_data_tol: float = 3.0,
    throw: bool = True,
) -> ImplicitRoots:
    r"""All the stable answers of a query that several starts reach.

    The first start is always the query's own: `z_init`, or `z0` (the start
    [`retrax.diffusion.implicit_infer`][] would use), so the answer
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

    - `model`: the implicit field.
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
    - `tol`, `max_steps`, `matrix_free`, `adjoint_solver`, `symmetric`,
      `off_data_tol`: as in `implicit_infer`, for every start.
    - `throw`: whether a slot whose solve did not converge raises.

    **Returns:**

    An [`retrax.diffusion.ImplicitRoots`][].
    """
    z0, rho, own = _check_query(model, z0, rho, z_init)
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
            model,
            q,
            r,
            start,
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
    z = sols.z
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
    out = ImplicitRoots(
        z=z[order],
        valid=keep[order],
        count=jnp.sum(keep),
        converged=sols.converged[order],
        stable=sols.stable[order],
        steps=sols.steps[order],
        result=jax.tree.map(lambda x: x[order], sols.result),
        clamp_load=sols.clamp_load[order],
        off_data=sols.off_data[order],
    )
    if throw:
        result = sols.result
        failed = (result != RESULTS.successful) & (result != RESULTS.unstable_root)
        first = jax.tree.map(lambda x: x[jnp.argmax(failed)], result)
        out = first.error_if(out, jnp.any(failed))
    return out


def _effective_lambda(model: AbstractImplicitRelation, dtype) -> Array:
    """`lam * sum_k w_k sigma_k^2 / alpha_k^2`: the field scale vs -grad log p."""
    return model.effective_lambda(dtype)


def implicit_laplace(
    model: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
) -> Float[Array, "n n"]:
    r"""The Laplace covariance of a query's answer.

    The field approximates $\lambda_{\mathrm{eff}}(-\nabla\log p)$ with
    $\lambda_{\mathrm{eff}} = \lambda\sum_k w_k\sigma_k^2/\alpha_k^2$ (1 when
    the model was built with `lam = density_lambda(schedule, nodes)`), so
    near a stable answer $-\nabla^2\log p \approx
    \mathrm{sym}(J_{FF})/\lambda_{\mathrm{eff}}$ and the covariance of the
    free coordinates is $\lambda_{\mathrm{eff}}\,\mathrm{sym}(J_{FF})^{-1}$,
    where $J_{FF}$ includes the soft inputs' $\rho_F^2$ (their evidence).
    Clamped coordinates are known exactly: their rows and columns are 0.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.

    **Returns:**

    The `(n, n)` covariance; NaN unless `sol` is converged and stable.
    """
    z = sol.z
    dtype = z.dtype
    rho = model.check_point("rho", rho).astype(dtype)
    clamped = clamp_mask(rho)
    jac = model.prior_jacobian(z) + jnp.diag(soft_stiffness(rho))
    sym = 0.5 * (jac + jac.T)
    both = ~clamped[:, None] & ~clamped[None, :]
    mat = jnp.where(both, sym, 0) + jnp.diag(clamped.astype(dtype))
    cov = jnp.linalg.inv(mat) * _effective_lambda(model, dtype)
    cov = jnp.where(both, cov, 0)
    good = sol.converged & sol.stable
    return jnp.where(good, cov, jnp.array(jnp.nan, dtype))


class LaplaceBelief(eqx.Module):
    """A Gaussian belief about a query's answer.

    **Attributes:**

    - `mean`: the answer $z^*$, shape `(n,)`.
    - `cov`: its covariance, shape `(n, n)`, zero on clamped coordinates.
    - `free`: the coordinates that are not clamped.
    """

    mean: Float[Array, " n"]
    cov: Float[Array, "n n"]
    free: Bool[Array, " n"]


def laplace_belief(
    model: AbstractImplicitRelation,
    sol: ImplicitSolution,
    rho: Float[ArrayLike, " n"],
) -> LaplaceBelief:
    """Package an answer and its [`retrax.diffusion.implicit_laplace`][] covariance.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `rho`: the query's stiffnesses.

    **Returns:**

    A [`retrax.diffusion.LaplaceBelief`][].
    """
    rho = model.check_point("rho", rho).astype(sol.z.dtype)
    return LaplaceBelief(
        mean=sol.z, cov=implicit_laplace(model, sol, rho), free=~clamp_mask(rho)
    )


def has_energy(model: AbstractImplicitRelation) -> bool:
    """Whether [`retrax.diffusion.implicit_energy`][] is defined for `model`."""
    return model.conservative


def implicit_energy(
    model: AbstractImplicitRelation,
    z: Float[ArrayLike, " n"],
    z0: Float[ArrayLike, " n"] | None = None,
    rho: Float[ArrayLike, " n"] | None = None,
) -> Float[Array, ""]:
    r"""The potential $U$ of a conservative field: $\nabla U = g$.

    For a predictor with a log-density (a Gaussian mixture, where
    $\hat\epsilon = -\sigma_t\nabla_x\log p_t$) or an energy
    ([`retrax.diffusion.EnergyNetwork`][], $\hat\epsilon = \sigma_t\nabla_x
    E$), with $x_k = \alpha_k z + \sigma_k e_k$:

    $U(z) = \sum_k w_k\lambda_k(\sigma_k/\alpha_k)\,E_k(x_k) -
    (\sum_k w_k\lambda_k e_k)^\top z$, with $E_k = -\log p_{t_k}$ or the
    network's energy. Given a query (`z0`, `rho`), the soft terms
    $\tfrac12\sum_F\rho_i^2(z_i - z_{0,i})^2$ are added, so that the query's
    residual is the gradient of $U$ on the free coordinates.

    **Arguments:**

    - `model`: the implicit field; its predictor must be a
      `GaussianMixtureEps` or an `EnergyNetwork`.
    - `z`: the point, shape `(n,)`.
    - `z0`, `rho`: an optional query.

    **Returns:**

    The scalar potential (up to a constant).
    """
    if not has_energy(model):
        raise TypeError(
            "implicit_energy needs a conservative relation with a known potential "
            "(a GaussianMixtureEps or EnergyNetwork predictor, or products and "
            f"restrictions of those), got {type(model).__name__}"
            + (f" of {type(model.pred).__name__}" if hasattr(model, "pred") else "")
            + "."
        )
    z = model.check_point("z", z)
    dtype = z.dtype
    u = model.energy(z)
    if (z0 is None) != (rho is None):
        raise ValueError("give both `z0` and `rho` for a query's energy, or neither.")
    if z0 is not None:
        z0 = model.check_point("z0", z0).astype(dtype)
        rho = model.check_point("rho", rho).astype(dtype)
        diff = jnp.where(clamp_mask(rho), jnp.zeros((), dtype), z - z0)
        u = u + 0.5 * jnp.sum(soft_stiffness(rho) * diff**2)
    return u


class MixtureBelief(eqx.Module):
    """A Gaussian-mixture belief about a query's answer.

    **Attributes:**

    - `weights`: the normalised component weights, shape `(m,)` (0 for
      invalid slots).
    - `means`: the component means, shape `(m, n)`.
    - `covs`: the component covariances, shape `(m, n, n)`.
    """

    weights: Float[Array, " m"]
    means: Float[Array, "m n"]
    covs: Float[Array, "m n n"]


def implicit_mixture(
    model: AbstractImplicitRelation,
    roots: ImplicitRoots,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
) -> MixtureBelief:
    r"""Combine the stable answers of a query into a Gaussian mixture.

    Each valid root $z_k$ gets its Laplace covariance $\Sigma_k$
    ([`retrax.diffusion.implicit_laplace`][]) and the weight
    $\propto \exp(-U(z_k)/\lambda_{\mathrm{eff}})\det(\Sigma_k)^{1/2}$ (the
    Laplace approximation of the probability mass of its basin), with $U$ from
    [`retrax.diffusion.implicit_energy`][] including the query's soft terms.
    For fields without a known potential the valid roots get equal weights.

    **Arguments:**

    - `model`: the implicit field.
    - `roots`: the query's answers from [`retrax.diffusion.implicit_roots`][].
    - `z0`, `rho`: the query.

    **Returns:**

    A [`retrax.diffusion.MixtureBelief`][] over the `n_starts` slots.
    """
    dtype = roots.z.dtype
    z0 = model.check_point("z0", z0).astype(dtype)
    rho = model.check_point("rho", rho).astype(dtype)
    free = ~clamp_mask(rho)

    def component(z, conv, stable):
        sol = ImplicitSolution(
            z=z,
            residual=jnp.zeros_like(z),
            steps=jnp.array(0),
            converged=conv,
            stable=stable,
            result=RESULTS.successful,
            clamp_load=jnp.zeros((), z.dtype),
            off_data=jnp.zeros((), bool),
        )
        return implicit_laplace(model, sol, rho)

    valid = roots.valid
    covs = jax.vmap(component)(roots.z, valid, valid)
    if has_energy(model):
        lam_eff = _effective_lambda(model, dtype)
        u = jax.vmap(lambda z: implicit_energy(model, z, z0, rho))(roots.z) / lam_eff
        eye = jnp.eye(z0.shape[0], dtype=dtype)
        mat = jnp.where(free[:, None] & free[None, :], covs, eye)
        _, logdet = jnp.linalg.slogdet(jnp.where(valid[:, None, None], mat, eye))
        logw = -u + 0.5 * logdet
    else:
        logw = jnp.zeros(valid.shape, dtype)
    logw = jnp.where(valid, logw, -jnp.inf)
    weights = jax.nn.softmax(logw)
    weights = jnp.where(valid, weights, jnp.zeros((), dtype))
    return MixtureBelief(weights=weights, means=roots.z, covs=covs)


def roots_by_energy(
    model: AbstractImplicitRelation,
    roots: ImplicitRoots,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
) -> tuple[ImplicitRoots, Float[Array, " starts"]]:
    r"""Order the answers of a query by energy, the most probable first.

    For a conservative relation (see
    [`retrax.diffusion.implicit_energy`][]) the valid answers of
    [`retrax.diffusion.implicit_roots`][] are sorted by the query's potential
    $U(z) + \tfrac12\sum_F\rho_i^2(z_i - z_{0,i})^2$, lowest first (the
    deepest mode of the learned density given the query); invalid slots
    follow. Jittable; derivatives pass through the reordered answers.

    **Arguments:**

    - `model`: the conservative relation the query was solved with.
    - `roots`: the query's answers.
    - `z0`, `rho`: the query.

    **Returns:**

    A tuple `(roots, energy)`: the reordered
    [`retrax.diffusion.ImplicitRoots`][] and each slot's energy
    (`inf` for invalid slots).
    """
    dtype = roots.z.dtype
    z0 = model.check_point("z0", z0).astype(dtype)
    rho = model.check_point("rho", rho).astype(dtype)
    energy = jax.vmap(lambda z: implicit_energy(model, z, z0, rho))(
        jax.lax.stop_gradient(roots.z)
    )
    energy = jnp.where(roots.valid, energy, jnp.array(jnp.inf, dtype))
    order = jnp.argsort(energy, stable=True)
    ordered = jax.tree.map(
        lambda x: x[order] if eqx.is_array(x) and x.ndim >= 1 else x, roots
    )
    return ordered, energy[order]
