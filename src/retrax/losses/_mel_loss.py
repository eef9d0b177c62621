"""A loss on mel band energies: the L1 distance of their logarithms."""

import equinox as eqx
import numpy as np

from ._band_loss import AbstractBandEnergyLoss, check_stft_settings
from ._mel import mel_filterbank
from ._stft import Window
from ._stft_loss import Weight, check_eps


class MelBandEnergyLoss(AbstractBandEnergyLoss):
    r"""The mean absolute difference of log mel band energies.

    With $E_{bm} = \sum_k M_{bk} |X_{mk}|^2$ the energy of mel band $b$ in
    frame $m$ ($M$ from `mel_filterbank`, $X$ the STFT framed as in
    `STFTLoss`), the loss is the mean over bands, frames and signals of
    $|\log(E^{pred}_{bm} + \varepsilon) - \log(E^{target}_{bm} + \varepsilon)|$.
    Signals are `(time,)`, `(channels, time)` or `(batch, channels, time)`
    with `time >= fft_size`; the mean runs over the whole input.

    **Arguments:**

    - `sample_rate`: the signals' sample rate in Hz, a finite number > 0.
    - `fft_size`, `hop_size`, `win_length`, `window`: the STFT, as in
      `STFTLoss` (`win_length=None` is `fft_size`).
    - `n_mels`, `f_min`, `f_max`: the bands, as in `mel_filterbank`.
    - `eps`: added to the energies before the logarithm, > 0.

    Invalid settings raise `ValueError` naming the argument.
    """

    sample_rate: float = eqx.field(static=True)
    fft_size: int = eqx.field(static=True)
    hop_size: int = eqx.field(static=True)
    win_length: int = eqx.field(static=True)
    window: Window = eqx.field(static=True)
    n_mels: int = eqx.field(static=True)
    f_min: float = eqx.field(static=True)
    f_max: float = eqx.field(static=True)
    eps: Weight

    def __init__(
        self,
        sample_rate: float | int,
        fft_size: int = 2048,
        hop_size: int = 512,
        win_length: int | None = None,
        window: Window = "hann_window",
        n_mels: int = 64,
        f_min: float | int = 0.0,
        f_max: float | int | None = None,
        eps: Weight = 1e-8,
    ):
        f_max = sample_rate / 2 if f_max is None else f_max
        # Checks sample_rate, fft_size, n_mels and the band edges.
        mel_filterbank(sample_rate, fft_size, n_mels, f_min, f_max)
        win_length = check_stft_settings(fft_size, hop_size, win_length, window)
        self.sample_rate = float(sample_rate)
        self.fft_size = fft_size
        self.hop_size = hop_size
        self.win_length = win_length
        self.window = window
        self.n_mels = n_mels
        self.f_min = float(f_min)
        self.f_max = float(f_max)
        self.eps = check_eps(eps)

    def filterbank(self) -> np.ndarray:
        """The bands' weights on the STFT's bins, `(bands, fft_size // 2 + 1)`."""
        return mel_filterbank(
            self.sample_rate, self.fft_size, self.n_mels, self.f_min, self.f_max
        )
