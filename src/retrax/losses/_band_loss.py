"""The distance that the band-energy losses share: L1 of log band energies."""

import jax
import jax.numpy as jnp
import numpy as np

from ._stft import analysis_window, stft_power


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
