"""The spectral loss at one STFT resolution (auraloss's `STFTLoss`)."""

from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from .._errors import error_if
from .._float_dtypes import check_float_dtype
from .._misc import as_inexact, check_positive_int, check_value, result_dtype
from ._stft import WINDOWS, Window, analysis_window, stft_magnitude


Weight = float | int | Real[Array, ""]
Reduction = Literal["mean", "sum"]
Distance = Literal["L1", "L2"]


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
    pred: ArrayLike, target: ArrayLike, min_length: int, *, fft: bool = True
) -> tuple[jax.Array, jax.Array]:
    """`pred` and `target` as arrays of one float dtype, checked.

    Shapes `(time,)`, `(channels, time)` or `(batch, channels, time)`, equal
    for both, with at least `min_length` samples; values finite (checked under
    `jit` too). With `fft` (the STFT losses) the dtype must be float32 or
    float64, XLA's FFT's (`TypeError` otherwise).
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
    pred = error_if(
        pred.astype(dtype),
        ~jnp.all(jnp.isfinite(pred)),
        "`pred` contains non-finite values.",
    )
    target = error_if(
        target.astype(dtype),
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


class STFTLoss(eqx.Module):
    r"""The spectral loss at one STFT resolution, as auraloss's `STFTLoss`.

    With $X$, $Y$ the magnitude spectrograms of `pred` and `target`
    ($|\mathrm{STFT}|$ clamped below at $\sqrt{\varepsilon}$), the loss is

    $$w_{sc} \frac{\lVert Y - X \rVert_F}{\lVert Y \rVert_F}
    + w_{log} \, d(\log X, \log Y) + w_{lin} \, d(X, Y)$$

    (spectral convergence, Arik et al. 2018, and the log- and linear-magnitude
    distances), where $d$ is the mean (or sum, `reduction="sum"`) of the
    absolute (`"L1"`) or squared (`"L2"`) differences. The STFT is
    `torch.stft`'s: periodic window of `win_length` samples centred in
    `fft_size`, the signal reflected by `fft_size // 2` samples at both ends.

    Signals are `(time,)`, `(channels, time)` or `(batch, channels, time)`; as
    in auraloss the norms and means run over the whole input, so the loss of
    a batch is not the mean of the examples' losses (use `jax.vmap` for
    per-example losses).

    **Arguments:**

    - `fft_size`: FFT length in samples, a positive integer.
    - `hop_size`: hop between frames in samples, a positive integer.
    - `win_length`: window length in samples, in `[1, fft_size]`.
    - `window`: `"hann_window"`, `"hamming_window"`, `"blackman_window"` or
      `"bartlett_window"` (torch's periodic windows).
    - `w_sc`, `w_log_mag`, `w_lin_mag`: weights of the three terms, >= 0.
    - `eps`: the clamp of the squared magnitude, > 0.
    - `reduction`: `"mean"` or `"sum"` for the magnitude distances.
    - `mag_distance`: `"L1"` or `"L2"`.

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

    def magnitudes(self, x: jax.Array) -> jax.Array:
        """The clamped magnitude spectrogram of checked signals `x`,
        `(..., frames, fft_size // 2 + 1)`."""
        window = analysis_window(self.window, self.win_length, self.fft_size)
        return stft_magnitude(x, self.fft_size, self.hop_size, window, self.eps)

    def unchecked_loss(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        """The loss without `__call__`'s checks, for signals already checked
        (as `MultiResolutionSTFTLoss` does once for all its resolutions)."""
        x = self.magnitudes(pred)
        y = self.magnitudes(target)
        total = jnp.zeros((), x.dtype)
        if not _is_zero(self.w_sc):
            total = total + _cast(self.w_sc, x) * (_norm(y - x) / _norm(y))
        if not _is_zero(self.w_log_mag):
            log_mag = _distance(
                jnp.log(x), jnp.log(y), self.mag_distance, self.reduction
            )
            total = total + _cast(self.w_log_mag, x) * log_mag
        if not _is_zero(self.w_lin_mag):
            lin_mag = _distance(x, y, self.mag_distance, self.reduction)
            total = total + _cast(self.w_lin_mag, x) * lin_mag
        return total

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""]:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time >= fft_size`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype. Mismatched shapes, too
        short or non-finite signals raise an error naming the argument; a
        dtype other than float32 or float64 (float16, bfloat16: XLA's FFT
        has no such transform) raises `TypeError` naming it.
        """
        pred, target = check_signals(pred, target, self.fft_size)
        return self.unchecked_loss(pred, target)
