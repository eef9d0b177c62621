r"""A reverb whose impulse response is band-filtered noise with per-band decays.

The construction of Steinmetz, Ithapu and Calamia ("Filtered noise shaping
for time domain room impulse response estimation from reverberant speech",
WASPAA 2021), as dasp-pytorch's `noise_shaped_reverberation` builds it:
white noise $w_{c,b}$ per channel $c$ and band $b$ is filtered by the
linear-phase FIR $f_b$ of one band of an octave filterbank (a 12 Hz
lowpass, ten octave bandpasses centred at 31.5 Hz to 16 kHz, an 18 kHz
highpass; `scipy.signal.firwin` designs with a Hamming window),
$\nu_{c,b}[n] = \sum_k f_b[k]\, w_{c,b}[n + k]$, and the impulse response
is the mean over the bands of the noise under exponential envelopes,

$$h_c[n] = \frac{1}{K} \sum_{b=1}^{K} g_b\,
  e^{-\alpha_b n}\, \nu_{c,b}[n], \qquad
  \alpha_b = \frac{3 \ln 10}{f_s\, T_{60,b}},$$

so that band $b$'s envelope falls by 60 dB in $T_{60,b}$ seconds. The wet
signal is the causal convolution $(h_c * x)[t]$, computed with FFTs, and
$y = (1 - \mathrm{mix})\, x + \mathrm{mix}\cdot (h * x)$.
"""

import math
from collections.abc import Sequence
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._float_dtypes import check_float_dtype
from .._signal import output, signal, state_leaf
from .._validate import check_finite, check_positive_int, check_rate, real_array


OCTAVE_CENTRES = (31.5, 63, 125, 250, 500, 1000, 2000, 4000, 8000, 16000)
N_BANDS = len(OCTAVE_CENTRES) + 2


def firwin(
    n_taps: int,
    cutoff: float | Sequence[float],
    *,
    pass_zero: bool,
    sample_rate: float | int,
) -> np.ndarray:
    """`scipy.signal.firwin(n_taps, cutoff, pass_zero=pass_zero, fs=sample_rate)`
    with its defaults (Hamming window, unit gain at the centre of the first
    passband), for one cutoff or one `[low, high]` band."""
    edges = np.atleast_1d(np.asarray(cutoff, float)) / (sample_rate / 2)
    pass_nyquist = bool(edges.size & 1) ^ pass_zero
    edges = np.concatenate([[0.0] * pass_zero, edges, [1.0] * pass_nyquist])
    bands = edges.reshape(-1, 2)
    m = np.arange(n_taps) - 0.5 * (n_taps - 1)
    h = sum(hi * np.sinc(hi * m) - lo * np.sinc(lo * m) for lo, hi in bands)
    if n_taps > 1:
        h = h * (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(n_taps) / (n_taps - 1)))
    lo, hi = bands[0]
    centre = 0.0 if lo == 0 else 1.0 if hi == 1 else 0.5 * (lo + hi)
    return h / np.sum(h * np.cos(np.pi * m * centre))


def octave_fir_bank(n_taps: int, sample_rate: float | int) -> np.ndarray:
    """The `(12, n_taps)` band filters: a 12 Hz lowpass, octave bandpasses
    from $f_c/\\sqrt2$ to $\\min(\\sqrt2 f_c, 0.999 f_s/2)$ at the centres
    31.5 Hz to 16 kHz, and an 18 kHz highpass (dasp-pytorch's bank)."""
    filters = [firwin(n_taps, 12.0, pass_zero=True, sample_rate=sample_rate)]
    for fc in OCTAVE_CENTRES:
        band = [fc / math.sqrt(2), min(fc * math.sqrt(2), 0.999 * sample_rate / 2)]
        filters.append(firwin(n_taps, band, pass_zero=False, sample_rate=sample_rate))
    filters.append(firwin(n_taps, 18000.0, pass_zero=False, sample_rate=sample_rate))
    return np.stack(filters)


def fft_size(n: int) -> int:
    """The smallest $2^a 3^b 5^c \\ge n$ (a fast FFT length)."""
    best = 1 << max(n - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            size = p35
            while size < n:
                size *= 2
            best = min(best, size)
            p35 *= 3
        p5 *= 5
    return best


def shape_noise(white: Array, n_taps: int, sample_rate: float) -> Array:
    """The band-filtered noise $\\nu$ `(channels, bands, length)` from white
    noise `(channels, bands, length + n_taps - 1)` (the valid part of each
    band's convolution with its FIR)."""
    taps = jnp.asarray(octave_fir_bank(n_taps, sample_rate), white.dtype)
    n = white.shape[-1]
    size = fft_size(n)
    spectrum = jnp.fft.rfft(white, size) * jnp.fft.rfft(taps, size)
    return jnp.fft.irfft(spectrum, size)[..., n_taps - 1 : n]


def convolve(x: Array, ir: Array, history: Array | None) -> Array:
    """The causal convolution $(h * x)[t]$ for `t` in `[0, T)` of `x`
    `(channels or 1, T)` with `ir` `(channels, L)`, after `history`
    `(channels, L - 1)` (`None`: silence, where only the first `T` taps of
    `ir` matter)."""
    length, t = ir.shape[-1], x.shape[-1]
    if history is None:
        size = fft_size(t + ir.shape[-1] - 1)
        wet = jnp.fft.irfft(jnp.fft.rfft(x, size) * jnp.fft.rfft(ir, size), size)
        return wet[..., :t]
    segment = jnp.concatenate(
        [history, jnp.broadcast_to(x, history.shape[:-1] + (t,))], -1
    )
    # circular convolution of the segment: only its first L - 1 outputs wrap
    size = fft_size(segment.shape[-1])
    wet = jnp.fft.irfft(jnp.fft.rfft(segment, size) * jnp.fft.rfft(ir, size), size)
    return wet[..., length - 1 : length - 1 + t]


def t60_range(length: int, sample_rate: float) -> Range:
    """The decay times' range: $[0.05, 10]$ s, its top raised to
    $3 \\ln 10\\,(L - 1) / f_s$ where that is longer (dasp-pytorch's slowest
    decay for an `length`-sample response), logarithmic."""
    longest = 3 * math.log(10.0) * (length - 1) / sample_rate
    return Range(0.05, max(10.0, longest), log=True)


def fresh_noise(
    key: PRNGKeyArray, shape: tuple[int, ...], n_taps: int, taps: int, dtype
) -> Array:
    """The white noise a reverb whose `noise` has `shape` draws from `key`
    (as its constructor would), cut to what its first `taps` samples need."""
    channels, bands, length = shape
    white = jax.random.normal(key, (channels, bands, length + n_taps - 1), dtype)
    return white[..., : taps + n_taps - 1]


class NoiseShapedReverb(AbstractRangedEffect):
    r"""Filtered-noise reverb: an impulse response of octave-band noise under
    per-band exponential decays (Steinmetz et al., WASPAA 2021; the
    construction of dasp-pytorch's `noise_shaped_reverberation`, see the
    module docstring).

    $$h_c[n] = \frac{1}{12} \sum_b g_b\, 10^{-3 n / (f_s T_{60,b})}\,
      \nu_{c,b}[n], \qquad y = (1 - \mathrm{mix})\, x
      + \mathrm{mix}\,(h * x).$$

    The shaped noise $\nu$ is drawn from `key` and filtered once, when the
    effect is built, and is then fixed (a room, not a random process): it is
    the field `noise`, and no gradient flows to it (`__call__` stops it). A
    new `key` gives a new room; a batch of keys under `eqx.filter_vmap`
    builds an ensemble. `effect(x, key=k)` instead draws fresh noise from
    `k` for that call, as dasp-pytorch draws it at every call: the same key
    gives the room `NoiseShapedReverb(..., key=k)` would hold, and
    `jax.vmap` over keys gives one room per key, without rebuilding the
    effect.

    **Arguments:**

    - `band_gains`: $g_b$, the 12 bands' linear gains, each in $[0, 1]$
      (normalised linearly); a scalar is used for every band.
    - `t60s`: $T_{60,b}$, the bands' decay times in seconds, each in
      $[0.05, T_{\max}]$ (normalised logarithmically), $T_{\max}$ 10 s or,
      for a longer response, $3 \ln 10\,(L - 1) / f_s$ (dasp-pytorch's
      slowest decay: 10.27 s at its default 65,536 samples and 44.1 kHz, so
      every dasp decay is a valid T60, see `retrax.effects.from_dasp`); a
      scalar for every band.
    - `mix`: the wet fraction, in $[0, 1]$.
    - `key`: a JAX PRNG key for the white noise.
    - `white_noise`: instead of `key`, the white noise itself, shape
      `(channels, 12, length + n_taps - 1)` (to reproduce another
      implementation's draw).
    - `channels`: the number of output channels, each with its own noise
      (default 2, a stereo reverb), a Python int.
    - `length`: the impulse response's length $L$ in samples (default 65536),
      a Python int.
    - `n_taps`: the band filters' length, an odd Python int (default 1023).
    - `sample_rate`: $f_s$ in Hz, a Python number above 36 kHz (the top
      band is an 18 kHz highpass; static).

    dasp-pytorch's `modules.NoiseShapedReverb` vector (12 band gains, 12
    band decays $d$, mix) goes through `retrax.effects.from_dasp(
    NoiseShapedReverb, p, key=...)` (a decay $d$ is the T60
    $3 \ln 10\,(L - 1) / (f_s (10 d + 1))$) and `to_dasp`.

    A mono signal `(time,)` is sent to every channel and returns
    `(channels, time)` (or `(time,)` when `channels == 1`); a
    `(channels, time)` signal must have the effect's channel count. The
    effect streams: the state `zi` is the last $L - 1$ input samples of
    every channel, shape `(channels, L - 1)` (`(L - 1,)` for a mono effect
    on a mono signal), zero by default. Parameters out of range raise an
    error (also under `jax.jit`). The convolution runs on XLA's FFT, which
    takes float32 and float64 only: a float16 or bfloat16 signal raises
    `TypeError` naming its dtype (cast it with `x.astype(jnp.float32)`).
    """

    band_gains: Float[Array, " bands"]
    t60s: Float[Array, " bands"]
    mix: Float[Array, ""]
    noise: Float[Array, "channels bands length"]
    sample_rate: float = eqx.field(static=True)
    n_taps: int = eqx.field(static=True)

    # the decay times' range is `t60_range(length, sample_rate)`
    RANGES: ClassVar[dict[str, Range]] = {
        "band_gains": Range(0.0, 1.0),
        "mix": Range(0.0, 1.0),
    }

    def __init__(
        self,
        band_gains: Shaped[ArrayLike, "*bands"] = 0.5,
        t60s: Shaped[ArrayLike, "*bands"] = 1.0,
        mix: Shaped[ArrayLike, ""] = 0.3,
        *,
        key: PRNGKeyArray | None = None,
        white_noise: Shaped[ArrayLike, "channels bands padded"] | None = None,
        channels: int = 2,
        length: int = 65536,
        n_taps: int = 1023,
        sample_rate: float | int = 44_100.0,
    ):
        for name, value in (("channels", channels), ("length", length)):
            check_positive_int(name, value)
        check_positive_int("n_taps", n_taps)
        if n_taps % 2 == 0:
            raise ValueError(f"`n_taps` must be odd (a highpass band), got {n_taps}.")
        self.sample_rate = check_rate("sample_rate", sample_rate)
        if self.sample_rate <= 36_000:
            raise ValueError(
                "`sample_rate` must exceed 36 kHz (the top band is an 18 kHz "
                f"highpass), got {sample_rate!r}."
            )
        self.n_taps = n_taps
        r = self.RANGES | {"t60s": t60_range(length, self.sample_rate)}
        values = {"band_gains": band_gains, "t60s": t60s}
        for name, value in values.items():
            value = jnp.asarray(value, float)
            if value.ndim == 0:
                value = jnp.full(N_BANDS, value)
            if value.shape != (N_BANDS,):
                raise ValueError(
                    f"`{name}` must be a scalar or hold one value per band, shape "
                    f"({N_BANDS},), got shape {value.shape}."
                )
            setattr(self, name, r[name].check_init(name, value, (N_BANDS,)))
        self.mix = r["mix"].check_init("mix", mix)
        shape = (channels, N_BANDS, length + n_taps - 1)
        if (key is None) == (white_noise is None):
            raise ValueError("Pass exactly one of `key` and `white_noise`.")
        if white_noise is None:
            white = jax.random.normal(key, shape, self.band_gains.dtype)
        else:
            white = real_array("white_noise", white_noise)
            if white.shape != shape:
                raise ValueError(
                    f"`white_noise` must have shape (channels, {N_BANDS}, length + "
                    f"n_taps - 1) = {shape}, got shape {white.shape}."
                )
            white = check_finite("white_noise", white.astype(self.band_gains.dtype))
        self.noise = shape_noise(white, n_taps, self.sample_rate)

    def ranges(self) -> dict[str, Range]:
        """`band_gains` in $[0, 1]$, `t60s` in $[0.05, T_{\\max}]$ s (log,
        see the class), `mix` in $[0, 1]$."""
        r = self.RANGES
        t60s = t60_range(self.length, self.sample_rate)
        return {"band_gains": r["band_gains"], "t60s": t60s, "mix": r["mix"]}

    @property
    def channels(self) -> int:
        """The number of output channels."""
        return self.noise.shape[-3]

    @property
    def length(self) -> int:
        """The impulse response's length $L$."""
        return self.noise.shape[-1]

    def impulse_response(
        self, dtype=None, taps: int | None = None, *, key: PRNGKeyArray | None = None
    ) -> Float[Array, "channels taps"]:
        """The impulse responses $h_c$ `(channels, L)` (in `dtype`, by default
        the parameters'), or their first `taps` samples; with `key`, from
        fresh noise drawn from it (see the class) instead of `noise`."""
        dtype = self.band_gains.dtype if dtype is None else dtype
        taps = self.length if taps is None else min(taps, self.length)
        gains = self.param("band_gains", dtype)
        t60s = self.param("t60s", dtype)
        if key is None:
            noise = self.noise[..., :taps]
        else:
            noise = fresh_noise(key, self.noise.shape, self.n_taps, taps, dtype)
            noise = shape_noise(noise, self.n_taps, self.sample_rate)
        noise = jax.lax.stop_gradient(noise).astype(dtype)
        n = jnp.arange(taps, dtype=dtype)
        rate = (3.0 * math.log(10.0) / self.sample_rate) / t60s
        envelope = gains[:, None] * jnp.exp(-rate[:, None] * n)
        return jnp.einsum("cbn,bn->cn", noise, envelope) / N_BANDS

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "NoiseShapedReverb":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "NoiseShapedReverb":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*state_channels history"] | None = None,
        return_zf: bool = False,
        key: PRNGKeyArray | None = None,
    ) -> (
        Float[Array, "*channels_out time"]
        | tuple[
            Float[Array, "*channels_out time"], Float[Array, "*channels_out history"]
        ]
    ):
        """Reverberate `x` `(time,)` or `(channels, time)`; with `return_zf`,
        also the last $L - 1$ input samples (the next block's `zi`); with
        `key`, through fresh noise drawn from it (see the class)."""
        x = signal(x)
        check_float_dtype("`x`", x.dtype, "NoiseShapedReverb (its FFT convolution)")
        dt = x.dtype
        c = self.channels
        if x.ndim == 2 and x.shape[0] != c:
            raise ValueError(
                f"`x` must be mono (time,) or have this reverb's {c} channels, got "
                f"shape {x.shape}."
            )
        mono_out = x.ndim == 1 and c == 1
        rows = x[None] if x.ndim == 1 else x
        mix = self.param("mix", dt)
        state_shape = (self.length - 1,) if mono_out else (c, self.length - 1)
        if zi is None and not return_zf:
            # from silence, only the response's first T taps reach the output
            ir = self.impulse_response(dt, rows.shape[-1], key=key)
            wet = convolve(rows, ir, None)
        else:
            history = state_leaf("zi", zi, state_shape, dt).reshape(c, -1)
            wet = convolve(rows, self.impulse_response(dt, key=key), history)
        y = (1 - mix) * rows + mix * wet
        if not return_zf:
            return y[0] if mono_out else y
        past = jnp.concatenate(
            [history, jnp.broadcast_to(rows, (c, rows.shape[-1]))], -1
        )
        zf = past[:, past.shape[-1] - (self.length - 1) :]
        return output(y[0] if mono_out else y, zf[0] if mono_out else zf, return_zf)
