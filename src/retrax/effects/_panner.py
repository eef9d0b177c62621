"""A constant-power stereo panner."""

import math
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import Range
from ._stereo import AbstractStereoEffect, pan


class StereoPanner(AbstractStereoEffect):
    r"""A constant-power (sine-law) panner.

    With $\theta = (\mathrm{pan} + 1)\,\pi / 4$, a mono signal becomes
    $(\cos\theta\; x, \sin\theta\; x)$: the power $\cos^2 + \sin^2 = 1$ is
    the same at every position, and the centre is $-3$ dB per side. A stereo
    signal is balanced with the same law normalised to unity at the centre,
    $(\sqrt2 \cos\theta\; x_L, \sqrt2 \sin\theta\; x_R)$.

    **Arguments:**

    - `pan`: the position, in $[-1, 1]$ (hard left to hard right,
      normalised linearly).

    Takes mono `(time,)` or stereo `(2, time)` and returns `(2, time)`;
    stateless (`zi=None`, `zf=None`). A `pan` out of range raises an error
    (also under `jax.jit`).
    """

    pan: Float[Array, ""]

    RANGES: ClassVar[dict[str, Range]] = {"pan": Range(-1.0, 1.0)}

    def __init__(self, pan: Shaped[ArrayLike, ""] = 0.0):
        self.pan = self.RANGES["pan"].check_init("pan", pan)

    def stereo_output(self, x: Array) -> Array:
        """Pan `x` `(time,)` or balance `x` `(2, time)`."""
        if x.ndim == 2 and x.shape[0] != 2:
            raise ValueError(
                f"`x` must be mono (time,) or stereo (2, time), got shape {x.shape}."
            )
        theta = (self.param("pan", x.dtype) + 1) * (math.pi / 4)
        gains = jnp.stack([jnp.cos(theta), jnp.sin(theta)])
        if x.ndim == 1:
            return pan(gains, x)
        return jnp.einsum("c,ct->ct", math.sqrt(2.0) * gains, x)
