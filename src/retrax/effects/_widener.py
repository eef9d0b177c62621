"""A mid/side stereo widener."""

from typing import ClassVar

from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import Range
from .._signal import stereo
from ._stereo import AbstractStereoEffect, mix


class StereoWidener(AbstractStereoEffect):
    r"""A mid/side stereo width control.

    With $M = (x_L + x_R)/2$ and $S = (x_L - x_R)/2$, the output is
    $(M + w S,\ M - w S)$: $w = 0$ is mono, $w = 1$ leaves the signal as it
    is, $w > 1$ widens it.

    **Arguments:**

    - `width`: $w$, in $[0, 2]$ (normalised linearly).

    Takes mono `(time,)` (sent to both channels, where it stays mono) or
    stereo `(2, time)` and returns `(2, time)`; stateless. A `width` out of
    range raises an error (also under `jax.jit`).
    """

    width: Float[Array, ""]

    RANGES: ClassVar[dict[str, Range]] = {"width": Range(0.0, 2.0)}

    def __init__(self, width: Shaped[ArrayLike, ""] = 1.0):
        self.width = self.RANGES["width"].check_init("width", width)

    def stereo_output(self, x: Array) -> Array:
        """`(M + w S, M - w S)` of `x` `(time,)` or `(2, time)`."""
        x = stereo(x)
        w = self.param("width", x.dtype)
        return mix(x, 0.5 * (1 + w), 0.5 * (1 - w))
