"""Biquads and a parametric equaliser (RBJ cookbook sections) on `sosfilt`."""

import math
from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import AbstractRangedEffect, Range
from .._errors import error_if
from .._misc import as_inexact
from .._signal import output, per_channel, signal, state_leaf
from .._unconstrained import (
    bounded,
    field_array,
    logit,
    positive,
    softplus_inverse,
    unconstrained,
)
from .._validate import check_in_range, check_init_range, check_rate
from ..ops import sosfilt
from ._parametrise import (
    biquad_denominator,
    gain_db_from_unconstrained,
    gain_db_to_unconstrained,
)


Shape = Literal["peak", "lowshelf", "highshelf"]


def rbj_section(
    shape: Shape,
    freq: Shaped[ArrayLike, ""],
    gain_db: Shaped[ArrayLike, ""],
    q: Shaped[ArrayLike, ""],
    sample_rate: float | int,
) -> Float[Array, " 6"]:
    r"""One RBJ Audio-EQ-Cookbook section as a normalised sos row.

    Peaking EQ and low/high shelves by R. Bristow-Johnson's formulas with
    $A = 10^{G/40}$, $\omega_0 = 2\pi f_0 / f_s$ and
    $\alpha = \sin\omega_0 / (2Q)$ (for shelves, $Q$ sets the slope; 0.7071
    is the steepest without overshoot).

    **Arguments:**

    - `shape`: `"peak"`, `"lowshelf"` or `"highshelf"`.
    - `freq`: centre or corner frequency in Hz, in $(0, f_s/2)$.
    - `gain_db`: gain in dB, finite.
    - `q`: quality factor, > 0.
    - `sample_rate`: $f_s$ in Hz, a positive Python number.

    **Returns:**

    The row `[b0, b1, b2, 1, a1, a2]` for `sosfilt`.

    Values out of range or non-finite raise an error naming the argument (also
    under `jax.jit`).
    """
    if shape not in ("peak", "lowshelf", "highshelf"):
        raise ValueError(
            f"`shape` must be 'peak', 'lowshelf' or 'highshelf', got {shape!r}."
        )
    sample_rate = check_rate("sample_rate", sample_rate)
    nyquist = sample_rate / 2
    freq = check_in_range("freq", as_inexact("freq", freq), 0.0, nyquist)
    gain_db = check_in_range("gain_db", as_inexact("gain_db", gain_db))
    q = check_in_range("q", as_inexact("q", q), 0.0)
    return _rbj(shape, freq, gain_db, q, sample_rate)


def _rbj(shape, freq, gain_db, q, sample_rate):
    """`rbj_section` of checked values."""
    return _rbj_rows((shape,), freq[None], gain_db[None], q[None], sample_rate)[0]


def _rbj_rows(shapes, freq, gain_db, q, sample_rate):
    """The sos rows `(n, 6)` of `n` checked sections, `shapes[k]` the shape of
    section `k`: every formula runs once on all sections (elementwise, the
    values of one section at a time), and each row takes its shape's, so the
    traced program does not grow with the number of sections."""
    A = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * jnp.pi * freq / sample_rate
    cos, alpha = jnp.cos(w0), jnp.sin(w0) / (2.0 * q)
    rows = {}
    if "peak" in shapes:
        b = jnp.stack([1 + alpha * A, -2 * cos, 1 - alpha * A], axis=-1)
        a = jnp.stack([1 + alpha / A, -2 * cos, 1 - alpha / A], axis=-1)
        rows["peak"] = b, a
    for shape in ("lowshelf", "highshelf"):
        if shape not in shapes:
            continue
        s = 1.0 if shape == "lowshelf" else -1.0
        root = 2.0 * jnp.sqrt(A) * alpha
        b = A[:, None] * jnp.stack(
            [
                (A + 1) - s * (A - 1) * cos + root,
                s * 2 * ((A - 1) - s * (A + 1) * cos),
                (A + 1) - s * (A - 1) * cos - root,
            ],
            axis=-1,
        )
        a = jnp.stack(
            [
                (A + 1) + s * (A - 1) * cos + root,
                -s * 2 * ((A - 1) + s * (A + 1) * cos),
                (A + 1) + s * (A - 1) * cos - root,
            ],
            axis=-1,
        )
        rows[shape] = b, a
    b, a = rows[shapes[0]]
    for shape, (b_shape, a_shape) in rows.items():
        mine = jnp.asarray([s == shape for s in shapes])[:, None]
        b, a = jnp.where(mine, b_shape, b), jnp.where(mine, a_shape, a)
    a0 = a[:, :1]
    return jnp.concatenate([b / a0, jnp.ones_like(a0), a[:, 1:] / a0], axis=-1)


class Biquad(AbstractRangedEffect):
    r"""A learnable second-order section with a conjugate pole pair.

    $$H(z) = \frac{b_0 + b_1 z^{-1} + b_2 z^{-2}}
      {1 - 2 r \cos\theta\, z^{-1} + r^2 z^{-2}}.$$

    The fields are the physical values: the numerator `b`, the pole
    `radius` $r$ and the pole `angle` $\theta$ in radians, so `eqx.tree_at`
    replaces them. They are checked when the section runs (also under
    `jax.jit`): a radius outside $(0, r_{\max})$ or a non-finite value raises
    an error naming the field.

    To train without leaving the stable region, train the unconstrained
    vector of `to_unconstrained()` and build the section from it inside the
    loss with `with_unconstrained`: $r = r_{\max}\,\sigma(\rho)$ from the
    fourth entry $\rho$, `b` and the angle as they are, so every real vector
    gives a stable section. ($\rho$ is clipped to $[-15, 15]$ first, where
    float32 would otherwise round $r$ onto $0$ or $r_{\max}$; there its
    derivative is 0.)

    It is a [ranged effect][retrax.effects.AbstractRangedEffect], also
    `retrax.effects.Biquad` (the same class, re-exported): its five
    normalised parameters are `[b0, b1, b2, radius, angle]` with the ranges
    of `ranges()`: each `b` in $[-4, 4]$, the radius in
    $[0.01, 0.99\, r_{\max}]$, the angle in $[0, \pi]$ (all linear). It
    filters `(time,)` or, channel by channel, `(channels, time)` signals, and
    streams: `zi` is `sosfilt`'s state `(1, 2)` (or `(channels, 1, 2)`).

    **Arguments:**

    - `b`: the numerator `(3,)`, finite.
    - `radius`: the pole radius in $(0, r_{\max})$.
    - `angle`: the pole angle in radians, finite.
    - `max_radius`: $r_{\max}$, the largest pole radius, a Python number in
      $(0, 1)$ (default 0.999).

    Invalid values raise `ValueError` (an error under `jax.jit` if the module
    is built from traced values, e.g. an ensemble built by `eqx.filter_vmap`
    over the constructor).
    """

    b: Float[Array, " 3"]
    radius: Float[Array, ""]
    angle: Float[Array, ""]
    max_radius: float = eqx.field(static=True)

    def __init__(
        self,
        b: Shaped[ArrayLike, " 3"],
        radius: float | Shaped[ArrayLike, ""] = 0.5,
        angle: float | Shaped[ArrayLike, ""] = 1.0,
        max_radius: float = 0.999,
    ):
        if not 0 < max_radius < 1:
            raise ValueError(f"`max_radius` must lie in (0, 1), got {max_radius!r}.")
        self.b = check_init_range("b", _numerator(b, default_float=True))
        radius = field_array("radius", radius, default_float=True)
        self.radius = check_init_range("radius", radius, 0.0, max_radius)
        angle = field_array("angle", angle, default_float=True)
        self.angle = check_init_range("angle", angle)
        self.max_radius = float(max_radius)

    def _checked(self) -> tuple[Array, Array, Array]:
        """The numerator, radius and angle, checked to be valid (`ValueError`
        at once for concrete values, at run time under `jax.jit`)."""
        b = check_init_range("b", _numerator(self.b))
        radius = field_array("radius", self.radius)
        radius = check_init_range("radius", radius, 0.0, self.max_radius)
        angle = check_init_range("angle", field_array("angle", self.angle))
        return b, radius, angle

    @property
    def sos(self) -> Float[Array, "1 6"]:
        """The section as an sos row; invalid fields raise (also under
        `jax.jit`)."""
        b, radius, angle = self._checked()
        a = biquad_denominator(radius, angle)
        return jnp.concatenate([b, jnp.ones((1,), a.dtype), a])[None]

    def to_unconstrained(self) -> Float[Array, " 5"]:
        r"""The unconstrained vector of this section,
        $[b_0, b_1, b_2, \operatorname{logit}(r / r_{\max}), \theta]$, the
        inverse of `with_unconstrained` (entries beyond its clipping
        do not round-trip). Invalid fields raise (also under
        `jax.jit`)."""
        b, radius, angle = self._checked()
        rho = logit(radius / self.max_radius)
        return jnp.concatenate([b, jnp.stack([rho, angle])])

    def with_unconstrained(self, theta: Shaped[ArrayLike, " 5"]) -> "Biquad":
        r"""This section with numerator `theta[:3]`, pole radius
        $r_{\max}\,\sigma$(`theta[3]`) and pole angle `theta[4]`, from any
        real `theta` `(5,)`: train `theta` (e.g. with optax) and build the
        section from it inside the loss, and every step gives a stable
        section."""
        theta = unconstrained("theta", theta, 5)
        radius = self.max_radius * bounded(theta[3])
        return eqx.tree_at(
            lambda f: (f.b, f.radius, f.angle), self, (theta[:3], radius, theta[4])
        )

    def ranges(self) -> dict[str, Range]:
        """The normalised parameters' ranges: `b` entries in $[-4, 4]$,
        `radius` in $[0.01, 0.99\\, r_{\\max}]$, `angle` in $[0, \\pi]$."""
        return {
            "b": Range(-4.0, 4.0),
            "radius": Range(0.01, 0.99 * self.max_radius),
            "angle": Range(0.0, math.pi),
        }

    def checked_values(self) -> dict[str, Array]:
        """The numerator, radius and angle, checked to be valid (they may lie
        outside their ranges)."""
        return dict(zip(("b", "radius", "angle"), self._checked(), strict=True))

    def with_values(self, values: dict[str, Array]) -> "Biquad":
        """The section with the numerator, radius and angle of `values`."""
        return Biquad(values["b"], values["radius"], values["angle"], self.max_radius)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels 1 2"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Filter `x` `(time,)` or `(channels, time)`; batch with `jax.vmap`.
        With `return_zf`, also the final state (the `zi` of the next block)."""
        return _cascade(self.sos, x, zi, return_zf)


def _numerator(b, default_float=False):
    b = field_array("b", b, 1, default_float=default_float)
    if b.shape != (3,):
        raise ValueError(f"`b` must have 3 coefficients, got shape {b.shape}.")
    return b


def _cascade(sos, x, zi, return_zf):
    x = signal(x)
    sos = sos.astype(x.dtype)

    def mono(xc, z):
        z = state_leaf("zi", z, (sos.shape[0], 2), xc.dtype)
        return sosfilt(sos, xc, axis=0, zi=z)

    y, zf = per_channel(mono, x, zi, (sos.shape[0], 2))
    return output(y, zf, return_zf)


def _band_edges(sample_rate: float, sections: int) -> np.ndarray:
    """The frequencies between which an `ordered` equaliser's sections'
    normalised ranges lie."""
    return np.geomspace(sample_rate / 2205, 0.45 * sample_rate, sections + 1)


def _audible(sample_rate: float) -> Range:
    """The normalised range of every section's frequency: from 20 Hz (or
    $f_s / 2205$ where that is lower, 20 Hz at 44.1 kHz) to $0.48 f_s$
    (21.2 kHz at 44.1 kHz, just below Nyquist), logarithmic."""
    return Range(min(20.0, sample_rate / 2205), 0.48 * sample_rate, log=True)


class ParametricEQ(AbstractRangedEffect):
    r"""A parametric equaliser: a low shelf, peaking bands and a high shelf.

    RBJ cookbook sections ([`rbj_section`][retrax.filters.rbj_section]), run
    as one `sosfilt` cascade. The fields are the physical values: the
    sections' frequencies `freqs` in Hz, low shelf first and high shelf
    last, their gains `gains_db` in dB and their `qs`, so `eqx.tree_at`
    replaces them. A section is a shelf or a peak by its position in the
    cascade, not by its frequency: the frequencies may come in any order
    (a high shelf below the last peak, as dasp-pytorch's `parametric_eq`
    allows). They are checked when the equaliser runs (also under
    `jax.jit`): frequencies outside $(0, f_s/2)$ (or, with `ordered=True`,
    not strictly increasing), non-finite gains and `qs` that are not $> 0$
    raise an error naming the field.

    To train without leaving the valid region, train the unconstrained
    vector of `to_unconstrained()` and build the equaliser from it inside
    the loss with `with_unconstrained`: the frequencies are
    $\frac{f_s}{2}\,\sigma(\ell_k)$ of logits $\ell_k$, one entry each
    (with `ordered=True`: the gaps of log frequency below, between and above
    the sections are a softmax of the entries, with at least 0.1% between
    neighbours, so they stay strictly increasing); gains through
    $60 \tanh(\theta / 60)$ dB (about $\theta$ near 0 dB, within
    $\pm 60$ dB) and Qs through softplus. Every real vector gives a valid
    equaliser of stable sections, in float32 too: the logits are clipped to
    $[-15, 15]$ before the sigmoid and the Qs' entries below at -15 before
    softplus (with derivative 0 there).

    It is a [ranged effect][retrax.effects.AbstractRangedEffect], also
    `retrax.effects.ParametricEQ` (the same class, re-exported): its `3 n`
    normalised parameters are the frequencies, the gains and the Qs
    (`ranges()`): every section's frequency in the audible band, 20 Hz (or
    $f_s/2205$ where that is lower) to $0.48 f_s$ (21.2 kHz at 44.1 kHz;
    logarithmic), so `to_normalised` lies in $[0, 1]$ for frequencies in
    that band in any order; gains in $[-18, 18]$ dB, Qs in $[0.1, 10]$
    (logarithmic). With `ordered=True` (the earlier default, kept as a mode)
    the range $[f_s/2205, 0.45 f_s]$ is cut into `n` equal logarithmic bands and
    section `k`'s frequency lies in band `k`, so a controller cannot move
    the sections out of frequency order. It filters `(time,)` or, channel
    by channel, `(channels, time)` signals, and streams: `zi` is `sosfilt`'s
    state `(n, 2)` (or `(channels, n, 2)`).

    dasp-pytorch's 18-value `ParametricEQ` vector is not this vector (it runs
    section by section, gain, cutoff, Q, over dasp's ranges), though it has
    its length: build from it with `retrax.effects.from_dasp(ParametricEQ, p,
    sample_rate=...)` (these sections, run as this recursion) or
    `from_dasp(DaspParametricEQ, p, ...)` (dasp's frequency sampling, equal
    to dasp's `process_normalized`), and read it back with `to_dasp`.

    **Arguments:**

    - `freqs`: the frequencies in Hz, low shelf first, high shelf last,
      peaking bands in between (at least 2 entries), in $(0, f_s/2)$, in any
      order (with `ordered=True`, strictly increasing).
    - `gains_db`: the gains in dB, same length (default 0 dB).
    - `qs`: the Q of every section (default 0.7071).
    - `sample_rate`: $f_s$ in Hz, a positive Python number.
    - `ordered`: keep the frequencies strictly increasing (checked, and so
      kept by the normalised bands and the unconstrained map), a static
      Python bool; default `False`.

    Invalid values (and, with `ordered=True`, frequencies not in increasing
    order) raise `ValueError` naming the argument (an error under `jax.jit`
    if the module is built from traced values, e.g. an ensemble built by
    `eqx.filter_vmap` over the constructor).
    """

    freqs: Float[Array, " sections"]
    gains_db: Float[Array, " sections"]
    qs: Float[Array, " sections"]
    sample_rate: float = eqx.field(static=True)
    ordered: bool = eqx.field(static=True)

    def __init__(
        self,
        freqs: Shaped[ArrayLike, " sections"] | Sequence[float | int],
        gains_db: Shaped[ArrayLike, " sections"] | Sequence[float | int] | None = None,
        qs: Shaped[ArrayLike, " sections"] | Sequence[float | int] | None = None,
        sample_rate: float | int = 44_100.0,
        *,
        ordered: bool = False,
    ):
        if not isinstance(ordered, bool):
            raise TypeError(f"`ordered` must be a Python bool, got {ordered!r}.")
        sample_rate = check_rate("sample_rate", sample_rate)
        freqs = jnp.asarray(freqs)
        n = freqs.shape[0] if freqs.ndim == 1 else 0
        if gains_db is None:
            gains_db = jnp.zeros(n, float)
        if qs is None:
            qs = jnp.full(n, 0.7071, float)
        freqs, gains_db, qs = _sections(freqs, gains_db, qs, default_float=True)
        freqs = check_init_range("freqs", freqs, 0.0, sample_rate / 2)
        self.freqs = _increasing(freqs) if ordered else freqs
        self.gains_db = check_init_range("gains_db", gains_db)
        self.qs = check_init_range("qs", qs, 0.0)
        self.sample_rate = sample_rate
        self.ordered = ordered

    @property
    def n_sections(self) -> int:
        """The number of sections."""
        return int(np.shape(self.freqs)[0])

    def _checked(self) -> tuple[Array, Array, Array]:
        """The frequencies, gains and Qs, checked to be valid (their ranges:
        `ValueError` at once for concrete values, at run time under
        `jax.jit`)."""
        freqs, gains_db, qs = _sections(self.freqs, self.gains_db, self.qs)
        freqs = check_init_range("freqs", freqs, 0.0, self.sample_rate / 2)
        if self.ordered:
            freqs = error_if(freqs, jnp.any(jnp.diff(freqs) <= 0), _INCREASING)
        gains_db = check_init_range("gains_db", gains_db)
        return freqs, gains_db, check_init_range("qs", qs, 0.0)

    @property
    def sos(self) -> Float[Array, "sections 6"]:
        """The cascade as sos rows; invalid fields raise (also under
        `jax.jit`)."""
        f, g, q = self._checked()
        shapes = ("lowshelf",) + ("peak",) * (f.shape[0] - 2) + ("highshelf",)
        return _rbj_rows(shapes, f, g, q, self.sample_rate)

    def to_unconstrained(self) -> Float[Array, " params"]:
        r"""The unconstrained vector `(3 n,)` of this equaliser, the inverse
        of `with_unconstrained`: the frequencies' entries
        $\ell_k = \operatorname{logit}(2 f_k / f_s)$ (with `ordered=True`:
        $\log w_k - \log w_n$ of the gaps $w$ of `with_unconstrained`), then
        $G \operatorname{artanh}(g_k / G)$ of the gains $g_k$ in dB
        ($G = 60$ dB), then $\operatorname{softplus}^{-1}(q_k)$. Entries
        beyond the map's clipping (with `ordered=True`, neighbours closer than
        its least gap; gains at or beyond $\pm G$) do not round-trip.
        Invalid fields raise (also under `jax.jit`)."""
        freqs, gains_db, qs = self._checked()
        if self.ordered:
            logits = _ordered_logits(freqs, self.sample_rate)
        else:
            logits = logit(freqs / (self.sample_rate / 2))
        gains = gain_db_to_unconstrained(gains_db)
        return jnp.concatenate([logits, gains, softplus_inverse(qs)])

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "ParametricEQ":
        r"""This equaliser from any real `theta` `(3 n,)`: frequencies
        $\frac{f_s}{2}\sigma(\ell_k)$ with $\ell_k = \theta_k$ (with
        `ordered=True`: $\log f_k = \log f_{\min} + k\,\delta +
        S \sum_{j \le k} w_j$ with $w = \operatorname{softmax}(\theta_0,
        \dots, \theta_{n-1}, 0)$, $\delta = 10^{-3}$ the least gap,
        $f_{\min}$ and $f_{\max}$ the frequencies of the logits $\mp 15$ and
        $S = \log(f_{\max}/f_{\min}) - (n-1)\delta$: strictly increasing for
        every finite `theta`); gains $G \tanh(\theta_{n+k} / G)$ in dB, with
        $G = 60$ dB (about $\theta_{n+k}$ near 0 dB, and bounded, so every
        finite `theta` gives finite sections); Qs
        $\operatorname{softplus}(\theta_{2n+k})$. Train `theta` (e.g. with
        optax) and build the equaliser from it inside the loss."""
        n = self.n_sections
        theta = unconstrained("theta", theta, 3 * n)
        if self.ordered:
            freqs = _ordered_freqs(theta[:n], self.sample_rate)
        else:
            freqs = bounded(theta[:n]) * (self.sample_rate / 2)
        gains_db = gain_db_from_unconstrained(theta[n : 2 * n])
        qs = positive(theta[2 * n :])
        return eqx.tree_at(
            lambda e: (e.freqs, e.gains_db, e.qs), self, (freqs, gains_db, qs)
        )

    def ranges(self) -> dict[str, Range]:
        r"""The normalised parameters' ranges: `freqs` in
        $\min(20, f_s/2205)$ Hz to $0.48 f_s$ (logarithmic; with
        `ordered=True`, one logarithmic band per section, in frequency order,
        section `k` is `freqs[k]`), `gains_db` in $[-18, 18]$ and `qs` in
        $[0.1, 10]$ (logarithmic)."""
        levels = {
            "gains_db": Range(-18.0, 18.0),
            "qs": Range(0.1, 10.0, log=True),
        }
        if not self.ordered:
            return {"freqs": _audible(self.sample_rate)} | levels
        edges = _band_edges(self.sample_rate, self.n_sections)
        bands = {
            f"freqs[{k}]": Range(float(lo), float(hi), log=True)
            for k, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True))
        }
        return bands | levels

    def checked_values(self) -> dict[str, Array]:
        """The frequencies, gains and Qs, checked to be valid (they may lie
        outside their ranges)."""
        return dict(zip(("freqs", "gains_db", "qs"), self._checked(), strict=True))

    def with_values(self, values: dict[str, Array]) -> "ParametricEQ":
        """The equaliser with the frequencies, gains and Qs of `values`."""
        return ParametricEQ(
            values["freqs"],
            values["gains_db"],
            values["qs"],
            self.sample_rate,
            ordered=self.ordered,
        )

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels sections 2"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Equalise `x` `(time,)` or `(channels, time)`; batch with
        `jax.vmap`. With `return_zf`, also the final state."""
        return _cascade(self.sos, x, zi, return_zf)


_INCREASING = "`freqs` must increase strictly: low shelf, peaking bands, high shelf."


def _sections(freqs, gains_db, qs, default_float=False):
    """The three per-section fields as vectors of one length, at least 2."""
    freqs = field_array("freqs", freqs, 1, default_float=default_float)
    n = freqs.shape[0]
    if n < 2:
        raise ValueError("`freqs` needs at least a low shelf and a high shelf.")
    gains_db = field_array("gains_db", gains_db, 1, default_float=default_float)
    qs = field_array("qs", qs, 1, default_float=default_float)
    if gains_db.shape != (n,) or qs.shape != (n,):
        raise ValueError("`gains_db` and `qs` need one entry per frequency.")
    return freqs, gains_db, qs


# The ordered map's reach: the frequencies of the unordered map's clipped
# logits, and the least gap between neighbours in log frequency (0.1%, far
# above float32's resolution, so no two sections ever round onto one value).
_ORDERED_REACH = (1 / (1 + math.exp(15.0)), 1 / (1 + math.exp(-15.0)))
_MIN_LOG_GAP = 1e-3


def _ordered_span(n: int, sample_rate: float) -> tuple[float, float]:
    """The lowest log frequency of the ordered map and the span of log
    frequency its `n + 1` free gaps share."""
    lo, hi = (math.log(r * sample_rate / 2) for r in _ORDERED_REACH)
    return lo, hi - lo - (n - 1) * _MIN_LOG_GAP


def _ordered_freqs(theta: Array, sample_rate: float) -> Array:
    r"""The ordered map: `n` real entries to `n` strictly increasing
    frequencies. The `n + 1` gaps of log frequency (below the first section,
    between neighbours, above the last) are the softmax of `theta` and a
    fixed 0, sharing the span left after the least gap between neighbours."""
    n = theta.shape[0]
    lo, span = _ordered_span(n, sample_rate)
    weights = jax.nn.softmax(jnp.concatenate([theta, jnp.zeros((1,), theta.dtype)]))
    steps = jnp.arange(n, dtype=theta.dtype) * _MIN_LOG_GAP
    freqs = jnp.exp(lo + steps + span * jnp.cumsum(weights[:-1]))
    # the top of the reach is 3e-7 below Nyquist, which float32's `exp`
    # (relative error about 1e-6 at these logarithms) can round past
    nyquist = jnp.asarray(sample_rate / 2, freqs.dtype)
    return jnp.minimum(freqs, jnp.nextafter(nyquist, jnp.zeros_like(nyquist)))


def _ordered_logits(freqs: Array, sample_rate: float) -> Array:
    """The inverse of `_ordered_freqs` for increasing `freqs` inside its
    reach, at least the least gap apart (others come back at the nearest
    point the map reaches)."""
    n = freqs.shape[0]
    lo, span = _ordered_span(n, sample_rate)
    steps = jnp.arange(n, dtype=freqs.dtype) * _MIN_LOG_GAP
    cumulative = (jnp.log(freqs) - lo - steps) / span
    edges = jnp.concatenate(
        [jnp.zeros((1,), freqs.dtype), cumulative, jnp.ones((1,), freqs.dtype)]
    )
    tiny = jnp.finfo(freqs.dtype).tiny
    log_weights = jnp.log(jnp.maximum(jnp.diff(edges), tiny))
    return log_weights[:-1] - log_weights[-1]


def _increasing(freqs):
    """`freqs`, checked to increase strictly (a `ValueError` at once for
    concrete values, at run time for traced ones)."""
    if isinstance(freqs, jax.core.Tracer):
        return error_if(freqs, jnp.any(jnp.diff(freqs) <= 0), _INCREASING)
    if np.any(np.diff(np.asarray(freqs)) <= 0):
        raise ValueError(_INCREASING)
    return freqs
