r"""dasp-pytorch's normalised parameter vectors, by name: one door for every
effect that has a dasp-pytorch 0.0.1 counterpart.

dasp's processors take one vector of normalised parameters in $[0, 1]$
(`modules.X(sample_rate).process_normalized(x, param_tensor)`), in the
order of their `param_ranges` and denormalised linearly over those ranges,
$v = l + p\,(h - l)$. A retrax effect's own normalised vector
(`with_normalised`) is in retrax's order over retrax's ranges, which may
differ (`ParametricEQ`'s is its frequencies, then gains, then Qs). The
functions here read and write dasp's vectors:

- `modules.Gain`: `Gain`; `gain_db` in $[-24, 24]$.
- `modules.Distortion`: `Distortion(antialias=False)`; `gain_db` (the
  drive) in $[0, 24]$.
- `modules.ParametricEQ`: `DaspParametricEQ` (dasp's frequency sampling)
  or `ParametricEQ` (the recursion); per section, low shelf to high shelf,
  its gain, cutoff and Q.
- `modules.Compressor`: `DaspCompressor`; threshold, ratio, attack,
  release, knee, make-up.
- `modules.NoiseShapedReverb`: `NoiseShapedReverb`; 12 band gains, 12 band
  decays, mix.
- `functional.stereo_panner` and `functional.stereo_widener` (no module):
  `DaspStereoPanner` and `DaspStereoWidener`; `pan` and `width` in $[0, 1]$.

dasp's reverb decay $d$ sets the envelope $e^{-(10 d + 1)\, n / (L - 1)}$
of an $L$-sample response, the T60 $3 \ln 10\,(L - 1) / (f_s (10 d + 1))$:
0.93 s to 10.27 s at dasp's default 65,536 samples and 44.1 kHz, all of it
inside `NoiseShapedReverb`'s range.
"""

import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._effect import AbstractRangedEffect, check_normalised
from .._errors import error_if
from .._validate import check_rate
from ..filters import ParametricEQ
from ._dasp_compressor import DaspCompressor
from ._dasp_eq import SECTIONS, DaspParametricEQ, _check_rate, dasp_eq_ranges
from ._dasp_panner import DaspStereoPanner
from ._dasp_widener import DaspStereoWidener
from ._distortion import Distortion
from ._gain import Gain
from ._noise_reverb import N_BANDS, NoiseShapedReverb


_COMPRESSOR = {
    "threshold_db": (-60.0, 0.0),
    "ratio": (1.0, 20.0),
    "attack_ms": (5.0, 100.0),
    "release_ms": (5.0, 100.0),
    "knee_db": (0.0, 12.0),
    "makeup_gain_db": (0.0, 12.0),
}
_REVERB = (
    {f"band{k}_gain": (0.0, 1.0) for k in range(N_BANDS)}
    | {f"band{k}_decay": (0.0, 1.0) for k in range(N_BANDS)}
    | {"mix": (0.0, 1.0)}
)


def _eq_values(v: Array) -> dict[str, Array]:
    """An equaliser's fields from dasp's physical vector (gain, cutoff, Q per
    section)."""
    v = v.reshape(len(SECTIONS), 3)
    return {"gains_db": v[:, 0], "freqs": v[:, 1], "qs": v[:, 2]}


def _eq_vector(effect) -> Array:
    values = effect.checked_values()
    return jnp.stack([values["gains_db"], values["freqs"], values["qs"]], 1).ravel()


def _decay_scale(effect: NoiseShapedReverb) -> float:
    """$3 \\ln 10\\,(L - 1) / f_s$: a dasp decay $d$ is the T60 of this over
    $10 d + 1$."""
    return 3 * math.log(10.0) * (effect.length - 1) / effect.sample_rate


def _reverb_values(effect: NoiseShapedReverb, v: Array) -> dict[str, Array]:
    t60s = _decay_scale(effect) / (10.0 * v[N_BANDS : 2 * N_BANDS] + 1.0)
    return {"band_gains": v[:N_BANDS], "t60s": t60s, "mix": v[-1]}


def _reverb_vector(effect: NoiseShapedReverb) -> Array:
    gains, t60s, mix = (
        jnp.asarray(getattr(effect, n)) for n in ("band_gains", "t60s", "mix")
    )
    decays = (_decay_scale(effect) / t60s - 1.0) / 10.0
    return jnp.concatenate([gains, decays, mix[None]])


# For each effect: dasp's processor, its names and ranges (from the sample
# rate), the fields of a physical vector in dasp's order, and back.
_Door = tuple[
    str,
    Callable[[float], dict[str, tuple[float, float]]],
    Callable[[Any, Array], dict[str, Array]],
    Callable[[Any], Array],
]
_DOORS: dict[type, _Door] = {
    Gain: (
        "modules.Gain",
        lambda fs: {"gain_db": (-24.0, 24.0)},
        lambda e, v: {"gain_db": v[0]},
        lambda e: jnp.reshape(jnp.asarray(e.gain_db), (1,)),
    ),
    Distortion: (
        "modules.Distortion",
        lambda fs: {"gain_db": (0.0, 24.0)},
        lambda e, v: {"drive_db": v[0]},
        lambda e: jnp.reshape(jnp.asarray(e.drive_db), (1,)),
    ),
    DaspCompressor: (
        "modules.Compressor",
        lambda fs: _COMPRESSOR,
        lambda e, v: dict(zip(list(e.ranges()), v, strict=True)),
        lambda e: jnp.stack([jnp.asarray(getattr(e, n)) for n in e.ranges()]),
    ),
    DaspParametricEQ: (
        "modules.ParametricEQ",
        lambda fs: dasp_eq_ranges(_check_rate(fs)),
        lambda e, v: _eq_values(v),
        _eq_vector,
    ),
    ParametricEQ: (
        "modules.ParametricEQ",
        lambda fs: dasp_eq_ranges(_check_rate(fs)),
        lambda e, v: _eq_values(v),
        _eq_vector,
    ),
    NoiseShapedReverb: (
        "modules.NoiseShapedReverb",
        lambda fs: _REVERB,
        _reverb_values,
        _reverb_vector,
    ),
    DaspStereoPanner: (
        "functional.stereo_panner",
        lambda fs: {"pan": (0.0, 1.0)},
        lambda e, v: {"pan": v[0]},
        lambda e: jnp.reshape(jnp.asarray(e.pan), (1,)),
    ),
    DaspStereoWidener: (
        "functional.stereo_widener",
        lambda fs: {"width": (0.0, 1.0)},
        lambda e, v: {"width": v[0]},
        lambda e: jnp.reshape(jnp.asarray(e.width), (1,)),
    ),
}


def _door(effect_type: type) -> _Door:
    if effect_type not in _DOORS:
        known = ", ".join(t.__name__ for t in _DOORS)
        raise TypeError(
            f"{effect_type.__name__} has no dasp-pytorch counterpart; dasp's "
            f"vectors are read by {known}."
        )
    return _DOORS[effect_type]


def _sample_rate(effect: AbstractRangedEffect) -> float:
    return getattr(effect, "sample_rate", 44_100.0)


def dasp_parameters(
    effect_type: type, sample_rate: float | int = 44_100.0
) -> dict[str, tuple[float, float]]:
    """dasp-pytorch's parameter names and ranges for `effect_type` (a retrax
    effect class), in the order of its normalised vector: its processor's
    `param_ranges` at `sample_rate` (the equaliser's top cutoffs depend on
    it).

    **Arguments:**

    - `effect_type`: `Gain`, `Distortion`, `DaspParametricEQ`, `ParametricEQ`,
      `DaspCompressor`, `NoiseShapedReverb`, `DaspStereoPanner` or
      `DaspStereoWidener`.
    - `sample_rate`: $f_s$ in Hz, a positive Python number.

    **Returns:**

    `{name: (low, high)}` in dasp's order.
    """
    return dict(_door(effect_type)[1](check_rate("sample_rate", sample_rate)))


def _expected(effect_type: type, ranges: dict) -> str:
    dasp = _door(effect_type)[0]
    return f"dasp-pytorch's `{dasp}` vector, in its order: {', '.join(ranges)}"


def with_dasp(
    effect: AbstractRangedEffect, p: Shaped[ArrayLike, " params"]
) -> AbstractRangedEffect:
    """`effect` (its structure: sample rate, noise, lengths) with the values
    of dasp-pytorch's normalised vector `p`, as dasp's `process_normalized`
    denormalises it: $v = l + p\\,(h - l)$ over dasp's ranges, in dasp's order
    (see `dasp_parameters`).

    **Arguments:**

    - `effect`: an instance of one of the classes of `dasp_parameters`.
    - `p`: dasp's vector `(P,)`, entries in $[0, 1]$.

    A `p` of another shape raises `ValueError` naming dasp's order (a batch
    `(B, P)` is built with `eqx.filter_vmap`); entries outside $[0, 1]$ raise
    an error (also under `jax.jit`).
    """
    return _with_dasp(effect, p)


def _with_dasp(effect: AbstractRangedEffect, p: Any) -> AbstractRangedEffect:
    """`with_dasp`, for `from_dasp` (whose `p` is checked here, once)."""
    _, ranges, values, _ = _door(type(effect))
    ranges = ranges(_sample_rate(effect))
    if np.shape(p) != (len(ranges),):
        raise ValueError(
            f"`p` must be {_expected(type(effect), ranges)} (shape "
            f"({len(ranges)},)), got shape {np.shape(p)}. Build a batch with "
            "`eqx.filter_vmap`."
        )
    p = check_normalised(p, len(ranges))
    lows = jnp.asarray([lo for lo, _ in ranges.values()], p.dtype)
    highs = jnp.asarray([hi for _, hi in ranges.values()], p.dtype)
    # dasp's `denormalize`: p (max - min) + min
    v = p * (highs - lows) + lows
    return effect.with_values(values(effect, v))


def from_dasp(
    effect_type: type, p: Shaped[ArrayLike, " params"], **options: Any
) -> AbstractRangedEffect:
    """The retrax effect that computes dasp-pytorch's
    `process_normalized(x, p)`: `effect_type(**options)` with the values of
    dasp's normalised vector `p` (see `with_dasp`).

    **Arguments:**

    - `effect_type`: `Gain`, `Distortion` (built with `antialias=False`,
      dasp's plain $\\tanh$, unless `options` say otherwise),
      `DaspParametricEQ` (dasp's frequency sampling; `ParametricEQ` gives
      the same six sections as a streamable recursion, which differs from
      dasp by the folded tail, see `DaspParametricEQ`), `DaspCompressor`,
      `NoiseShapedReverb` (pass `key=` or `white_noise=`; `length` and
      `n_taps` default to dasp's 65,536 and 1,023), `DaspStereoPanner` or
      `DaspStereoWidener`.
    - `p`: dasp's vector `(P,)`, entries in $[0, 1]$, in dasp's order.
    - `options`: the constructor's structural arguments (`sample_rate`,
      ...).

    **Returns:**

    The effect; call it on `(time,)` or `(channels, time)`. Works under
    `jax.jit` and `eqx.filter_vmap` (a batch `(B, P)` gives a batch of
    effects).
    """
    _door(effect_type)
    if effect_type is Distortion:
        options = {"antialias": False} | options
    if effect_type is ParametricEQ:
        rate = options.get("sample_rate", 44_100.0)
        options = {"freqs": [1000.0] * 6, "sample_rate": rate} | options
    return _with_dasp(effect_type(**options), p)


def to_dasp(effect: AbstractRangedEffect) -> Float[Array, " params"]:
    """dasp-pytorch's normalised vector `(P,)` of `effect`, in dasp's order
    (the inverse of `with_dasp`). A value outside dasp's range raises an
    error naming dasp's parameter (also under `jax.jit`).

    **Arguments:**

    - `effect`: an instance of one of the classes of `dasp_parameters`.
    """
    _, ranges, _, vector = _door(type(effect))
    ranges = ranges(_sample_rate(effect))
    v = vector(effect)
    lows = jnp.asarray([lo for lo, _ in ranges.values()], v.dtype)
    highs = jnp.asarray([hi for _, hi in ranges.values()], v.dtype)
    p = (v - lows) / (highs - lows)
    # rounding only: a value at an end of its range maps onto 0 or 1
    tol = 16 * jnp.finfo(v.dtype).eps
    for k, (name, (lo, hi)) in enumerate(ranges.items()):
        p = error_if(
            p,
            ~((p[k] >= -tol) & (p[k] <= 1 + tol)),
            f"`{name}` lies outside dasp-pytorch's range [{lo}, {hi}]: this "
            f"{type(effect).__name__} has no dasp vector.",
        )
    return jnp.clip(p, 0.0, 1.0)
