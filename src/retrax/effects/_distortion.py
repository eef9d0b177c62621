r"""Tanh waveshaping with first-order antiderivative antialiasing.

Antiderivative antialiasing (Parker, Zavalishin and Le Bihan, "Reducing the
aliasing of nonlinear waveshaping using continuous-time convolution", DAFx
2016; Bilbao, Esqueda, Parker and Välimäki, "Antiderivative antialiasing for
memoryless nonlinearities", IEEE SPL 2017) replaces $f(u_n)$ by the mean of
$f$ over the segment from $u_{n-1}$ to $u_n$,

$$y_n = \frac{F(u_n) - F(u_{n-1})}{u_n - u_{n-1}}, \qquad F' = f,$$

which is $f$ of the signal convolved with a one-sample box: it lowpasses
what the nonlinearity folds back, at the price of half a sample of delay.
For $f = \tanh$, $F(u) = \log\cosh u = |u| + \log(1 + e^{-2|u|}) - \log 2$.
The divided difference is computed from that split: $|u_n| - |u_{n-1}|$
has no cancellation beyond the inputs' own rounding, and the rest is below
$\log 2$, so rounding costs about $\epsilon / |u_n - u_{n-1}|$. Where
$|u_n - u_{n-1}|$ is below $\epsilon^{1/4}$ the difference is replaced by
its Taylor expansion about the midpoint $m$,
$\tanh m\,\bigl(1 - \tfrac{h^2}{12} \operatorname{sech}^2 m\bigr)$
($h = u_n - u_{n-1}$), whose error is of order $h^4$; both branches are
evaluated on safe arguments, so derivatives of every order stay finite.
"""

from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike, Float, Shaped

from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    logit_to_unconstrained,
    logit_with_unconstrained,
    with_values_by_tree_at,
)
from .._signal import output, per_channel, signal, state_leaf


def _soft(u: Array) -> Array:
    # log cosh u - |u| + log 2, in [0, log 2]
    return jnp.log1p(jnp.exp(-2.0 * jnp.abs(u)))


def _adaa(u: Array, previous: Array):
    """The antialiased tanh `y` and the pieces its derivatives reuse."""
    extended = jnp.concatenate([previous[None], u])
    before = extended[:-1]
    h = u - before
    small = jnp.abs(h) < jnp.finfo(u.dtype).eps ** 0.25
    safe = jnp.where(small, 1.0, h)
    # each sample's |u| and soft part once, differenced (XLA would evaluate
    # the shifted copies again: exp and log1p dominate the cost)
    size, soft = jnp.abs(extended), _soft(extended)
    exact = ((size[1:] - size[:-1]) + (soft[1:] - soft[:-1])) / safe
    t = jnp.tanh(0.5 * (u + before))
    hs = jnp.where(small, h, 0.0)
    near = t * (1.0 - hs**2 / 12.0 * (1.0 - t * t))
    return jnp.where(small, near, exact), extended, small, safe, t, hs


@jax.custom_jvp
def adaa_tanh(u: Array, previous: Array) -> Array:
    """The antialiased tanh of `u` (time first) after the sample `previous`."""
    return _adaa(u, previous)[0]


@adaa_tanh.defjvp
def _adaa_tanh_jvp(primals, tangents):
    # y_n depends on u_n and u_{n-1} alone: dy_n = a_n du_n + b_n du_{n-1},
    # with a = (tanh u_n - y_n) / h and b = (y_n - tanh u_{n-1}) / h (the
    # divided difference's partial derivatives), or the Taylor form's where
    # h is small. Reverse mode then transposes two products and a shift
    # instead of the log1p, exp and quotient of the value.
    u, previous = primals
    du, dprevious = tangents
    y, extended, small, safe, t, hs = _adaa(u, previous)
    f = jnp.tanh(extended)
    sech2 = 1.0 - t * t
    dm = sech2 * (1.0 - hs**2 / 12.0 * (1.0 - 3.0 * t * t))
    dh = -hs / 6.0 * t * sech2
    a = jnp.where(small, 0.5 * dm + dh, (f[1:] - y) / safe)
    b = jnp.where(small, 0.5 * dm - dh, (y - f[:-1]) / safe)
    dextended = jnp.concatenate([dprevious[None], du])
    return y, a * dextended[1:] + b * dextended[:-1]


class Distortion(AbstractRangedEffect):
    r"""Tanh distortion with antiderivative antialiasing.

    $$y_n = \frac{F(u_n) - F(u_{n-1})}{u_n - u_{n-1}},
      \qquad u_n = G x_n,\ F = \log\cosh,$$

    the first-order antialiased form of $\tanh(G x_n)$ with the drive
    $G = 10^{\mathrm{drive\_db}/20}$ (see the module docstring; it delays the
    signal by half a sample). At $u_n = u_{n-1}$ it is $\tanh u_n$. The
    state is the previous input sample, so the effect streams.

    **Arguments:**

    - `drive_db`: the drive in dB, in $[0, 40]$ (normalised linearly).
    - `antialias`: a Python bool (static). `False` gives plain
      $y_n = \tanh(G x_n)$, which aliases (dasp-pytorch's and faustax's
      distortion); the state is then kept but unused.

    dasp-pytorch's `modules.Distortion` vector (its drive `gain_db` in
    $[0, 24]$ dB) goes through `retrax.effects.from_dasp(Distortion, p)`,
    which builds `antialias=False`, and `to_dasp`.

    `(channels, time)` signals are distorted channel by channel; `zi` is the
    input before the first sample (shape `()`, or `(channels,)`), zero by
    default. A `drive_db` out of range raises an error (also under
    `jax.jit`).
    """

    drive_db: Float[Array, ""]
    antialias: bool = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {"drive_db": Range(0.0, 40.0)}

    def __init__(self, drive_db: Shaped[ArrayLike, ""] = 12.0, antialias: bool = True):
        if not isinstance(antialias, bool):
            raise ValueError(f"`antialias` must be a Python bool, got {antialias!r}.")
        self.drive_db = self.RANGES["drive_db"].check_init("drive_db", drive_db)
        self.antialias = antialias

    def ranges(self) -> dict[str, Range]:
        """`drive_db` in $[0, 40]$ dB."""
        return self.RANGES

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Distortion":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " params"]:
        return logit_to_unconstrained(self)

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Distortion":
        return logit_with_unconstrained(self, theta)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: Shaped[ArrayLike, "*channels"] | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], Array]:
        """Distort `x` `(time,)` or `(channels, time)`; `zi` is the previous
        input sample(s), and `zf` the last."""
        x = signal(x)
        drive = 10.0 ** (self.param("drive_db", x.dtype) / 20.0)

        def mono(xc, z):
            z = state_leaf("zi", z, (), xc.dtype)
            if xc.shape[0] == 0:
                return xc, z
            if not self.antialias:
                return jnp.tanh(drive * xc), xc[-1]
            return adaa_tanh(drive * xc, drive * z), xc[-1]

        y, zf = per_channel(mono, x, zi, ())
        return output(y, zf, return_zf)
