"""dasp-pytorch's stereo panner, by its definition."""

import math
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import Range
from ._stereo import AbstractStereoEffect, pan


class DaspStereoPanner(AbstractStereoEffect):
    r"""dasp-pytorch's panner, `dasp_pytorch.functional.stereo_panner`.

    With $\theta = p\,\pi/2$, a mono signal becomes $(g_L x, g_R x)$ with

    $$g_L = \sqrt{(1 - 2\theta/\pi)\cos\theta},\qquad
    g_R = \sqrt{(2\theta/\pi)\sin\theta},$$

    the geometric mean of the linear and the constant-power (sine) laws: a
    $-4.5$ dB centre. retrax's [`StereoPanner`][retrax.effects.StereoPanner]
    is the sine law ($-3$ dB centre); the two agree at the hard left and
    right only, so no map of one's parameter gives the other: this class is
    dasp's law.

    **Arguments:**

    - `pan`: $p$, in $[0, 1]$ (hard left to hard right, normalised
      linearly): dasp's range; dasp's vector `[pan]` also goes through
      `retrax.effects.from_dasp(DaspStereoPanner, p)` and `to_dasp`.

    Takes one mono signal `(time,)` and returns `(2, time)`; stateless. dasp
    pans a stack of tracks `(tracks, time)` to `(2, tracks, time)`: map this
    effect over the tracks with `jax.vmap`, which gives `(tracks, 2, time)`,
    the layout of [`stereo_bus`][retrax.effects.stereo_bus]. A `pan` out of
    range raises an error (also under `jax.jit`).
    """

    pan: Float[Array, ""]

    RANGES: ClassVar[dict[str, Range]] = {"pan": Range(0.0, 1.0)}

    def __init__(self, pan: Shaped[ArrayLike, ""] = 0.5):
        self.pan = self.RANGES["pan"].check_init("pan", pan)

    def stereo_output(self, x: Array) -> Array:
        """dasp's panning of the mono signal `x` `(time,)`."""
        if x.ndim != 1:
            raise ValueError(
                f"`x` must be one mono signal of shape (time,), got shape {x.shape}. "
                "Pan several tracks with `jax.vmap`."
            )
        theta = self.param("pan", x.dtype) * (math.pi / 2)
        # (1 - 2 theta / pi) cos(theta) = (2 / pi) phi sin(phi) with
        # phi = pi / 2 - theta: each gain is u sqrt((2 / pi) sin(u) / u), the
        # same value as dasp's square root, whose derivative is finite at
        # the ends too (dasp's is NaN there: the square root of 0)
        u = jnp.stack([(math.pi / 2) - theta, theta])
        return pan(u * jnp.sqrt((2 / math.pi) * jnp.sinc(u / math.pi)), x)
