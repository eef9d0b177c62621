"""Differentiable oscillators for synthesis: phase, sine and FM operators."""

from ._oscillators import fm_operator as fm_operator, phase as phase, sine as sine
