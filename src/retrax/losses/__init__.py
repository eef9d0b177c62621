"""Spectral losses for audio: STFT losses and mel band energies."""

from ._mel import mel_filterbank as mel_filterbank
from ._mel_loss import MelBandEnergyLoss as MelBandEnergyLoss
from ._multi_resolution import (
    MultiResolutionSTFTLoss as MultiResolutionSTFTLoss,
    multi_resolution_stft_loss as multi_resolution_stft_loss,
)
from ._stft_loss import STFTLoss as STFTLoss
