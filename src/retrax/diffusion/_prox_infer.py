"""Clamped inference with a proximal prior, by half-quadratic splitting."""

import jax
import jax.numpy as jnp
import optimistix as optx
from jaxtyping import Array, ArrayLike, Bool, Float

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._never_silent import never_silent
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_value
from ._prox import AbstractProximalPredictor, _as_lam
from ._solution import RESULTS
from ._state import as_state, as_state_like, time_like


def _max_norm(x) -> Array:
    # in the default float, the dtype of FixedPointIteration's initial error,
    # so that float32 solves also run with x64 enabled
    return optx.max_norm(x).astype(jnp.result_type(float))


class ProxSolution(AbstractSolution):
    """The result of [`retrax.diffusion.prox_infer`][].

    **Attributes:**

    - `value`: the answer $w$: exact on hard clamps, full length.
    - `u`: the prior's proximal point at the answer, $\\mathrm{prox}(w)$.
    - `residual`: the fixed-point residual $T(w) - w$, full length (0 on
      hard clamps).
    - `converged`: whether the iteration met its tolerance and the prox at
      the answer is a proximal point.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: optimistix's result of
      the iteration, or the prox's own failure at the answer (see
      [`retrax.diffusion.AbstractProximalPredictor.prox_result`][]).
    - `stats`: `{"num_steps": ...}`, the number of iterations taken (see
      [`retrax.diffusion.AbstractSolution`][]).

    `z` is a deprecated alias of `value`, and `steps` of
    `stats["num_steps"]`.
    """

    value: Float[Array, " n"]
    u: Float[Array, " n"]
    residual: Float[Array, " n"]
    converged: Bool[Array, ""]
    result: RESULTS
    stats: dict[str, Array]

    z = deprecated_property("ProxSolution.z", ".value", lambda s: s.value)
    steps = deprecated_property(
        "ProxSolution.steps", '.stats["num_steps"]', lambda s: s.stats["num_steps"]
    )


def _hqs_step(w, args):
    prox, z0, rho, hard, t, lam = args
    # The prox's own failures are checked at the answer (`prox_infer`); its
    # derivatives here are the map's, so that the adjoint's operator is finite.
    u, _ = prox.prox_result(w, t, lam)
    stiff = lam * rho**2
    return jnp.where(hard, z0, (u + stiff * z0) / (1 + stiff))


@filter_jit
def prox_infer(
    prox: AbstractProximalPredictor,
    z0: Float[ArrayLike, " n"],
    rho: Float[ArrayLike, " n"],
    t: Float[ArrayLike, ""] | float,
    lam: Float[ArrayLike, ""] | float = 0.01,
    *,
    z_init: Float[ArrayLike, " n"] | None = None,
    tol: float | None = None,
    max_steps: int = 10_000,
    throw: bool = True,
) -> ProxSolution:
    r"""Clamped inference with a proximal prior, by half-quadratic splitting.

    Finds a stationary point of
    $-\log p_t(u) + \tfrac1{2\lambda}\lVert u - w\rVert^2 +
    \tfrac12\sum_i\rho_i^2(w_i - z_{0,i})^2$ by the fixed-point iteration
    $w \leftarrow T(w)$:
    $u = \mathrm{prox}_{-\lambda\log p_t}(w)$, then
    $w_i = (u_i + \lambda\rho_i^2 z_{0,i})/(1 + \lambda\rho_i^2)$, and
    $w_i = z_{0,i}$ where $\rho_i = \infty$ (the plug-and-play / DiffPIR
    splitting; as $\lambda \to 0$ it tends to the clamped mode of $p_t$).
    Clamps follow the relation queries: $\rho_i = \infty$ is a hard clamp
    (exact), finite positive a soft target with standard deviation
    $1/\rho_i$, and 0 leaves the coordinate free (its `z0` is then only the
    start).

    The iteration is `optx.fixed_point` with `optx.FixedPointIteration`, and
    derivatives with respect to `z0`, `rho`, `t`, `lam` and the prior's
    parameters come from `optx.ImplicitAdjoint` (one linear solve with
    $I - \partial T/\partial w$), never through the loop. The derivative
    with respect to an infinite `rho` is 0.

    **Arguments:**

    - `prox`: the prior's proximal operator.
    - `z0`: the clamped values and soft targets, shape `(n,)`; finite where
      `rho > 0` (and everywhere when `z_init` is not given).
    - `rho`: the stiffnesses, shape `(n,)`, in `[0, inf]`.
    - `t`: the prior's diffusion time in `[0, 1]`.
    - `lam`: the splitting strength $\lambda > 0$.
    - `z_init`: the start, shape `(n,)`; `z0` by default. Its hard-clamped
      entries are ignored.
    - `tol`: the relative and absolute tolerance on the change of $w$ per
      step; `None` means 1e-9 in float64 and 1e-5 in float32. The iteration
      contracts linearly, so the error is about `tol` divided by one minus
      its rate.
    - `max_steps`: the most iterations.
    - `throw`: raise if the iteration does not converge, or if the prox at
      the answer failed (see
      [`retrax.diffusion.AbstractProximalPredictor.prox_result`][]). With
      `throw=False` a failed solve returns its last iterate and its result
      code, and every derivative of `z`, `u` and `residual` is NaN (forward
      and reverse mode), never a silent number.

    **Returns:**

    A [`retrax.diffusion.ProxSolution`][].
    """
    z0 = as_state("z0", z0)
    if z0.ndim != 1:
        raise ValueError(
            f"`z0` must be one query as a vector of shape (n,), got {z0.shape}. "
            "Batch several with `jax.vmap`."
        )
    rho = as_state_like("rho", rho, "z0", z0)
    dtype = z0.dtype
    rho = rho.astype(dtype)
    rho = error_if(
        rho, jnp.isnan(rho) | (rho < 0), "`rho` must lie in [0, inf] (no NaN)."
    )
    lam = _as_lam(lam, dtype, positive=True)
    t = time_like(t, z0)
    check_positive_int("max_steps", max_steps)
    if tol is None:
        tol = 1e-9 if dtype == jnp.float64 else 1e-5
    tol = check_value(tol, lambda xp, v: ~(v > 0), "`tol` must be positive.")
    hard = jnp.isinf(rho)
    used = rho > 0
    z0 = error_if(z0, used & ~jnp.isfinite(z0), "`z0` must be finite where `rho` > 0.")
    z0 = jnp.where(used, z0, 0.0) if z_init is not None else z0
    rho_soft = jnp.where(hard, 0.0, rho)
    if z_init is None:
        start = z0
    else:
        start = as_state_like("z_init", z_init, "z0", z0).astype(dtype)
    start = jnp.where(hard, z0, start)
    start = error_if(
        start,
        ~jnp.all(jnp.isfinite(start)),
        "the start (`z_init`, or `z0` at free coordinates) must be finite.",
    )
    args = (prox, jnp.where(used, z0, 0.0), rho_soft, hard, t, lam)
    sol = optx.fixed_point(
        _hqs_step,
        optx.FixedPointIteration(rtol=tol, atol=tol, norm=_max_norm),
        start,
        args,
        max_steps=max_steps,
        adjoint=optx.ImplicitAdjoint(),
        throw=False,
    )
    _, prox_result = prox.prox_result(jax.lax.stop_gradient(sol.value), t, lam)
    result = RESULTS.where(
        sol.result == optx.RESULTS.successful,
        prox_result,
        RESULTS.promote(sol.result),
    )
    converged = result == RESULTS.successful
    z = never_silent(sol.value, (prox, z0, rho_soft, t, lam), converged)
    u, _ = prox.prox_result(z, t, lam)
    residual = _hqs_step(z, args) - z
    steps = jnp.asarray(sol.stats["num_steps"])
    out = ProxSolution(
        value=z,
        u=u,
        residual=residual,
        converged=converged,
        result=result,
        stats={"num_steps": steps},
    )
    return throw_if_failed(out, throw, ~converged)
