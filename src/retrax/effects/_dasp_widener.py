"""dasp-pytorch's mid/side stereo widener, by its definition."""

from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import Range
from .._signal import stereo
from ._stereo import AbstractStereoEffect, mix


class DaspStereoWidener(AbstractStereoEffect):
    r"""dasp-pytorch's stereo widener, `dasp_pytorch.functional.stereo_widener`.

    With $M = (x_L + x_R)/\sqrt2$ and $S = (x_L - x_R)/\sqrt2$ scaled to
    $2(1 - w) M$ and $2 w S$, the output is $((M + S)/\sqrt2, (M - S)/\sqrt2)$:

    $$y_L = (1 - w)(x_L + x_R) + w (x_L - x_R) = x_L + (1 - 2w) x_R,\quad
    y_R = (1 - w)(x_L + x_R) - w (x_L - x_R) = (1 - 2w) x_L + x_R.$$

    $w = 1/2$ leaves the signal as it is, $w = 0$ is the mid channel at
    twice its level, $w = 1$ the side channel at twice its level. It is
    retrax's [`StereoWidener`][retrax.effects.StereoWidener] of width
    $w / (1 - w)$ after a gain of $2(1 - w)$, which that widener's range
    ($[0, 2]$, $w \le 2/3$) cannot reach beyond $w = 2/3$: this class covers
    dasp's whole range.

    **Arguments:**

    - `width`: $w$, in $[0, 1]$ (normalised linearly; dasp gives it no
      range, its docstring says "higher is wider" and $w > 1$ inverts the
      mid channel); dasp's vector `[width]` also goes through
      `retrax.effects.from_dasp(DaspStereoWidener, p)` and `to_dasp`.

    Takes mono `(time,)` (sent to both channels) or stereo `(2, time)` and
    returns `(2, time)`; stateless. A `width` out of range raises an error
    (also under `jax.jit`).
    """

    width: Float[Array, ""]

    RANGES: ClassVar[dict[str, Range]] = {"width": Range(0.0, 1.0)}

    def __init__(self, width: Shaped[ArrayLike, ""] = 0.5):
        self.width = self.RANGES["width"].check_init("width", width)

    def stereo_output(self, x: Array) -> Array:
        """dasp's widening of `x` `(time,)` or `(2, time)`: the mix
        $(x_L + (1 - 2w) x_R,\\ (1 - 2w) x_L + x_R)$."""
        x = stereo(x)
        w = self.param("width", x.dtype)
        return mix(x, jnp.ones_like(w), 1 - 2 * w)
