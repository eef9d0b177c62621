"""Trainable filter components and stable parametrisations."""

from ._parametrise import (
    biquad_denominator as biquad_denominator,
    lpc2rc as lpc2rc,
    rc2lpc as rc2lpc,
)
