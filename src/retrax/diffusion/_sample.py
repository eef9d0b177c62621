"""Sampling from a noise predictor: reverse SDE, DDIM, probability-flow ODE."""

from collections.abc import Callable
from typing import Literal

import diffrax
import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from .._errors import error_if
from .._misc import check_positive_int, static_float
from ._predictor import AbstractPredictor, as_state, as_state_like, epsilon_jacobian


def _shape(shape: int | tuple[int, ...]) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(s, int) and s >= 1 for s in shape):
        raise ValueError(f"`shape` must be a tuple of positive integers, got {shape}.")
    return shape


def _t_end(pred: AbstractPredictor, t_end: float | None, name: str = "t_end") -> float:
    t_end = pred.schedule.t_min if t_end is None else static_float(name, t_end)
    if not 0.0 < t_end < 1.0:
        raise ValueError(
            f"`{name}` must lie in (0, 1) (at t = 0 the noise scale is 0 and the "
            f"score is singular), got {t_end}."
        )
    return t_end


def _dtype(dtype: DTypeLike | None) -> jnp.dtype:
    """The sampler's real floating dtype, JAX's default float for `None`."""
    dtype = jnp.dtype(jnp.result_type(float) if dtype is None else dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a real floating dtype, got {dtype}.")
    return dtype


def _reverse_scan(pred, key, shape, dtype, steps, t_end, update, clamp):
    """One `lax.scan` from t = 1 down to `t_end` over a uniform time grid.

    `update(x, t, s, key)` returns the state at the earlier time `s`. With a
    clamp `(mask, values)`, clamped coordinates are replaced after every step
    by a fresh draw of the forward process at `s` (the replacement method).
    """
    sched = pred.schedule
    k_init, k_clamp, k_steps = jax.random.split(key, 3)
    x = jax.random.normal(k_init, shape, dtype)
    ts = jnp.linspace(1.0, t_end, steps + 1, dtype=dtype)
    keys = jax.random.split(k_steps, steps)

    def replace(x, s, k):
        mask, values = clamp
        noised = sched.perturb(values, s, jax.random.normal(k, shape, dtype))
        return jnp.where(mask, noised, x)

    if clamp is not None:
        x = replace(x, ts[0], k_clamp)

    def body(x, inp):
        t, s, k = inp
        k_step, k_clamp = jax.random.split(k)
        x = update(x, t, s, k_step)
        if clamp is not None:
            x = replace(x, s, k_clamp)
        return x, None

    x, _ = jax.lax.scan(body, x, (ts[:-1], ts[1:], keys))
    if clamp is not None:
        mask, values = clamp
        x = jnp.where(mask, values, x)
    return x


def _transition(sched, t, s):
    """VP transition from s to t > s: alpha_{t|s} and sigma_{t|s}^2, no cancellation."""
    db = sched.integrated_beta(t) - sched.integrated_beta(s)
    return jnp.exp(-0.5 * db), -jnp.expm1(-db)


def _ancestral_update(pred):
    sched = pred.schedule

    def update(x, t, s, key):
        a_ts, var_ts = _transition(sched, t, s)
        sig_t, sig_s = sched.sigma(t), sched.sigma(s)
        eps = pred.epsilon(x, t)
        mean = (x - (var_ts / sig_t) * eps) / a_ts
        std = jnp.sqrt(var_ts) * sig_s / sig_t
        return mean + std * jax.random.normal(key, x.shape, x.dtype)

    return update


@eqx.filter_jit
def sample_ancestral(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 500,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
) -> Float[Array, "*shape"]:
    r"""Draw one sample by ancestral sampling of the reverse process.

    Starting from $x_1 \sim N(0, I)$, each step on a uniform grid from $t=1$
    to `t_end` draws $x_s \sim q(x_s | x_t, \hat x_0)$, the exact Gaussian
    posterior of the forward process given Tweedie's $\hat x_0$ (DDPM, Ho et
    al. 2020, for a continuous-time VP schedule): mean
    $(x_t - \sigma_{t|s}^2 \hat\epsilon / \sigma_t)/\alpha_{t|s}$ and standard
    deviation $\sigma_{t|s}\sigma_s/\sigma_t$. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `shape`: the shape of one example.
    - `steps`: the number of reverse steps.
    - `t_end`: the final time, `schedule.t_min` by default. The sample is $x$
      at `t_end` (noised at $\sigma(t_{\mathrm{end}})$, not denoised).
    - `dtype`: JAX's default float by default.

    **Returns:**

    One sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    return _reverse_scan(
        pred, key, shape, dtype, steps, t_end, _ancestral_update(pred), None
    )


@eqx.filter_jit
def sample_euler_maruyama(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 1000,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
) -> Float[Array, "*shape"]:
    r"""Draw one sample by Euler–Maruyama on the reverse-time SDE.

    $dx = [f(x,t) - g(t)^2 \nabla\log p_t(x)]\,dt + g(t)\,d\bar w$ from
    $t = 1$ to `t_end` (Song et al., ICLR 2021): with $h = t - s > 0$,
    $x_s = x_t + \beta_t(\tfrac12 x_t - \hat\epsilon/\sigma_t) h +
    \sqrt{\beta_t h}\, z$. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `shape`: the shape of one example.
    - `steps`: the number of Euler–Maruyama steps.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `dtype`: JAX's default float by default.

    **Returns:**

    One sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    sched = pred.schedule

    def update(x, t, s, key):
        h = t - s
        beta = sched.beta(t)
        drift = beta * (0.5 * x - pred.epsilon(x, t) / sched.sigma(t))
        noise = jnp.sqrt(beta * h) * jax.random.normal(key, x.shape, x.dtype)
        return x + drift * h + noise

    return _reverse_scan(pred, key, shape, dtype, steps, t_end, update, None)


@eqx.filter_jit
def sample_ddim(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    shape: int | tuple[int, ...],
    *,
    steps: int = 100,
    eta: float = 0.0,
    t_end: float | None = None,
    dtype: DTypeLike | None = None,
) -> Float[Array, "*shape"]:
    r"""Draw one sample with DDIM (Song, Meng and Ermon, ICLR 2021).

    $x_s = \alpha_s \hat x_0 + \sqrt{\sigma_s^2 - \eta^2 v}\,\hat\epsilon +
    \eta\sqrt{v}\, z$ with $v = \sigma_{t|s}^2\sigma_s^2/\sigma_t^2$ the
    ancestral variance: deterministic for `eta = 0` (a discretisation of the
    probability-flow ODE), ancestral for `eta = 1`. One `lax.scan`.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key (the initial noise, and the step noise if `eta > 0`).
    - `shape`: the shape of one example.
    - `steps`: the number of steps.
    - `eta`: the stochasticity, in `[0, 1]`.
    - `t_end`: the final time, `schedule.t_min` by default.
    - `dtype`: JAX's default float by default.

    **Returns:**

    One sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    if not 0.0 <= static_float("eta", eta) <= 1.0:
        raise ValueError(f"`eta` must lie in [0, 1], got {eta}.")
    sched = pred.schedule

    def update(x, t, s, key):
        _, var_ts = _transition(sched, t, s)
        a_t, sig_t = sched.alpha(t), sched.sigma(t)
        a_s, sig_s = sched.alpha(s), sched.sigma(s)
        eps = pred.epsilon(x, t)
        x0 = (x - sig_t * eps) / a_t
        v = eta**2 * var_ts * sig_s**2 / sig_t**2
        out = a_s * x0 + jnp.sqrt(sig_s**2 - v) * eps
        if eta > 0:
            out = out + jnp.sqrt(v) * jax.random.normal(key, x.shape, x.dtype)
        return out

    return _reverse_scan(pred, key, shape, dtype, steps, t_end, update, None)


@eqx.filter_jit
def sample_conditional(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    mask: Bool[ArrayLike, "*shape"],
    values: Float[ArrayLike, "*shape"],
    *,
    steps: int = 500,
    t_end: float | None = None,
) -> Float[Array, "*shape"]:
    r"""Draw one sample with some coordinates clamped (the replacement method).

    Ancestral sampling as in [`retrax.diffusion.sample_ancestral`][], but
    after every step the clamped coordinates are replaced by a fresh draw of
    the forward process at the new time, $\alpha_s v + \sigma_s z$, so that
    the free coordinates are steered by noised versions of the known values
    (Song et al., ICLR 2021, appendix on imputation). The replacement method
    is an approximation to the true conditional, accurate when the clamped
    coordinates determine the mixture component well; see
    `retrax.diffusion` implicit inference for exact conditional roots.

    **Arguments:**

    - `pred`: the noise predictor.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `mask`: `True` at the clamped coordinates; its shape is the example's.
    - `values`: the clamped values (entries where `mask` is `False` are
      ignored), shaped like `mask`.
    - `steps`: the number of reverse steps.
    - `t_end`: the final time, `schedule.t_min` by default.

    **Returns:**

    One sample, equal to `values` where `mask` is `True`.
    """
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"`mask` must be a boolean array, got dtype {mask.dtype}.")
    values = as_state_like("values", values, "mask", mask)
    values = error_if(
        values,
        mask & ~jnp.isfinite(values),
        "the clamped `values` must be finite.",
    )
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    values = jnp.where(mask, values, 0.0)
    return _reverse_scan(
        pred,
        key,
        mask.shape,
        values.dtype,
        steps,
        t_end,
        _ancestral_update(pred),
        (mask, values),
    )


def _ode_field(pred):
    sched = pred.schedule

    def field(t, x, args):
        beta = sched.beta(t).astype(x.dtype)
        sigma = sched.sigma(t).astype(x.dtype)
        return 0.5 * beta * (pred.epsilon(x, t) / sigma - x)

    return field


def _solve(term, t0, t1, y0, rtol, atol, max_steps, throw):
    return diffrax.diffeqsolve(
        term,
        diffrax.Tsit5(),
        t0=t0,
        t1=t1,
        dt0=None,
        y0=y0,
        stepsize_controller=diffrax.PIDController(rtol=rtol, atol=atol),
        max_steps=max_steps,
        throw=throw,
    )


@eqx.filter_jit
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
) -> Float[Array, "*shape"]:
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
    - `throw`: raise if the solver fails (e.g. `max_steps` reached);
      otherwise a failed solve returns NaN.

    **Returns:**

    One sample of the given shape.
    """
    shape, dtype = _shape(shape), _dtype(dtype)
    t_end = _t_end(pred, t_end)
    x1 = jax.random.normal(key, shape, dtype)
    term = diffrax.ODETerm(_ode_field(pred))
    sol = _solve(
        term,
        jnp.asarray(1.0, dtype),
        jnp.asarray(t_end, dtype),
        x1,
        rtol,
        atol,
        max_steps,
        throw,
    )
    ok = sol.result == diffrax.RESULTS.successful
    return jnp.where(ok, sol.ys[-1], jnp.nan)


def _standard_normal_logdensity(x: Array) -> Array:
    return -0.5 * (jnp.sum(x**2) + x.size * jnp.log(2 * jnp.pi).astype(x.dtype))


@eqx.filter_jit
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
) -> Float[Array, ""]:
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
    - `throw`: raise if the solver fails; otherwise a failed solve returns NaN.

    **Returns:**

    The scalar $\log p_{t_0}(x)$.
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
        diffrax.ODETerm(augmented),
        jnp.asarray(t0, dtype),
        jnp.asarray(t1, dtype),
        y0,
        rtol,
        atol,
        max_steps,
        throw,
    )
    z1, integral = sol.ys[0][-1], sol.ys[1][-1]
    prior = _standard_normal_logdensity if prior is None else prior
    logp = prior(z1) + integral
    return jnp.where(sol.result == diffrax.RESULTS.successful, logp, jnp.nan)
