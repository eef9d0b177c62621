"""The stereo effects' shared call, and the two linear maps they are made of.

The widener and the panner, retrax's and dasp-pytorch's, are stateless
effects of one parameter that return stereo `(2, time)`: a symmetric 2 x 2
mix of the two channels, or a pair of gains on one mono signal.
"""

import abc

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._signal import no_state, output, signal


class AbstractStereoEffect(AbstractRangedEffect):
    """A stateless effect whose output is stereo `(2, time)`, with constant
    ranges `RANGES`; subclasses compute the output in `stereo_output`."""

    RANGES: eqx.AbstractClassVar[dict[str, Range]]

    def ranges(self) -> dict[str, Range]:
        """The ranges of the class, `RANGES`."""
        return self.RANGES

    @abc.abstractmethod
    def stereo_output(self, x: Array) -> Array:
        """The output `(2, time)` of the checked signal `x`, `(time,)` or
        `(channels, time)`."""

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "AbstractStereoEffect":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "AbstractStereoEffect":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "2 time"] | tuple[Float[Array, "2 time"], None]:
        """Process `x`, `(time,)` or `(channels, time)` as the class says;
        returns `(2, time)` (and `zf=None` with `return_zf`: stateless, so
        `zi` must be `None`)."""
        no_state(zi)
        return output(self.stereo_output(signal(x)), None, return_zf)


# As einsums, the transposes of both maps are dots: XLA's CPU backend turns
# the transpose of a broadcasting product (a sum over time of a broadcast
# gain) into a reduction over materialised broadcasts, 15x slower for a batch
# of eight.


def mix(x: Array, direct: Array, cross: Array) -> Array:
    """`(direct x_L + cross x_R, cross x_L + direct x_R)` of stereo `x`
    `(2, time)`: the symmetric mix of a mid/side widener."""
    matrix = jnp.stack([jnp.stack([direct, cross]), jnp.stack([cross, direct])])
    return jnp.einsum("ij,jt->it", matrix, x)


def pan(gains: Array, x: Array) -> Array:
    """`(g_L x, g_R x)` of mono `x` `(time,)`, with `gains` `(2,)`."""
    return jnp.einsum("c,t->ct", gains, x)
