"""Jezar's Freeverb: damped feedback combs in parallel, allpasses in series."""

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
from .._float_dtypes import check_float_dtype
from .._signal import output, per_channel, signal, state_leaf
from .._validate import check_rate
from ..ops import schroeder_allpass
from ._absorption import absorbed_fdn, absorbed_state_shape


COMB_TUNING = (1116, 1188, 1277, 1356, 1422, 1491, 1557, 1617)
ALLPASS_TUNING = (556, 441, 341, 225)
TUNING_RATE = 44_100.0
ALLPASS_GAIN = 0.5
# Freeverb's `fixedgain` (0.015) times its `scalewet` (3).
WET_GAIN = 0.045


class Freeverb(AbstractRangedEffect):
    r"""Freeverb (Jezar at Dreampoint, 2000): eight lowpass-feedback combs in
    parallel, then four Schroeder allpasses in series.

    Comb $j$ of $m_j$ samples is Freeverb's: with
    $g = 0.7 + 0.28\,\mathrm{room\_size}$ and $\delta = 0.4\,\mathrm{damping}$,

    $$o_j[t] = s_j[t - m_j], \quad
      \ell_j[t] = (1 - \delta)\, o_j[t] + \delta\, \ell_j[t-1], \quad
      s_j[t] = x[t] + g\, \ell_j[t],$$

    whose output $o_j$ decays more slowly at low than at high frequencies
    (the damping). The sum $0.045 \sum_j o_j$ (Freeverb's input gain 0.015
    times its wet scale 3) passes through [`retrax.ops.schroeder_allpass`][]
    with gain 0.5 and delays 556, 441, 341, 225, and
    $y = (1 - \mathrm{mix})\, x + \mathrm{mix}\cdot\mathrm{wet}$. The combs
    run as one [`retrax.ops.fdn`][] (see `retrax.effects._absorption`) and
    the allpasses on the comb core, so the gradient is their adjoint
    recursions. Freeverb's own allpass,
    $y = -x + v[t - D]$ with $v = x + 0.5\, v[t - D]$, is not exactly
    allpass; this one is Schroeder's.

    The tunings are Freeverb's at 44.1 kHz, scaled to `sample_rate` and
    rounded (combs at least 2 samples, allpasses at least 1).

    **Arguments:**

    - `room_size`: in $[0, 1]$ (normalised linearly), the comb feedback
      $0.7 + 0.28\,\mathrm{room\_size}$.
    - `damping`: in $[0, 1]$, the comb lowpass coefficient
      $0.4\,\mathrm{damping}$.
    - `mix`: the wet fraction, in $[0, 1]$.
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).

    Works channel by channel on `(channels, time)` (the same tuning for
    every channel). The state `zi` is a tuple `(combs, previous, allpasses)`:
    the comb network's state `(16, max(m) - 1)`, the comb sum's last sample
    `()`, and the four allpasses' states `(2, D_k)` (each with a leading
    channel axis for `(channels, time)`). Parameters out of range raise an
    error (also under `jax.jit`). The combs' kernel computes in float32 or
    float64: a float16 or bfloat16 signal raises `TypeError` naming its
    dtype (cast it with `x.astype(jnp.float32)`).
    """

    room_size: Float[Array, ""]
    damping: Float[Array, ""]
    mix: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "room_size": Range(0.0, 1.0),
        "damping": Range(0.0, 1.0),
        "mix": Range(0.0, 1.0),
    }

    def __init__(
        self,
        room_size: Shaped[ArrayLike, ""] = 0.5,
        damping: Shaped[ArrayLike, ""] = 0.5,
        mix: Shaped[ArrayLike, ""] = 0.3,
        sample_rate: float | int = 44_100.0,
    ):
        self.sample_rate = check_rate("sample_rate", sample_rate)
        r = self.RANGES
        self.room_size = r["room_size"].check_init("room_size", room_size)
        self.damping = r["damping"].check_init("damping", damping)
        self.mix = r["mix"].check_init("mix", mix)

    def ranges(self) -> dict[str, Range]:
        """`room_size`, `damping` and `mix`, each in $[0, 1]$."""
        return self.RANGES

    @property
    def comb_delays(self) -> tuple[int, ...]:
        """The comb lengths in samples at this sample rate."""
        scale = self.sample_rate / TUNING_RATE
        return tuple(max(2, round(m * scale)) for m in COMB_TUNING)

    @property
    def allpass_delays(self) -> tuple[int, ...]:
        """The allpass delays in samples at this sample rate."""
        scale = self.sample_rate / TUNING_RATE
        return tuple(max(1, round(m * scale)) for m in ALLPASS_TUNING)

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Freeverb":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Freeverb":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: tuple | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], tuple]:
        """Reverberate `x` `(time,)` or `(channels, time)`."""
        x = signal(x)
        check_float_dtype("`x`", x.dtype, "Freeverb (its delay-network kernel)")
        dt = x.dtype
        g = 0.7 + 0.28 * self.param("room_size", dt)
        damp = 0.4 * self.param("damping", dt)
        mix = self.param("mix", dt)
        combs = self.comb_delays
        n = len(combs)
        A = jnp.eye(n, dtype=dt)
        p = jnp.full(n, damp, dt)
        k = jnp.full(n, g * (1 - damp), dt)
        ones = jnp.ones(n, dt)
        zeros = jnp.zeros(n, dt)
        if zi is not None and not (isinstance(zi, tuple) and len(zi) == 3):
            raise ValueError(
                "`zi` must be the tuple (combs, previous, allpasses) of a Freeverb."
            )

        def mono(xc, z):
            zc, zp, za = (None, None, (None,) * 4) if z is None else z
            zc = state_leaf("zi[0]", zc, absorbed_state_shape(combs), dt)
            zp = state_leaf("zi[1]", zp, (), dt)
            za = [
                state_leaf(f"zi[2][{i}]", a, (2, d), dt)
                for i, (a, d) in enumerate(zip(za, self.allpass_delays, strict=True))
            ]
            # The network's lines give s_j[t - m_j + 1]: o_j is one sample later.
            early, zc = absorbed_fdn(
                WET_GAIN * xc, combs, A, ones, ones, zeros, k, p, zc
            )
            wet = jnp.concatenate([zp[None], early])
            wet, zp = wet[:-1], wet[-1]
            zf = []
            for d, state in zip(self.allpass_delays, za, strict=True):
                wet, state = schroeder_allpass(
                    wet, d, ALLPASS_GAIN, zi=state, return_zf=True
                )
                zf.append(state)
            return (1 - mix) * xc + mix * wet, (zc, zp, tuple(zf))

        shapes = (
            absorbed_state_shape(combs),
            (),
            tuple((2, d) for d in self.allpass_delays),
        )
        y, zf = per_channel(mono, x, zi, shapes)
        return output(y, zf, return_zf)
