"""The history a fractional delay line reads before its first sample.

`ops.delay` keeps this many past inputs as its state, and the delay effects
size their streaming state by it, so both packages share it here.
"""

import math
from typing import Literal


Interpolation = Literal["linear", "lagrange3"]
INTERPOLATIONS = ("linear", "lagrange3")


def history_length(interpolation: Interpolation, max_delay: float) -> int:
    """The past inputs a delay up to `max_delay` reads at $t = 0$: it reads
    back to `x[-history_length]`."""
    whole = math.floor(max_delay)
    if interpolation == "linear":
        return whole + 1
    return max(whole + 2, 3)


def supported_delay(interpolation: Interpolation, length: int) -> int:
    """The largest `max_delay` that a history of `length` samples supports."""
    return length - 1 if interpolation == "linear" else length - 2
