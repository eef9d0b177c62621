"""Implicit inference: answer a query as a stable root of the field, and
differentiate the answer by the implicit function theorem."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
from jaxtyping import Array, ArrayLike, Float, PyTree

from ._field import ImplicitDiffusion, clamp_mask, soft_stiffness
from ._solution import RESULTS, ImplicitSolution
from ._solver import GuardedNewton


def _query_residual(y, args):
    model, z0, rho = args
    return model.implicit_residual(y, z0, rho)


@jax.custom_jvp
def _gate(z, scale):
    return z


@_gate.defjvp
def _gate_jvp(primals, tangents):
    z, scale = primals
    tz, _ = tangents
    return z, tz * jax.lax.stop_gradient(scale)


@jax.custom_jvp
def _poison(leaves, scale, like):
    return jnp.zeros_like(like)


@_poison.defjvp
def _poison_jvp(primals, tangents):
    leaves, scale, like = primals
    t_leaves, _, _ = tangents
    total = sum(
        jnp.sum(t.astype(like.dtype))
        for t in jax.tree.leaves(t_leaves)
        if jnp.issubdtype(t.dtype, jnp.inexact)
    )
    out = jnp.zeros_like(like)
    return out, out + jax.lax.stop_gradient(scale) * total


def _never_silent(z, inputs, converged):
    """`z`, whose derivatives are NaN when the solve did not converge.

    Linear in the tangents, so reverse mode transposes it. The cotangent fed to
    the implicit (adjoint) linear solve is zeroed rather than NaN'ed (lineax
    rejects non-finite right-hand sides), and NaN reaches every input through a
    separate path instead.
    """
    dtype = z.dtype
    one = jnp.where(converged, jnp.ones((), dtype), jnp.zeros((), dtype))
    nan = jnp.where(converged, jnp.zeros((), dtype), jnp.array(jnp.nan, dtype))
    leaves = [x for x in jax.tree.leaves(inputs) if eqx.is_inexact_array(x)]
    return _gate(z, one) + _poison(leaves, nan, z)


def default_tol(dtype) -> float:
    """`1e-9` in float64 and `1e-5` in float32 (and lower precisions)."""
    return 1e-9 if jnp.finfo(dtype).bits >= 64 else 1e-5


def _check_query(model, z0, rho, z_init):
    if not isinstance(model, ImplicitDiffusion):
        raise TypeError(
            f"`model` must be an ImplicitDiffusion, got {type(model).__name__}."
        )
    z0 = model.check_point("z0", z0)
    dtype = z0.dtype
    rho = model.check_point("rho", rho).astype(dtype)
    z_init = z0 if z_init is None else model.check_point("z_init", z_init)
    z_init = z_init.astype(dtype)
    rho = eqx.error_if(
        rho,
        jnp.any(jnp.isnan(rho) | (rho < 0)),
        "`rho` must be nonnegative stiffnesses (0 free, inf clamped); it holds "
        "a NaN or a negative value.",
    )
    rho = eqx.error_if(
        rho,
        jnp.all(clamp_mask(rho)),
        "every coordinate is clamped (`rho = inf` everywhere): nothing to infer. "
        "Leave at least one coordinate free (`rho = 0`) or soft (finite `rho`).",
    )
    z0 = eqx.error_if(
        z0, jnp.any(~jnp.isfinite(z0)), "`z0` must be finite (it holds inf or NaN)."
    )
    z_init = eqx.error_if(
        z_init,
        jnp.any(~jnp.isfinite(z_init) & ~clamp_mask(rho)),
        "`z_init` must be finite on the coordinates that are not clamped.",
    )
    return z0, rho, z_init


def _solver(tol: float, matrix_free: bool) -> GuardedNewton:
    if matrix_free:
        return GuardedNewton(
            rtol=tol,
            atol=tol,
            matrix_free=True,
            linear_solver=lx.GMRES(rtol=0.01 * tol, atol=0.01 * tol, restart=40),
        )
    return GuardedNewton(rtol=tol, atol=tol)


@eqx.filter_jit
def implicit_infer(
    model: ImplicitDiffusion,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    *,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 200,
    matrix_free: bool = False,
    adjoint_solver: lx.AbstractLinearSolver | None = None,
    throw: bool = True,
) -> ImplicitSolution:
    r"""Answer a query: the stable root of the clamped residual nearest the start.

    Solves $r(z) = 0$ for the residual of
    [`retrax.diffusion.ImplicitDiffusion.implicit_residual`][] with the
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
    - `throw`: whether a solve that did not converge raises.

    **Returns:**

    An [`retrax.diffusion.ImplicitSolution`][].
    """
    z0, rho, z_init = _check_query(model, z0, rho, z_init)
    dtype = z0.dtype
    tol = default_tol(dtype) if tol is None else float(tol)
    clamped = clamp_mask(rho)
    y0 = jnp.where(clamped, z0, z_init)
    if adjoint_solver is None:
        adjoint_solver = (
            lx.GMRES(rtol=0.01 * tol, atol=0.01 * tol, restart=40)
            if matrix_free
            else lx.LU()
        )
    sol = optx.root_find(
        _query_residual,
        _solver(tol, matrix_free),
        y0,
        args=(model, z0, rho),
        options={"fixed": clamped},
        max_steps=max_steps,
        adjoint=optx.ImplicitAdjoint(linear_solver=adjoint_solver),
        throw=False,
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
    z = _never_silent(sol.value, (model, z0, rho), converged)
    residual = jnp.where(clamped, jnp.zeros((), dtype), state.f)
    out = ImplicitSolution(
        z=z,
        residual=residual,
        steps=jnp.asarray(sol.stats["num_steps"]),
        converged=converged,
        stable=stable,
        result=result,
    )
    if throw:
        failed = (result != RESULTS.successful) & (result != RESULTS.unstable_root)
        out = result.error_if(out, failed)
    return out


@eqx.filter_jit
def implicit_pullback(
    model: ImplicitDiffusion,
    sol: ImplicitSolution,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    zbar: Float[ArrayLike, " n"],
) -> tuple[PyTree, Float[Array, " n"], Float[Array, " n"]]:
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
    converge.

    **Arguments:**

    - `model`: the implicit field the query was solved with.
    - `sol`: the query's solution.
    - `z0`, `rho`: the query.
    - `zbar`: the cotangent of the answer `sol.z`, shape `(n,)`.

    **Returns:**

    A tuple `(model_bar, z0_bar, rho_bar)`: a pytree shaped like `model` with
    the cotangent at every floating-point leaf (`None` elsewhere), and two
    `(n,)` vectors.
    """
    z0, rho, _ = _check_query(model, z0, rho, None)
    dtype = z0.dtype
    z = jax.lax.stop_gradient(sol.z).astype(dtype)
    zbar = model.check_point("zbar", zbar).astype(dtype)
    clamped = clamp_mask(rho)
    jac = jax.jacfwd(lambda y: model.implicit_residual(y, z0, rho))(z)
    mu = jnp.linalg.solve(jac.T, -zbar)
    mu = jnp.where(clamped, jnp.zeros((), dtype), mu)
    _, vjp = eqx.filter_vjp(lambda m: m.prior_field(z), model)
    (model_bar,) = vjp(mu)
    rho_sq = soft_stiffness(rho)
    safe_rho = jnp.where(clamped, jnp.zeros((), dtype), rho)
    z0_bar = jnp.where(clamped, zbar + jac.T @ mu, -rho_sq * mu)
    rho_bar = jnp.where(clamped, jnp.zeros((), dtype), 2 * safe_rho * (z - z0) * mu)
    scale = jnp.where(sol.converged, jnp.ones((), dtype), jnp.array(jnp.nan, dtype))
    model_bar = jax.tree.map(lambda x: x * scale.astype(x.dtype), model_bar)
    return model_bar, z0_bar * scale, rho_bar * scale
