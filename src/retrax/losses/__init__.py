"""Losses for audio: STFT losses, time-domain losses (error-to-signal, DC,
log-cosh, SNR and SDR), mel and fractional-octave band energies, and energy
decay curves of impulse responses."""

from ._chroma import chroma_filterbank as chroma_filterbank
from ._edc import (
    EnergyDecayLoss as EnergyDecayLoss,
    energy_decay_curve as energy_decay_curve,
    t60_from_edc as t60_from_edc,
)
from ._mel import mel_filterbank as mel_filterbank
from ._mel_loss import MelBandEnergyLoss as MelBandEnergyLoss
from ._multi_resolution import (
    MultiResolutionSTFTLoss as MultiResolutionSTFTLoss,
    multi_resolution_stft_loss as multi_resolution_stft_loss,
)
from ._octave import (
    octave_band_sos as octave_band_sos,
    octave_band_split as octave_band_split,
    octave_bands as octave_bands,
    octave_filterbank as octave_filterbank,
)
from ._octave_loss import OctaveBandEnergyLoss as OctaveBandEnergyLoss
from ._random_resolution import RandomResolutionSTFTLoss as RandomResolutionSTFTLoss
from ._scaled_stft_loss import (
    AbstractScaledSTFTLoss as AbstractScaledSTFTLoss,
    ChromaSTFTLoss as ChromaSTFTLoss,
    MelSTFTLoss as MelSTFTLoss,
)
from ._stft_loss import STFTLoss as STFTLoss, STFTLossTerms as STFTLossTerms
from ._sum_difference import (
    SumAndDifferenceSTFTLoss as SumAndDifferenceSTFTLoss,
    SumAndDifferenceTerms as SumAndDifferenceTerms,
)
from ._time_domain import (
    AbstractTimeDomainLoss as AbstractTimeDomainLoss,
    DCLoss as DCLoss,
    ESRLoss as ESRLoss,
    LogCoshLoss as LogCoshLoss,
    SDSDRLoss as SDSDRLoss,
    SISDRLoss as SISDRLoss,
    SNRLoss as SNRLoss,
)
