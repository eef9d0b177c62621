r"""Sampling conditioned on a linear measurement $y = Hx + \sigma_y\xi$.

Two samplers of $p(x_0 \mid y)$ for a diffusion prior and a linear Gaussian
measurement, both reverse-time chains over a uniform grid from $t = 1$:

- Tweedie moment projection: at every step the denoiser's posterior
  $p(x_0 \mid x_t)$ is replaced by the Gaussian with Tweedie's mean and
  covariance, conditioned on $y$ exactly (a Kalman update), and the next state
  is drawn from $q(x_s \mid x_t, x_0)$ with $x_0$ drawn from that conditional.
  For Gaussian data the projection is exact and so is every transition: the
  chain samples $p(x_0 \mid y)$ at any number of steps.
- DPS (diffusion posterior sampling, Chung et al., ICLR 2023): ancestral
  steps plus the gradient of the approximate likelihood
  $p(y \mid x_t) \approx N(y; H\hat x_0(x_t), \sigma_y^2 I)$, which drops the
  denoiser's covariance; biased even for Gaussian data.
"""

import math
from typing import Literal

import jax
import jax.numpy as jnp
import jax.scipy.linalg as jsl
from jax.typing import DTypeLike
from jaxtyping import ArrayLike, PRNGKeyArray, Shaped

from .._errors import error_if, filter_jit
from .._validate import check_positive_int, check_value, static_float
from ._predictor import AbstractPredictor, epsilon_jacobian
from ._sample import Sample, _t_end, _transition, finished_sample
from ._state import as_state


def _float_dtype(dtype: DTypeLike) -> jnp.dtype:
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"`dtype` must be a real floating dtype, got {dtype}.")
    return dtype


def _check_measurement(pred, H, y, sigma_y, dtype):
    """The measurement cast to `dtype` and checked; each message names its argument."""
    if not isinstance(pred, AbstractPredictor):
        raise TypeError(
            "`pred` must be a noise predictor (an AbstractPredictor), got "
            f"{type(pred).__name__}."
        )
    H = as_state("H", H)
    y = as_state("y", y)
    if H.ndim != 2 or H.shape[0] == 0 or H.shape[1] == 0:
        raise ValueError(
            "`H` must be a matrix of shape (m, n): m measurements of a point of "
            f"dimension n, got shape {H.shape}."
        )
    m, n = H.shape
    if y.shape != (m,):
        raise ValueError(
            f"`y` must have shape ({m},), one value per row of `H`, got shape "
            f"{y.shape}."
        )
    sigma_y = check_value(
        sigma_y,
        lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
        "`sigma_y` must be a finite, positive noise standard deviation.",
    )
    sigma_y = jnp.asarray(sigma_y)
    if sigma_y.ndim != 0:
        raise ValueError(
            f"`sigma_y` must be a scalar standard deviation, got shape {sigma_y.shape}."
        )
    if not jnp.issubdtype(sigma_y.dtype, jnp.floating):
        sigma_y = sigma_y.astype(dtype)
    H = error_if(H.astype(dtype), ~jnp.all(jnp.isfinite(H)), "`H` must be finite.")
    y = error_if(y.astype(dtype), ~jnp.all(jnp.isfinite(y)), "`y` must be finite.")
    try:
        out = jax.eval_shape(pred.epsilon, jnp.zeros((n,), dtype), jnp.ones((), dtype))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"`H` has {n} columns, but the predictor cannot take a point of shape "
            f"({n},): {err}"
        ) from err
    if out.shape != (n,):
        raise ValueError(
            f"`H` has {n} columns, but the predictor maps a point of shape ({n},) "
            f"to shape {out.shape}."
        )
    return H, y, sigma_y.astype(dtype)


def _posterior_moments(pred, x, t, jacobian_mode):
    r"""Tweedie's mean and covariance of $x_0$ given $x_t = x$.

    $m = (x - \sigma\hat\epsilon)/\alpha$ and
    $C = (\sigma^2/\alpha)\,\partial m/\partial x
    = (\sigma^2/\alpha^2)(I - \sigma\,\partial\hat\epsilon/\partial x)$,
    symmetrised (a learned field's Jacobian is not symmetric).
    """
    sched = pred.schedule
    a, s = sched.alpha(t).astype(x.dtype), sched.sigma(t).astype(x.dtype)
    eps = pred.epsilon(x, t)
    jac = epsilon_jacobian(pred, x, t, mode=jacobian_mode)
    mean = (x - s * eps) / a
    cov = (s / a) ** 2 * (jnp.eye(x.shape[0], dtype=x.dtype) - s * jac)
    return mean, 0.5 * (cov + cov.T)


def _psd_sqrt(cov):
    r"""A square root $L$ ($LL^\top = C_+$) of `cov` and $C_+$ itself.

    Cholesky when `cov` is positive definite. A learned field may give an
    indefinite $C$: then its eigendecomposition, with the negative
    eigenvalues clipped to 0. The eigendecomposition is fed a matrix with
    distinct eigenvalues when it is not used, since its derivative is
    infinite at repeated ones (the isotropic $C$ of Gaussian data), and
    `where` would let that through as NaN.
    """
    n = cov.shape[0]
    chol = jnp.linalg.cholesky(cov)
    ok = jnp.all(jnp.isfinite(chol))
    spread = jnp.diag(jnp.arange(1, n + 1, dtype=cov.dtype))
    vals, vecs = jnp.linalg.eigh(jnp.where(ok, spread, cov))
    vals = jnp.maximum(vals, 0)
    root = jnp.where(ok, jnp.where(jnp.isfinite(chol), chol, 0), vecs * jnp.sqrt(vals))
    return root, jnp.where(ok, cov, (vecs * vals) @ vecs.T)


def _projected_draw(pred, x, t, noise, H, y, sigma_y, jacobian_mode):
    r"""One draw of $x_0$ from the Gaussian projection of $p(x_0 \mid x_t, y)$.

    Matheron's rule: a draw $x_0' = m + C^{1/2}z$ of the prior projection
    $N(m, C)$ is moved by the Kalman gain,
    $x_0 = x_0' + K(y - Hx_0' - \sigma_y\xi)$ with
    $K = CH^\top(HCH^\top + \sigma_y^2 I)^{-1}$, which is a draw of the
    conditioned Gaussian. `noise` holds $z$ and then $\xi$.
    """
    n = x.shape[0]
    mean, cov = _posterior_moments(pred, x, t, jacobian_mode)
    root, cov = _psd_sqrt(cov)
    prior_draw = mean + root @ noise[:n]
    innovation = y - H @ prior_draw - sigma_y * noise[n:]
    gram = H @ cov @ H.T + sigma_y**2 * jnp.eye(y.shape[0], dtype=x.dtype)
    factor = jsl.cho_factor(gram)
    return prior_draw + cov @ H.T @ jsl.cho_solve(factor, innovation)


def _chain(key, n, dtype, ts, update):
    """One `lax.scan` over the time grid `ts`, from a standard normal draw."""
    k_init, k_steps = jax.random.split(key)
    x = jax.random.normal(k_init, (n,), dtype)
    keys = jax.random.split(k_steps, ts.shape[0] - 1)

    def body(x, inp):
        t, s, k = inp
        return update(x, t, s, k), None

    x, _ = jax.lax.scan(body, x, (ts[:-1], ts[1:], keys))
    return x


@filter_jit
def sample_tweedie_projection(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    # loose annotations: the shapes are checked with messages naming them
    H: Shaped[ArrayLike, "..."],
    y: Shaped[ArrayLike, "..."],
    sigma_y: Shaped[ArrayLike, "..."] | float,
    *,
    steps: int = 100,
    t_end: float | None = None,
    jacobian_mode: Literal["auto", "fwd", "rev", "fd", "exact"] = "auto",
    dtype: DTypeLike = jnp.float32,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample of $p(x_0 \mid y)$ by Tweedie moment projection.

    The measurement is $y = Hx_0 + \sigma_y\xi$, $\xi \sim N(0, I)$. At each
    step from $t$ to $s < t$ on a uniform grid from $t = 1$ to `t_end`, the
    denoiser's posterior $p(x_0 \mid x_t)$ is projected onto the Gaussian with
    Tweedie's moments, mean $m = (x_t - \sigma_t\hat\epsilon)/\alpha_t$ and
    covariance $C = (\sigma_t^2/\alpha_t)\,\partial m/\partial x_t$ (the
    Jacobian of Tweedie's mean, by [`retrax.diffusion.epsilon_jacobian`][]:
    $n$ forward passes, for the small dimension of a factor); the
    projection is conditioned on $y$ exactly (the Kalman update
    $m_y = m + K(y - Hm)$, $C_y = C - KHC$,
    $K = CH^\top(HCH^\top + \sigma_y^2 I)^{-1}$); a draw
    $x_0 \sim N(m_y, C_y)$ then gives the next state
    $x_s \sim q(x_s \mid x_t, x_0)$, the Gaussian bridge of the forward
    process. After the last step the returned sample is a draw of $x_0$ from
    the projection at `t_end`.

    Since $y$ depends on $x_t$ only through $x_0$, the true transition is
    $p(x_s \mid x_t, y) = \int q(x_s \mid x_t, x_0)\,p(x_0 \mid x_t, y)\,dx_0$:
    when the data are Gaussian, $p(x_0 \mid x_t)$ is exactly Gaussian with
    Tweedie's moments, every transition is exact, and the samples follow the
    posterior $p(x_0 \mid y)$ at any number of steps (up to the start
    $x_1 \sim N(0, I)$ instead of $p(x_1 \mid y)$, a relative error of
    $\alpha_1^2 \approx 4\cdot10^{-5}$ for the default `VPSDE`). For other
    data it is an approximation that improves as $\sigma_t \to 0$, where
    $p(x_0 \mid x_t)$ concentrates (the moment projection of Boys et al.,
    "Tweedie moment projected diffusions for inverse problems", 2023, here
    used to draw each step's $x_0$). See [`retrax.diffusion.sample_dps`][]
    for the common baseline and its bias.

    **Arguments:**

    - `pred`: the noise predictor of the prior.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `H`: the measurement operator, shape `(m, n)`; the sample has shape
      `(n,)`.
    - `y`: the measurement, shape `(m,)`.
    - `sigma_y`: the measurement noise's standard deviation, positive (may be
      traced).
    - `steps`: the number of reverse steps.
    - `t_end`: the time of the last step, `schedule.t_min` by default.
    - `jacobian_mode`: how the denoiser's Jacobian is formed, as in
      [`retrax.diffusion.epsilon_jacobian`][].
    - `dtype`: the sampling dtype, float32 by default; `H`, `y` and `sigma_y`
      are cast to it.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of $x_0$, shape `(n,)`.
    """
    dtype = _float_dtype(dtype)
    H, y, sigma_y = _check_measurement(pred, H, y, sigma_y, dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    sched = pred.schedule

    n, m = H.shape[1], H.shape[0]

    def update(x, t, s, key):
        # one draw per step (threefry is slow to compile: fewer calls, not fewer
        # numbers)
        noise = jax.random.normal(key, (2 * n + m,), dtype)
        x0 = _projected_draw(pred, x, t, noise[n:], H, y, sigma_y, jacobian_mode)
        a_ts, var_ts = _transition(sched, t, s)
        sig_t2 = sched.sigma(t) ** 2
        sig_s2 = sched.sigma(s) ** 2
        mean = (a_ts * sig_s2 * x + sched.alpha(s) * var_ts * x0) / sig_t2
        return mean + jnp.sqrt(var_ts * sig_s2 / sig_t2) * noise[:n]

    # The last step goes from `t_end` to 0, where the bridge q(x_0 | x_t, x_0)
    # is the point x_0: it returns the draw of x_0 itself.
    grid = jnp.linspace(1.0, t_end, steps + 1, dtype=dtype)
    ts = jnp.concatenate([grid, jnp.zeros((1,), dtype)])
    return finished_sample(_chain(key, n, dtype, ts, update), steps + 1, throw)


def _dps_likelihood_step(
    pred, x, t, a_t, sig_t, a_ts, var_ts, mean_std, noise, H, y, sigma_y
):
    r"""One ancestral step guided by the likelihood's score, within the step
        length its linearisation supports.

        The guidance is $c\,d$ with $d = J^	op H^	op r$ ($J = \partial\hat
        x_0/\partial x_t$, $r = y - H\hat x_0$) and the likelihood's weight
        $c = \sigma_{t|s}^2/(lpha_{t|s}\sigma_y^2)$. Linearised, moving $x$ by
        $c\,d$ changes the residual to $r - c\,HJd$, and the misfit
        $\lVert r - c\,HJd
    Vert$ falls only for $c < 2c^*$, least at
        $c^* = \lVert d
    Vert^2/\lVert HJd
    Vert^2$ (where the residual along
        $HJd$ is gone). When $\sigma_y$ is small against the prior's spread,
        $c \gg c^*$: every step overshoots by the factor $c/c^*$ and the chain
        diverges geometrically. So the weight is $\min(c, c^*)$: the score of the
        likelihood where the linearisation allows it, the linearised projection
        onto the measurement where it does not. $HJd$ is one forward product
        through the linearisation that gives $J^	op$ (`jax.linearize`).
    """
    eps, eps_lin = jax.linearize(lambda v: pred.epsilon(v, t), x)
    x0 = (x - sig_t * eps) / a_t
    pull = H.T @ (y - H @ x0)
    (eps_t,) = jax.linear_transpose(eps_lin, x)(pull)
    # (d x0 / d x)^T v = (v - sigma (d eps / d x)^T v) / alpha, and d x0 / d x alike
    ascent = (pull - sig_t * eps_t) / a_t
    push = H @ ((ascent - sig_t * eps_lin(ascent)) / a_t)
    along, across = jnp.sum(ascent**2), jnp.sum(push**2)
    weight = (var_ts / a_ts) / sigma_y**2
    supported = along / jnp.where(across > 0, across, jnp.ones((), x.dtype))
    weight = jnp.where(across > 0, jnp.minimum(weight, supported), weight)
    out = (x - mean_std[0] * eps) / a_ts + mean_std[1] * noise
    return out + weight * ascent


@filter_jit
def sample_dps(
    pred: AbstractPredictor,
    key: PRNGKeyArray,
    # loose annotations: the shapes are checked with messages naming them
    H: Shaped[ArrayLike, "..."],
    y: Shaped[ArrayLike, "..."],
    sigma_y: Shaped[ArrayLike, "..."] | float,
    *,
    steps: int = 500,
    step_size: float | None = None,
    t_end: float | None = None,
    dtype: DTypeLike = jnp.float32,
    throw: bool = True,
) -> Sample:
    r"""Draw one sample of $p(x_0 \mid y)$ by diffusion posterior sampling (DPS).

    Chung et al., "Diffusion posterior sampling for general noisy inverse
    problems", ICLR 2023: ancestral steps (as in
    [`retrax.diffusion.sample_ancestral`][]) guided by the gradient, through
    the denoiser, of the approximate likelihood
    $p(y \mid x_t) \approx N(y; H\hat x_0(x_t), \sigma_y^2 I)$ with Tweedie's
    $\hat x_0$. With `step_size=None` the guidance is that likelihood's
    score, weighted as the ancestral step weights the prior's score:
    $x_s \mathrel{+}= c\,d$ with $d = (\partial\hat x_0/\partial x_t)^\top
    H^\top(y - H\hat x_0)$ and $c = \sigma_{t|s}^2/(\alpha_{t|s}\sigma_y^2)$,
    but never beyond the step its linearisation supports:
    $c \le c^* = \lVert d\rVert^2/\lVert H(\partial\hat x_0/\partial x_t)
    d\rVert^2$, the step along $d$ that minimises the linearised misfit
    $\lVert y - H\hat x_0\rVert$. Without that bound a small $\sigma_y$
    (against the prior's spread) makes every step overshoot $y$ by the factor
    $c/c^*$, and the chain diverges: on a 3-d Gaussian mixture with
    components of standard deviation 0.3 and $\sigma_y = 0.02$ it ended at
    $10^5$ to $10^{11}$, and at $\sigma_y = 0.01$ at NaN in float32. Where
    $c \le c^*$ (as at $\sigma_y = 0.3$ in the bias measurement below) the
    step is the likelihood's score unchanged. One linearisation per step
    (a vector-Jacobian and a Jacobian-vector product), no Jacobian.
    With a float `step_size` $\zeta$ it is the paper's normalised step
    (Algorithm 1), $x_s \mathrel{-}= \zeta\,\nabla_{x_t}\lVert y -
    H\hat x_0\rVert^2 / \lVert y - H\hat x_0\rVert$, whose strength does not
    depend on $\sigma_y$ (one vector-Jacobian product per step).
    The returned sample is Tweedie's $\hat x_0$ at `t_end`.

    **Bias.** The approximation drops the covariance of $x_0$ given $x_t$
    from the likelihood, so DPS is biased even when the data are Gaussian,
    where the exact posterior is known. Measured on such a problem (a prior
    $N(\mu, 0.8^2 I)$ in 3 dimensions, 2 measurements with
    $\sigma_y = 0.3$; `test_dps_bias_is_measured` in
    `tests/diffusion/test_measurement.py`: 10,000 samples, 500 steps,
    `step_size=None`, Monte Carlo errors 0.01 and 0.007): the sample mean is
    off the exact posterior mean by 0.073, 0.055 and -0.086 posterior
    standard deviations, and the sample standard deviations are 0.905, 0.983
    and 0.875 of the exact ones, over-confident. With 2,000 steps the
    numbers are alike (it is the approximation, not the discretisation).
    The paper's normalised step does not remove it: `step_size=0.1` gives
    standard deviations down to 0.74 of the exact ones, `step_size=1.0`
    up to 2.1 times. [`retrax.diffusion.sample_tweedie_projection`][] is
    exact there. Where the step bound holds (small $\sigma_y$) DPS projects
    onto the measurement rather than weighing it: on the mixture above
    (`tests/diffusion/test_measurement.py`) $H x_0$ lands within 0.1 $\sigma_y$ of
    $y$ on average, but spreads by 0.86 to 0.93 $\sigma_y$ at
    $\sigma_y = 0.01$ and by 0.47 to 0.52 $\sigma_y$ at $0.02$, where the
    posterior spreads by nearly $\sigma_y$ (over-confident again).

    **Arguments:**

    - `pred`: the noise predictor of the prior.
    - `key`: a PRNG key; batch with `jax.vmap` over keys.
    - `H`: the measurement operator, shape `(m, n)`; the sample has shape
      `(n,)`.
    - `y`: the measurement, shape `(m,)`.
    - `sigma_y`: the measurement noise's standard deviation, positive (may be
      traced).
    - `steps`: the number of reverse steps.
    - `step_size`: `None` for the likelihood's own weight, or the paper's
      $\zeta > 0$.
    - `t_end`: the time of the last step, `schedule.t_min` by default.
    - `dtype`: the sampling dtype, float32 by default; `H`, `y` and `sigma_y`
      are cast to it.
    - `throw`: raise if the sample is not finite; otherwise such a sample is
      NaN with `result` `nonfinite_sample`.

    **Returns:**

    A [`retrax.diffusion.Sample`][]: `x`, one sample of $x_0$, shape `(n,)`.
    """
    dtype = _float_dtype(dtype)
    H, y, sigma_y = _check_measurement(pred, H, y, sigma_y, dtype)
    check_positive_int("steps", steps)
    t_end = _t_end(pred, t_end)
    if step_size is not None:
        step_size = static_float("step_size", step_size)
        if not (step_size > 0 and math.isfinite(step_size)):
            raise ValueError(
                f"`step_size` must be a finite positive float or None, got {step_size}."
            )
    sched = pred.schedule

    def update(x, t, s, key):
        a_t, sig_t = sched.alpha(t), sched.sigma(t)
        a_ts, var_ts = _transition(sched, t, s)
        mean_std = var_ts / sig_t, jnp.sqrt(var_ts) * sched.sigma(s) / sig_t
        noise = jax.random.normal(key, x.shape, x.dtype)
        if step_size is None:
            return _dps_likelihood_step(
                pred, x, t, a_t, sig_t, a_ts, var_ts, mean_std, noise, H, y, sigma_y
            )
        eps, eps_vjp = jax.vjp(lambda v: pred.epsilon(v, t), x)
        x0 = (x - sig_t * eps) / a_t
        residual = y - H @ x0
        # (d x0 / d x)^T v = (v - sigma (d eps / d x)^T v) / alpha
        (back,) = eps_vjp(H.T @ residual)
        ascent = (H.T @ residual - sig_t * back) / a_t
        out = (x - mean_std[0] * eps) / a_ts + mean_std[1] * noise
        norm = jnp.sqrt(jnp.sum(residual**2))
        safe = jnp.where(norm > 0, norm, jnp.ones((), x.dtype))
        return out + jnp.where(norm > 0, 2 * step_size * ascent / safe, 0)

    ts = jnp.linspace(1.0, t_end, steps + 1, dtype=dtype)
    x = _chain(key, H.shape[1], dtype, ts, update)
    return finished_sample(pred.denoise(x, jnp.asarray(t_end, dtype)), steps, throw)
