"""Biquads and a parametric equaliser (RBJ cookbook sections) on `sosfilt`."""

from collections.abc import Sequence
from typing import Literal

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._misc import as_inexact
from ..ops import sosfilt
from ..ops._validate import check_in_range, check_init_range, check_rate, check_signal
from ._parametrise import biquad_denominator


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
    A = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * jnp.pi * freq / sample_rate
    cos, alpha = jnp.cos(w0), jnp.sin(w0) / (2.0 * q)
    if shape == "peak":
        b = jnp.stack([1 + alpha * A, -2 * cos, 1 - alpha * A])
        a = jnp.stack([1 + alpha / A, -2 * cos, 1 - alpha / A])
    else:
        s = 1.0 if shape == "lowshelf" else -1.0
        root = 2.0 * jnp.sqrt(A) * alpha
        b = A * jnp.stack(
            [
                (A + 1) - s * (A - 1) * cos + root,
                s * 2 * ((A - 1) - s * (A + 1) * cos),
                (A + 1) - s * (A - 1) * cos - root,
            ]
        )
        a = jnp.stack(
            [
                (A + 1) + s * (A - 1) * cos + root,
                -s * 2 * ((A - 1) + s * (A + 1) * cos),
                (A + 1) + s * (A - 1) * cos - root,
            ]
        )
    return jnp.concatenate([b / a[0], jnp.ones((1,), a.dtype), a[1:] / a[0]])


def _logit(p):
    return jnp.log(p) - jnp.log1p(-p)


def _inverse_softplus(v):
    return v + jnp.log(-jnp.expm1(-v))


class Biquad(eqx.Module):
    """A learnable second-order section that cannot become unstable.

    The poles are stored as a radius logit and an angle,
    $r = r_{\\max}\\,\\sigma(\\rho)$, so every optax step keeps them inside
    the unit circle; the numerator `b` is free.

    **Arguments:**

    - `b`: the initial numerator `(3,)`, finite.
    - `radius`: the initial pole radius in $(0, r_{\\max})$.
    - `angle`: the initial pole angle in radians, finite.
    - `max_radius`: the largest reachable pole radius, a Python number in
      $(0, 1)$ (default 0.999).

    Invalid values raise `ValueError` (an error under `jax.jit` if the module
    is built from traced values).
    """

    b: Float[Array, " 3"]
    raw_radius: Float[Array, ""]
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
        b = jnp.asarray(b, float)
        if b.shape != (3,):
            raise ValueError(f"`b` must have 3 coefficients, got shape {b.shape}.")
        self.b = check_init_range("b", b)
        radius = check_init_range("radius", jnp.asarray(radius, float), 0.0, max_radius)
        self.raw_radius = _logit(radius / max_radius)
        self.angle = check_init_range("angle", jnp.asarray(angle, float))
        self.max_radius = float(max_radius)

    @property
    def radius(self) -> Float[Array, ""]:
        """The pole radius."""
        return self.max_radius * jax.nn.sigmoid(self.raw_radius)

    @property
    def sos(self) -> Float[Array, "1 6"]:
        """The section as an sos row."""
        a = biquad_denominator(self.radius, self.angle)
        return jnp.concatenate([self.b, jnp.ones((1,), a.dtype), a])[None]

    def __call__(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """Filter one signal `(T,)`; batch with `jax.vmap`."""
        x = as_inexact("x", x)
        check_signal("x", x)
        return sosfilt(self.sos.astype(x.dtype), x, axis=0)


class ParametricEQ(eqx.Module):
    """A parametric equaliser: a low shelf, peaking bands and a high shelf.

    Frequencies are stored as logits of `freq / nyquist`, resonances as
    inverse softplus of `q`, gains in dB, so every parameter is real and
    unconstrained and the sections stay valid (and stable) under any optax
    step. All sections run as one `sosfilt` cascade.

    **Arguments:**

    - `freqs`: the initial frequencies in Hz, low shelf first, high shelf
      last, peaking bands in between (at least 2 entries).
    - `gains_db`: the initial gains in dB, same length (default 0 dB).
    - `qs`: the initial Q of every section (default 0.7071).
    - `sample_rate`: $f_s$ in Hz, a positive Python number.

    Invalid values raise `ValueError` naming the argument (an error under
    `jax.jit` if the module is built from traced values).
    """

    raw_freqs: Float[Array, " sections"]
    gains_db: Float[Array, " sections"]
    raw_qs: Float[Array, " sections"]
    sample_rate: float = eqx.field(static=True)

    def __init__(
        self,
        freqs: Shaped[ArrayLike, " sections"] | Sequence[float | int],
        gains_db: Shaped[ArrayLike, " sections"] | Sequence[float | int] | None = None,
        qs: Shaped[ArrayLike, " sections"] | Sequence[float | int] | None = None,
        sample_rate: float | int = 44_100.0,
    ):
        sample_rate = check_rate("sample_rate", sample_rate)
        freqs = jnp.asarray(freqs, float)
        n = freqs.shape[0] if freqs.ndim == 1 else 0
        if n < 2:
            raise ValueError("`freqs` needs at least a low shelf and a high shelf.")
        nyquist = sample_rate / 2
        gains_db = jnp.zeros(n) if gains_db is None else jnp.asarray(gains_db, float)
        qs = jnp.full(n, 0.7071, float) if qs is None else jnp.asarray(qs, float)
        if gains_db.shape != (n,) or qs.shape != (n,):
            raise ValueError("`gains_db` and `qs` need one entry per frequency.")
        freqs = check_init_range("freqs", freqs, 0.0, nyquist)
        gains_db = check_init_range("gains_db", gains_db)
        qs = check_init_range("qs", qs, 0.0)
        self.raw_freqs = _logit(freqs / nyquist)
        self.gains_db = gains_db
        self.raw_qs = _inverse_softplus(qs)
        self.sample_rate = sample_rate

    @property
    def freqs(self) -> Float[Array, " sections"]:
        """The section frequencies in Hz."""
        return jax.nn.sigmoid(self.raw_freqs) * (self.sample_rate / 2)

    @property
    def qs(self) -> Float[Array, " sections"]:
        """The section resonances."""
        return jax.nn.softplus(self.raw_qs)

    @property
    def sos(self) -> Float[Array, "sections 6"]:
        """The cascade as sos rows."""
        f, g, q = self.freqs, self.gains_db, self.qs
        shapes = ["lowshelf"] + ["peak"] * (f.shape[0] - 2) + ["highshelf"]
        return jnp.stack(
            [
                rbj_section(s, f[i], g[i], q[i], self.sample_rate)
                for i, s in enumerate(shapes)
            ]
        )

    def __call__(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """Equalise one signal `(T,)`; batch with `jax.vmap`."""
        x = as_inexact("x", x)
        check_signal("x", x)
        return sosfilt(self.sos.astype(x.dtype), x, axis=0)
