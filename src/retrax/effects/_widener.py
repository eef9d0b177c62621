"""A mid/side stereo widener."""

from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import AbstractRangedEffect, Range
from .._signal import no_state, output, stereo


class StereoWidener(AbstractRangedEffect):
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

    def ranges(self) -> dict[str, Range]:
        """`width` in $[0, 2]$."""
        return self.RANGES

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "2 time"] | tuple[Float[Array, "2 time"], None]:
        """Widen `x` `(time,)` or `(2, time)`; returns `(2, time)`."""
        no_state(zi)
        x = stereo(x)
        w = self.param("width", x.dtype)
        # (M + w S, M - w S) as a 2 x 2 matrix times the signal: its
        # transposes are dots (see the panner)
        a, b = 0.5 * (1 + w), 0.5 * (1 - w)
        matrix = jnp.stack([jnp.stack([a, b]), jnp.stack([b, a])])
        return output(jnp.einsum("ij,jt->it", matrix, x), None, return_zf)
