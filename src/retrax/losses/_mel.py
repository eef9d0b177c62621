"""Mel filterbanks (librosa's Slaney-style `librosa.filters.mel`)."""

import numpy as np

from .._validate import check_positive_int, check_rate


_F_SP = 200.0 / 3  # Hz per mel below 1 kHz
_MIN_LOG_HZ = 1000.0
_MIN_LOG_MEL = _MIN_LOG_HZ / _F_SP
_LOGSTEP = np.log(6.4) / 27.0


def _hz_to_mel(f: float | np.ndarray) -> np.ndarray:
    f = np.asarray(f, np.float64)
    log = _MIN_LOG_MEL + np.log(np.maximum(f, _MIN_LOG_HZ) / _MIN_LOG_HZ) / _LOGSTEP
    return np.where(f >= _MIN_LOG_HZ, log, f / _F_SP)


def _mel_to_hz(m: float | np.ndarray) -> np.ndarray:
    m = np.asarray(m, np.float64)
    log = _MIN_LOG_HZ * np.exp(_LOGSTEP * (np.maximum(m, _MIN_LOG_MEL) - _MIN_LOG_MEL))
    return np.where(m >= _MIN_LOG_MEL, log, _F_SP * m)


def mel_filterbank(
    sample_rate: float | int,
    fft_size: int,
    n_mels: int = 128,
    f_min: float | int = 0.0,
    f_max: float | int | None = None,
) -> np.ndarray:
    """Triangular mel filters, `(n_mels, fft_size // 2 + 1)`, in float64.

    The same matrix as `librosa.filters.mel(sr=sample_rate, n_fft=fft_size,
    n_mels=n_mels, fmin=f_min, fmax=f_max)`: Slaney's mel scale (linear below
    1 kHz, logarithmic above), filters with corners at neighbouring centres,
    each scaled to unit area in Hz ("slaney" normalisation).

    **Arguments:**

    - `sample_rate`: the sample rate in Hz, a finite number > 0.
    - `fft_size`: the FFT length the spectra come from, a positive integer.
    - `n_mels`: the number of bands, a positive integer.
    - `f_min`, `f_max`: the band edges in Hz, `0 <= f_min < f_max <=
      sample_rate / 2` (`f_max=None` is `sample_rate / 2`).

    **Returns:**

    The filters as a NumPy array (a constant of any traced program).
    """
    sample_rate = check_rate("sample_rate", sample_rate)
    check_positive_int("fft_size", fft_size)
    check_positive_int("n_mels", n_mels)
    f_max = sample_rate / 2 if f_max is None else f_max
    if not 0 <= f_min < f_max <= sample_rate / 2:
        raise ValueError(
            "`f_min` and `f_max` must satisfy 0 <= f_min < f_max <= sample_rate / 2, "
            f"got f_min={f_min!r}, f_max={f_max!r} at sample_rate={sample_rate!r}."
        )
    f_min, f_max = float(f_min), float(f_max)
    fft_freqs = np.linspace(0, sample_rate / 2, 1 + fft_size // 2)
    mel = np.linspace(_hz_to_mel(f_min), _hz_to_mel(f_max), n_mels + 2)
    centres = _mel_to_hz(mel)
    widths = np.diff(centres)
    ramps = centres[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / widths[:-1, None]
    upper = ramps[2:] / widths[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (centres[2:] - centres[:-2]))[:, None]
