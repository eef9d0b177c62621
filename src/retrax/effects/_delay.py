"""A single echo: the signal mixed with a fractionally delayed copy."""

import math

import equinox as eqx
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._delay_history import history_length
from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._signal import output, per_channel, signal, state_leaf
from .._validate import check_rate, static_float
from ..ops import delay


class Delay(AbstractRangedEffect):
    r"""A delay (one echo) with a trainable, fractional delay time.

    $$y_t = (1 - \mathrm{mix})\, x_t + \mathrm{mix}\; x_{t - d},
      \qquad d = \mathrm{delay\_ms} \cdot f_s / 1000 \text{ samples},$$

    read between samples by [`retrax.ops.delay`][] with linear interpolation,
    so the output is differentiable in `delay_ms` (away from whole samples)
    and in `mix`.

    **Arguments:**

    - `delay_ms`: the delay in ms, in $[0, \mathrm{max\_delay\_ms}]$
      (normalised linearly); default half of `max_delay_ms`.
    - `mix`: the wet fraction, in $[0, 1]$.
    - `max_delay_ms`: the longest delay, a finite Python number `> 0` (static: it
      fixes the history the delay line keeps).
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).

    Works channel by channel on `(channels, time)`. The state `zi` is the
    delay line's history, the last `H` inputs newest first, shape `(H,)`
    (or `(channels, H)`), with `H = floor(max_delay_ms * fs / 1000) + 1`.
    Parameters out of range raise an error (also under `jax.jit`).
    """

    delay_ms: Float[Array, ""]
    mix: Float[Array, ""]
    max_delay_ms: float = eqx.field(static=True)
    sample_rate: float = eqx.field(static=True)

    def __init__(
        self,
        delay_ms: Shaped[ArrayLike, ""] | None = None,
        mix: Shaped[ArrayLike, ""] = 0.5,
        max_delay_ms: float | int = 500.0,
        sample_rate: float | int = 44_100.0,
    ):
        max_delay_ms = static_float("max_delay_ms", max_delay_ms)
        if not (math.isfinite(max_delay_ms) and max_delay_ms > 0):
            raise ValueError(
                f"`max_delay_ms` must be a finite number > 0 (it fixes the history "
                f"the delay line keeps), got {max_delay_ms!r}."
            )
        self.max_delay_ms = max_delay_ms
        self.sample_rate = check_rate("sample_rate", sample_rate)
        ranges = self.ranges()
        if delay_ms is None:
            delay_ms = 0.5 * max_delay_ms
        self.delay_ms = ranges["delay_ms"].check_init("delay_ms", delay_ms)
        self.mix = ranges["mix"].check_init("mix", mix)

    def ranges(self) -> dict[str, Range]:
        """`delay_ms` in $[0, \\mathrm{max\\_delay\\_ms}]$, `mix` in $[0, 1]$."""
        return {"delay_ms": Range(0.0, self.max_delay_ms), "mix": Range(0.0, 1.0)}

    @property
    def max_delay(self) -> float:
        """The longest delay in samples."""
        return self.max_delay_ms * self.sample_rate / 1000.0

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Delay":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Delay":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels history"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Delay and mix `x` `(time,)` or `(channels, time)`."""
        x = signal(x)
        d = self.param("delay_ms", x.dtype) * (self.sample_rate / 1000.0)
        mix = self.param("mix", x.dtype)
        size = history_length("linear", self.max_delay)

        def mono(xc, z):
            z = state_leaf("zi", z, (size,), xc.dtype)
            wet, zf = delay(xc, d, max_delay=self.max_delay, zi=z, return_zf=True)
            return (1 - mix) * xc + mix * wet, zf

        y, zf = per_channel(mono, x, zi, (size,))
        return output(y, zf, return_zf)
