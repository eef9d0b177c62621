"""auraloss's A-weighting pre-emphasis: a linear-phase FIR fit of the IEC
A-weighting curve (auraloss's `FIRFilter(filter_type="aw")`)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .._misc import scipy_signal


# Poles (Hz) and 1 kHz gain (dB) of the analog A-weighting filter, IEC/CD 1672,
# as auraloss defines them.
_F1, _F2, _F3, _F4 = 20.598997, 107.65265, 737.86223, 12194.217
_A1000 = 1.9997
A_WEIGHTING_TAPS = 101


@functools.lru_cache(maxsize=32)
def _taps(sample_rate: float, n_taps: int) -> np.ndarray:
    num = [(2 * np.pi * _F4) ** 2 * (10 ** (_A1000 / 20)), 0, 0, 0, 0]
    den = np.polymul(
        [1, 4 * np.pi * _F4, (2 * np.pi * _F4) ** 2],
        [1, 4 * np.pi * _F1, (2 * np.pi * _F1) ** 2],
    )
    den = np.polymul(np.polymul(den, [1, 2 * np.pi * _F3]), [1, 2 * np.pi * _F2])
    signal = scipy_signal("the A-weighting filter (`perceptual_weighting=True`)")
    b, a = signal.bilinear(num, den, fs=sample_rate)
    freqs, response = signal.freqz(b, a, worN=512, fs=sample_rate)
    taps = signal.firls(n_taps, freqs, np.abs(response), fs=sample_rate)
    # auraloss stores the taps in float32; the same rounding keeps float64
    # losses equal to its float64 ones.
    taps = taps.astype(np.float32).astype(np.float64)
    taps.flags.writeable = False
    return taps


def a_weighting_taps(sample_rate: float, n_taps: int = A_WEIGHTING_TAPS) -> np.ndarray:
    """The `n_taps` (odd) FIR taps of auraloss's A-weighting filter at
    `sample_rate`: the bilinear transform of the analog IEC A-weighting filter,
    its magnitude at 512 frequencies fitted by least squares
    (`scipy.signal.firls`), rounded to float32 as auraloss stores them."""
    return _taps(float(sample_rate), n_taps)


def fir_same(x: jax.Array, taps: np.ndarray) -> jax.Array:
    """`x` filtered along its last axis by `taps` (odd length) as
    `torch.nn.functional.conv1d(x, taps, padding=len(taps) // 2)`: a
    correlation of the zero-padded signal, as long as `x`."""
    half = len(taps) // 2
    kernel = jnp.asarray(taps, x.dtype)
    flat = x.reshape(-1, x.shape[-1])
    padded = jnp.pad(flat, ((0, 0), (half, half)))
    out = jax.vmap(
        lambda row: jnp.correlate(row, kernel, mode="valid", precision="highest")
    )(padded)
    return out.reshape(x.shape)
