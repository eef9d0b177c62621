r"""Losses on the waveform itself, as auraloss's time-domain losses.

Each is a ratio or a distance of `pred` and `target` along their last axis
(time), one value per signal, reduced over the leading axes (`"mean"`, the
default, `"sum"`, or `"none"` for the per-signal values), with auraloss's
definitions and defaults: `ESRLoss`, `DCLoss`, `LogCoshLoss`, `SNRLoss`,
`SISDRLoss`, `SDSDRLoss`.
"""

import abc
import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Real

from .._compiled import compiled
from .._errors import error_if
from ._stft_loss import Weight, check_choice, check_signals, check_weight


Reduction = Literal["mean", "sum", "none"]
REDUCTIONS = ("mean", "sum", "none")


def _reduce(losses: jax.Array, reduction: str) -> jax.Array:
    if reduction == "mean":
        return jnp.mean(losses)
    if reduction == "sum":
        return jnp.sum(losses)
    return losses


def _centred(x: jax.Array) -> jax.Array:
    return x - jnp.mean(x, axis=-1, keepdims=True)


def _energy(x: jax.Array) -> jax.Array:
    return jnp.sum(x * x, axis=-1)


def _ratio_db(num: jax.Array, den: jax.Array, eps: jax.Array) -> jax.Array:
    """auraloss's $10 \\log_{10}(n / (d + \\varepsilon) + \\varepsilon)$.

    Plus `0 * den`, which is 0 (value and derivative unchanged) unless the
    denominator is not finite: an infinite error energy would otherwise give
    the finite $10 \\log_{10} \\varepsilon$, hiding a non-finite `pred` from
    the check on the loss's value (see `_checked`)."""
    return 10 * jnp.log10(num / (den + eps) + eps) + 0 * den


def _any_not_finite(x: jax.Array) -> jax.Array:
    return ~jnp.all(jnp.isfinite(x))


def _checked(values: jax.Array, pred: jax.Array, target: jax.Array) -> jax.Array:
    """`values` with the run-time check that `pred` and `target` are finite.

    Every loss here is non-finite where an input is, so the inputs are only
    read again (to name the one at fault) when the loss is not finite: a
    check of each input on every call would cost two more passes over the
    signals and the copies that `error_if` makes of them, more than these
    losses themselves. A finite input whose squares overflow leaves the
    value non-finite without an error, as before the check."""
    bad = _any_not_finite(values)
    bad_pred, bad_target = lax.cond(
        bad,
        lambda: (_any_not_finite(pred), _any_not_finite(target)),
        lambda: (jnp.zeros((), bool), jnp.zeros((), bool)),
    )
    values = error_if(values, bad_pred, "`pred` contains non-finite values.")
    return error_if(values, bad_target, "`target` contains non-finite values.")


class AbstractTimeDomainLoss(eqx.Module):
    """A loss of `pred` against `target` computed per signal along the last
    axis, then reduced over the leading axes.

    Subclasses define `per_signal`, on checked signals of one float dtype.
    """

    eps: eqx.AbstractVar[Weight]
    reduction: eqx.AbstractVar[Reduction]

    @abc.abstractmethod
    def per_signal(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        """The loss of each signal: `pred.shape[:-1]`."""

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, "..."]:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar with `reduction="mean"` (the mean over signals) or `"sum"`;
        with `"none"`, one value per signal, shape `pred.shape[:-1]`. Raises
        `ValueError` for mismatched or empty shapes, or non-finite values (a
        run-time error under `jit`).
        """
        pred, target = check_signals(pred, target, 1, fft=False, finite=False)
        return _loss(self, pred, target)

    def _eps(self, like: jax.Array) -> jax.Array:
        return jnp.asarray(self.eps).astype(like.dtype)


@compiled()
def _loss(
    loss: AbstractTimeDomainLoss, pred: jax.Array, target: jax.Array
) -> jax.Array:
    """The reduced loss, compiled as a whole: an eager call costs one
    dispatch, not one per operation (and inside a user's `jax.jit`, it is
    inlined)."""
    values = _checked(loss.per_signal(pred, target), pred, target)
    return _reduce(values, loss.reduction)


def _init(self, eps: Weight, reduction: Reduction) -> None:
    check_choice("reduction", reduction, REDUCTIONS)
    self.eps = check_weight("eps", eps)
    self.reduction = reduction


class ESRLoss(AbstractTimeDomainLoss):
    r"""The error-to-signal ratio, as auraloss's `ESRLoss` (Wright and
    Välimäki, 2019):

    $$\frac{\sum_t (y_t - \hat y_t)^2}{\sum_t y_t^2 + \varepsilon}$$

    per signal, with $\hat y$ the prediction and $y$ the target.

    **Arguments:**

    - `eps`: added to the target's energy, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    eps: Weight
    reduction: Reduction = eqx.field(static=True)

    def __init__(self, eps: Weight = 1e-8, reduction: Reduction = "mean"):
        _init(self, eps, reduction)

    def per_signal(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        return _energy(target - pred) / (_energy(target) + self._eps(pred))


class DCLoss(AbstractTimeDomainLoss):
    r"""The DC error, as auraloss's `DCLoss` (Wright and Välimäki, 2019):

    $$\frac{\big(\tfrac1T \sum_t (y_t - \hat y_t)\big)^2}
    {\tfrac1T \sum_t y_t^2 + \varepsilon}$$

    per signal of $T$ samples.

    **Arguments:**

    - `eps`: added to the target's mean power, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    eps: Weight
    reduction: Reduction = eqx.field(static=True)

    def __init__(self, eps: Weight = 1e-8, reduction: Reduction = "mean"):
        _init(self, eps, reduction)

    def per_signal(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        num = jnp.mean(target - pred, axis=-1) ** 2
        return num / (jnp.mean(target * target, axis=-1) + self._eps(pred))


class LogCoshLoss(AbstractTimeDomainLoss):
    r"""The log-cosh distance, as auraloss's `LogCoshLoss` (Chen et al., 2019):

    $$\frac1T \sum_t \frac1a \log\big(\cosh(a (\hat y_t - y_t)) + \varepsilon\big)$$

    per signal of $T$ samples: about $a d^2 / 2$ for small differences $d$
    and $|d| - \log 2 / a$ for large ones. It is computed as a log-sum-exp,
    so it stays finite where $\cosh$ would overflow (auraloss returns `inf`
    there); elsewhere it equals auraloss's.

    **Arguments:**

    - `a`: the smoothness, > 0 (smaller is smoother; default 1).
    - `eps`: added inside the logarithm, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    a: Weight
    eps: Weight
    reduction: Reduction = eqx.field(static=True)

    def __init__(
        self, a: Weight = 1.0, eps: Weight = 1e-8, reduction: Reduction = "mean"
    ):
        _init(self, eps, reduction)
        self.a = check_weight("a", a)
        if isinstance(a, int | float) and a == 0:
            raise ValueError("`a` must be a finite number > 0, got 0.")

    def per_signal(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        a = jnp.asarray(self.a).astype(pred.dtype)
        x = a * (pred - target)
        # log(cosh x + eps) = log(e^x / 2 + e^-x / 2 + eps)
        log_cosh = jnp.logaddexp(x, -x) - math.log(2)
        value = jnp.logaddexp(log_cosh, jnp.log(self._eps(pred)))
        return jnp.mean(value / a, axis=-1)


class _AbstractSignalToError(AbstractTimeDomainLoss):
    """The negative of a signal-to-error ratio in dB, with auraloss's
    optional removal of each signal's mean first."""

    zero_mean: bool = eqx.field(static=True)
    eps: Weight
    reduction: Reduction = eqx.field(static=True)

    def __init__(
        self, zero_mean: bool = True, eps: Weight = 1e-8, reduction: Reduction = "mean"
    ):
        _init(self, eps, reduction)
        if not isinstance(zero_mean, bool):
            raise TypeError(f"`zero_mean` must be a bool, got {zero_mean!r}.")
        self.zero_mean = zero_mean

    def per_signal(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        if self.zero_mean:
            pred, target = _centred(pred), _centred(target)
        return -self.ratio(pred, target, self._eps(pred))

    @abc.abstractmethod
    def ratio(self, pred: jax.Array, target: jax.Array, eps: jax.Array) -> jax.Array:
        """The ratio in dB of each signal."""


def _scaled_energy(
    pred: jax.Array, target: jax.Array, eps: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The least-squares gain $\\alpha$ of `target` onto `pred`, as auraloss
    forms it, and the energy of the scaled target, $\\alpha^2 \\sum_t y_t^2$
    (auraloss sums the squares of $\\alpha y$, equal up to rounding: here
    the scaled target is never formed, one pass over the signals fewer)."""
    target_energy = _energy(target)
    alpha = jnp.sum(pred * target, axis=-1) / (target_energy + eps)
    return alpha, alpha * alpha * target_energy


class SNRLoss(_AbstractSignalToError):
    r"""The negative signal-to-noise ratio in dB, as auraloss's `SNRLoss`:

    $$-10 \log_{10}\Big(\frac{\sum_t y_t^2}{\sum_t (\hat y_t - y_t)^2
    + \varepsilon} + \varepsilon\Big)$$

    per signal, after removing each signal's mean if `zero_mean`.

    **Arguments:**

    - `zero_mean`: remove the mean of `pred` and of `target` first (default
      `True`).
    - `eps`: the two regularisers above, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    def ratio(self, pred: jax.Array, target: jax.Array, eps: jax.Array) -> jax.Array:
        return _ratio_db(_energy(target), _energy(pred - target), eps)


class SISDRLoss(_AbstractSignalToError):
    r"""The negative scale-invariant signal-to-distortion ratio in dB, as
    auraloss's `SISDRLoss` (Le Roux et al., 2018): with
    $\alpha = \sum_t \hat y_t y_t / (\sum_t y_t^2 + \varepsilon)$,

    $$-10 \log_{10}\Big(\frac{\sum_t (\alpha y_t)^2}{\sum_t (\hat y_t -
    \alpha y_t)^2 + \varepsilon} + \varepsilon\Big)$$

    per signal, after removing each signal's mean if `zero_mean`.

    **Arguments:**

    - `zero_mean`: remove the mean of `pred` and of `target` first (default
      `True`).
    - `eps`: the regularisers above, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    def ratio(self, pred: jax.Array, target: jax.Array, eps: jax.Array) -> jax.Array:
        alpha, scaled_energy = _scaled_energy(pred, target, eps)
        error = _energy(pred - alpha[..., None] * target)
        return _ratio_db(scaled_energy, error, eps)


class SDSDRLoss(_AbstractSignalToError):
    r"""The negative scale-dependent signal-to-distortion ratio in dB, as
    auraloss's `SDSDRLoss` (Le Roux et al., 2018): with $\alpha$ as in
    [`SISDRLoss`][retrax.losses.SISDRLoss],

    $$-10 \log_{10}\Big(\frac{\sum_t (\alpha y_t)^2}{\sum_t (\hat y_t -
    y_t)^2 + \varepsilon} + \varepsilon\Big)$$

    per signal (the error against the unscaled target), after removing each
    signal's mean if `zero_mean`.

    **Arguments:**

    - `zero_mean`: remove the mean of `pred` and of `target` first (default
      `True`).
    - `eps`: the regularisers above, >= 0 (default `1e-8`).
    - `reduction`: `"mean"` (default), `"sum"` or `"none"` over the signals.
    """

    def ratio(self, pred: jax.Array, target: jax.Array, eps: jax.Array) -> jax.Array:
        _, scaled_energy = _scaled_energy(pred, target, eps)
        return _ratio_db(scaled_energy, _energy(pred - target), eps)
