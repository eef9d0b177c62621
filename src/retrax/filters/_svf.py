"""The topology-preserving-transform state-variable filter (Zavalishin; Cytomic)."""

from typing import Literal

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import AbstractRangedEffect, Range
from .._misc import as_inexact, result_dtype
from .._signal import output, per_channel, signal, state_leaf
from .._unconstrained import (
    bounded,
    field_array,
    logit,
    positive,
    softplus_inverse,
    unconstrained,
)
from .._validate import (
    check_in_range,
    check_init_range,
    check_rate,
    check_signal,
    check_zi,
)
from ..ops import state_space


Mode = Literal["lowpass", "bandpass", "highpass", "notch", "allpass", "peak"]

# Each mode is m0 x + m1 band + m2 low; high = x - k band - low.
_MIX = {
    "lowpass": lambda k: (0.0, 0.0, 1.0),
    "bandpass": lambda k: (0.0, 1.0, 0.0),
    "highpass": lambda k: (1.0, -k, -1.0),
    "notch": lambda k: (1.0, -k, 0.0),
    "allpass": lambda k: (1.0, -2.0 * k, 0.0),
    "peak": lambda k: (-1.0, k, 2.0),
}


def svf_matrices(cutoff, q, sample_rate: float | int, mode: Mode):
    """The TPT SVF as a state space: `A (..., 2, 2)`, `B (..., 2, 1)`, `C`, `D`.

    With $g = \\tan(\\pi f_c / f_s)$, $k = 1/q$, $a_1 = 1/(1 + g(g + k))$,
    $a_2 = g a_1$, $a_3 = g a_2$ and Cytomic's integrator states
    $s = (ic_1, ic_2)$: band $= a_1 s_1 - a_2 s_2 + a_2 x$,
    low $= a_2 s_1 + (1 - a_3) s_2 + a_3 x$, and
    $s' = 2(\\text{band}, \\text{low}) - s$.
    """
    g = jnp.tan(jnp.pi * cutoff / sample_rate)
    k = 1.0 / q
    a1 = 1.0 / (1.0 + g * (g + k))
    a2 = g * a1
    a3 = g * a2
    band_s = jnp.stack([a1, -a2], -1)
    low_s = jnp.stack([a2, 1.0 - a3], -1)
    A = jnp.stack([2.0 * band_s, 2.0 * low_s], -2) - jnp.eye(2, dtype=a1.dtype)
    B = jnp.stack([2.0 * a2, 2.0 * a3], -1)[..., None]
    m0, m1, m2 = (jnp.asarray(m, a1.dtype) for m in _MIX[mode](k))
    C = (m1[..., None] * band_s + m2[..., None] * low_s)[..., None, :]
    D = (m0 + m1 * a2 + m2 * a3)[..., None, None]
    return A, B, C, D


def svf(
    x: Shaped[ArrayLike, " time"],
    cutoff: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    q: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    sample_rate: float | int,
    mode: Mode = "lowpass",
    zi: Shaped[ArrayLike, " 2"] | None = None,
    *,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, " 2"]]:
    r"""State-variable filter, topology-preserving transform (trapezoidal).

    Zavalishin's TPT SVF in Cytomic's formulation (A. Simper, "Linear trapezoidal
    integrated SVF"): with $g = \tan(\pi f_c / f_s)$ and $k = 1/q$, its
    responses are the bilinear transforms, prewarped at the cutoff, of the
    analogue prototypes $1/D$ (lowpass), $s/D$ (bandpass), $s^2/D$
    (highpass), $(s^2 + 1)/D$ (notch), $(s^2 - k s + 1)/D$ (allpass) and
    $(1 - s^2)/D$ (peak, Cytomic's `low - high`), $D = s^2 + k s + 1$.
    It runs on `state_space`, so cutoff and resonance may be modulated per
    sample, gradients run the adjoint system backwards in time, and the
    filter streams in blocks.

    **Arguments:**

    - `x`: the signal, shape `(T,)`.
    - `cutoff`: the cutoff in Hz, scalar or per sample `(T,)`; must lie in
      $(0, f_s/2)$ (checked at run time, also under `jax.jit`).
    - `q`: the resonance, scalar or per sample, > 0 (0.7071 is Butterworth).
    - `sample_rate`: $f_s$ in Hz, a positive Python number.
    - `mode`: `"lowpass"`, `"bandpass"`, `"highpass"`, `"notch"`,
      `"allpass"` or `"peak"`.
    - `zi`: Cytomic's integrator states `(ic1eq, ic2eq)` before the first
      sample; defaults to zeros.
    - `return_zf`: also return the final states, to stream in blocks.

    **Returns:**

    The filtered signal `(T,)`, or `(y, zf)`.

    Non-finite or out-of-range `cutoff` and `q` raise an error (also under
    `jax.jit`); non-finite samples of `x` pass through, as in scipy.
    """
    if mode not in _MIX:
        raise ValueError(f"`mode` must be one of {sorted(_MIX)}, got {mode!r}.")
    sample_rate = check_rate("sample_rate", sample_rate)
    x = as_inexact("x", x)
    check_signal("x", x)
    cutoff = as_inexact("cutoff", cutoff)
    q = as_inexact("q", q)
    for name, value in (("cutoff", cutoff), ("q", q)):
        if value.ndim > 1 or (value.ndim == 1 and value.shape != x.shape):
            raise ValueError(
                f"`{name}` must be a scalar or have the shape of `x` {x.shape}, "
                f"got shape {value.shape}."
            )
    cutoff = check_in_range("cutoff", cutoff, 0.0, 0.5 * sample_rate)
    q = check_in_range("q", q, 0.0)
    dtype = result_dtype(x, cutoff, q)
    zi = check_zi(zi, (2,), "(ic1eq, ic2eq)")
    if zi is not None:
        zi = zi.astype(dtype)
    if cutoff.ndim or q.ndim:
        cutoff, q = jnp.broadcast_arrays(cutoff, q)
        cutoff = jnp.broadcast_to(cutoff, x.shape)
        q = jnp.broadcast_to(q, x.shape)
    A, B, C, D = svf_matrices(cutoff.astype(dtype), q.astype(dtype), sample_rate, mode)
    out = state_space(
        x.astype(dtype)[:, None], A=A, B=B, C=C, D=D, zi=zi, return_zf=return_zf
    )
    if not return_zf:
        return out[:, 0]
    y, zf = out
    return y[:, 0], zf


class SVF(AbstractRangedEffect):
    r"""A state-variable filter with learnable cutoff and resonance.

    The fields are the physical values: `cutoff` in Hz and the resonance `q`,
    so `eqx.tree_at(lambda f: f.cutoff, svf, 1_000.0)` sets the cutoff. They
    are checked when the filter runs (also under `jax.jit`): a cutoff outside
    $(0, f_s/2)$ or a `q` that is not $> 0$ raises an error naming the
    field.

    To train without leaving the valid region, train the unconstrained
    vector of `to_unconstrained()` and build the filter from it inside the
    loss with `with_unconstrained`:
    $f_c = \frac{f_s}{2}\,\sigma(\theta_0)$ and
    $q = \operatorname{softplus}(\theta_1)$, so every real $\theta$ gives a
    valid filter. ($\theta_0$ is clipped to $[-15, 15]$ and $\theta_1$
    below at -15 first, where float32 would otherwise round the cutoff onto
    $0$ or $f_s/2$ and `q` onto 0; there the derivative is 0.)

    It is a [ranged effect][retrax.effects.AbstractRangedEffect], also
    `retrax.effects.SVF` (the same class, re-exported): its normalised
    parameters are `[cutoff, q]` with the ranges of `ranges()`: the cutoff in
    $[f_s / 2205, 0.45 f_s]$ (20 Hz to 19.8 kHz at 44.1 kHz) and `q` in
    $[0.1, 10]$, both logarithmic. It filters `(time,)` or, channel by
    channel, `(channels, time)` signals, and streams: `zi` is the integrator
    state `(2,)` (or `(channels, 2)`) as in `svf`.

    **Arguments:**

    - `cutoff`: the cutoff in Hz, in $(0, f_s/2)$.
    - `q`: the resonance, > 0.
    - `sample_rate`: $f_s$ in Hz, a positive Python number.
    - `mode`: the response, as in `svf`.

    Invalid values raise `ValueError` naming the argument (an error under
    `jax.jit` if the module is built from traced values, e.g. an ensemble
    built by `eqx.filter_vmap` over the constructor).
    """

    cutoff: Float[Array, ""]
    q: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)
    mode: Mode = eqx.field(static=True)

    def __init__(
        self,
        cutoff: Shaped[ArrayLike, ""],
        q: Shaped[ArrayLike, ""] = 0.7071,
        sample_rate: float | int = 44_100.0,
        mode: Mode = "lowpass",
    ):
        if mode not in _MIX:
            raise ValueError(f"`mode` must be one of {sorted(_MIX)}, got {mode!r}.")
        sample_rate = check_rate("sample_rate", sample_rate)
        nyquist = sample_rate / 2
        cutoff = field_array("cutoff", cutoff, default_float=True)
        self.cutoff = check_init_range("cutoff", cutoff, 0.0, nyquist)
        q = field_array("q", q, default_float=True)
        self.q = check_init_range("q", q, 0.0)
        self.sample_rate = sample_rate
        self.mode = mode

    def _checked(self) -> tuple[Array, Array]:
        """The cutoff and resonance, checked to be valid (`ValueError` at once
        for concrete values, at run time under `jax.jit`)."""
        cutoff = check_init_range(
            "cutoff", field_array("cutoff", self.cutoff), 0.0, self.sample_rate / 2
        )
        return cutoff, check_init_range("q", field_array("q", self.q), 0.0)

    def to_unconstrained(self) -> Float[Array, " 2"]:
        r"""The unconstrained vector $\theta$ of this filter:
        $[\operatorname{logit}(2 f_c / f_s), \operatorname{softplus}^{-1}(q)]$,
        the inverse of `with_unconstrained` (entries beyond its clipping
        do not round-trip). Invalid fields raise (also under
        `jax.jit`)."""
        cutoff, q = self._checked()
        return jnp.stack([logit(cutoff / (self.sample_rate / 2)), softplus_inverse(q)])

    def with_unconstrained(self, theta: Shaped[ArrayLike, " 2"]) -> "SVF":
        r"""This filter with cutoff $\frac{f_s}{2}\sigma(\theta_0)$ and
        resonance $\operatorname{softplus}(\theta_1)$, from any real
        `theta` `(2,)`: train `theta` (e.g. with optax) and build the filter
        from it inside the loss, and every step gives a valid filter."""
        theta = unconstrained("theta", theta, 2)
        cutoff = bounded(theta[0]) * (self.sample_rate / 2)
        q = positive(theta[1])
        return eqx.tree_at(lambda f: (f.cutoff, f.q), self, (cutoff, q))

    def ranges(self) -> dict[str, Range]:
        """The normalised parameters' ranges: `cutoff` in
        $[f_s / 2205, 0.45 f_s]$ Hz and `q` in $[0.1, 10]$, both logarithmic."""
        fs = self.sample_rate
        return {
            "cutoff": Range(fs / 2205, 0.45 * fs, log=True),
            "q": Range(0.1, 10.0, log=True),
        }

    def checked_values(self) -> dict[str, Array]:
        """The cutoff and resonance, checked to be valid (they may lie
        outside their ranges)."""
        cutoff, q = self._checked()
        return {"cutoff": cutoff, "q": q}

    def with_values(self, values: dict[str, Array]) -> "SVF":
        """The filter with the cutoff and resonance of `values`."""
        return SVF(values["cutoff"], values["q"], self.sample_rate, self.mode)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels 2"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Filter `x` `(time,)` or `(channels, time)`; batch with `jax.vmap`.
        With `return_zf`, also the final state (the `zi` of the next block)."""
        x = signal(x)
        # `svf` checks their values, naming them as the fields are named
        cutoff = field_array("cutoff", self.cutoff).astype(x.dtype)
        q = field_array("q", self.q).astype(x.dtype)

        def mono(xc, z):
            z = state_leaf("zi", z, (2,), xc.dtype)
            return svf(xc, cutoff, q, self.sample_rate, self.mode, z, return_zf=True)

        y, zf = per_channel(mono, x, zi, (2,))
        return output(y, zf, return_zf)
