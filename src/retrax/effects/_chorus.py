"""A chorus: the signal mixed with a copy read at a slowly oscillating delay."""

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
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
from .._validate import check_rate
from ..ops import delay


class Chorus(AbstractRangedEffect):
    r"""A chorus: a delay modulated by a sine LFO, mixed with the dry signal.

    $$d_t = \bigl(\mathrm{centre\_ms} + \mathrm{depth\_ms}\,
      \sin(2\pi \phi_t)\bigr) f_s / 1000, \qquad
      \phi_t = \phi_0 + \mathrm{rate\_hz}\; t / f_s,$$

    $$y_t = (1 - \mathrm{mix})\, x_t + \mathrm{mix}\; x_{t - d_t},$$

    the moving delay read by [`retrax.ops.delay`][] with third-order Lagrange
    interpolation (`"lagrange3"`), so the output is differentiable in every
    parameter, the LFO's rate included.

    **Arguments:**

    - `rate_hz`: the LFO rate in Hz, in $[0.05, 5]$ (normalised
      logarithmically).
    - `depth_ms`: the modulation depth in ms, in $[0, 5]$.
    - `centre_ms`: the mean delay in ms, in $[5, 25]$.
    - `mix`: the wet fraction, in $[0, 1]$.
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).

    Works channel by channel on `(channels, time)` (one LFO for all). The
    state `zi` is `(history, phase)`: the delay line's last `H` inputs newest
    first, `H = floor(30 fs / 1000) + 2` (30 ms is the longest delay), and
    the LFO phase $\phi_0$ in cycles, both with a leading channel axis for
    `(channels, time)`. Parameters out of range raise an error (also under
    `jax.jit`).
    """

    rate_hz: Float[Array, ""]
    depth_ms: Float[Array, ""]
    centre_ms: Float[Array, ""]
    mix: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "rate_hz": Range(0.05, 5.0, log=True),
        "depth_ms": Range(0.0, 5.0),
        "centre_ms": Range(5.0, 25.0),
        "mix": Range(0.0, 1.0),
    }
    MAX_DELAY_MS = 30.0

    def __init__(
        self,
        rate_hz: Shaped[ArrayLike, ""] = 0.8,
        depth_ms: Shaped[ArrayLike, ""] = 2.0,
        centre_ms: Shaped[ArrayLike, ""] = 12.0,
        mix: Shaped[ArrayLike, ""] = 0.5,
        sample_rate: float | int = 44_100.0,
    ):
        self.sample_rate = check_rate("sample_rate", sample_rate)
        r = self.RANGES
        self.rate_hz = r["rate_hz"].check_init("rate_hz", rate_hz)
        self.depth_ms = r["depth_ms"].check_init("depth_ms", depth_ms)
        self.centre_ms = r["centre_ms"].check_init("centre_ms", centre_ms)
        self.mix = r["mix"].check_init("mix", mix)

    def ranges(self) -> dict[str, Range]:
        """`rate_hz` in $[0.05, 5]$ (log), `depth_ms` in $[0, 5]$,
        `centre_ms` in $[5, 25]$, `mix` in $[0, 1]$."""
        return self.RANGES

    @property
    def max_delay(self) -> float:
        """The longest delay in samples."""
        return self.MAX_DELAY_MS * self.sample_rate / 1000.0

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Chorus":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Chorus":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: tuple[Array, Array] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], tuple]:
        """Chorus `x` `(time,)` or `(channels, time)`."""
        x = signal(x)
        dt = x.dtype
        rate = self.param("rate_hz", dt) / self.sample_rate
        depth = self.param("depth_ms", dt) * (self.sample_rate / 1000.0)
        centre = self.param("centre_ms", dt) * (self.sample_rate / 1000.0)
        mix = self.param("mix", dt)
        size = history_length("lagrange3", self.max_delay)
        length = x.shape[-1]
        if zi is not None and not (isinstance(zi, tuple) and len(zi) == 2):
            raise ValueError("`zi` must be the pair (history, phase) of a chorus.")

        def mono(xc, z):
            history, phase = (None, None) if z is None else z
            history = state_leaf("zi[0]", history, (size,), dt)
            phase = state_leaf("zi[1]", phase, (), dt)
            cycles = phase + rate * jnp.arange(length, dtype=dt)
            d = centre + depth * jnp.sin((2 * math.pi) * cycles)
            wet, hf = delay(
                xc,
                d,
                max_delay=self.max_delay,
                interpolation="lagrange3",
                zi=history,
                return_zf=True,
            )
            end = phase + rate * length
            return (1 - mix) * xc + mix * wet, (hf, end - jnp.floor(end))

        y, zf = per_channel(mono, x, zi, ((size,), ()))
        return output(y, zf, return_zf)
