"""Audio effects on retrax's primitives, with normalised parameters for controllers."""

from .._effect import (
    AbstractEffect as AbstractEffect,
    AbstractRangedEffect as AbstractRangedEffect,
    Range as Range,
)

# The filters and the compressor are effects too: the same classes as in
# `retrax.filters`, where they are defined and documented.
from ..filters import (
    SVF as SVF,
    Biquad as Biquad,
    Compressor as Compressor,
    ParametricEQ as ParametricEQ,
)
from ._chain import Chain as Chain
from ._chorus import Chorus as Chorus
from ._dasp_compressor import DaspCompressor as DaspCompressor
from ._dasp_eq import DaspParametricEQ as DaspParametricEQ
from ._dasp_panner import DaspStereoPanner as DaspStereoPanner
from ._dasp_vectors import (
    dasp_parameters as dasp_parameters,
    from_dasp as from_dasp,
    to_dasp as to_dasp,
    with_dasp as with_dasp,
)
from ._dasp_widener import DaspStereoWidener as DaspStereoWidener
from ._delay import Delay as Delay
from ._distortion import Distortion as Distortion
from ._fdn_reverb import FDNReverb as FDNReverb
from ._feedback_delay import FeedbackDelay as FeedbackDelay
from ._freeverb import Freeverb as Freeverb
from ._gain import Gain as Gain
from ._noise_reverb import NoiseShapedReverb as NoiseShapedReverb
from ._panner import StereoPanner as StereoPanner
from ._ping_pong import PingPongDelay as PingPongDelay
from ._stereo_bus import stereo_bus as stereo_bus
from ._widener import StereoWidener as StereoWidener
