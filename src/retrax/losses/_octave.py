"""Fractional-octave bands (IEC 61260-1): centres, FFT filterbanks and band
filters."""

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Real

from .._misc import as_inexact, scipy_signal
from .._validate import check_positive_int, check_rate
from ..ops import sosfilt


_G = 10.0 ** (3.0 / 10.0)  # IEC 61260-1's octave frequency ratio (base 10)
_F_REF = 1000.0


def _band_containing(fraction: int, f: float | int) -> int:
    """The index x of the band with lower edge <= f < upper edge."""
    u = fraction * np.log(f / _F_REF) / np.log(_G)
    # a small tolerance: nominal edges computed in floating point
    return int(np.floor(u + (0.5 if fraction % 2 else 0.0) + 1e-9))


def _centres(fraction: int, x: np.ndarray) -> np.ndarray:
    if fraction % 2:
        return _F_REF * _G ** (x / fraction)
    return _F_REF * _G ** ((2 * x + 1) / (2 * fraction))


def octave_bands(
    fraction: int = 1,
    f_min: float | int = 20.0,
    f_max: float | int = 20000.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The fractional-octave bands of IEC 61260-1 from `f_min` to `f_max`.

    Base-ten bands of $1/b$ octave ($b$ = `fraction`): with
    $G = 10^{3/10}$ and $f_r = 1000$ Hz, the exact midband frequencies are
    $f_m = f_r G^{x/b}$ for odd $b$ and $f_r G^{(2x+1)/(2b)}$ for even
    $b$ (integer $x$), and the band edges $f_m G^{\mp 1/(2b)}$. The nominal
    octave centres 125, 250, ..., 8000 Hz are 125.89, 251.19, ..., 7943.3 Hz
    exactly.

    **Arguments:**

    - `fraction`: $b$, a positive int: 1 for octave bands, 3 for third-octave
      bands.
    - `f_min`, `f_max`: the bands returned run from the band containing
      `f_min` to the band containing `f_max`, `0 < f_min <= f_max`.

    **Returns:**

    `(lower, centre, upper)`: the bands' edges and exact midband frequencies
    in Hz, NumPy float64 arrays of one entry per band, increasing.
    """
    check_positive_int("fraction", fraction)
    if not 0 < f_min <= f_max:
        raise ValueError(
            f"`f_min` and `f_max` must satisfy 0 < f_min <= f_max, got "
            f"f_min={f_min!r}, f_max={f_max!r}."
        )
    x = np.arange(_band_containing(fraction, f_min),
                  _band_containing(fraction, f_max) + 1)  # fmt: skip
    centre = _centres(fraction, x)
    half = 0.5 / fraction
    return centre * _G**-half, centre, centre * _G**half


def _bands_below_nyquist(sample_rate, fraction, f_min, f_max):
    sample_rate = check_rate("sample_rate", sample_rate)
    nyquist = sample_rate / 2
    if f_max is None:
        lower, centre, upper = octave_bands(fraction, f_min, nyquist)
        keep = upper <= nyquist
        lower, centre, upper = lower[keep], centre[keep], upper[keep]
        if not centre.size:
            raise ValueError(
                f"No band of 1/{fraction} octave from `f_min`={f_min!r} Hz fits "
                f"below the Nyquist frequency ({nyquist} Hz): lower `f_min`."
            )
        return sample_rate, lower, centre, upper
    lower, centre, upper = octave_bands(fraction, f_min, f_max)
    if upper[-1] > nyquist:
        raise ValueError(
            f"The band at {centre[-1]:.1f} Hz (from `f_max`={f_max!r}) reaches "
            f"{upper[-1]:.1f} Hz, above the Nyquist frequency ({nyquist} Hz): "
            "lower `f_max` or raise `sample_rate`."
        )
    return sample_rate, lower, centre, upper


def octave_filterbank(
    sample_rate: float | int,
    fft_size: int,
    fraction: int = 1,
    f_min: float | int = 20.0,
    f_max: float | int | None = None,
) -> np.ndarray:
    """Fractional-octave bands on the FFT's bins, `(bands, fft_size // 2 + 1)`.

    Row $i$ is 1 on the bins whose frequency $k f_s / N$ lies in band $i$ of
    `octave_bands` (lower edge included, upper excluded) and 0 elsewhere, so
    a power spectrum times its transpose gives the energy in each band (the
    bands partition the frequencies they cover). `fraction=3` gives
    third-octave bands.

    **Arguments:**

    - `sample_rate`: the sample rate in Hz, a finite number > 0.
    - `fft_size`: the FFT length $N$, a positive int.
    - `fraction`, `f_min`, `f_max`: the bands, as in `octave_bands`; every
      band must lie below the Nyquist frequency (`f_max=None`: the bands from
      `f_min` up to the last one that does).

    **Returns:**

    The weights, a NumPy float64 array (a constant of any traced program).
    A band that holds no bin (too narrow for `fft_size`) or reaches above
    the Nyquist frequency raises a `ValueError`.
    """
    check_positive_int("fft_size", fft_size)
    sample_rate, lower, centre, upper = _bands_below_nyquist(
        sample_rate, fraction, f_min, f_max
    )
    freqs = np.arange(fft_size // 2 + 1) * (sample_rate / fft_size)
    bank = (freqs >= lower[:, None]) & (freqs < upper[:, None])
    empty = ~np.any(bank, axis=1)
    if np.any(empty):
        raise ValueError(
            f"The band at {centre[empty][0]:.1f} Hz holds no FFT bin at "
            f"`fft_size`={fft_size} (bins every {sample_rate / fft_size:.1f} "
            "Hz): raise `fft_size` or `f_min`."
        )
    return bank.astype(np.float64)


def octave_band_sos(
    sample_rate: float | int,
    fraction: int = 1,
    f_min: float | int = 20.0,
    f_max: float | int | None = None,
    order: int = 3,
) -> np.ndarray:
    """Butterworth band-pass filters of the fractional-octave bands.

    Band $i$ is `scipy.signal.butter(order, [lower[i], upper[i]],
    btype="bandpass", fs=sample_rate, output="sos")` with the edges of
    `octave_bands`: a common realisation of fractional-octave band filters,
    e.g. for measuring decay times per band (ISO 3382-1). (Whether a given
    order meets an IEC 61260-1 tolerance class is not checked here.) The
    design needs scipy (`pip install "retrax[scipy]"`).

    **Arguments:**

    - `sample_rate`: the sample rate in Hz, a finite number > 0.
    - `fraction`, `f_min`, `f_max`: the bands, as in `octave_filterbank`.
    - `order`: the Butterworth order of the low-pass prototype, a positive
      int (each band filter has `order` second-order sections).

    **Returns:**

    The sections, shape `(bands, order, 6)`, NumPy float64, each band's in
    `scipy.signal.sosfilt`'s layout.
    """
    check_positive_int("order", order)
    sample_rate, lower, _, upper = _bands_below_nyquist(
        sample_rate, fraction, f_min, f_max
    )
    butter = scipy_signal("the octave band filters (`octave_band_sos`)").butter
    return np.stack([
        butter(order, [lo, hi], btype="bandpass", fs=sample_rate, output="sos")
        for lo, hi in zip(lower, upper, strict=True)
    ])  # fmt: skip


def octave_band_split(
    x: Real[ArrayLike, "*batch time"],
    sample_rate: float | int,
    fraction: int = 1,
    f_min: float | int = 20.0,
    f_max: float | int | None = None,
    order: int = 3,
) -> Float[Array, "*batch bands time"]:
    """`x` filtered by each band filter of `octave_band_sos`.

    The filters run with `retrax.ops.sosfilt` along the last (time) axis, so
    the split is differentiable (adjoint-filter derivatives) and jits and
    vmaps.

    **Arguments:**

    - `x`: real signals, time last, `(..., time)`.
    - `sample_rate`, `fraction`, `f_min`, `f_max`, `order`: the bands and
      filters, as in `octave_band_sos`.

    **Returns:**

    The band signals, `(..., bands, time)`, in `x`'s float dtype.
    """
    sos = octave_band_sos(sample_rate, fraction, f_min, f_max, order)
    x = as_inexact("x", x)
    if jnp.iscomplexobj(x) or x.ndim < 1:
        raise ValueError(
            f"`x` must be real signals with time last, got shape {x.shape} and "
            f"dtype {x.dtype}."
        )
    sos = jnp.asarray(sos, x.dtype)
    bands = jax.vmap(lambda s: sosfilt(s, x, axis=-1))(sos)
    return jnp.moveaxis(bands, 0, -2)
