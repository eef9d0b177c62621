"""Chroma filterbanks (librosa's `librosa.filters.chroma`)."""

import numpy as np

from .._validate import check_positive_int, check_rate


def chroma_filterbank(
    sample_rate: float | int,
    fft_size: int,
    n_chroma: int = 12,
    tuning: float | int = 0.0,
    ctroct: float | int = 5.0,
    octwidth: float | int | None = 2.0,
    base_c: bool = True,
) -> np.ndarray:
    r"""Chroma (pitch-class) filters, `(n_chroma, fft_size // 2 + 1)`, in float64.

    The same matrix as `librosa.filters.chroma(sr=sample_rate, n_fft=fft_size,
    n_chroma=n_chroma, tuning=tuning, ctroct=ctroct, octwidth=octwidth,
    base_c=base_c)` (Ellis's chroma): each FFT bin $k > 0$ sits at
    $c_k = n_{chroma} \log_2(f_k / (440 \cdot 2^{tuning / n_{chroma}} / 16))$
    chroma bins (the 0 Hz bin 1.5 octaves below bin 1); filter $j$ weights bin
    $k$ by a Gaussian in the circular distance between $c_k$ and $j$ (half the
    bin's spacing wide), each bin's weights are scaled to unit Euclidean norm,
    then weighted by a Gaussian in octaves centred on `ctroct` (octaves above
    A0 = 27.5 Hz) of half-width `octwidth` (`None`: flat), and the rows are
    rotated to start at C (`base_c`) rather than A.

    **Arguments:**

    - `sample_rate`: the sample rate in Hz, a finite number > 0.
    - `fft_size`: the FFT length the spectra come from, a positive integer.
    - `n_chroma`: the number of chroma bins, a positive integer.
    - `tuning`: the deviation from A440 in chroma bins.
    - `ctroct`, `octwidth`: the octave weighting's centre and half-width
      (`octwidth > 0`, or `None`).
    - `base_c`: start the filters at C (`True`) or at A.

    **Returns:**

    The filters as a NumPy array (a constant of any traced program).
    """
    sample_rate = check_rate("sample_rate", sample_rate)
    check_positive_int("fft_size", fft_size)
    check_positive_int("n_chroma", n_chroma)
    for name, value in (("tuning", tuning), ("ctroct", ctroct)):
        if not np.isfinite(value):
            raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    if octwidth is not None and not (np.isfinite(octwidth) and octwidth > 0):
        raise ValueError(
            f"`octwidth` must be a finite number > 0 or None, got {octwidth!r}."
        )
    if fft_size < 2:
        raise ValueError(f"`fft_size` must be at least 2 for chroma, got {fft_size}.")
    freqs = np.linspace(0, sample_rate, fft_size, endpoint=False)[1:]
    a440 = 440.0 * 2.0 ** (tuning / n_chroma)
    bins = n_chroma * np.log2(freqs / (a440 / 16))
    bins = np.concatenate(([bins[0] - 1.5 * n_chroma], bins))
    widths = np.concatenate((np.maximum(bins[1:] - bins[:-1], 1.0), [1]))
    distance = np.subtract.outer(bins, np.arange(n_chroma, dtype=np.float64)).T
    half = np.round(n_chroma / 2)
    # into [-n_chroma / 2, n_chroma / 2): the offset keeps the remainder's
    # argument positive, as librosa does
    distance = np.remainder(distance + half + 10 * n_chroma, n_chroma) - half
    weights = np.exp(-0.5 * (2 * distance / widths[None, :]) ** 2)
    norms = np.sqrt(np.sum(weights**2, axis=0))
    norms[norms < np.finfo(weights.dtype).tiny] = 1.0
    weights = weights / norms
    if octwidth is not None:
        weights = weights * np.exp(-0.5 * ((bins / n_chroma - ctroct) / octwidth) ** 2)
    if base_c:
        weights = np.roll(weights, -3 * (n_chroma // 12), axis=0)
    return np.ascontiguousarray(weights[:, : fft_size // 2 + 1])
