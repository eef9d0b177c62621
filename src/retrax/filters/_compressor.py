"""A feed-forward compressor/expander as a ranged effect."""

from typing import ClassVar

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import (
    AbstractRangedEffect,
    Range,
    fields_as_they_are,
    with_values_by_tree_at,
)
from .._misc import as_inexact
from .._signal import output, per_channel, signal, state_leaf
from .._unconstrained import (
    SATURATION,
    bounded,
    logit,
    positive,
    softplus_inverse,
    unconstrained,
)
from .._validate import check_delay, check_init_range, check_rate
from ..dynamics import avg, compexp_gain, db2amp, ms2coef


# The values each parameter may take (`low`, `high`, whether `low` is
# excluded), checked at construction and at every call: `eqx.tree_at` or an
# optimiser may have moved a field since.
_LIMITS = {
    "threshold_db": (None, None, True),
    "ratio": (1.0, None, True),
    "attack_ms": (0.0, None, True),
    "release_ms": (0.0, None, True),
    "makeup_db": (None, None, True),
    "knee_db": (0.0, None, False),
    "exp_threshold_db": (None, None, True),
    "exp_ratio": (0.0, 1.0, True),
    "rms_ms": (0.0, None, True),
}


class Compressor(AbstractRangedEffect):
    r"""A feed-forward compressor/expander with soft knee, lookahead and makeup gain.

    The level is the RMS over a one-pole average, `sqrt(avg(x**2, c))` with
    the coefficient `c` of `rms_ms`; the gain $g_t$ is
    [`compexp_gain`][retrax.dynamics.compexp_gain] of that level (a static
    curve in dB with the knee `knee_db`, then attack and release
    ballistics); the output is

    $$y_t = x_{t - D}\, g_t\, 10^{\mathrm{makeup\_db}/20},$$

    with the lookahead $D$ = `lookahead_samples`: the gain is computed from
    the undelayed signal and applied to the signal $D$ samples later, so it
    falls before a transient reaches the output (the output lags the input
    by $D$ samples; dasp-pytorch's `lookahead_samples`). $D = 0$ is a plain
    feed-forward compressor.

    **Arguments:**

    - `threshold_db`, `ratio`: the compressor's threshold (dB, finite) and
      ratio (> 1).
    - `attack_ms`, `release_ms`: the gain's attack and release times (ms,
      > 0; see [`ms2coef`][retrax.dynamics.ms2coef]).
    - `makeup_db`: the makeup gain in dB, finite.
    - `exp_threshold_db`, `exp_ratio`: the expander's threshold (dB) and
      ratio in (0, 1); the default threshold (-120 dB) leaves the expander
      idle.
    - `rms_ms`: the averaging time of the level detector (ms, > 0).
    - `sample_rate`: $f_s$ in Hz, a positive Python number (static).
    - `knee_db`: the width of the soft knee in dB, $\ge 0$ (0, the default,
      is a hard knee), around both thresholds: the quadratic knee of
      Giannoulis, Massberg and Reiss (2012), as in dasp-pytorch.
    - `lookahead_samples`: the lookahead $D$, a Python int $\ge 0$ (static:
      it fixes the state's shape). For a lookahead of $m$ ms pass
      `round(m * sample_rate / 1000)`.

    The parameters are stored as given, in physical units, one field each
    (`threshold_db`, `ratio`, `attack_ms`, `release_ms`, `makeup_db`,
    `knee_db`, `exp_threshold_db`, `exp_ratio`, `rms_ms`): `eqx.tree_at`
    replaces them, e.g. `eqx.tree_at(lambda c: c.ratio, comp, 8.0)`, and
    optax trains them. Their values are checked when the module is built
    (`ValueError` naming the argument; an error at run time if it is built
    from traced values, e.g. under `eqx.filter_vmap`, which builds an
    ensemble) and again at every call (an error naming the field, also under
    `jax.jit`), since a replaced or trained field may have left its range.
    To train without leaving the valid region, train the unconstrained
    vector of `to_unconstrained()` and build the compressor from it inside
    the loss with `with_unconstrained` (as for the other filter modules):
    every real vector gives a valid compressor, so an optimiser's step, however
    large, never makes the next call raise. Or train the normalised
    parameters below.

    It is a [ranged effect][retrax.effects.AbstractRangedEffect], also
    `retrax.effects.Compressor` (the same class, re-exported): its six
    normalised parameters are `[threshold_db, ratio, attack_ms, release_ms,
    makeup_db, knee_db]` with the ranges of `ranges()`: threshold in
    $[-60, 0]$ dB, ratio in $[1.1, 20]$, attack in $[0.1, 100]$ ms, release
    in $[5, 1000]$ ms (these three logarithmic), makeup in $[-12, 24]$ dB
    and knee in $[0, 24]$ dB; the expander, the detector's averaging time and the
    lookahead stay outside the normalised vector. It compresses `(time,)` or,
    channel by channel, `(channels, time)` signals (each channel with its own
    detector), and streams: `zi` is the triple `(power, gain, delayed)` of
    the detector's running mean power, the smoothed gain before the first
    sample (scalars, or `(channels,)`) and the last $D$ input samples, oldest
    first (`(D,)`, or `(channels, D)`), by default `(0, 1, zeros)`; entries
    may be `None` for their defaults.

    dasp-pytorch's `compressor` is another definition (a summed side-chain,
    $|x|$ in dB, attack-only smoothing of the gain in dB): it is
    [`DaspCompressor`][retrax.effects.DaspCompressor]."""

    threshold_db: Float[Array, ""]
    ratio: Float[Array, ""]
    attack_ms: Float[Array, ""]
    release_ms: Float[Array, ""]
    makeup_db: Float[Array, ""]
    knee_db: Float[Array, ""]
    exp_threshold_db: Float[Array, ""]
    exp_ratio: Float[Array, ""]
    rms_ms: Float[Array, ""]
    sample_rate: float = eqx.field(static=True)
    lookahead_samples: int = eqx.field(static=True)

    RANGES: ClassVar[dict[str, Range]] = {
        "threshold_db": Range(-60.0, 0.0),
        "ratio": Range(1.1, 20.0, log=True),
        "attack_ms": Range(0.1, 100.0, log=True),
        "release_ms": Range(5.0, 1000.0, log=True),
        "makeup_db": Range(-12.0, 24.0),
        "knee_db": Range(0.0, 24.0),
    }

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
        *,
        knee_db: Shaped[ArrayLike, ""] = 0.0,
        lookahead_samples: int = 0,
    ):
        self.sample_rate = check_rate("sample_rate", sample_rate)
        self.lookahead_samples = check_delay(
            "lookahead_samples", lookahead_samples, minimum=0
        )
        values = {
            "threshold_db": threshold_db,
            "ratio": ratio,
            "attack_ms": attack_ms,
            "release_ms": release_ms,
            "makeup_db": makeup_db,
            "knee_db": knee_db,
            "exp_threshold_db": exp_threshold_db,
            "exp_ratio": exp_ratio,
            "rms_ms": rms_ms,
        }
        for name, value in values.items():
            low, high, low_open = _LIMITS[name]
            checked = check_init_range(
                name, jnp.asarray(value, float), low, high, low_open=low_open
            )
            setattr(self, name, checked)

    def _checked(self, name: str) -> Array:
        """The field `name`, checked to hold a valid value (`ValueError` at
        once for a concrete value, at run time under `jax.jit`)."""
        low, high, low_open = _LIMITS[name]
        # `as_inexact`: `eqx.tree_at` may have put a Python number here
        value = as_inexact(name, getattr(self, name))
        return check_init_range(name, value, low, high, low_open=low_open)

    def _gain(self, x, power, gain):
        """The gain `(T,)` for one channel from the detector's `power` and
        the smoothed `gain` before it, and their final values."""
        dt = x.dtype
        sr = self.sample_rate

        def coef(name):
            return ms2coef(self._checked(name), sr).astype(dt)

        def value(name):
            return self._checked(name).astype(dt)

        power, power_zf = avg(x * x, coef("rms_ms"), power, return_zf=True)
        rms = jnp.sqrt(jnp.maximum(power, jnp.finfo(dt).tiny))
        gain, gain_zf = compexp_gain(
            rms,
            value("threshold_db"),
            value("ratio"),
            value("exp_threshold_db"),
            value("exp_ratio"),
            coef("attack_ms"),
            coef("release_ms"),
            knee_db=value("knee_db"),
            zi=gain,
            return_zf=True,
        )
        return gain, power_zf, gain_zf

    def gain(self, x: Shaped[ArrayLike, " time"]) -> Float[Array, " time"]:
        """The linear gain $g_t$ (without makeup) for one signal `(time,)`,
        from silence; with a lookahead it multiplies the delayed signal."""
        x = as_inexact("x", x)
        zero = jnp.zeros((), x.dtype)
        return self._gain(x, zero, jnp.ones((), x.dtype))[0]

    def ranges(self) -> dict[str, Range]:
        """The normalised parameters' ranges (see the class docstring)."""
        return self.RANGES

    def checked_values(self) -> dict[str, Array]:
        return fields_as_they_are(self)

    def with_values(self, values: dict[str, Array]) -> "Compressor":
        return with_values_by_tree_at(self, values)

    def to_unconstrained(self) -> Float[Array, " 9"]:
        r"""The unconstrained vector `(9,)` of this compressor, the inverse of
        `with_unconstrained`: in field order, `threshold_db`,
        $\operatorname{softplus}^{-1}(\mathrm{ratio} - 1)$,
        $\operatorname{softplus}^{-1}$ of `attack_ms`, `release_ms`,
        `makeup_db`, $\operatorname{softplus}^{-1}$ of `knee_db`,
        `exp_threshold_db`, $\operatorname{logit}$ of `exp_ratio` and
        $\operatorname{softplus}^{-1}$ of `rms_ms`. Entries beyond the map's
        clipping do not round-trip: a knee below
        $\operatorname{softplus}(-15) = 3.1 \cdot 10^{-7}$ dB, such as the
        default hard knee, maps to -15, which `with_unconstrained` gives back
        as a knee of $3.1 \cdot 10^{-7}$ dB, whose derivative there is 0: to
        train the knee, start from a soft one (e.g. 0.5 dB). Invalid fields
        raise (also under `jax.jit`)."""
        v = {name: self._checked(name) for name in _LIMITS}
        knee = v["knee_db"]
        v["knee_db"] = jnp.maximum(knee, positive(jnp.full_like(knee, -SATURATION)))
        return jnp.stack(
            [
                v["threshold_db"],
                softplus_inverse(v["ratio"] - 1),
                softplus_inverse(v["attack_ms"]),
                softplus_inverse(v["release_ms"]),
                v["makeup_db"],
                softplus_inverse(v["knee_db"]),
                v["exp_threshold_db"],
                logit(v["exp_ratio"]),
                softplus_inverse(v["rms_ms"]),
            ]
        )

    def with_unconstrained(self, theta: Shaped[ArrayLike, " 9"]) -> "Compressor":
        r"""This compressor from any real `theta` `(9,)`: thresholds and
        makeup in dB as they are (`theta[0]`, `theta[4]`, `theta[6]`), the
        ratio $1 + \operatorname{softplus}(\theta_1)$, the attack, release
        and detector times in ms and the knee in dB through softplus
        (`theta[2]`, `theta[3]`, `theta[8]`, `theta[5]`), the expander's
        ratio $\sigma(\theta_7)$ in $(0, 1)$. The softplus entries are clipped
        below at -15 and the sigmoid's to $[-15, 15]$ (derivative 0 beyond),
        where float32 would round the fields onto the ends of their
        intervals. Train `theta` (e.g. with optax) and build the compressor
        from it inside the loss: every step gives a valid compressor. The
        sample rate and lookahead stay this compressor's."""
        theta = unconstrained("theta", theta, 9)
        values = (
            theta[0],
            1 + positive(theta[1]),
            positive(theta[2]),
            positive(theta[3]),
            theta[4],
            positive(theta[5]),
            theta[6],
            bounded(theta[7]),
            positive(theta[8]),
        )
        names = tuple(_LIMITS)
        return eqx.tree_at(lambda c: tuple(getattr(c, n) for n in names), self, values)

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: tuple | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels time"] | tuple[Float[Array, "*channels time"], tuple]:
        """Compress `x` `(time,)` or `(channels, time)`; batch with
        `jax.vmap`. With `return_zf`, also the final `(power, gain, delayed)`
        state."""
        x = signal(x)
        makeup = db2amp(self._checked("makeup_db")).astype(x.dtype)
        if zi is not None and not (isinstance(zi, tuple) and len(zi) == 3):
            raise ValueError(
                "`zi` must be the triple (power, gain, delayed) of a compressor."
            )
        lookahead = self.lookahead_samples

        def mono(xc, z):
            power, gain, delayed = (None, None, None) if z is None else z
            power = state_leaf("zi[0]", power, (), xc.dtype)
            gain = jnp.ones((), xc.dtype) if gain is None else gain
            gain = state_leaf("zi[1]", gain, (), xc.dtype)
            delayed = state_leaf("zi[2]", delayed, (lookahead,), xc.dtype)
            g, power_zf, gain_zf = self._gain(xc, power, gain)
            # the signal D samples late: the kept samples, then this block's
            line = jnp.concatenate([delayed, xc])
            n = xc.shape[0]
            return line[:n] * g * makeup, (power_zf, gain_zf, line[n:])

        y, zf = per_channel(mono, x, zi, ((), (), (lookahead,)))
        return output(y, zf, return_zf)
