"""An echo train: a delay line whose output is fed back into its input."""

from typing import ClassVar

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
from .._errors import error_if
from .._signal import output, per_channel, signal, state_leaf
from .._validate import check_delay
from ..ops import comb


def comb_history(u, delay: int, g, zi):
    """`w = comb(u, delay, g)` streamed from `zi` (the last `delay` values of
    `w`, newest first); returns `(full, zf)` with `full[delay + t] = w[t]`,
    so `w[t - k]` for `0 <= k <= delay` is `full[delay - k + t]`."""
    w, zf = comb(u, delay, g, zi=zi, return_zf=True)
    return jnp.concatenate([zi[::-1], w]), zf


class AbstractFeedbackDelay(AbstractRangedEffect):
    """What the feedback delays share: a static loop delay of `delay_samples`
    and the parameters `feedback` in $[0, 0.95]$ and `mix` in $[0, 1]$.
    Subclasses are final and implement `__call__`."""

    feedback: Float[Array, ""]
    mix: Float[Array, ""]
    delay_samples: int = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "feedback": Range(0.0, 0.95),
        "mix": Range(0.0, 1.0),
    }

    def __init__(
        self,
        feedback: Shaped[ArrayLike, ""] = 0.5,
        mix: Shaped[ArrayLike, ""] = 0.5,
        delay_samples: int = 11_025,
    ):
        self.delay_samples = check_delay("delay_samples", delay_samples)
        self.feedback = self.RANGES["feedback"].check_init("feedback", feedback)
        self.mix = self.RANGES["mix"].check_init("mix", mix)

    def ranges(self) -> dict[str, Range]:
        """`feedback` in $[0, 0.95]$, `mix` in $[0, 1]$."""
        return self.RANGES

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "AbstractFeedbackDelay":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "AbstractFeedbackDelay":
        return logit_with_unconstrained(self, theta)


class FeedbackDelay(AbstractFeedbackDelay):
    r"""A feedback delay: echoes every $D$ samples, each `feedback` times the last.

    $$w_t = x_t + g\, w_{t-D}, \qquad
      y_t = (1 - \mathrm{mix})\, x_t + \mathrm{mix}\; w_{t-D},$$

    so the wet signal is $x_{t-D} + g x_{t-2D} + g^2 x_{t-3D} + \dots$. The
    loop is [`retrax.ops.comb`][] on the recurrence core: its gradient is the
    comb run backwards in time.

    **Arguments:**

    - `feedback`: the feedback gain $g$, in $[0, 0.95]$ (normalised
      linearly).
    - `mix`: the wet fraction, in $[0, 1]$.
    - `delay_samples`: the loop delay $D$, a Python `int >= 1` (static: an
      integer delay fixes the recursion's structure, so the delay time is not
      a trainable parameter here; see [`Delay`][retrax.effects.Delay] for a
      trainable, fractional one).

    Works channel by channel on `(channels, time)`. The state `zi` holds the
    last $D$ values of $w$, newest first, shape `(D,)` (or `(channels, D)`).
    Parameters out of range raise an error (also under `jax.jit`).
    """

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels delay"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Echo `x` `(time,)` or `(channels, time)`."""
        x = signal(x)
        g = self.param("feedback", x.dtype)
        mix = self.param("mix", x.dtype)
        D = self.delay_samples

        def mono(xc, z):
            z = state_leaf("zi", z, (D,), xc.dtype)
            full, zf = comb_history(xc, D, g, z)
            wet = full[: xc.shape[0]]  # w[t - D]
            return (1 - mix) * xc + mix * wet, zf

        y, zf = per_channel(mono, x, zi, (D,))
        if x.shape[-1] <= D:
            y = _feedback_checked(y, self.feedback, self.RANGES["feedback"])
        return output(y, zf, return_zf)


def _feedback_checked(y: Array, feedback: ArrayLike, valid: Range) -> Array:
    """`y` carrying the range check of `feedback`. A signal no longer than
    the loop delay ends before the first echo, so its output never reads the
    feedback gain, and under `jax.jit` a check carried by the gain alone
    would be dropped with it."""
    g = jnp.asarray(feedback)
    bad = ~jnp.isfinite(g) | (g < valid.low) | (g > valid.high)
    return error_if(
        y,
        jnp.any(bad),
        f"`feedback` must be finite and lie in [{valid.low}, {valid.high}].",
    )
