"""The probability-flow ODE: sampling and the exact log-likelihood.

diffrax is imported where it is used, not with `retrax.diffusion`: most of the
package (schedules, predictors, the relations built on them) never solves an
ODE, and diffrax's import is a tenth of a second of every script's start.
"""

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, Int, PRNGKeyArray

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._solution import AbstractSolution, throw_if_failed
from .._validate import static_float
from ._predictor import AbstractPredictor, epsilon_jacobian
from ._sample import Sample, _dtype, _shape, _t_end, finished_sample
from ._solution import RESULTS
from ._state import as_state


class LogLikelihood(AbstractSolution):
    r"""What [`retrax.diffusion.log_likelihood`][] returns.

    **Attributes:**

    - `value`: the scalar $\log p_{t_0}(x)$ (`(batch,)` under `jax.vmap`);
      NaN when `result` is not `successful`.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful`,
      `ode_failed` (the ODE solve did not reach `t1`) or `nonfinite_sample`
      (it did, with a non-finite value).
    - `stats`: `{"num_steps": ...}`, the ODE solver's accepted and rejected
      steps (see [`retrax.diffusion.AbstractSolution`][]).

    `log_p` is a deprecated alias of `value`.
    """

    value: Float[Array, ""]
    result: RESULTS
    stats: dict[str, Int[Array, ""]]

    log_p = deprecated_property("LogLikelihood.log_p", ".value", lambda s: s.value)


def _ode_result(sol) -> RESULTS:
    """`successful`, or `ode_failed` for any failure diffrax reports."""
    import diffrax

    ok = sol.result == diffrax.RESULTS.successful
    return RESULTS.where(ok, RESULTS.successful, RESULTS.ode_failed)


def _ode_field(pred):
    sched = pred.schedule

    def field(t, x, args):
        beta = sched.beta(t).astype(x.dtype)
        sigma = sched.sigma(t).astype(x.dtype)
        return 0.5 * beta * (pred.epsilon(x, t) / sigma - x)

    return field


def _ode_term(field):
    import diffrax

    return diffrax.ODETerm(field)


def _solve(term, t0, t1, y0, rtol, atol, max_steps):
    import diffrax

    return diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=t0,
        t1=t1,
        dt0=None,
        y0=y0,
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=False,
    )


@filter_jit
def sample_ode(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    t_end: float | None = None,
    rtol: float = 1e-5,
    atol: float = 1e-5,
    max_steps: int = 4096,
    dtype: DTypeLike | None = None,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample by integrating the probability-flow ODE.

    $\dot x = f(x,t) - \tfrac12 g(t)^2 \nabla\log p_t(x) =
    \tfrac12\beta_t(\hat\epsilon/\sigma_t - x)$ from $t = 1$, $x_1 \sim N(0,I)$,
    to `t_end` (Song et al., ICLR 2021) with diffrax's adaptive `Tsit5` and a
    `PIDController`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key for the initial noise; batch with `jax.vmap`.
    - `shape`: the shape of one example.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `rtol`, `atol`: the step-size controller's tolerances.
    - `max_steps`: the most solver steps.
    - `dtype`: JAX's default float by default.
    - `throw`: raise if the solve fails (e.g. `max_steps` reached) or its
      sample is not finite; otherwise such a sample is NaN, with `result`
      `ode_failed` or `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of the given shape;
    `stats["num_steps"]` counts the solver's steps.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    t_end = _t_end(pred, t_end)
    x1 = jax.random.normal(key, shape, dtype)
    term = _ode_term(_ode_field(pred))
    sol = _solve(
        term,
        jnp.asarray(1.0, dtype),
        jnp.asarray(t_end, dtype),
        x1,
        rtol,
        atol,
        max_steps,
    )
    return finished_sample(sol.ys[-1], sol.stats["num_steps"], throw, _ode_result(sol))


def _standard_normal_logdensity(x: Array) -> Array:
    return -0.5 * (jnp.sum(x**2) + x.size * jnp.log(2 * jnp.pi).astype(x.dtype))


@filter_jit
def log_likelihood(
    pred: AbstractPredictor,
    x: Float[ArrayLike, " n"],
    *,
    t0: float | None = None,
    t1: float = 1.0,
    prior: Callable[[Array], Array] | None = None,
    rtol: float = 1e-6,
    atol: float = 1e-6,
    max_steps: int = 4096,
    jacobian_mode: Literal["auto", "fwd", "rev", "fd", "exact"] = "auto",
    throw: bool = True,
) -> LogLikelihood:
    r"""The log-density of the model at `x` through the probability-flow ODE.

    By the instantaneous change of variables (Chen et al. 2018; Song et al.,
    ICLR 2021), along the ODE $\dot x = \tilde f(x,t)$ the density obeys
    $\tfrac{d}{dt}\log p_t(x(t)) = -\nabla\cdot\tilde f$, so
    $\log p_{t_0}(x) = \log p_{t_1}(x(t_1)) + \int_{t_0}^{t_1}
    \nabla\cdot\tilde f\, dt$. The divergence
    $-\tfrac n2\beta_t + \tfrac{\beta_t}{2\sigma_t}
    \mathrm{tr}\,\partial\hat\epsilon/\partial x$ is exact (the full Jacobian,
    for the small dimension of a factor), not a Hutchinson estimate.

    **Arguments:**

    - `pred`: the noise predictor.
    - `x`: one point, shape `(n,)`, at time `t0`.
    - `t0`: the time of `x`, `schedule.t_min` by default.
    - `t1`: the time where `prior` is evaluated.
    - `prior`: the log-density at `t1`; the standard normal by default (the
      VP marginal at `t = 1` for unit-variance data, up to $\alpha_1^2$).
    - `rtol`, `atol`: the step-size controller's tolerances.
    - `max_steps`: the most solver steps.
    - `jacobian_mode`: how the Jacobian is formed, as in
      [`retrax.diffusion.epsilon_jacobian`][].
    - `throw`: raise if the solve fails or its value is not finite;
      otherwise `log_p` is NaN, with `result` `ode_failed` or
      `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.LogLikelihood`][]: `log_p`, the scalar
    $\log p_{t_0}(x)$.
    """
    x = as_state("x", x)
    if x.ndim != 1:
        raise ValueError(f"`x` must be one point of shape (n,), got shape {x.shape}.")
    x = error_if(x, ~jnp.all(jnp.isfinite(x)), "`x` must be finite.")
    t0 = _t_end(pred, t0, "t0")
    if not t0 < static_float("t1", t1) <= 1.0:
        raise ValueError(f"`t1` must lie in (t0, 1] = ({t0}, 1], got {t1}.")
    dtype = x.dtype
    sched = pred.schedule
    field = _ode_field(pred)
    n = x.shape[0]

    def augmented(t, y, args):
        z, _ = y
        jac = epsilon_jacobian(pred, z, t, mode=jacobian_mode)
        beta = sched.beta(t).astype(dtype)
        sigma = sched.sigma(t).astype(dtype)
        div = 0.5 * beta * (jnp.trace(jac) / sigma - n)
        return field(t, z, args), div

    y0 = (x, jnp.zeros((), dtype))
    sol = _solve(
        _ode_term(augmented),
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        y0,
        rtol,
        atol,
        max_steps,
    )
    z1, integral = sol.ys[0][-1], sol.ys[1][-1]
    prior = _standard_normal_logdensity if prior is None else prior
    logp = prior(z1) + integral
    result = _ode_result(sol)
    result = RESULTS.where(
        jnp.isfinite(logp) | (result != RESULTS.successful),
        result,
        RESULTS.nonfinite_sample,
    )
    logp = jnp.where(result == RESULTS.successful, logp, jnp.array(jnp.nan, dtype))
    stats = {"num_steps": jnp.asarray(sol.stats["num_steps"], jnp.int32)}
    return throw_if_failed(LogLikelihood(logp, result, stats), throw)
