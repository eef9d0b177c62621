"""Trainable effect modules: a compressor and a modal state-space filter."""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Shaped

from .._misc import as_inexact, check_positive_int
from ..dynamics import avg, compexp_gain, db2amp, ms2coef
from ..effects._processor import (
    AbstractEffect,
    Range,
    check_normalised,
    output,
    per_channel,
    signal,
    state_leaf,
)
from ..ops import diag_state_space
from ..ops._validate import check_in_range, check_init_range, check_rate
from ._eq import _inverse_softplus, _logit


class Compressor(AbstractEffect):
    """A feed-forward compressor/expander with makeup gain, all parameters learnable.

    The level is the RMS over a one-pole average, `sqrt(avg(x**2, c))`; the
    gain is `compexp_gain` of that level; the output is
    `x * gain * db2amp(makeup_db)`. Times are learned as logs of
    milliseconds and the ratios through softplus and sigmoid, so every optax
    step keeps them valid (compression ratio > 1, expansion ratio in (0, 1),
    times > 0).

    **Arguments:**

    - `threshold_db`, `ratio`: the compressor's threshold (dB) and ratio (> 1).
    - `attack_ms`, `release_ms`: the gain's attack and release times.
    - `makeup_db`: the makeup gain in dB.
    - `exp_threshold_db`, `exp_ratio`: the expander's threshold and ratio in
      (0, 1); the default threshold (-120 dB) leaves the expander idle.
    - `rms_ms`: the averaging time of the level detector.
    - `sample_rate`: $f_s$ in Hz, a positive Python number.

    Every value must be finite and the times positive; invalid values raise
    `ValueError` naming the argument (an error under `jax.jit` if the module
    is built from traced values).

    As an [effect][retrax.effects.AbstractEffect], its five normalised
    parameters are `[threshold_db, ratio, attack_ms, release_ms, makeup_db]`
    with the ranges of `ranges()`: threshold in $[-60, 0]$ dB, ratio in
    $[1.1, 20]$, attack in $[0.1, 100]$ ms, release in $[5, 1000]$ ms (these
    three logarithmic) and makeup in $[-12, 24]$ dB; the expander and the
    detector's averaging time are fields outside the normalised vector. It
    compresses `(time,)` or, channel by channel, `(channels, time)` signals
    (each channel with its own detector), and streams: `zi` is the pair
    `(power, gain)` of the detector's running mean power and the smoothed
    gain before the first sample (scalars, or `(channels,)`), by default
    `(0, 1)`.
    """

    threshold_db: Float[Array, ""]
    raw_ratio: Float[Array, ""]
    log_attack_ms: Float[Array, ""]
    log_release_ms: Float[Array, ""]
    makeup_db: Float[Array, ""]
    exp_threshold_db: Float[Array, ""]
    raw_exp_ratio: Float[Array, ""]
    log_rms_ms: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)

    def __init__(
        self,
        threshold_db: Shaped[ArrayLike, ""] = -18.0,
        ratio: Shaped[ArrayLike, ""] = 4.0,
        attack_ms: Shaped[ArrayLike, ""] = 5.0,
        release_ms: Shaped[ArrayLike, ""] = 100.0,
        makeup_db: Shaped[ArrayLike, ""] = 0.0,
        exp_threshold_db: Shaped[ArrayLike, ""] = -120.0,
        exp_ratio: Shaped[ArrayLike, ""] = 0.5,
        rms_ms: Shaped[ArrayLike, ""] = 10.0,
        sample_rate: float | int = 44_100.0,
    ):
        sample_rate = check_rate("sample_rate", sample_rate)

        def f(name, value, low=None, high=None):
            return check_init_range(name, jnp.asarray(value, float), low, high)

        self.threshold_db = f("threshold_db", threshold_db)
        self.raw_ratio = _inverse_softplus(f("ratio", ratio, 1.0) - 1.0)
        self.log_attack_ms = jnp.log(f("attack_ms", attack_ms, 0.0))
        self.log_release_ms = jnp.log(f("release_ms", release_ms, 0.0))
        self.makeup_db = f("makeup_db", makeup_db)
        self.exp_threshold_db = f("exp_threshold_db", exp_threshold_db)
        self.raw_exp_ratio = _logit(f("exp_ratio", exp_ratio, 0.0, 1.0))
        self.log_rms_ms = jnp.log(f("rms_ms", rms_ms, 0.0))
        self.sample_rate = sample_rate

    @property
    def ratio(self) -> Float[Array, ""]:
        """The compression ratio."""
        return 1.0 + jax.nn.softplus(self.raw_ratio)

    @property
    def exp_ratio(self) -> Float[Array, ""]:
        """The expansion ratio."""
        return jax.nn.sigmoid(self.raw_exp_ratio)

    @property
    def attack_ms(self) -> Float[Array, ""]:
        """The attack time in ms."""
        return jnp.exp(self.log_attack_ms)

    @property
    def release_ms(self) -> Float[Array, ""]:
        """The release time in ms."""
        return jnp.exp(self.log_release_ms)

    def gain(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """The linear gain (without makeup) applied to one signal."""
        x = as_inexact("x", x)
        dt = x.dtype
        sr = self.sample_rate
        power = avg(x * x, ms2coef(jnp.exp(self.log_rms_ms), sr).astype(dt))
        rms = jnp.sqrt(jnp.maximum(power, jnp.finfo(dt).tiny))
        return compexp_gain(
            rms,
            self.threshold_db.astype(dt),
            self.ratio.astype(dt),
            self.exp_threshold_db.astype(dt),
            self.exp_ratio.astype(dt),
            ms2coef(self.attack_ms, sr).astype(dt),
            ms2coef(self.release_ms, sr).astype(dt),
        )

    def _gain(self, x, zi):
        dt = x.dtype
        sr = self.sample_rate
        coef = ms2coef(jnp.exp(self.log_rms_ms), sr).astype(dt)
        power, power_zf = avg(x * x, coef, zi[0], return_zf=True)
        rms = jnp.sqrt(jnp.maximum(power, jnp.finfo(dt).tiny))
        gain, gain_zf = compexp_gain(
            rms,
            self.threshold_db.astype(dt),
            self.ratio.astype(dt),
            self.exp_threshold_db.astype(dt),
            self.exp_ratio.astype(dt),
            ms2coef(self.attack_ms, sr).astype(dt),
            ms2coef(self.release_ms, sr).astype(dt),
            zi=zi[1],
            return_zf=True,
        )
        return gain, (power_zf, gain_zf)

    def ranges(self) -> dict[str, Range]:
        """The normalised parameters' ranges (see the class docstring)."""
        return {
            "threshold_db": Range(-60.0, 0.0),
            "ratio": Range(1.1, 20.0, log=True),
            "attack_ms": Range(0.1, 100.0, log=True),
            "release_ms": Range(5.0, 1000.0, log=True),
            "makeup_db": Range(-12.0, 24.0),
        }

    @property
    def n_params(self) -> int:
        """5: threshold, ratio, attack, release and makeup."""
        return 5

    def to_normalised(self) -> Float[Array, " 5"]:
        """The five parameters normalised; values outside the ranges raise
        (also under `jax.jit`)."""
        return jnp.stack(
            [
                r.normalised(r.check(name, getattr(self, name)))
                for name, r in self.ranges().items()
            ]
        )

    def with_normalised(self, p: Shaped[ArrayLike, " 5"]) -> "Compressor":
        """The compressor with the five parameters of `p` in $[0, 1]$ and
        this one's expander, detector time and sample rate."""
        p = check_normalised(p, 5)
        values = {
            name: r.physical(p[i]) for i, (name, r) in enumerate(self.ranges().items())
        }
        return Compressor(
            **values,
            exp_threshold_db=self.exp_threshold_db,
            exp_ratio=self.exp_ratio,
            rms_ms=jnp.exp(self.log_rms_ms),
            sample_rate=self.sample_rate,
        )

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: tuple | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], tuple]:
        """Compress `x` `(time,)` or `(channels, time)`; batch with
        `jax.vmap`. With `return_zf`, also the final `(power, gain)` state."""
        x = signal(x)
        makeup = db2amp(check_in_range("makeup_db", self.makeup_db)).astype(x.dtype)
        if zi is not None and not (isinstance(zi, tuple) and len(zi) == 2):
            raise ValueError("`zi` must be the pair (power, gain) of a compressor.")

        def mono(xc, z):
            power, gain = (None, None) if z is None else z
            power = state_leaf("zi[0]", power, (), xc.dtype)
            gain = jnp.ones((), xc.dtype) if gain is None else gain
            gain = state_leaf("zi[1]", gain, (), xc.dtype)
            g, zf = self._gain(xc, (power, gain))
            return xc * g * makeup, zf

        y, zf = per_channel(mono, x, zi)
        return output(y, zf, return_zf)


class StateSpaceFilter(eqx.Module):
    """A learnable real filter in modal form with bounded pole radius.

    `n_modes` complex-conjugate pole pairs $p_j = r_j e^{i\\theta_j}$ with
    $r_j = r_{\\max}\\,\\sigma(\\rho_j)$, so the filter is stable for every
    parameter value, and complex input and output weights; the output is
    $y = 2\\,\\mathrm{Re} \\sum_j c_j h_j + d\\,x$ with
    $h_{t+1} = p \\odot h_t + b\\,x_t$
    (`diag_state_space`), which equals a real system of order `2 n_modes`.
    All parameters are stored as real arrays (real and imaginary parts kept
    apart), so optax treats them as ordinary real leaves.

    **Arguments:**

    - `n_modes`: the number of pole pairs.
    - `key`: a PRNG key for the initial weights.
    - `max_radius`: the largest pole radius (default 0.9995).
    """

    raw_radius: Float[Array, " modes"]
    angle: Float[Array, " modes"]
    b: Float[Array, "modes 2"]
    c: Float[Array, "modes 2"]
    d: Float[Array, ""]
    max_radius: float = eqx.field(static=True)

    def __init__(self, n_modes: int, key: PRNGKeyArray, max_radius: float = 0.9995):
        check_positive_int("n_modes", n_modes)
        if not 0 < max_radius < 1:
            raise ValueError(f"`max_radius` must lie in (0, 1), got {max_radius!r}.")
        k1, k2, k3 = jax.random.split(key, 3)
        self.raw_radius = jnp.zeros(n_modes, float) + 2.0
        self.angle = jnp.linspace(0.05, 3.0, n_modes, dtype=float)
        self.b = jax.random.normal(k1, (n_modes, 2), float) / jnp.sqrt(n_modes)
        self.c = jax.random.normal(k2, (n_modes, 2), float) / jnp.sqrt(n_modes)
        self.d = jax.random.normal(k3, (), float) * 0.1
        self.max_radius = float(max_radius)

    @property
    def poles(self) -> Array:
        """The complex poles (one of each conjugate pair)."""
        radius = self.max_radius * jax.nn.sigmoid(self.raw_radius)
        return jax.lax.complex(
            radius * jnp.cos(self.angle), radius * jnp.sin(self.angle)
        )

    def __call__(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """Filter one real signal `(T,)`; batch with `jax.vmap`."""
        x = as_inexact("x", x)
        ctype = jnp.complex128 if x.dtype == jnp.float64 else jnp.complex64
        poles = self.poles.astype(ctype)
        b = jax.lax.complex(self.b[:, 0], self.b[:, 1]).astype(ctype)[:, None]
        c = jax.lax.complex(self.c[:, 0], self.c[:, 1]).astype(ctype)[None, :]
        # A conjugate pair contributes 2 Re(c h): the real system's output.
        y = diag_state_space(poles, b, 2 * c, None, x.astype(ctype)[:, None])
        d = check_in_range("d", self.d)
        return jnp.real(y[:, 0]) + d.astype(x.dtype) * x
