"""The STFT loss on mel or chroma bands (auraloss's `MelSTFTLoss` and
`ChromaSTFTLoss`)."""

from typing import Any

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, Real

from ._stft import Window
from ._stft_loss import Distance, Output, Reduction, STFTLoss, STFTLossTerms, Weight


# The constructors' arguments that pass to `STFTLoss` as they are, by name.
_SHARED = (
    "fft_size",
    "hop_size",
    "win_length",
    "window",
    "w_sc",
    "w_log_mag",
    "w_lin_mag",
    "w_phs",
    "eps",
    "reduction",
    "mag_distance",
    "sample_rate",
    "perceptual_weighting",
    "scale_invariance",
    "output",
)


def _stft_loss(scale: str, n_bins: int, arguments: dict[str, Any]) -> STFTLoss:
    """The `STFTLoss` at `scale` with `n_bins` bins, built from a scaled
    loss's constructor `arguments` (its `locals()`): the mel and the chroma
    loss differ only in the scale and the name of the number of bins."""
    return STFTLoss(
        scale=scale, n_bins=n_bins, **{name: arguments[name] for name in _SHARED}
    )


class AbstractScaledSTFTLoss(eqx.Module):
    """An `STFTLoss` at a fixed frequency scale; called as the `STFTLoss` it
    holds."""

    stft: eqx.AbstractVar[STFTLoss]

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""] | STFTLossTerms:
        """The loss of `pred` against `target`, as `STFTLoss.__call__`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time >= fft_size`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype (`STFTLossTerms` with
        `output="full"`).
        """
        return self.stft(pred, target)


class MelSTFTLoss(AbstractScaledSTFTLoss):
    """`STFTLoss` on `n_mels` mel bands, as auraloss's `MelSTFTLoss`:
    `STFTLoss(..., scale="mel", n_bins=n_mels, sample_rate=sample_rate)`.

    The magnitudes (clamped) are mapped to librosa's Slaney mel bands
    (`mel_filterbank(sample_rate, fft_size, n_mels)`) before the terms.

    **Arguments:**

    - `sample_rate`: the sample rate in Hz.
    - `fft_size`, `hop_size`, `win_length`, `window`, `w_sc`, `w_log_mag`,
      `w_lin_mag`, `w_phs`: as `STFTLoss`, in auraloss's order.
    - `n_mels`: the number of mel bands, in `[1, fft_size]`.
    - `eps`, `reduction`, `mag_distance`, `perceptual_weighting`,
      `scale_invariance`, `output`: as `STFTLoss` (auraloss's keyword
      arguments).

    **Fields:**

    - `stft`: the `STFTLoss` it evaluates.
    """

    stft: STFTLoss

    def __init__(
        self,
        sample_rate: float | int,
        fft_size: int = 1024,
        hop_size: int = 256,
        win_length: int = 1024,
        window: Window = "hann_window",
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        w_phs: Weight = 0.0,
        n_mels: int = 128,
        *,
        eps: Weight = 1e-8,
        reduction: Reduction = "mean",
        mag_distance: Distance = "L1",
        perceptual_weighting: bool = False,
        scale_invariance: bool = False,
        output: Output = "loss",
    ):
        self.stft = _stft_loss("mel", n_mels, locals())


class ChromaSTFTLoss(AbstractScaledSTFTLoss):
    """`STFTLoss` on `n_chroma` chroma bins, as auraloss's `ChromaSTFTLoss`:
    `STFTLoss(..., scale="chroma", n_bins=n_chroma, sample_rate=sample_rate)`.

    The magnitudes (clamped) are mapped to librosa's chroma filters
    (`chroma_filterbank(sample_rate, fft_size, n_chroma)`) before the terms.
    auraloss 0.4.0's `ChromaSTFTLoss` raises `TypeError` at construction (it
    registers librosa's NumPy filterbank as a torch buffer); this is what it
    computes with that filterbank as a tensor.

    **Arguments:**

    - `sample_rate`: the sample rate in Hz.
    - `fft_size`, `hop_size`, `win_length`, `window`, `w_sc`, `w_log_mag`,
      `w_lin_mag`, `w_phs`: as `STFTLoss`, in auraloss's order.
    - `n_chroma`: the number of chroma bins, in `[1, fft_size]`.
    - `eps`, `reduction`, `mag_distance`, `perceptual_weighting`,
      `scale_invariance`, `output`: as `STFTLoss` (auraloss's keyword
      arguments).

    **Fields:**

    - `stft`: the `STFTLoss` it evaluates.
    """

    stft: STFTLoss

    def __init__(
        self,
        sample_rate: float | int,
        fft_size: int = 1024,
        hop_size: int = 256,
        win_length: int = 1024,
        window: Window = "hann_window",
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        w_phs: Weight = 0.0,
        n_chroma: int = 12,
        *,
        eps: Weight = 1e-8,
        reduction: Reduction = "mean",
        mag_distance: Distance = "L1",
        perceptual_weighting: bool = False,
        scale_invariance: bool = False,
        output: Output = "loss",
    ):
        self.stft = _stft_loss("chroma", n_chroma, locals())
