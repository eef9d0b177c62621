"""The magnitude spectrogram that the spectral losses compare."""

from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np


Window = Literal[
    "hann_window",
    "hamming_window",
    "blackman_window",
    "bartlett_window",
    "kaiser_window",
]
WINDOWS = (
    "hann_window",
    "hamming_window",
    "blackman_window",
    "bartlett_window",
    "kaiser_window",
)
# torch.kaiser_window's default shape parameter.
KAISER_BETA = 12.0


def analysis_window(name: str, win_length: int, fft_size: int) -> np.ndarray:
    """The periodic window `name` of `win_length` samples, zero-padded on both
    sides to `fft_size` samples as `torch.stft` pads it (float64)."""
    n = np.arange(win_length)
    phase = 2 * np.pi * n / win_length
    if win_length == 1:
        w = np.ones(1)
    elif name == "hann_window":
        w = 0.5 - 0.5 * np.cos(phase)
    elif name == "hamming_window":
        w = 0.54 - 0.46 * np.cos(phase)
    elif name == "blackman_window":
        w = 0.42 - 0.5 * np.cos(phase) + 0.08 * np.cos(2 * phase)
    elif name == "bartlett_window":
        w = 1.0 - np.abs(2.0 * n / win_length - 1.0)
    elif name == "kaiser_window":
        # periodic: the symmetric window one sample longer, less its last
        w = np.kaiser(win_length + 1, KAISER_BETA)[:-1]
    else:
        raise ValueError(f"`window` must be one of {WINDOWS}, got {name!r}.")
    left = (fft_size - win_length) // 2
    return np.pad(w, (left, fft_size - win_length - left))


def stft(
    x: jax.Array, fft_size: int, hop_size: int, window: np.ndarray | jax.Array
) -> jax.Array:
    """The complex STFT of `x` over its last axis, `(..., frames, fft_size // 2 + 1)`.

    The frames are those of `torch.stft(..., center=True, pad_mode="reflect")`:
    the signal is reflected by `fft_size // 2` samples at both ends and frame
    `m` starts at sample `m * hop_size` of the padded signal.
    """
    pad = fft_size // 2
    widths = [(0, 0)] * (x.ndim - 1) + [(pad, pad)]
    padded = jnp.pad(x, widths, mode="reflect")
    n_frames = 1 + (padded.shape[-1] - fft_size) // hop_size
    index = np.arange(n_frames)[:, None] * hop_size + np.arange(fft_size)[None, :]
    frames = padded[..., index] * jnp.asarray(window, x.dtype)
    return jnp.fft.rfft(frames, axis=-1)


def stft_power(
    x: jax.Array, fft_size: int, hop_size: int, window: np.ndarray
) -> jax.Array:
    """`|STFT(x)|^2`, `(..., frames, fft_size // 2 + 1)`, with `stft`'s frames."""
    spectrum = stft(x, fft_size, hop_size, window)
    return jnp.real(spectrum) ** 2 + jnp.imag(spectrum) ** 2


def clamped_magnitude(spectrum: jax.Array, eps: float | jax.Array) -> jax.Array:
    """`sqrt(max(|spectrum|^2, eps))` in the spectrum's real dtype. The clamp
    at `eps` keeps the logarithm and its derivative finite in silent bins."""
    power = jnp.real(spectrum) ** 2 + jnp.imag(spectrum) ** 2
    return jnp.sqrt(jnp.maximum(power, jnp.asarray(eps, power.dtype)))


def safe_angle(spectrum: jax.Array) -> jax.Array:
    """`jnp.angle(spectrum)` with derivative 0 (not NaN) at 0, where the
    angle is undefined (as torch's `angle` defines it): silent bins. A zero
    bin's angle is 0."""
    re, im = jnp.real(spectrum), jnp.imag(spectrum)
    zero = (re == 0) & (im == 0)
    # (a zero bin's angle is 0, as `jnp.angle` gives it for +0; the inputs
    # replaced there keep the derivative finite, and 0 by the `where`)
    return jnp.arctan2(jnp.where(zero, 0, im), jnp.where(zero, 1, re))
