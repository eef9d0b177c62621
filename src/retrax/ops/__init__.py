"""Differentiable linear recursive filters whose gradients run the adjoint filter."""

from ._allpole import allpole as allpole, linear_recurrence as linear_recurrence
from ._ballistics import ballistics as ballistics
from ._filtfilt import filtfilt as filtfilt
from ._fir import fir as fir
from ._lfilter import lfilter as lfilter, lfilter_zi as lfilter_zi, lfiltic as lfiltic
from ._sosfilt import freqz as freqz, sosfilt as sosfilt, sosfreqz as sosfreqz
from ._state_space import (
    diag_state_space as diag_state_space,
    state_space as state_space,
)
