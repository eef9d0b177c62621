"""Spectral losses for audio: single- and multi-resolution STFT losses."""

from ._multi_resolution import (
    MultiResolutionSTFTLoss as MultiResolutionSTFTLoss,
    multi_resolution_stft_loss as multi_resolution_stft_loss,
)
from ._stft_loss import STFTLoss as STFTLoss
