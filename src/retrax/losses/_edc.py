"""Energy decay curves (Schroeder integration), decay times, and a loss on them."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._errors import error_if
from .._misc import as_inexact
from .._validate import check_positive_int, check_rate, static_float
from ._octave import octave_band_sos, octave_band_split
from ._stft_loss import check_choice, check_signals


def _checked_eps(eps) -> float:
    eps = static_float("eps", eps)
    if not (eps >= 0 and eps < float("inf")):
        raise ValueError(f"`eps` must be a finite number >= 0, got {eps!r}.")
    return eps


def _check(x, pred, msg: str):
    """`x`, raising `msg` where `pred` holds: `ValueError` at once when
    `pred` is concrete, at run time (`error_if`) when it is traced."""
    if isinstance(pred, jax.core.Tracer):
        return error_if(x, pred, msg)
    if bool(pred):
        raise ValueError(msg)
    return x


def _real_signals(name: str, x: ArrayLike) -> jax.Array:
    x = as_inexact(name, x)
    if jnp.iscomplexobj(x) or x.ndim < 1 or x.shape[-1] < 1:
        raise ValueError(
            f"`{name}` must be real signals with time last, `(..., time)` with "
            f"time >= 1, got shape {x.shape} and dtype {x.dtype}."
        )
    return x


def _edc(x: jax.Array, normalize: bool, eps: float) -> jax.Array:
    energy = jnp.cumsum((x * x)[..., ::-1], axis=-1)[..., ::-1]
    if normalize:
        total = energy[..., :1]
        positive = total > 0
        energy = jnp.where(positive, energy / jnp.where(positive, total, 1), 0)
    return 10 * jnp.log10(energy + jnp.asarray(eps, x.dtype))


def energy_decay_curve(
    x: Real[ArrayLike, "*batch time"],
    *,
    normalize: bool = True,
    eps: float = 0.0,
) -> Float[Array, "*batch time"]:
    r"""The energy decay curve of impulse responses, in dB.

    Schroeder's backward integration ("New method of measuring reverberation
    time", JASA 1965): $E(t) = \sum_{\tau \ge t} x[\tau]^2$, returned as
    $10 \log_{10}(E(t)/E(0) + \varepsilon)$ (`normalize=True`, so the curve
    starts at 0 dB) or $10 \log_{10}(E(t) + \varepsilon)$. The sum runs to
    the end of the signal, without compensation for a noise floor.

    **Arguments:**

    - `x`: real impulse responses, time last, `(..., time)`; one curve per
      leading index (e.g. per band of `octave_band_split`).
    - `normalize`: divide by the total energy $E(0)$ (an all-zero signal
      then gives $10\log_{10}\varepsilon$).
    - `eps`: $\varepsilon \ge 0$, a floor under the energies (a Python
      float). With `eps=0` the curve is exact but $-\infty$ where the
      remaining energy is zero (e.g. trailing zeros), where derivatives are
      not finite; a small `eps` (e.g. `1e-10`, a floor 100 dB down) keeps
      them finite.

    **Returns:**

    The curve in dB, the shape of `x`, in its float dtype. jits, vmaps and
    differentiates.
    """
    x = _real_signals("x", x)
    return _edc(x, normalize, _checked_eps(eps))


def t60_from_edc(
    edc: Real[ArrayLike, "*batch time"],
    sample_rate: float | int,
    *,
    start_db: float = -5.0,
    stop_db: float = -35.0,
) -> Float[Array, "*batch"]:
    r"""The reverberation time $T_{60}$ from an energy decay curve.

    The least-squares line through the curve's samples between `start_db`
    and `stop_db` below its first sample (ISO 3382-1's $T_{30}$ with the
    defaults, -5 to -35 dB), extrapolated to a 60 dB decay:
    $T_{60} = -60 / s$ for the fitted slope $s$ in dB per second.

    **Arguments:**

    - `edc`: energy decay curves in dB, time last, `(..., time)`, e.g. from
      `energy_decay_curve`; each must fall to `stop_db` below its start.
    - `sample_rate`: the sample rate in Hz, a finite Python number > 0.
    - `start_db`, `stop_db`: the fit's range in dB relative to the start,
      `0 >= start_db > stop_db` (Python floats).

    **Returns:**

    $T_{60}$ in seconds, shape `edc.shape[:-1]`. Differentiable with
    respect to the curve's samples inside the range (the range itself is
    held fixed). A curve that holds a NaN or $+\infty$ anywhere (the
    $-\infty$ of zero remaining energy is allowed), does not fall to
    `stop_db`, has fewer than two samples in the range, is not finite at its
    start or rises over the range (a non-negative slope) raises an error
    naming `edc`: `ValueError` at once for a concrete curve, at run time
    under `jax.jit` (never a decay time fitted around the bad samples). A
    `sample_rate` that is not a finite number > 0 raises `ValueError`.
    """
    edc = _real_signals("edc", edc)
    fs = check_rate("sample_rate", static_float("sample_rate", sample_rate))
    start_db = static_float("start_db", start_db)
    stop_db = static_float("stop_db", stop_db)
    if not 0 >= start_db > stop_db:
        raise ValueError(
            "`start_db` and `stop_db` must satisfy 0 >= start_db > stop_db, got "
            f"start_db={start_db!r}, stop_db={stop_db!r}."
        )
    edc = _check(
        edc,
        jnp.any(jnp.isnan(edc) | (edc == jnp.inf)),
        "`edc` holds NaN or +inf entries: an energy decay curve in dB is finite "
        "(or -inf where no energy remains).",
    )
    edc = _check(
        edc,
        ~jnp.all(jnp.isfinite(edc[..., 0])),
        "`edc` must be finite at its first sample (the level it is measured from).",
    )
    level = edc - edc[..., :1]
    edc = _check(
        edc,
        ~jnp.all(jnp.any(level <= stop_db, axis=-1)),
        f"`edc` does not fall to {stop_db} dB below its start: the response is "
        "too short (or too noisy) to measure a decay time; lengthen it, or raise "
        "`stop_db`.",
    )
    inside = (level <= start_db) & (level >= stop_db)
    count = jnp.sum(inside, axis=-1)
    edc = _check(
        edc,
        ~jnp.all(count >= 2),
        f"`edc` has fewer than two samples between {start_db} and {stop_db} dB: "
        "it falls too fast to fit a line at this sample rate.",
    )
    level = edc - edc[..., :1]
    w = inside.astype(edc.dtype)
    n = jnp.maximum(count, 2).astype(edc.dtype)
    t = jnp.arange(edc.shape[-1], dtype=edc.dtype) / jnp.asarray(fs, edc.dtype)
    y = jnp.where(inside, level, 0)
    t_mean = jnp.sum(w * t, axis=-1, keepdims=True) / n[..., None]
    y_mean = jnp.sum(y, axis=-1, keepdims=True) / n[..., None]
    dt = w * (t - t_mean)
    slope = jnp.sum(dt * (y - y_mean), axis=-1) / jnp.sum(dt * dt, axis=-1)
    slope = _check(
        slope,
        ~jnp.all(slope < 0),
        "`edc` does not decay over the fitted range (its fitted slope is not "
        "negative): an energy decay curve decreases with time.",
    )
    return -60.0 / slope


class EnergyDecayLoss(eqx.Module):
    r"""The mean absolute (or squared) difference of energy decay curves in dB.

    With $L_{pred}$, $L_{target}$ the `energy_decay_curve`s of the two
    signals (broadband, or of each fractional-octave band of
    `octave_band_split` when `fraction` is given), the loss is the mean over
    samples, bands and signals of $|L_{pred} - L_{target}|$ (`"L1"`) or
    $(L_{pred} - L_{target})^2$ (`"L2"`): a loss on how a reverb's impulse
    response decays, per band, whatever its fine structure (two noises with
    the same decay are close). Signals are `(time,)`, `(channels, time)` or
    `(batch, channels, time)`.

    **Arguments:**

    - `sample_rate`: the signals' sample rate in Hz, a finite number > 0;
      needed with `fraction`, otherwise unused (may be `None`).
    - `fraction`: `None` for one broadband curve, or $b$ for curves per
      $1/b$-octave band (1: octave bands, 3: third-octave bands).
    - `f_min`, `f_max`, `order`: the bands and their Butterworth filters, as
      in `octave_band_sos`.
    - `normalize`: compare curves each relative to its own total energy (the
      shape of the decay; default), or absolute energies in dB (also the
      level).
    - `eps`: the floor under the energies, as in `energy_decay_curve`, > 0 so
      that the loss differentiates where a curve ends (default `1e-7`, 70 dB
      down).
    - `distance`: `"L1"` or `"L2"`.

    Invalid settings raise `ValueError` naming the argument.
    """

    sample_rate: float | None = eqx.field(static=True)
    fraction: int | None = eqx.field(static=True)
    f_min: float = eqx.field(static=True)
    f_max: float | None = eqx.field(static=True)
    order: int = eqx.field(static=True)
    normalize: bool = eqx.field(static=True)
    eps: float = eqx.field(static=True)
    distance: Literal["L1", "L2"] = eqx.field(static=True)

    def __init__(
        self,
        sample_rate: float | int | None = None,
        fraction: int | None = None,
        f_min: float | int = 20.0,
        f_max: float | int | None = None,
        order: int = 3,
        normalize: bool = True,
        eps: float | int = 1e-7,
        distance: Literal["L1", "L2"] = "L1",
    ):
        check_choice("distance", distance, ("L1", "L2"))
        eps = _checked_eps(eps)
        if eps == 0:
            raise ValueError(
                "`eps` must be > 0 for a loss (its derivative is not finite where "
                "a curve reaches zero energy), got 0."
            )
        if sample_rate is not None:
            sample_rate = check_rate("sample_rate", sample_rate)
        if fraction is not None:
            if sample_rate is None:
                raise ValueError("`sample_rate` is needed for bands (`fraction`).")
            check_positive_int("fraction", fraction)
            # Checks sample_rate, the bands and order.
            octave_band_sos(sample_rate, fraction, f_min, f_max, order)
        self.sample_rate = None if sample_rate is None else float(sample_rate)
        self.fraction = fraction
        self.f_min = float(f_min)
        self.f_max = None if f_max is None else float(f_max)
        self.order = order
        self.normalize = normalize
        self.eps = eps
        self.distance = distance

    def curves(self, x: jax.Array) -> jax.Array:
        """The curves the loss compares, in dB: `(..., time)`, or
        `(..., bands, time)` with `fraction`."""
        if self.fraction is not None:
            x = octave_band_split(
                x, self.sample_rate, self.fraction, self.f_min, self.f_max,
                self.order,
            )  # fmt: skip
        return _edc(x, self.normalize, self.eps)

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""]:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype. Mismatched shapes or
        non-finite signals raise an error naming the argument.
        """
        pred, target = check_signals(pred, target, 1, fft=False)
        d = self.curves(pred) - self.curves(target)
        # sign(d) * d: |d| with a zero derivative where the curves meet.
        return jnp.mean(jnp.sign(d) * d if self.distance == "L1" else d * d)
