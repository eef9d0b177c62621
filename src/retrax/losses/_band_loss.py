"""What the band-energy losses share: STFT settings, band energies and the L1
distance of their logarithms."""

import abc

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from .._validate import check_positive_int
from ._stft import WINDOWS, Window, analysis_window, stft_power
from ._stft_loss import Weight, check_choice, check_signals, compiled_terms


def check_stft_settings(
    fft_size: int, hop_size: int, win_length: int | None, window: Window
) -> int:
    """The checked STFT settings of a band-energy loss; returns `win_length`
    (`fft_size` when `None`). The filterbank checks `fft_size` itself."""
    win_length = fft_size if win_length is None else win_length
    check_positive_int("hop_size", hop_size)
    check_positive_int("win_length", win_length)
    check_choice("window", window, WINDOWS)
    if win_length > fft_size:
        raise ValueError(
            f"`win_length` ({win_length}) must not exceed `fft_size` ({fft_size})."
        )
    return win_length


def band_energies(
    x: jax.Array,
    bank: np.ndarray,
    fft_size: int,
    hop_size: int,
    win_length: int,
    window: str,
) -> jax.Array:
    """The energies `(..., frames, bands)` of signals `x` in the bands whose
    weights on the STFT's bins are the rows of `bank`."""
    power = stft_power(
        x, fft_size, hop_size, analysis_window(window, win_length, fft_size)
    )
    return power @ jnp.asarray(bank.T, x.dtype)


def log_band_l1(e_pred: jax.Array, e_target: jax.Array, eps: float) -> jax.Array:
    r"""The mean over all entries of
    $|\log(E^{pred} + \varepsilon) - \log(E^{target} + \varepsilon)|$."""
    eps = jnp.asarray(eps).astype(e_pred.dtype)
    d = jnp.log(e_pred + eps) - jnp.log(e_target + eps)
    # sign(d) * d: |d| with a zero derivative where pred meets target.
    return jnp.mean(jnp.sign(d) * d)


class AbstractBandEnergyLoss(eqx.Module):
    """A loss on the log energies of frequency bands of an STFT.

    Subclasses are final modules that hold the STFT settings and implement
    `filterbank()`, the bands' weights on the STFT's bins.
    """

    fft_size: eqx.AbstractVar[int]
    hop_size: eqx.AbstractVar[int]
    win_length: eqx.AbstractVar[int]
    window: eqx.AbstractVar[Window]
    eps: eqx.AbstractVar[Weight]

    @abc.abstractmethod
    def filterbank(self) -> np.ndarray:
        """The bands' weights `(bands, fft_size // 2 + 1)` on the STFT's bins."""

    def band_energies(self, x: jax.Array) -> jax.Array:
        """The band energies of checked signals `x`, `(..., frames, bands)`."""
        return band_energies(
            x,
            self.filterbank(),
            self.fft_size,
            self.hop_size,
            self.win_length,
            self.window,
        )

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
        return compiled_terms(self, pred, target)

    def unchecked_terms(self, pred: jax.Array, target: jax.Array) -> jax.Array:
        """The loss of checked signals, without `__call__`'s checks."""
        return log_band_l1(
            self.band_energies(pred), self.band_energies(target), self.eps
        )
