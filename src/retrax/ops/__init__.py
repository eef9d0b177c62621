"""Differentiable linear recursive filters whose gradients run the adjoint filter."""

from ._allpole import allpole as allpole, linear_recurrence as linear_recurrence
from ._ballistics import ballistics as ballistics
from ._comb import comb as comb, schroeder_allpass as schroeder_allpass
from ._delay import delay as delay
from ._fdn import fdn as fdn
from ._fdn_frequency import (
    fdn_frequency_response as fdn_frequency_response,
    fdn_impulse_response as fdn_impulse_response,
)
from ._filtfilt import filtfilt as filtfilt, sosfiltfilt as sosfiltfilt
from ._fir import fir as fir
from ._freqz import freqz as freqz, freqz_sos as freqz_sos, sosfreqz as sosfreqz
from ._lfilter import lfilter as lfilter, lfilter_zi as lfilter_zi, lfiltic as lfiltic
from ._lfilter_tv import lfilter_tv as lfilter_tv, lfilter_tv_zi as lfilter_tv_zi
from ._sosfilt import sosfilt as sosfilt, sosfilt_zi as sosfilt_zi
from ._state_space import (
    diag_state_space as diag_state_space,
    state_space as state_space,
)
