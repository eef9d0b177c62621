"""Trainable filter components and stable parametrisations."""

from ._compressor import Compressor as Compressor
from ._eq import (
    Biquad as Biquad,
    ParametricEQ as ParametricEQ,
    rbj_section as rbj_section,
)
from ._parametrise import (
    biquad_denominator as biquad_denominator,
    lpc2rc as lpc2rc,
    rc2lpc as rc2lpc,
)
from ._state_space_filter import StateSpaceFilter as StateSpaceFilter
from ._svf import SVF as SVF, svf as svf
