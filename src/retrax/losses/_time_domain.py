r"""Losses on the waveform itself, as auraloss's time-domain losses.

Each is a ratio or a distance of `pred` and `target` along their last axis
(time), one value per signal, reduced over the leading axes (`"mean"`, the
default, `"sum"`, or `"none"` for the per-signal values), with auraloss's
definitions and defaults: `ESRLoss`, `DCLoss`, `LogCoshLoss`, `SNRLoss`,
`SISDRLoss`, `SDSDRLoss`.
"""

import abc
import functools
import math
from typing import ClassVar, Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Real

from .._compiled import compiled
from .._errors import error_if
from .._validate import check_value
from ._stft_loss import (
    Weight,
    check_choice,
    check_signals,
    check_weight,
    power_of_two_scale,
)


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


def _guarded(x: jax.Array) -> jax.Array:
    """`x`, per-signal sums (energies, products), NaN where its square
    overflows the dtype, with derivative 1 everywhere.

    (Its square: the derivative of a ratio divides by its denominator's
    square.) The NaN reaches every value and derivative computed from the
    sum's value, and only those: a derivative that does not read it (the
    ESR's with respect to `pred` reads the target's energy, not the
    error's) stays exact, and in reverse mode never computes the sum at
    all. A derivative that reads it is a per-signal factor times the
    signals, so the signal's whole row of the cotangent is NaN.
    `_rescuable` recomputes what comes out not finite from scaled
    signals."""
    big = math.sqrt(float(jnp.finfo(x.dtype).max))
    poison = jnp.where(jnp.abs(x) <= big, 0, jnp.nan).astype(x.dtype)
    return x + lax.stop_gradient(poison)


def _ratio_db(
    num: jax.Array, den: jax.Array, eps_energy: jax.Array, eps: jax.Array
) -> jax.Array:
    """auraloss's $10 \\log_{10}(n / (d + \\varepsilon) + \\varepsilon)$, the
    first $\\varepsilon$ (`eps_energy`, an energy) scaled with the signals by
    `_rescued`, the second (`eps`, a ratio) not.

    `num` and `den` come through `_guarded`: a non-finite error energy,
    which would give the finite $10 \\log_{10} \\varepsilon$, is NaN
    there (and a non-finite `pred` named by `_checked`)."""
    return 10 * jnp.log10(num / (den + eps_energy) + eps)


def _any_not_finite(x: jax.Array) -> jax.Array:
    return ~jnp.all(jnp.isfinite(x))


def _checked(
    values: jax.Array, pred: jax.Array, target: jax.Array, eps: jax.Array
) -> jax.Array:
    """`values` with the run-time checks that `pred` and `target` are finite
    and that the loss of finite signals is finite.

    Every loss here is non-finite where an input is, so the inputs are only
    read again (to name the one at fault) when the loss is not finite: a
    check of each input on every call would cost two more passes over the
    signals and the copies that `error_if` makes of them, more than these
    losses themselves. A loss of finite signals that is still not finite
    after `_rescued` either divides by zero (`eps=0` and a silent target, or
    an exact prediction of a signal-to-error ratio) or has a value beyond
    the dtype's range: each raises its own error."""
    bad = _any_not_finite(values)
    bad_pred, bad_target = lax.cond(
        bad,
        lambda: (_any_not_finite(pred), _any_not_finite(target)),
        lambda: (jnp.zeros((), bool), jnp.zeros((), bool)),
    )
    values = error_if(values, bad_pred, "`pred` contains non-finite values.")
    values = error_if(values, bad_target, "`target` contains non-finite values.")
    unexplained = bad & ~bad_pred & ~bad_target
    values = error_if(
        values,
        unexplained & (eps == 0),
        "The loss divides by zero: `eps` is 0 and `target` is silent (zero "
        "energy; for SNR, SI-SDR and SD-SDR also an exact prediction). Pass "
        "`eps > 0`.",
    )
    return error_if(
        values,
        unexplained & (eps != 0),
        f"The loss of these finite signals is not finite in {values.dtype}: its "
        "value lies beyond the dtype's range (as the ESR of a `pred` 1e20 times "
        "larger than `target` does in float32), or the signals' scales differ "
        "by more than the dtype spans. Compute it in float64, or bring `pred` "
        "and `target` to a common scale.",
    )


def _rescued(
    loss: "AbstractTimeDomainLoss", pred: jax.Array, target: jax.Array, eps: jax.Array
) -> jax.Array:
    r"""`loss.per_signal` computed from the signals scaled by a power of two
    $c$ (per signal, where its peak exceeds $M^{1/4} / \sqrt{16 T}$, $M$ the
    dtype's largest value and $T$ the samples: then no energy or product of
    the formulas, nor its square, overflows) with the energy regulariser
    scaled by $c^2$: the ratios are unchanged (each is a ratio of energies,
    the regulariser of the energies scaled with them), and a power of two
    rounds nothing, so they are finite wherever their value is and equal the
    direct formulas' elsewhere (where $c = 1$, they are the direct
    formulas). Still not finite: a non-finite input (named by `_checked`),
    or sums beyond the dtype's range even so."""
    peak = jnp.maximum(
        jnp.max(jnp.abs(pred), axis=-1, keepdims=True),
        jnp.max(jnp.abs(target), axis=-1, keepdims=True),
    )
    limit = math.sqrt(
        math.sqrt(float(jnp.finfo(pred.dtype).max)) / (16 * pred.shape[-1])
    )
    c = power_of_two_scale(peak, limit)
    return loss.per_signal(c * pred, c * target, eps, eps * c[..., 0] ** 2)


def _unless_finite(x: jax.Array, check: jax.Array, recompute) -> jax.Array:
    """`x`, or `recompute()` if `check` (`x`, or a part of it that is not
    finite wherever `x` is not) is not finite. Under `vmap` it stays one
    branch: the recomputed values equal the others up to rounding, so the
    whole batch may take it."""
    bad = eqx.internal.unvmap_any(~jnp.all(jnp.isfinite(check)))
    # (a no-op select that makes `x` wait for the check: XLA then runs the
    # check before the loop that writes `x`, which may then write over a
    # temporary it reads; checked after it, the temporary stays alive and
    # the SNR's gradient costs 7% more)
    x = jnp.where(bad, jnp.zeros((), x.dtype), x)
    return lax.cond(bad, recompute, lambda: x)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _rescuable(
    loss: "AbstractTimeDomainLoss", pred: jax.Array, target: jax.Array, eps: jax.Array
) -> jax.Array:
    """`loss.per_signal` of a `scale_invariant` loss (its static part:
    `eps` comes as an argument), recomputed by `_rescued` where the direct
    formulas' sums overflow.

    Its derivative is that of the direct formulas unless that is not
    finite, and then `_rescued`'s. A `lax.cond` would cost the common case
    in reverse mode: JAX keeps the rescue branch's residuals (arrays the
    size of the signals, zero when it is not taken) and adds its zero
    cotangent to the other's, and the flags that choose the branch need
    every sum of the loss, while the derivative with respect to `pred` may
    need fewer (the ESR's needs only the target's energy). Here each
    cotangent is computed directly and only one that is not finite (which
    `_guarded` makes it wherever it read an overflowing sum) is recomputed,
    so reverse mode costs what the direct formulas' derivative costs.
    Forward mode (`jax.jvp`, `jax.jacfwd`) is not defined for it."""
    values = loss.per_signal(pred, target, eps, eps)
    return _unless_finite(values, values, lambda: _rescued(loss, pred, target, eps))


def _rescuable_fwd(loss, pred, target, eps):
    values, vjp = jax.vjp(
        lambda p, t, e: loss.per_signal(p, t, e, e), pred, target, eps
    )
    values = _unless_finite(values, values, lambda: _rescued(loss, pred, target, eps))
    return values, (vjp, pred, target, eps)


def _rescuable_bwd(loss, residuals, cotangent):
    vjp, pred, target, eps = residuals
    direct = vjp(cotangent)

    def rescued(i: int) -> jax.Array:
        _, rescued_vjp = jax.vjp(functools.partial(_rescued, loss), pred, target, eps)
        return rescued_vjp(cotangent)[i]

    # (a row of a signal's cotangent is NaN throughout or not at all, see
    # `_guarded`: its first sample tells, without another pass over it; the
    # cotangents are checked one by one, so that one not asked for is not
    # computed)
    return tuple(
        _unless_finite(d, d[..., :1] if d.ndim else d, functools.partial(rescued, i))
        for i, d in enumerate(direct)
    )


_rescuable.defvjp(_rescuable_fwd, _rescuable_bwd)


class AbstractTimeDomainLoss(eqx.Module):
    """A loss of `pred` against `target` computed per signal along the last
    axis, then reduced over the leading axes.

    Subclasses define `per_signal`, on checked signals of one float dtype,
    and say whether it is `scale_invariant`: a ratio of energies, unchanged
    when both signals and the energy regulariser are scaled together (then a
    loss whose squares overflow the dtype is computed from scaled signals).
    """

    eps: eqx.AbstractVar[Weight]
    reduction: eqx.AbstractVar[Reduction]
    scale_invariant: eqx.AbstractClassVar[bool]

    @abc.abstractmethod
    def per_signal(
        self, pred: jax.Array, target: jax.Array, eps: jax.Array, eps_energy: jax.Array
    ) -> jax.Array:
        """The loss of each signal, `pred.shape[:-1]`, with `eps` the loss's
        `eps` in the signals' dtype (read in place of the field, which
        `_rescuable` does not hold) and `eps_energy` the regulariser of the
        energies (`eps`, or `eps` scaled with the signals: one value per
        signal). The sums of a `scale_invariant` loss come through
        `_guarded`."""

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
        run-time error under `jit`). Finite signals give a finite loss: the
        ratios are computed from signals scaled down by a power of two where
        their energies' squares would overflow the dtype; a loss whose value
        itself lies beyond the dtype's range, or that divides by zero
        (`eps=0` with a silent `target`), raises an error saying which (at
        run time under `jit`).

        Differentiable in reverse mode (`jax.grad`, `jax.vjp`, and
        `jax.hessian`, forward over reverse). The ratios (every loss here but
        `LogCoshLoss`) have no forward mode: `jax.jvp` and `jax.jacfwd` raise
        `TypeError`, as their derivative is a reverse-mode rule that
        recomputes scaled signals only where the direct one is not finite, at
        no cost to the others.
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
    eps = loss._eps(pred)
    if loss.scale_invariant:
        # (the static part: `eps` is an argument, which may be traced)
        values = _rescuable(
            eqx.filter(loss, eqx.is_array, inverse=True), pred, target, eps
        )
    else:
        values = loss.per_signal(pred, target, eps, eps)
    values = _checked(values, pred, target, eps)
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

    scale_invariant: ClassVar[bool] = True

    def per_signal(
        self, pred: jax.Array, target: jax.Array, eps: jax.Array, eps_energy: jax.Array
    ) -> jax.Array:
        error, energy = _guarded(_energy(target - pred)), _guarded(_energy(target))
        return error / (energy + eps_energy)


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

    scale_invariant: ClassVar[bool] = True

    def per_signal(
        self, pred: jax.Array, target: jax.Array, eps: jax.Array, eps_energy: jax.Array
    ) -> jax.Array:
        num = _guarded(jnp.mean(target - pred, axis=-1) ** 2)
        power = _guarded(jnp.mean(target * target, axis=-1))
        return num / (power + eps_energy)


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
        self.a = check_value(
            a,
            lambda xp, v: ~xp.isfinite(v) | (v <= 0),
            f"`a` must be a finite number > 0, got {a!r}.",
        )

    scale_invariant: ClassVar[bool] = False

    def per_signal(
        self, pred: jax.Array, target: jax.Array, eps: jax.Array, eps_energy: jax.Array
    ) -> jax.Array:
        a = jnp.asarray(self.a).astype(pred.dtype)
        # a traced `a` (a Python or concrete one was checked when built)
        a = error_if(a, ~jnp.isfinite(a) | (a <= 0), "`a` must be a finite number > 0.")
        x = a * (pred - target)
        # log(cosh x + eps) = log(e^x / 2 + e^-x / 2 + eps)
        log_cosh = jnp.logaddexp(x, -x) - math.log(2)
        return jnp.mean(jnp.logaddexp(log_cosh, jnp.log(eps)) / a, axis=-1)


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

    scale_invariant: ClassVar[bool] = True

    def per_signal(
        self, pred: jax.Array, target: jax.Array, eps: jax.Array, eps_energy: jax.Array
    ) -> jax.Array:
        if self.zero_mean:
            pred, target = _centred(pred), _centred(target)
        return -self.ratio(pred, target, eps_energy, eps)

    @abc.abstractmethod
    def ratio(
        self, pred: jax.Array, target: jax.Array, eps_energy: jax.Array, eps: jax.Array
    ) -> jax.Array:
        """The ratio in dB of each signal, with `eps_energy` the regulariser
        of the energies and `eps` that of the ratio, its sums through
        `_guarded`."""


def _scaled_energy(
    pred: jax.Array, target: jax.Array, eps: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """The least-squares gain $\\alpha$ of `target` onto `pred`, as auraloss
    forms it, and the energy of the scaled target, $\\alpha^2 \\sum_t y_t^2$
    (auraloss sums the squares of $\\alpha y$, equal up to rounding: here
    the scaled target is never formed, one pass over the signals fewer),
    through `_guarded`."""
    target_energy = _guarded(_energy(target))
    alpha = _guarded(jnp.sum(pred * target, axis=-1)) / (target_energy + eps)
    # (alpha times alpha y's energy, not alpha squared: for a target far
    # smaller than the prediction, alpha squared alone may overflow)
    return alpha, _guarded(alpha * (alpha * target_energy))


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

    def ratio(
        self, pred: jax.Array, target: jax.Array, eps_energy: jax.Array, eps: jax.Array
    ) -> jax.Array:
        num, den = _guarded(_energy(target)), _guarded(_energy(pred - target))
        return _ratio_db(num, den, eps_energy, eps)


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

    def ratio(
        self, pred: jax.Array, target: jax.Array, eps_energy: jax.Array, eps: jax.Array
    ) -> jax.Array:
        alpha, scaled_energy = _scaled_energy(pred, target, eps_energy)
        error = _guarded(_energy(pred - alpha[..., None] * target))
        return _ratio_db(scaled_energy, error, eps_energy, eps)


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

    def ratio(
        self, pred: jax.Array, target: jax.Array, eps_energy: jax.Array, eps: jax.Array
    ) -> jax.Array:
        _, scaled_energy = _scaled_energy(pred, target, eps_energy)
        error = _guarded(_energy(pred - target))
        return _ratio_db(scaled_energy, error, eps_energy, eps)
