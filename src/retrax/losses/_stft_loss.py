"""The spectral loss at one STFT resolution (auraloss's `STFTLoss`)."""

import math
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Real

from .._errors import error_if, filter_jit
from .._float_dtypes import check_float_dtype
from .._misc import as_inexact, cast, result_dtype
from .._validate import check_positive_int, check_rate, check_value
from ._a_weighting import a_weighting_taps, fir_same
from ._chroma import chroma_filterbank
from ._mel import mel_filterbank
from ._stft import (
    WINDOWS,
    Window,
    analysis_window,
    clamped_magnitude,
    safe_angle,
    stft,
)


Weight = float | int | Real[Array, ""]
Reduction = Literal["mean", "sum"]
Distance = Literal["L1", "L2"]
Scale = Literal["mel", "chroma"]
Output = Literal["loss", "full"]


def check_weight(name: str, value: Weight) -> Weight:
    """A loss weight: finite and >= 0."""
    return check_value(
        value,
        lambda xp, v: ~xp.isfinite(v) | (v < 0),
        f"`{name}` must be a finite number >= 0, got {value!r}.",
    )


def check_eps(eps: Weight) -> Weight:
    return check_value(
        eps,
        lambda xp, v: ~xp.isfinite(v) | (v <= 0),
        f"`eps` must be a finite number > 0, got {eps!r}.",
    )


def check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"`{name}` must be one of {choices}, got {value!r}.")


def check_signals(
    pred: ArrayLike,
    target: ArrayLike,
    min_length: int,
    *,
    fft: bool = True,
    finite: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """`pred` and `target` as arrays of one float dtype, checked.

    Shapes `(time,)`, `(channels, time)` or `(batch, channels, time)`, equal
    for both, with at least `min_length` samples; with `finite`, values
    finite (checked under `jit` too; without, the caller checks them). With
    `fft` (the STFT losses) the dtype must be float32 or float64, XLA's FFT's
    (`TypeError` otherwise).
    """
    pred = as_inexact("pred", pred)
    target = as_inexact("target", target)
    for name, x in (("pred", pred), ("target", target)):
        if jnp.iscomplexobj(x):
            raise ValueError(f"`{name}` must be a real signal, got dtype {x.dtype}.")
        if not 1 <= x.ndim <= 3:
            raise ValueError(
                f"`{name}` must have shape (time,), (channels, time) or "
                f"(batch, channels, time), got shape {x.shape}."
            )
    if pred.shape != target.shape:
        raise ValueError(
            f"`pred` and `target` must have the same shape, got {pred.shape} "
            f"and {target.shape}."
        )
    if pred.shape[-1] < min_length:
        raise ValueError(
            f"`pred` and `target` have {pred.shape[-1]} samples, fewer than the "
            f"largest `fft_size` ({min_length}): pass at least {min_length} "
            "samples (or use smaller FFT sizes)."
        )
    dtype = result_dtype(pred, target)
    if fft:
        check_float_dtype("`pred` (with `target`)", dtype, "an STFT loss")
    pred, target = cast(pred, dtype), cast(target, dtype)
    if not finite:
        return pred, target
    pred = error_if(
        pred,
        ~jnp.all(jnp.isfinite(pred)),
        "`pred` contains non-finite values.",
    )
    target = error_if(
        target,
        ~jnp.all(jnp.isfinite(target)),
        "`target` contains non-finite values.",
    )
    return pred, target


def _norm(x: jax.Array) -> jax.Array:
    # The Frobenius norm with a zero (not NaN) derivative at x = 0, which a
    # prediction that matches its target reaches.
    squares = jnp.sum(x * x)
    positive = squares > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squares, 1)), 0)


def signal_peak(pred: jax.Array, target: jax.Array) -> jax.Array:
    """The largest magnitude of `pred` and `target`."""
    return jnp.maximum(jnp.max(jnp.abs(pred)), jnp.max(jnp.abs(target)))


def power_of_two_scale(peak: jax.Array, limit: float) -> jax.Array:
    """$2^{-k}$, the power of two that brings `peak` below `limit` (1 when it
    is below already), held constant for the derivative. Multiplying by a
    power of two is exact, so scaled values round as the unscaled ones."""
    ratio = jnp.where(peak > limit, peak / limit, 1)
    k = jnp.ceil(jnp.log2(ratio)).astype(jnp.int32)
    return lax.stop_gradient(jnp.ldexp(jnp.ones((), peak.dtype), -k))


def _distance(x: jax.Array, y: jax.Array, kind: str, reduction: str) -> jax.Array:
    d = x - y
    # sign(d) * d is |d| with derivative sign(d): zero where the prediction
    # meets its target (as in torch), where `jnp.abs` would give 1.
    d = jnp.sign(d) * d if kind == "L1" else d * d
    return jnp.mean(d) if reduction == "mean" else jnp.sum(d)


def _is_zero(w: Weight) -> bool:
    # auraloss skips a term whose weight is zero (so a non-finite unused term
    # cannot leak in as 0 * inf); a traced weight always keeps its term.
    return isinstance(w, (int, float)) and w == 0


def _cast(w: Weight, x: jax.Array) -> jax.Array:
    return jnp.asarray(w).astype(x.dtype)


@filter_jit
def compiled_terms(loss, pred: jax.Array, target: jax.Array):
    """`loss.unchecked_terms(pred, target)` compiled as a whole.

    An eager call costs one dispatch instead of one per operation, and an
    eager `jax.grad` one linearisation. The loss's arrays are traced and its
    Python numbers and settings fixed, as when a user's `jax.jit` closes over
    the loss: a zero weight still skips its term, and a new weight compiles
    anew. Inside a user's `jax.jit` it is inlined.

    The signals are checked finite before, and loud ones scaled so that no
    square overflows (`STFTLoss.weighted_terms`); a loss that is still not
    finite has a value beyond the dtype's range, which raises an error (at
    run time) rather than returning `inf`."""
    terms = loss.unchecked_terms(pred, target)
    leaves = jax.tree.leaves(terms)
    return error_if(
        terms,
        ~jnp.all(jnp.stack([jnp.all(jnp.isfinite(v)) for v in leaves])),
        f"The loss of these finite signals is not finite in {leaves[0].dtype}: "
        "its value lies beyond the dtype's range (as the linear-magnitude L2 "
        "distance of signals near 1e20 can in float32), or its signals' scales "
        "differ by more than the dtype spans. Compute it in float64, or bring "
        "`pred` and `target` to a common scale.",
    )


class STFTLossTerms(eqx.Module):
    """The loss and its terms, as auraloss's `output="full"` returns them.

    A term whose weight is zero is not computed and is 0 here (as in
    auraloss). The terms are unweighted; `loss` is their weighted sum
    (`STFTLoss`) or the mean of the resolutions' losses
    (`MultiResolutionSTFTLoss`, whose terms have one entry per resolution,
    shape `(resolutions,)`, as auraloss's lists do).

    **Fields:**

    - `loss`: the loss, a scalar.
    - `sc_mag`: the spectral convergence.
    - `log_mag`: the log-magnitude distance.
    - `lin_mag`: the linear-magnitude distance.
    - `phs`: the phase term.
    """

    loss: Float[Array, ""]
    sc_mag: Float[Array, "*resolutions"]
    log_mag: Float[Array, "*resolutions"]
    lin_mag: Float[Array, "*resolutions"]
    phs: Float[Array, "*resolutions"]


class STFTLoss(eqx.Module):
    r"""The spectral loss at one STFT resolution, as auraloss's `STFTLoss`.

    With $X$, $Y$ the magnitude spectrograms of `pred` and `target`
    ($|\mathrm{STFT}|$ clamped below at $\sqrt{\varepsilon}$), the loss is

    $$w_{sc} \frac{\lVert Y - X \rVert_F}{\lVert Y \rVert_F}
    + w_{log} \, d(\log X, \log Y) + w_{lin} \, d(X, Y)
    + w_{phs} \, \overline{(\angle X - \angle Y)^2}$$

    (spectral convergence, Arik et al. 2018, the log- and linear-magnitude
    distances, and the mean squared difference of the STFTs' phases in
    $(-\pi, \pi]$), where $d$ is the mean (or sum, `reduction="sum"`) of the
    absolute (`"L1"`) or squared (`"L2"`) differences. The STFT is
    `torch.stft`'s: periodic window of `win_length` samples centred in
    `fft_size`, the signal reflected by `fft_size // 2` samples at both ends.

    auraloss's options, in the order it applies them:

    - `perceptual_weighting=True` first filters both signals with auraloss's
      A-weighting FIR (101 taps fitted to the IEC A-weighting curve at
      `sample_rate`, applied as a zero-padded correlation that keeps the
      length).
    - `scale="mel"` or `"chroma"` maps the magnitudes (after the clamp) to
      `n_bins` bands with librosa's filterbank (`mel_filterbank`,
      `chroma_filterbank` at `sample_rate`, `fft_size`); the phase term
      stays on the STFT bins.
    - `scale_invariance=True` replaces $Y$ by $\alpha Y$ with
      $\alpha = \langle X, Y \rangle / \lVert Y \rVert_F^2$ computed per
      signal (each channel of each example; the derivative flows through
      $\alpha$). auraloss 0.4.0 broadcasts its $\alpha$ correctly only for a
      single signal: with several it raises, or (when their number equals the
      number of frequency bins) pairs the scales with the bins.
    - `output="full"` returns `STFTLossTerms` instead of the loss.

    The phase term is ill-conditioned where a bin lies on the negative real
    axis: a frame symmetric about its centre (the first frame, reflected,
    when the window is centred on that sample: `win_length` of the parity of
    `fft_size`, as at auraloss's defaults) has a real STFT up to rounding, and
    the angle of its negative bins is $+\pi$ or $-\pi$ by the sign of that
    rounding, which differs between FFT implementations (and between torch's
    float32 and float64). Such bins make the phase term differ from auraloss
    (its derivative does not, being the same on both sides); with an odd
    `win_length` in an even `fft_size` no frame is symmetric and the term
    agrees to rounding. The angle of a silent bin (0) is 0 with derivative
    0, as torch's `angle` defines it, so the term's gradient is finite at
    silence.

    Signals loud enough that a sum of squares could overflow the dtype are
    scaled down together by a power of two first (exact; `eps` and the
    linear-magnitude distance scaled to match), so finite signals give the
    loss's value wherever the dtype holds it; a loss whose value itself
    lies beyond the dtype raises an error rather than returning `inf`.

    auraloss 0.4.0's `scale="chroma"` raises `TypeError` at construction (it
    registers librosa's NumPy filterbank as a buffer); retrax computes what it
    would with that filterbank as a tensor.

    Signals are `(time,)`, `(channels, time)` or `(batch, channels, time)`; as
    in auraloss the norms and means run over the whole input, so the loss of
    a batch is not the mean of the examples' losses (use `jax.vmap` for
    per-example losses).

    **Arguments:**

    - `fft_size`: FFT length in samples, a positive integer.
    - `hop_size`: hop between frames in samples, a positive integer.
    - `win_length`: window length in samples, in `[1, fft_size]`.
    - `window`: `"hann_window"`, `"hamming_window"`, `"blackman_window"`,
      `"bartlett_window"` or `"kaiser_window"` (torch's periodic windows; the
      Kaiser window with torch's $\beta = 12$).
    - `w_sc`, `w_log_mag`, `w_lin_mag`: weights of the magnitude terms, >= 0.
    - `eps`: the clamp of the squared magnitude, > 0.
    - `reduction`: `"mean"` or `"sum"` for the magnitude distances.
    - `mag_distance`: `"L1"` or `"L2"`.
    - `w_phs`: weight of the phase term, >= 0.
    - `sample_rate`: the sample rate in Hz, needed by `scale` and
      `perceptual_weighting` (`None` otherwise).
    - `scale`: `None`, `"mel"` or `"chroma"`.
    - `n_bins`: the number of mel or chroma bands, in `[1, fft_size]`, needed
      by `scale`.
    - `perceptual_weighting`: A-weight both signals first (the filter's design
      needs scipy: `pip install "retrax[scipy]"`).
    - `scale_invariance`: compare with the optimally scaled target.
    - `output`: `"loss"` (a scalar) or `"full"` (`STFTLossTerms`).

    The arguments after `mag_distance` are in a different position than in
    auraloss (whose `w_phs` follows `w_lin_mag`): pass them by keyword.
    Invalid settings raise `ValueError` naming the argument.
    """

    fft_size: int = eqx.field(static=True)
    hop_size: int = eqx.field(static=True)
    win_length: int = eqx.field(static=True)
    window: Window = eqx.field(static=True)
    w_sc: Weight
    w_log_mag: Weight
    w_lin_mag: Weight
    eps: Weight
    reduction: Reduction = eqx.field(static=True)
    mag_distance: Distance = eqx.field(static=True)
    w_phs: Weight
    sample_rate: float | None = eqx.field(static=True)
    scale: Scale | None = eqx.field(static=True)
    n_bins: int | None = eqx.field(static=True)
    perceptual_weighting: bool = eqx.field(static=True)
    scale_invariance: bool = eqx.field(static=True)
    output: Output = eqx.field(static=True)

    def __init__(
        self,
        fft_size: int = 1024,
        hop_size: int = 256,
        win_length: int = 1024,
        window: Window = "hann_window",
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        eps: Weight = 1e-8,
        reduction: Reduction = "mean",
        mag_distance: Distance = "L1",
        w_phs: Weight = 0.0,
        sample_rate: float | int | None = None,
        scale: Scale | None = None,
        n_bins: int | None = None,
        perceptual_weighting: bool = False,
        scale_invariance: bool = False,
        output: Output = "loss",
    ):
        check_positive_int("fft_size", fft_size)
        check_positive_int("hop_size", hop_size)
        check_positive_int("win_length", win_length)
        if win_length > fft_size:
            raise ValueError(
                f"`win_length` ({win_length}) must not exceed `fft_size` ({fft_size})."
            )
        check_choice("window", window, WINDOWS)
        check_choice("reduction", reduction, ("mean", "sum"))
        check_choice("mag_distance", mag_distance, ("L1", "L2"))
        check_choice("output", output, ("loss", "full"))
        if scale is not None:
            check_choice("scale", scale, ("mel", "chroma"))
            if sample_rate is None:
                raise ValueError(f"`sample_rate` must be given with `scale={scale!r}`.")
            if n_bins is None:
                raise ValueError(f"`n_bins` must be given with `scale={scale!r}`.")
            check_positive_int("n_bins", n_bins)
            if n_bins > fft_size:
                raise ValueError(
                    f"`n_bins` ({n_bins}) must not exceed `fft_size` ({fft_size})."
                )
        for name, flag in (
            ("perceptual_weighting", perceptual_weighting),
            ("scale_invariance", scale_invariance),
        ):
            if not isinstance(flag, bool | np.bool_):
                raise ValueError(f"`{name}` must be True or False, got {flag!r}.")
        if perceptual_weighting and sample_rate is None:
            raise ValueError(
                "`sample_rate` must be given with `perceptual_weighting=True`."
            )
        self.fft_size = fft_size
        self.hop_size = hop_size
        self.win_length = win_length
        self.window = window
        self.w_sc = check_weight("w_sc", w_sc)
        self.w_log_mag = check_weight("w_log_mag", w_log_mag)
        self.w_lin_mag = check_weight("w_lin_mag", w_lin_mag)
        self.eps = check_eps(eps)
        self.reduction = reduction
        self.mag_distance = mag_distance
        self.w_phs = check_weight("w_phs", w_phs)
        self.sample_rate = (
            None if sample_rate is None else check_rate("sample_rate", sample_rate)
        )
        self.scale = scale
        self.n_bins = n_bins
        self.perceptual_weighting = bool(perceptual_weighting)
        self.scale_invariance = bool(scale_invariance)
        self.output = output

    def filterbank(self) -> np.ndarray | None:
        """The mel or chroma filterbank of `scale`, `(n_bins, fft_size // 2 +
        1)` in float64, or `None` without `scale`."""
        if self.scale is None:
            return None
        assert self.sample_rate is not None and self.n_bins is not None
        make = mel_filterbank if self.scale == "mel" else chroma_filterbank
        return make(self.sample_rate, self.fft_size, self.n_bins)

    def weighted(self, x: jax.Array) -> jax.Array:
        """`x` A-weighted along its last axis if `perceptual_weighting`, else
        `x`."""
        if not self.perceptual_weighting:
            return x
        assert self.sample_rate is not None
        return fir_same(x, a_weighting_taps(self.sample_rate))

    def spectrum(self, x: jax.Array, scale: jax.Array | None = None) -> jax.Array:
        """The complex STFT of (weighted) signals `x`, `(..., frames,
        fft_size // 2 + 1)`, of `x` times `scale` if given (applied to the
        window, which the frames are multiplied by anyway)."""
        window = analysis_window(self.window, self.win_length, self.fft_size)
        if scale is not None:
            window = jnp.asarray(window, x.dtype) * scale
        return stft(x, self.fft_size, self.hop_size, window)

    def magnitudes(self, x: jax.Array) -> jax.Array:
        """The clamped magnitude spectrogram of checked signals `x`,
        `(..., frames, fft_size // 2 + 1)` (before `scale` and
        `perceptual_weighting`)."""
        return clamped_magnitude(self.spectrum(x), self.eps)

    def unchecked_terms(self, pred: jax.Array, target: jax.Array) -> STFTLossTerms:
        """The loss and its terms without `__call__`'s checks, for signals
        already checked (as `MultiResolutionSTFTLoss` does once for all its
        resolutions)."""
        return self.weighted_terms(self.weighted(pred), self.weighted(target))

    def weighted_terms(
        self, pred: jax.Array, target: jax.Array, peak: jax.Array | None = None
    ) -> STFTLossTerms:
        """`unchecked_terms` of signals already passed through `weighted`
        (so that `MultiResolutionSTFTLoss` A-weights once for all its
        resolutions).

        Signals loud enough that a square could overflow the dtype (a peak
        above `quiet_limit`, about $10^{4}$ for a few seconds of float32
        audio at auraloss's resolutions) are scaled down
        together by a power of two $c$ first, with `eps` scaled by $c^2$ and
        the linear-magnitude distance by $1/c$ ($1/c^2$ for L2): the other
        terms do not change with a common scale, and a power of two scales
        exactly, so the terms are those of the direct formulas to rounding.
        Quieter signals are not scaled ($c = 1$). `peak` is `signal_peak(pred,
        target)`, if the caller has it (computed once for all resolutions)."""
        if peak is None:
            peak = signal_peak(pred, target)
        c = power_of_two_scale(peak, self.quiet_limit(pred))
        eps = _cast(self.eps, pred) * (c * c)
        lin_scale = 1 / c if self.mag_distance == "L1" else 1 / (c * c)
        return self.scaled_terms(pred, target, c, eps, lin_scale)

    def quiet_limit(self, x: jax.Array) -> float:
        """A peak below which no sum of squares in the terms' formulas, nor
        its square (which their derivatives divide by), overflows the dtype
        of `x` (signals of its shape): a magnitude is at most the window's
        sum times the peak (times the filterbank's largest row sum), and the
        largest sum adds `x.size / hop_size + 1` frames of
        `fft_size // 2 + 1` bins of such squares (four times over, for a
        difference of two): below the square root of the dtype's largest
        value."""
        window = analysis_window(self.window, self.win_length, self.fft_size)
        gain = float(np.sum(np.abs(window)))
        bank = self.filterbank()
        if bank is not None:
            gain *= max(float(np.max(np.sum(np.abs(bank), axis=1))), 1.0)
        frames = x.size // max(x.shape[-1], 1) * (x.shape[-1] // self.hop_size + 1)
        count = frames * (self.fft_size // 2 + 1)
        largest = float(jnp.finfo(x.dtype).max)
        return math.sqrt(math.sqrt(largest) / (4 * count)) / gain

    def scaled_terms(
        self,
        pred: jax.Array,
        target: jax.Array,
        scale: jax.Array,
        eps: jax.Array,
        lin_scale: jax.Array,
    ) -> STFTLossTerms:
        """The terms of signals scaled by `scale` (a power of two, chosen by
        `weighted_terms`), with the clamp `eps` and the factor `lin_scale` of
        the linear-magnitude distance that undo it."""
        pred_spec = self.spectrum(pred, scale)
        target_spec = self.spectrum(target, scale)
        x = clamped_magnitude(pred_spec, eps)
        y = clamped_magnitude(target_spec, eps)
        bank = self.filterbank()
        if bank is not None:
            bank_t = jnp.asarray(bank.T, x.dtype)
            x = jnp.matmul(x, bank_t, precision="highest")
            y = jnp.matmul(y, bank_t, precision="highest")
        if self.scale_invariance:
            alpha = jnp.sum(x * y, axis=(-2, -1), keepdims=True) / jnp.sum(
                y * y, axis=(-2, -1), keepdims=True
            )
            y = y * alpha
        zero = jnp.zeros((), x.dtype)
        sc_mag = log_mag = lin_mag = phs = zero
        if not _is_zero(self.w_sc):
            sc_mag = _norm(y - x) / _norm(y)
        if not _is_zero(self.w_log_mag):
            log_mag = _distance(
                jnp.log(x), jnp.log(y), self.mag_distance, self.reduction
            )
        if not _is_zero(self.w_lin_mag):
            lin_mag = _distance(x, y, self.mag_distance, self.reduction) * lin_scale
        if not _is_zero(self.w_phs):
            d = safe_angle(pred_spec) - safe_angle(target_spec)
            phs = jnp.mean(d * d)
        total = zero
        for w, term in (
            (self.w_sc, sc_mag),
            (self.w_log_mag, log_mag),
            (self.w_lin_mag, lin_mag),
            (self.w_phs, phs),
        ):
            if not _is_zero(w):
                total = total + _cast(w, x) * term
        return STFTLossTerms(total, sc_mag, log_mag, lin_mag, phs)

    def unchecked_loss(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        """The loss (a scalar, whatever `output`) without `__call__`'s
        checks."""
        return self.unchecked_terms(pred, target).loss

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""] | STFTLossTerms:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time >= fft_size`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype (`STFTLossTerms` with
        `output="full"`). Mismatched shapes, too short or non-finite signals
        raise an error naming the argument; a dtype other than float32 or
        float64 (float16, bfloat16: XLA's FFT has no such transform) raises
        `TypeError` naming it.
        """
        pred, target = check_signals(pred, target, self.fft_size)
        terms = compiled_terms(self, pred, target)
        return terms if self.output == "full" else terms.loss
