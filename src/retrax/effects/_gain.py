"""A gain stage in decibels."""

from typing import ClassVar

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


class Gain(AbstractRangedEffect):
    r"""A gain in decibels: $y = 10^{g/20}\, x$.

    **Arguments:**

    - `gain_db`: the gain $g$ in dB, in $[-24, 24]$ (normalised linearly).

    dasp-pytorch's `modules.Gain` vector (the same range) goes through
    `retrax.effects.from_dasp(Gain, p)` and `to_dasp`.

    Stateless: works on `(time,)` and `(channels, time)` signals alike. A
    `gain_db` out of its range raises an error naming it (`ValueError` at
    once for concrete values, at run time under `jax.jit`).
    """

    gain_db: Float[Array, ""]

    RANGES: ClassVar[dict[str, Range]] = {"gain_db": Range(-24.0, 24.0)}

    def __init__(self, gain_db: Shaped[ArrayLike, ""] = 0.0):
        self.gain_db = self.RANGES["gain_db"].check_init("gain_db", gain_db)

    def ranges(self) -> dict[str, Range]:
        """`gain_db` in $[-24, 24]$ dB."""
        return self.RANGES

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Gain":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Gain":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], None]:
        """Apply the gain to `x` `(time,)` or `(channels, time)`; with
        `return_zf`, `(y, None)` (no state)."""
        no_state(zi)
        x = signal(x)
        gain = 10.0 ** (self.param("gain_db", x.dtype) / 20.0)
        return output(gain * x, None, return_zf)
