"""RED-Diff: variational inverse problems with a diffusion prior as a regulariser."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
from jaxtyping import Array, ArrayLike, Bool, Float, PRNGKeyArray

from .._deprecated import deprecated_property
from .._errors import error_if, filter_jit
from .._misc import all_finite
from .._never_silent import never_silent
from .._solution import AbstractSolution, throw_if_failed
from .._validate import check_positive_int, check_value, static_float
from ._predictor import AbstractPredictor
from ._schedule import AbstractNoiseSchedule, as_time
from ._solution import RESULTS
from ._state import as_state, is_key


def _check_lam(lam):
    return check_value(
        lam,
        lambda xp, v: ~(v >= 0) | ~xp.isfinite(v),
        "`lam` (the regulariser strength) must be nonnegative and finite.",
    )


class REDDiff(eqx.Module):
    r"""The configuration of RED-Diff (Mardani et al., "A variational perspective
    on solving inverse problems with diffusion models", ICLR 2024,
    arXiv:2305.04391).

    RED-Diff fits a point estimate $x$ (the mean of a variational posterior
    whose variance tends to zero) by first-order optimisation of
    data fit + regulariser, where the regulariser's gradient is
    $\mathbb{E}_{t,\epsilon}[\lambda_t(\hat\epsilon(\alpha_t x + \sigma_t\epsilon, t)
    - \epsilon)]$ with $\lambda_t = \lambda\sigma_t/\alpha_t$ (their
    Proposition 2), the noise predictor's Jacobian dropped.

    **Time sampling.** Every step draws its `samples` times independently and
    uniformly on `[schedule.t_min, t_max]` (the paper's random order, with
    `t_max = 1`). The
    paper's descending schedule is not offered: it changes the objective
    during the run (the last steps see only small $t$, where $\lambda_t$ is
    tiny), whereas uniform draws give one stationary objective, the one
    [`retrax.diffusion.calibrate_lambda`][] calibrates.

    **Iterate averaging.** Adam with a constant step size does not settle: on
    noisy gradients its iterates jitter about the optimum by about `lr`.
    `average > 0` returns the mean of the last `round(average * steps)`
    iterates (Polyak–Ruppert averaging) instead of the last one.

    **Arguments:**

    - `lam`: the regulariser strength $\lambda \ge 0$ (0.25 is the paper's
      tuned value, not a universal constant).
    - `steps`: the number of optimiser steps.
    - `lr`: Adam's step size.
    - `samples`: Monte Carlo draws of $(t, \epsilon)$ per step.
    - `average`: the fraction of the final iterates to average, in `[0, 1)`;
      0 (the default) returns the last iterate.
    - `t_max`: the largest time drawn, in `(t_min, 1]`; smaller values make
      the regulariser see only the fine structure of the prior (calibrate
      with the same `t_max`).
    - `b1`, `b2`, `eps`: Adam's moment decays and denominator offset.
    """

    lam: float | Float[Array, ""]
    steps: int = eqx.field(static=True)
    lr: float | Float[Array, ""]
    samples: int = eqx.field(static=True)
    average: float
    t_max: float | Float[Array, ""]
    b1: float | Float[Array, ""]
    b2: float | Float[Array, ""]
    eps: float | Float[Array, ""]

    def __init__(
        self,
        lam: float | Float[ArrayLike, ""] = 0.25,
        steps: int = 200,
        lr: float | Float[ArrayLike, ""] = 0.1,
        samples: int = 1,
        average: float = 0.0,
        t_max: float | Float[ArrayLike, ""] = 1.0,
        b1: float | Float[ArrayLike, ""] = 0.9,
        b2: float | Float[ArrayLike, ""] = 0.999,
        eps: float | Float[ArrayLike, ""] = 1e-8,
    ):
        # Python numbers are checked here; traced ones (a configuration built
        # under `jit`, `vmap` or `grad`) when the program runs, with the same
        # messages. `average` fixes the number of averaged iterates, so it must
        # be a Python number.
        check_positive_int("steps", steps)
        check_positive_int("samples", samples)
        if not 0 <= static_float("average", average) < 1:
            raise ValueError(
                f"`average` (the fraction of iterates averaged) must lie in [0, 1), "
                f"got {average}."
            )
        self.lam = _check_lam(lam)
        self.steps = steps
        self.lr = check_value(lr, lambda xp, v: ~(v > 0), "`lr` must be positive.")
        self.samples = samples
        self.average = average
        self.t_max = check_value(
            t_max, lambda xp, v: ~((v > 0) & (v <= 1)), "`t_max` must lie in (0, 1]."
        )
        self.b1, self.b2 = (
            check_value(
                b,
                lambda xp, v: ~((v >= 0) & (v < 1)),
                f"Adam's `{name}` must lie in [0, 1).",
            )
            for name, b in (("b1", b1), ("b2", b2))
        )
        self.eps = check_value(
            eps, lambda xp, v: ~(v > 0), "Adam's `eps` must be positive."
        )

    @property
    def window(self) -> int:
        """The number of final iterates averaged (1: the last iterate only)."""
        return max(1, round(self.average * self.steps))


def reddiff_weight(
    schedule: AbstractNoiseSchedule,
    t: Float[ArrayLike, "*shape"] | float,
    lam: Float[ArrayLike, ""] | float,
) -> Float[Array, "*shape"]:
    r"""RED-Diff's weight $\lambda_t = \lambda\sigma_t/\alpha_t$.

    That is $\lambda/\mathrm{SNR}_t$. It grows without bound as $t \to 1$:
    heavily noised times weigh most, the opposite of the ELBO weighting
    (Mardani et al. 2023).

    **Arguments:**

    - `schedule`: the noise schedule.
    - `t`: diffusion time(s) in `[0, 1]`.
    - `lam`: the regulariser strength $\lambda \ge 0$.

    **Returns:**

    $\lambda_t$, shaped like `t`.
    """
    lam = _check_lam(lam)
    t = as_time(t)
    lam = jnp.asarray(lam).astype(t.dtype)
    return lam * schedule.sigma(t) / schedule.alpha(t)


def _as_vector(name: str, x: ArrayLike) -> Float[Array, " n"]:
    x = as_state(name, x)
    if x.ndim != 1:
        raise ValueError(
            f"`{name}` must be one example as a vector of shape (n,), got shape "
            f"{x.shape}. Batch several with `jax.vmap`."
        )
    return x


@filter_jit
def regulariser_gradient(
    pred: AbstractPredictor,
    cfg: REDDiff,
    x: Float[ArrayLike, " n"],
    key: PRNGKeyArray,
) -> Float[Array, " n"]:
    r"""RED-Diff's regulariser gradient, by Monte Carlo (Proposition 2).

    $\frac1S\sum_{s=1}^S \lambda_{t_s}(\hat\epsilon(\alpha_{t_s}x +
    \sigma_{t_s}\epsilon_s, t_s) - \epsilon_s)$ with $S$ = `cfg.samples`,
    $t_s \sim U[t_{\min}, 1]$, $\epsilon_s \sim N(0, I)$ and
    $\lambda_t$ = [`retrax.diffusion.reddiff_weight`][]. The predictor's
    output is under `stop_gradient`: one forward pass per draw, never its
    Jacobian (an unbiased estimate of Proposition 2's expression, which is
    not the exact gradient of the score-matching regulariser).

    **Arguments:**

    - `pred`: the noise predictor.
    - `cfg`: the RED-Diff configuration (`lam`, `samples`).
    - `x`: the current estimate, shape `(n,)`.
    - `key`: a PRNG key for the draws.

    **Returns:**

    The gradient estimate, shaped and typed like `x`.
    """
    x = _as_vector("x", x)
    if not is_key(key):
        raise TypeError("`key` must be one PRNG key, e.g. `jax.random.key(0)`.")
    return _regulariser_gradient(pred, cfg, x, key)


def _regulariser_gradient(pred, cfg, x, key):
    sched = pred.schedule
    dtype = x.dtype
    k_t, k_eps = jax.random.split(key)
    t_max = check_value(
        cfg.t_max,
        lambda xp, v: ~(v > sched.t_min),
        "`cfg.t_max` must exceed the schedule's `t_min`.",
    )
    ts = jax.random.uniform(
        k_t, (cfg.samples,), dtype, minval=sched.t_min, maxval=t_max
    )
    eps = jax.random.normal(k_eps, (cfg.samples,) + x.shape, dtype)

    def one(t, e):
        xt = sched.perturb(x, t, e)
        eps_hat = jax.lax.stop_gradient(pred.epsilon(xt, t))
        return reddiff_weight(sched, t, cfg.lam) * (eps_hat - e)

    return jnp.mean(jax.vmap(one)(ts, eps), axis=0)


class REDDiffSolution(AbstractSolution):
    """The result of [`retrax.diffusion.reddiff_solve`][].

    **Attributes:**

    - `value`: the answer: the average of the last `cfg.window` iterates
      (the last iterate when `cfg.average == 0`); NaN when the run failed.
    - `last`: the last iterate; NaN when the run failed.
    - `path`: every iterate, shape `(steps, n)`, when requested with
      `save_path=True` (as computed: a failed run's path shows where it left
      the finite numbers); otherwise `None`.
    - `result`: a [`retrax.diffusion.RESULTS`][] code: `successful` when
      every iterate was finite, `nonfinite_iterate` otherwise. The run has
      no convergence test (a fixed number of steps), so `successful` does
      not say that the answer is a minimum.
    - `stats`: `{"num_steps": ..., "nonfinite_step": ...}`: the number of
      optimiser steps taken (`cfg.steps`), and the first step (counted from
      0) whose iterate was not finite, -1 when none was (see
      [`retrax.diffusion.AbstractSolution`][]).

    `x` is a deprecated alias of `value`.
    """

    value: Float[Array, " n"]
    last: Float[Array, " n"]
    path: Float[Array, "steps n"] | None
    result: RESULTS
    stats: dict[str, Array]

    x = deprecated_property("REDDiffSolution.x", ".value", lambda s: s.value)


def _check_hard(hard, x):
    if hard is None:
        return None
    try:
        mask, values = hard
    except (TypeError, ValueError):
        raise TypeError(
            "`hard` must be a pair `(mask, values)` of a boolean mask and the "
            "clamped values, or None."
        ) from None
    mask = jnp.asarray(mask)
    if mask.dtype != jnp.bool_:
        raise TypeError(f"the hard-clamp mask must be boolean, got dtype {mask.dtype}.")
    values = as_state("values", values)
    if mask.shape != x.shape or values.shape != x.shape:
        raise ValueError(
            f"the hard clamp `(mask, values)` must have the shape of `x_init` "
            f"{x.shape}, got {mask.shape} and {values.shape}."
        )
    values = error_if(
        values, mask & ~jnp.isfinite(values), "the clamped `values` must be finite."
    )
    return mask, jnp.where(mask, values.astype(x.dtype), jnp.zeros((), x.dtype))


@filter_jit
def reddiff_solve(
    pred: AbstractPredictor,
    cfg: REDDiff,
    x_init: Float[ArrayLike, " n"],
    data_grad: Callable[[Float[Array, " n"]], Float[Array, " n"]],
    hard: tuple[Bool[ArrayLike, " n"], Float[ArrayLike, " n"]] | None = None,
    *,
    key: PRNGKeyArray,
    save_path: bool = False,
    throw: bool = True,
) -> REDDiffSolution:
    r"""Solve an inverse problem by RED-Diff (Mardani et al. 2023, Algorithm 1).

    Runs `cfg.steps` steps of Adam (optax) on the gradient
    `data_grad(x)` + [`retrax.diffusion.regulariser_gradient`][], as one jitted
    `lax.scan`. Hard clamps are projections: after every step (and on the
    start) the clamped coordinates are overwritten by their values, so they
    hold exactly throughout.

    With a Gaussian data distribution $N(\mu, v_0 I)$ and
    `cfg.lam = calibrate_lambda(schedule, v0)`, the expected regulariser
    gradient is exactly $(x - \mu)/v_0$, so RED-Diff targets the MAP
    estimate; Adam's constant step leaves a jitter of about `cfg.lr` that
    iterate averaging (`cfg.average`) removes.

    A run whose iterate leaves the finite numbers (a `data_grad` that is NaN
    or inf somewhere on the path, or an `lr` that overflows) fails: its
    result is `RESULTS.nonfinite_iterate`, and `x` and `last` are NaN. With
    `throw=True` (the default) it raises that message instead, eagerly and
    under `jax.jit` (an `eqx.EquinoxRuntimeError`); under `jax.vmap` with
    `throw=False` each example gets its own result, and the others are
    untouched. The run has no convergence test: `successful` says that every
    iterate was finite, not that the answer is a minimum.

    Not differentiable: the run has a fixed number of steps and its
    regulariser is under `stop_gradient`, so a derivative through the
    unrolled steps would be a silent, wrong number. Every derivative of the
    solution is NaN instead; for an answer with derivatives use
    [`retrax.relations.implicit_infer`][] or
    [`retrax.diffusion.prox_infer`][].

    **Arguments:**

    - `pred`: the noise predictor (the prior).
    - `cfg`: the configuration.
    - `x_init`: the start, shape `(n,)`; must be finite.
    - `data_grad`: the gradient of the data term (the negative
      log-likelihood), `data_grad(x) -> g` shaped like `x`. Pass a module or
      a `jax.tree_util.Partial` (not a fresh lambda) to reuse the compilation.
    - `hard`: `(mask, values)`: coordinates where the boolean `mask` is `True`
      are clamped to `values` (entries elsewhere are ignored); or `None`.
    - `key`: a PRNG key for the Monte Carlo draws.
    - `save_path`: also return every iterate.
    - `throw`: whether a run whose iterate became non-finite raises; with
      `throw=False` it returns NaN answers and its result code.

    **Returns:**

    A [`retrax.diffusion.REDDiffSolution`][].
    """
    x = _as_vector("x_init", x_init)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"`x_init` must be real floating, got {x.dtype}.")
    x = error_if(x, ~jnp.all(jnp.isfinite(x)), "`x_init` must be finite.")
    if not is_key(key):
        raise TypeError("`key` must be one PRNG key, e.g. `jax.random.key(0)`.")
    clamp = _check_hard(hard, x)
    out = jax.eval_shape(data_grad, x)
    if getattr(out, "shape", None) != x.shape:
        raise ValueError(
            f"`data_grad(x)` must return an array shaped like `x` {x.shape}, got "
            f"{getattr(out, 'shape', type(out))}."
        )
    dtype = x.dtype

    def project(x):
        if clamp is None:
            return x
        mask, values = clamp
        return jnp.where(mask, values, x)

    optimizer = optax.adam(cfg.lr, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
    x = project(x)
    with jax.numpy_dtype_promotion("standard"):
        opt_state = optimizer.init(x)
    window = cfg.window
    first_avg = cfg.steps - window

    def step(carry, inp):
        x, opt_state, mean, bad = carry
        k, i = inp
        g = data_grad(x).astype(dtype) + _regulariser_gradient(pred, cfg, x, k)
        # optax's Adam mixes Python floats with its int32 step count, which a
        # caller's strict dtype promotion would reject
        with jax.numpy_dtype_promotion("standard"):
            updates, opt_state = optimizer.update(g, opt_state, x)
        x = project(x + updates.astype(dtype))
        # running mean of the iterates i >= first_avg; exact on clamped entries
        count = jnp.maximum(i - first_avg + 1, 1).astype(dtype)
        mean = jnp.where(i >= first_avg, mean + (x - mean) / count, mean)
        # the first step whose iterate is not finite (the clamped entries are
        # finite by construction, so this is the free ones)
        bad = jnp.where((bad < 0) & ~all_finite(x), i, bad)
        return (x, opt_state, mean, bad), (x if save_path else None)

    keys = jax.random.split(key, cfg.steps)
    idx = jnp.arange(cfg.steps)
    inputs = (pred, cfg, x, data_grad, clamp)
    none = jnp.asarray(-1, idx.dtype)
    (x, _, mean, bad), path = jax.lax.scan(step, (x, opt_state, x, none), (keys, idx))
    failed = bad >= 0
    result = RESULTS.where(failed, RESULTS.nonfinite_iterate, RESULTS.successful)
    # a failed run's answer is NaN everywhere, clamped entries included
    nan = jnp.full_like(x, jnp.nan)
    mean = jnp.where(failed, nan, project(mean))
    x = jnp.where(failed, nan, x)
    # Not differentiable: a fixed number of steps with no convergence test, and
    # the regulariser under stop_gradient. NaN derivatives, never a silent number.
    no = jnp.zeros((), bool)
    mean, x = never_silent(mean, inputs, no), never_silent(x, inputs, no)
    if path is not None:
        path = never_silent(path, inputs, no)
    stats = {"num_steps": jnp.asarray(cfg.steps, idx.dtype), "nonfinite_step": bad}
    out = REDDiffSolution(mean, x, path, result, stats)
    return throw_if_failed(out, throw)


def calibrate_lambda(
    schedule: AbstractNoiseSchedule,
    v0: Float[ArrayLike, ""] | float = 1.0,
    *,
    t_max: float = 1.0,
    nodes: int = 64,
) -> Float[Array, ""]:
    r"""The RED-Diff strength that makes the regulariser exact for a Gaussian prior.

    For data $N(\mu, v_0 I)$ the optimal noise predictor is linear, and the
    expected RED-Diff regulariser gradient with $t \sim U[t_{\min}, t_{\max}]$
    collapses to a shrinkage $\kappa (x - \mu)$ with
    $\kappa = \lambda\,\bar f$,
    $\bar f = \frac{1}{t_{\max} - t_{\min}}\int_{t_{\min}}^{t_{\max}}
    \frac{\sigma_t^2}{\alpha_t^2 v_0 + \sigma_t^2}\,dt$, while the true
    negative log-prior gradient is $(x - \mu)/v_0$. Hence
    $\lambda = 1/(v_0 \bar f)$.

    This is the spec's $1/(v_0\int_{t_{\min}}^1 \dots dt)$ times
    $(1 - t_{\min})$: the factor makes it exact for RED-Diff's uniform time
    density $1/(1 - t_{\min})$ (a 0.1% difference at `t_min = 1e-3`).
    The integral is computed by Gauss–Legendre quadrature in JAX's default
    float (the integrand is smooth and analytic on the interval; 64 nodes
    give machine precision).

    **Arguments:**

    - `schedule`: the noise schedule.
    - `v0`: the data variance per coordinate, positive.
    - `t_max`: the largest time RED-Diff draws (`REDDiff.t_max`).
    - `nodes`: the number of quadrature nodes.

    **Returns:**

    $\lambda$, a scalar in JAX's default float dtype.
    """
    if np.ndim(v0) != 0:
        raise ValueError(f"`v0` must be a scalar variance, got shape {np.shape(v0)}.")
    v0 = check_value(
        v0,
        lambda xp, v: ~(v > 0) | ~xp.isfinite(v),
        "`v0` must be a positive finite scalar variance.",
    )
    if not (isinstance(nodes, int) and nodes >= 2):
        raise ValueError(f"`nodes` must be an integer >= 2, got {nodes!r}.")
    t_min = float(schedule.t_min)
    if not t_min < static_float("t_max", t_max) <= 1:
        raise ValueError(f"`t_max` must lie in (t_min, 1] = ({t_min}, 1], got {t_max}.")
    dtype = jnp.result_type(float)
    xg, wg = np.polynomial.legendre.leggauss(nodes)
    t = jnp.asarray(0.5 * (t_max - t_min) * xg + 0.5 * (t_max + t_min), dtype)
    sigma2 = schedule.sigma(t) ** 2
    f = sigma2 / (schedule.alpha(t) ** 2 * jnp.asarray(v0, dtype) + sigma2)
    mean = 0.5 * jnp.sum(jnp.asarray(wg, dtype) * f)  # the integral / (t_max - t_min)
    return 1.0 / (jnp.asarray(v0, dtype) * mean)
