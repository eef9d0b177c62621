"""A constant-power stereo panner."""

import math
from typing import ClassVar

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import AbstractRangedEffect, Range
from .._signal import no_state, output, signal


class StereoPanner(AbstractRangedEffect):
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

    def ranges(self) -> dict[str, Range]:
        """`pan` in $[-1, 1]$."""
        return self.RANGES

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "2 time"] | tuple[Float[Array, "2 time"], None]:
        """Pan `x` `(time,)` or balance `x` `(2, time)`; returns `(2, time)`."""
        no_state(zi)
        x = signal(x)
        if x.ndim == 2 and x.shape[0] != 2:
            raise ValueError(
                f"`x` must be mono (time,) or stereo (2, time), got shape {x.shape}."
            )
        theta = (self.param("pan", x.dtype) + 1) * (math.pi / 4)
        gains = jnp.stack([jnp.cos(theta), jnp.sin(theta)])
        # As einsums, the transposes are dots: XLA's CPU backend turns the
        # transpose of a broadcasting product (a sum over time of a
        # broadcast gain) into a reduction over materialised broadcasts, 15x
        # slower for a batch of eight.
        if x.ndim == 1:
            return output(jnp.einsum("c,t->ct", gains, x), None, return_zf)
        y = jnp.einsum("c,ct->ct", math.sqrt(2.0) * gains, x)
        return output(y, None, return_zf)
