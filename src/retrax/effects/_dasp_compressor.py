r"""dasp-pytorch's compressor, by its definition.

dasp-pytorch 0.0.1's `dasp_pytorch.functional.compressor` (Steinmetz,
Bryan and Reiss, JAES 2022) differs from retrax's
[`Compressor`][retrax.filters.Compressor] in each stage: its detector is
$|x|$ in dB of the channels' sum (a linked side-chain, no RMS), its gain is
smoothed in dB by one one-pole lowpass with the attack constant only (the
release time is taken and unused), and that lowpass is applied by frequency
sampling (its `lfilter_via_fsm`): with $N = 2^{\lceil \log_2 (2T - 1)\rceil}$
for a signal of $T$ samples,

$$\bar g = \mathrm{irfft}_N\big(\mathrm{rfft}_N(g)\, H\big)_{0:T},\qquad
H_k = \frac{1 - \alpha}{1 - \alpha e^{-2\pi i k / N}},$$

the response of $b = (1 - \alpha, 0)$, $a = (1, -\alpha)$ sampled at $N$
frequencies. That is a circular convolution of the zero-padded gain with the
$N$-periodic impulse response $(1 - \alpha)\alpha^n / (1 - \alpha^N)$, not
the causal recursion: with a long attack and a short signal the last samples'
gain leaks into the first ones. The FFT is the definition, so this module
computes the same FFT (its derivative is the FFT's, no adjoint recursion).

The one numerical choice: the denominator is evaluated as
$(1 - \alpha) + \alpha\,(2 \sin^2(\pi k / N) + i \sin(2\pi k / N))$, which is
$1 - \alpha e^{-2\pi i k/N}$ without the cancellation of $1 - \alpha\cos$ near
$k = 0$ (with a 100 ms attack $1 - \alpha \approx 5 \cdot 10^{-4}$): in
float32 it keeps the response to the float32 precision, where dasp's own
float32 FFT of $a$ is off by up to $10^{-4}$ at the first bins.
"""

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._deprecated import warn_deprecated
from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._signal import no_state, output, signal
from .._validate import check_delay, check_rate


def _check_eps(value: object) -> float:
    """The detector's floor, a static positive Python number."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise ValueError(f"`eps` must be a positive Python number, got {value!r}.")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"`eps` must be a positive Python number, got {value!r}.")
    return float(value)


def _makeup_db(makeup_db: object, makeup_gain_db: object) -> object:
    """The make-up gain from `makeup_db` or its deprecated spelling
    `makeup_gain_db` (one of them, default 0 dB)."""
    if makeup_gain_db is None:
        return 0.0 if makeup_db is None else makeup_db
    if makeup_db is not None:
        raise ValueError(
            "Pass the make-up gain once, as `makeup_db` (`makeup_gain_db` is its "
            "deprecated spelling)."
        )
    warn_deprecated(
        "`DaspCompressor(makeup_gain_db=...)` is deprecated; pass `makeup_db=...` "
        "(spelt as retrax's other gains in dB, e.g. `Compressor.makeup_db`)."
    )
    return makeup_gain_db


def _fft_length(time: int) -> int:
    """dasp's FFT length, $2^{\\lceil \\log_2(2T - 1) \\rceil}$, with its
    logarithm taken in float32 as torch takes it of an integer tensor."""
    return int(2 ** np.ceil(np.log2(np.float32(2 * time - 1))))


def _smooth(g: Array, alpha: Array) -> Array:
    """dasp's `lfilter_via_fsm(g, [1 - alpha, 0], [1, -alpha])` of one gain
    curve `(T,)`: the one-pole lowpass sampled at `N` frequencies."""
    time = g.shape[-1]
    n = _fft_length(time)
    dtype = g.dtype
    b0 = 1 - alpha
    if n == 1:
        # `rfft(., 1)` keeps the first coefficient of `b` and of `a`
        return b0 * g
    k = np.arange(n // 2 + 1)
    half = jnp.asarray(2 * np.sin(np.pi * k / n) ** 2, dtype)
    sine = jnp.asarray(np.sin(2 * np.pi * k / n), dtype)
    # 1 - alpha e^{-i w}, without the cancellation of 1 - alpha cos(w)
    real = b0 + alpha * half
    response = lax.complex(b0, jnp.zeros_like(b0)) / lax.complex(real, alpha * sine)
    spectrum = jnp.fft.rfft(g, n) * response
    return jnp.fft.irfft(spectrum, n)[:time].astype(dtype)


class DaspCompressor(AbstractRangedEffect):
    r"""dasp-pytorch's dynamic range compressor, `dasp_pytorch.functional.compressor`.

    For a signal $x$ `(time,)` or `(channels, time)` the side-chain is the
    sum of the channels, $s_t = \sum_c x_{c,t}$ (linked: every channel gets
    the same gain); its level is $L_t = 20 \log_{10} \max(|s_t|, \epsilon)$;
    the static curve with threshold $\theta$, ratio $R$ and knee $W$ is

    $$C(L) = \begin{cases} L & L < \theta - W/2,\\
    L + (1/R - 1)\,(L - \theta + W/2)^2 / (2W) & |L - \theta| \le W/2,\\
    \theta + (L - \theta)/R & L > \theta + W/2,\end{cases}$$

    the gain in dB $g_t = C(L_t) - L_t$ is smoothed by a one-pole lowpass
    with $\alpha = \exp(-\ln 9 / (f_s\, t_A / 1000))$ applied by frequency
    sampling, as dasp applies it (see the module `_dasp_compressor`: a
    circular convolution over $2^{\lceil\log_2(2T-1)\rceil}$ samples, not a
    causal recursion), and the output is

    $$y_{c,t} = x_{c,t-D}\; 10^{(\bar g_t + m)/20},$$

    with the makeup gain $m$ and the lookahead $D$ (zeros before the signal).
    This is retrax's port of dasp's definition, for its users and for
    models and papers built on it; retrax's own
    [`Compressor`][retrax.filters.Compressor] (an RMS detector, attack and
    release ballistics on the linear gain, channels apart) is another
    definition.

    **Arguments** (dasp's names, but for `makeup_db`, dasp's
    `makeup_gain_db`, spelt as retrax's other gains in dB are):

    - `threshold_db`: $\theta$ in dB, in $[-60, 0]$.
    - `ratio`: $R$, in $[1, 20]$.
    - `attack_ms`: $t_A$ in ms, in $[5, 100]$.
    - `release_ms`: in ms, in $[5, 100]$; dasp takes it and does not use it
      (its gradient is zero), kept so that dasp's six normalised parameters
      map one to one.
    - `knee_db`: $W$ in dB, in $[0, 12]$ ($0$ is a hard knee).
    - `makeup_db`: $m$ in dB, in $[0, 12]$. Deprecated spelling:
      `makeup_gain_db=` (a keyword; warns with `DeprecationWarning`), and the
      read-only property `makeup_gain_db`.
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).
    - `lookahead_samples`: $D$, a Python int $\ge 0$ (static).
    - `eps`: the detector's floor $\epsilon$ (static, dasp's `1e-8`).

    The ranges are those of dasp's `modules.Compressor`, all linear, in its
    order: the normalised vector `[threshold_db, ratio, attack_ms,
    release_ms, knee_db, makeup_db]` is the `param_tensor` of dasp's
    `Compressor.process_normalized` (also through `retrax.effects.from_dasp`,
    the door of every dasp effect). A value out of its range raises an
    error naming it (also under `jax.jit`).

    Equal to dasp-pytorch 0.0.1 to float64 rounding in float64 and, in
    float32, within $10^{-5}$ of max $|y|$ of dasp's float64 values (dasp's
    own float32 values differ from those by up to about $5 \cdot 10^{-5}$:
    its float32 FFT of the denominator, see the module). Differentiable in
    every parameter and in the signal under `jax.jit`, `jax.vmap` and
    `jax.grad`. Not streamable: the frequency-sampled lowpass is defined on
    the whole signal, so `zi` must be `None` and `zf` is `None`.
    """

    threshold_db: Float[Array, ""]
    ratio: Float[Array, ""]
    attack_ms: Float[Array, ""]
    release_ms: Float[Array, ""]
    knee_db: Float[Array, ""]
    makeup_db: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)
    lookahead_samples: int = eqx.field(static=True)
    eps: float = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "threshold_db": Range(-60.0, 0.0),
        "ratio": Range(1.0, 20.0),
        "attack_ms": Range(5.0, 100.0),
        "release_ms": Range(5.0, 100.0),
        "knee_db": Range(0.0, 12.0),
        "makeup_db": Range(0.0, 12.0),
    }

    def __init__(
        self,
        threshold_db: Shaped[ArrayLike, ""] = -20.0,
        ratio: Shaped[ArrayLike, ""] = 4.0,
        attack_ms: Shaped[ArrayLike, ""] = 10.0,
        release_ms: Shaped[ArrayLike, ""] = 100.0,
        knee_db: Shaped[ArrayLike, ""] = 6.0,
        makeup_db: Shaped[ArrayLike, ""] | None = None,
        sample_rate: float | int = 44_100.0,
        *,
        lookahead_samples: int = 0,
        eps: float = 1e-8,
        makeup_gain_db: Shaped[ArrayLike, ""] | None = None,
    ):
        self.sample_rate = check_rate("sample_rate", sample_rate)
        self.lookahead_samples = check_delay(
            "lookahead_samples", lookahead_samples, minimum=0
        )
        self.eps = _check_eps(eps)
        r = self.RANGES
        self.threshold_db = r["threshold_db"].check_init("threshold_db", threshold_db)
        self.ratio = r["ratio"].check_init("ratio", ratio)
        self.attack_ms = r["attack_ms"].check_init("attack_ms", attack_ms)
        self.release_ms = r["release_ms"].check_init("release_ms", release_ms)
        self.knee_db = r["knee_db"].check_init("knee_db", knee_db)
        makeup_db = _makeup_db(makeup_db, makeup_gain_db)
        self.makeup_db = r["makeup_db"].check_init("makeup_db", makeup_db)

    # Unannotated: `eqx.tree_at(lambda c: c.makeup_gain_db, ...)` reads it
    # with a placeholder in the field, which an array annotation would refuse.
    @property
    def makeup_gain_db(self):
        """Deprecated: the make-up gain in dB, now `makeup_db`."""
        warn_deprecated(
            "`DaspCompressor.makeup_gain_db` is deprecated; read `makeup_db`."
        )
        return self.makeup_db

    def ranges(self) -> dict[str, Range]:
        """dasp's ranges (see the class docstring)."""
        return self.RANGES

    def gain_db(self, x: Shaped[ArrayLike, "*channels time"]) -> Float[Array, " time"]:
        r"""The smoothed gain $\bar g_t$ in dB (without makeup) of the signal
        `x` `(time,)` or `(channels, time)`, from its summed side-chain."""
        x = signal(x)
        dtype = x.dtype
        side = x if x.ndim == 1 else jnp.sum(x, axis=0)
        threshold = self.param("threshold_db", dtype)
        ratio = self.param("ratio", dtype)
        knee = self.param("knee_db", dtype)
        attack = self.param("attack_ms", dtype)
        level = 20 * jnp.log10(jnp.maximum(jnp.abs(side), jnp.asarray(self.eps, dtype)))
        low, high = threshold - knee / 2, threshold + knee / 2
        # Inside the knee `level - low` lies in [0, knee]; clipped there (and
        # the knee kept off 0) the branch that `where` discards stays finite,
        # so its zero cotangent never meets an infinite derivative.
        inside = jnp.clip(level - low, 0, knee)
        safe_knee = jnp.where(knee > 0, knee, 1)
        in_knee = level + ((1 / ratio) - 1) * inside**2 / (2 * safe_knee)
        above = threshold + (level - threshold) / ratio
        curve = jnp.where(level > high, above, jnp.where(level >= low, in_knee, level))
        g = curve - level
        # dasp's arithmetic, in the signal's dtype: alpha rounds as dasp's
        # does (its float32 rounding moves a 100 ms time constant by 1e-4)
        frames = self.sample_rate * (attack / 1e3)
        alpha = jnp.exp(-jnp.log(jnp.asarray(9.0, dtype)) / frames)
        return _smooth(g, alpha)

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "DaspCompressor":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "DaspCompressor":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], None]:
        """Compress `x` `(time,)` or `(channels, time)` (one gain for all
        channels, from their sum); batch with `jax.vmap`. With `return_zf`,
        `(y, None)`."""
        no_state(zi)
        x = signal(x)
        if x.shape[-1] == 0:
            return output(x, None, return_zf)
        g = self.gain_db(x) + self.param("makeup_db", x.dtype)
        d = self.lookahead_samples
        if d > 0:
            pad = [(0, 0)] * (x.ndim - 1) + [(d, 0)]
            # dasp rolls the signal by D and zeroes the first D samples
            x = jnp.pad(x, pad)[..., : x.shape[-1]]
        return output(x * 10 ** (g / 20), None, return_zf)
