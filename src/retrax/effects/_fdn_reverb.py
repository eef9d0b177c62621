"""A feedback-delay-network reverb with frequency-dependent decay."""

import math
from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
import numpy as np
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
from .._float_dtypes import check_float_dtype
from .._signal import output, per_channel, signal, state_leaf
from .._validate import check_delay, check_finite, check_rate
from ._absorption import absorbed_fdn, absorbed_state_shape


DEFAULT_DELAYS = (1109, 1327, 1559, 1801, 2053, 2293, 2539, 2801)


def householder(v: Array) -> Array:
    r"""The Householder reflection $I - 2 v v^\top / v^\top v$ (orthogonal)."""
    u = v / jnp.sqrt(jnp.sum(v * v))
    return jnp.eye(v.shape[0], dtype=v.dtype) - 2.0 * jnp.outer(u, u)


def absorption(delays, t60, hf_ratio, sample_rate):
    r"""Jot's one-pole absorption filters from the T60s: the poles $p_j$ and
    input gains $k_j$ with DC gain $10^{-3 m_j / (f_s T_{60})}$ and Nyquist
    gain $10^{-3 m_j / (f_s\, h\, T_{60})}$."""
    m = jnp.asarray(delays, t60.dtype)
    scale = 3.0 * math.log(10.0) * m / (sample_rate * t60)
    g0 = jnp.exp(-scale)
    # Nyquist / DC gain = exp(-beta); p = (1 - e^-beta) / (1 + e^-beta)
    beta = scale * (1.0 / hf_ratio - 1.0)
    p = jnp.tanh(0.5 * beta)
    return p, g0 * (1.0 - p)


class FDNReverb(AbstractRangedEffect):
    r"""A feedback delay network reverb (Jot and Chaigne, AES 1991).

    $N$ delay lines of $m_j$ samples, a Householder feedback matrix
    $A = I - 2 v v^\top / v^\top v$ (orthogonal, hence lossless, for every
    $v \ne 0$), and in every loop a one-pole absorption filter
    $H_j(z) = g_j (1 - p_j) / (1 - p_j z^{-1})$ designed from the decay
    times (Jot's method): its gain at DC, $g_j = 10^{-3 m_j / (f_s T_{60})}$,
    makes the response decay by 60 dB in $T_{60}$ seconds at low
    frequencies, and its gain at Nyquist, $10^{-3 m_j / (f_s h T_{60})}$,
    in $h T_{60}$ seconds at high frequencies. The filtered line outputs
    $f_j$ feed the matrix:
    $s_i[t] = b_i x[t] + \sum_j A_{ij} f_j[t]$, and the wet signal is
    $\sum_j c_j f_j[t]$; $y = (1 - \mathrm{mix})\, x + \mathrm{mix}\cdot
    \mathrm{wet}$. It runs as one [`retrax.ops.fdn`][] of $2N$ lines (see
    `retrax.effects._absorption`), so its gradient is the network's adjoint
    recursion.

    **Arguments:**

    - `t60`: the decay time at low frequencies in seconds, in $[0.05, 10]$
      (normalised logarithmically).
    - `hf_ratio`: $h$, the decay time at Nyquist over `t60`, in
      $[0.05, 1]$.
    - `mix`: the wet fraction, in $[0, 1]$.
    - `v`: the Householder vector `(N,)`, nonzero (default all ones); a
      trainable field outside the normalised vector.
    - `b`, `c`: the input and output gains `(N,)` (defaults $1/\sqrt N$
      and alternating $\pm 1/\sqrt N$); trainable fields outside the
      normalised vector.
    - `delays`: the line lengths $m_j$, Python ints `>= 2` (static; the
      defaults, 25 to 64 ms at 44.1 kHz, are primes).
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).

    Works channel by channel on `(channels, time)`. The state `zi` is the
    network's, shape `(2N, max(delays) - 1)` (with a leading channel axis
    for `(channels, time)`). Parameters out of range, a zero `v` or
    non-finite gains raise an error (also under `jax.jit`). The network's
    kernel computes in float32 or float64: a float16 or bfloat16 signal
    raises `TypeError` naming its dtype (cast it with `x.astype(jnp.float32)`).
    """

    t60: Float[Array, ""]
    hf_ratio: Float[Array, ""]
    mix: Float[Array, ""]
    v: Float[Array, " lines"]
    b: Float[Array, " lines"]
    c: Float[Array, " lines"]
    delays: tuple[int, ...] = eqx.field(static=True)
    sample_rate: float = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "t60": Range(0.05, 10.0, log=True),
        "hf_ratio": Range(0.05, 1.0),
        "mix": Range(0.0, 1.0),
    }

    def __init__(
        self,
        t60: Shaped[ArrayLike, ""] = 1.5,
        hf_ratio: Shaped[ArrayLike, ""] = 0.5,
        mix: Shaped[ArrayLike, ""] = 0.3,
        v: Shaped[ArrayLike, " lines"] | None = None,
        b: Shaped[ArrayLike, " lines"] | None = None,
        c: Shaped[ArrayLike, " lines"] | None = None,
        delays: tuple[int, ...] | list[int] = DEFAULT_DELAYS,
        sample_rate: float | int = 44_100.0,
    ):
        delays = tuple(check_delay(f"delays[{i}]", m) for i, m in enumerate(delays))
        if not delays or min(delays) < 2:
            raise ValueError(
                f"`delays` must hold at least one line length, each >= 2, got {delays}."
            )
        n = len(delays)
        self.delays = delays
        self.sample_rate = check_rate("sample_rate", sample_rate)
        r = self.RANGES
        self.t60 = r["t60"].check_init("t60", t60)
        self.hf_ratio = r["hf_ratio"].check_init("hf_ratio", hf_ratio)
        self.mix = r["mix"].check_init("mix", mix)
        signs = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)
        defaults = {
            "v": jnp.ones(n, float),
            "b": jnp.full(n, 1 / math.sqrt(n), float),
            "c": jnp.asarray(signs / math.sqrt(n), float),
        }
        for name, value in (("v", v), ("b", b), ("c", c)):
            value = defaults[name] if value is None else jnp.asarray(value, float)
            if value.shape != (n,):
                raise ValueError(
                    f"`{name}` must have one entry per delay line, shape ({n},), got "
                    f"shape {value.shape}."
                )
            setattr(self, name, value)

    def ranges(self) -> dict[str, Range]:
        """`t60` in $[0.05, 10]$ s (log), `hf_ratio` in $[0.05, 1]$, `mix` in
        $[0, 1]$."""
        return self.RANGES

    @property
    def feedback_matrix(self) -> Float[Array, "lines lines"]:
        """The Householder feedback matrix $A$."""
        return householder(self.v)

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "FDNReverb":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "FDNReverb":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels lines2 history"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Reverberate `x` `(time,)` or `(channels, time)`."""
        x = signal(x)
        check_float_dtype("`x`", x.dtype, "FDNReverb (its delay-network kernel)")
        dt = x.dtype
        t60 = self.param("t60", dt)
        hf = self.param("hf_ratio", dt)
        mix = self.param("mix", dt)
        v = check_finite("v", self.v.astype(dt))
        v = error_if(v, jnp.all(v == 0), "`v` (the Householder vector) must not be 0.")
        b = check_finite("b", self.b.astype(dt))
        c = check_finite("c", self.c.astype(dt))
        A = householder(v)
        p, k = absorption(self.delays, t60, hf, self.sample_rate)
        shape = absorbed_state_shape(self.delays)
        zeros = jnp.zeros_like(c)

        def mono(xc, z):
            z = state_leaf("zi", z, shape, dt)
            wet, zf = absorbed_fdn(xc, self.delays, A, b, zeros, c, k, p, z)
            return (1 - mix) * xc + mix * wet, zf

        y, zf = per_channel(mono, x, zi, shape)
        return output(y, zf, return_zf)
