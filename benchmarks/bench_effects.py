"""Benchmark retrax's effects and losses against dasp-pytorch, faustax and
auraloss.

Forward, and forward plus the gradient of `sum(y * w)` (a fixed random `w`)
with respect to the signal and every parameter, for one second of audio at
44.1 kHz per signal (float32), B = 1 and B = 8 signals with their own
parameters: retrax's effect modules (`jax.vmap` over a batch of modules at
B = 8), dasp-pytorch's functional processors (batched `(B, channels, T)`
tensors and `(B,)` parameters) and faustax's processors
(`process_normalized`, gradient with respect to the parameter matrix), all
in one process, interleaved (see `_harness.py`). `DaspCompressor` (dasp's
definition) runs against dasp's `compressor` over dasp's parameter ranges, and
retrax's own `Compressor` against it where the two definitions agree (instant
ballistics, below).

The losses (ESR, SI-SDR, mel STFT, sum-and-difference STFT) run on stereo
`(B, 2, T)` predictions and targets of one second, forward (the loss) and
forward plus the gradient with respect to the prediction, against auraloss's
classes of the same settings, in the same interleaved run: retrax under
`jax.jit` ("fwd", "grad") and called eagerly ("eager fwd", "eager grad": the
loss module called on arrays, and `jax.grad` of that call), auraloss eagerly
in both (torch's only way).

A peer's time counts only after its output matched retrax's on the same
inputs and parameters; each case states its tolerance and why, and a peer
that computes something else is marked "differs" with the reason. retrax is
configured to compute what the peer computes (mapping the peer's parameter
conventions onto retrax's): see `EFFECTS` below. Peers are optional: a
missing one is skipped with a note.

Run from the repository root:
`PYTHONPATH=src python benchmarks/bench_effects.py [--repeats 5] [--number 20]
[--markdown PATH]` (with the peers: a python that has retrax, jax and the
peers torch, dasp-pytorch, auraloss, faustax).
"""

import argparse
import copy
import dataclasses
import math
import os
import platform
import sys
import time
from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, optional_import, pin_cpus, run_table  # noqa: E402

from retrax import (
    effects as fx,  # noqa: E402
    losses as rl,  # noqa: E402
)
from retrax.filters import Compressor, ParametricEQ  # noqa: E402


SR = 44_100
# The compressor's knee: today's retrax Compressor has a hard knee. dasp
# divides by the knee width (NaN gradients at 0), so it gets the narrowest
# knee that keeps its gradient finite; its curve is then within
# (1 - 1/ratio) * knee / 8 dB (1e-4 dB) of the hard knee.
KNEE_DB = 0.0
DASP_KNEE_DB = 1e-3
# Attack and release this short make every one-pole coefficient 1 in float32
# (1 - exp(-2200 / (ms * fs)) with ms * fs = 0.044 samples): the ballistics
# pass the static curve through. Only then do retrax's compressor (switched
# attack/release ballistics of the linear gain) and dasp's (one attack-only
# one-pole on the dB gain) compute the same thing; the cost of either does not
# depend on these values.
INSTANT_MS = 1e-3


@dataclasses.dataclass
class Sizes:
    length: int = SR
    reverb_length: int = 65_536
    reverb_taps: int = 1_023
    loss_length: int = SR


def signals(batch: int, channels: int, length: int, seed: int = 0) -> np.ndarray:
    """`(batch, channels, length)` float32: harmonic tones (8 partials, 80 to
    220 Hz fundamentals) under a slow envelope, with a little noise (never
    exactly zero, peaks about 0.8)."""
    rng = np.random.default_rng(seed)
    t = np.arange(length) / SR
    shape = (batch, channels, 1)
    f0 = rng.uniform(80, 220, shape)
    tone = sum(
        np.sin(2 * np.pi * k * f0 * t + rng.uniform(0, 2 * np.pi, shape)) / k
        for k in range(1, 9)
    )
    envelope = 0.1 + 0.9 * np.abs(np.sin(2 * np.pi * rng.uniform(1, 3, shape) * t))
    x = 0.3 * envelope * tone + 1e-3 * rng.standard_normal((batch, channels, length))
    return x.astype(np.float32)


# --- the effects: parameters in the peers' conventions, and retrax's equal ---


def _uniform(rng, low, high, batch):
    return rng.uniform(low, high, batch)


def gain_params(rng, batch):
    return {"gain_db": _uniform(rng, -12, 12, batch)}


def distortion_params(rng, batch):
    return {"drive_db": _uniform(rng, 6, 18, batch)}


EQ_SECTIONS = (
    # (dasp name, centre Hz): increasing (retrax's ParametricEQ takes any order)
    # and inside faustax's slider ranges after a +-10% jitter
    ("low_shelf", 150.0),
    ("band0", 600.0),
    ("band1", 3000.0),
    ("band2", 9000.0),
    ("band3", 14000.0),
    ("high_shelf", 18000.0),
)


def eq_params(rng, batch):
    p = {}
    for name, centre in EQ_SECTIONS:
        p[f"{name}_cutoff_freq"] = centre * rng.uniform(0.9, 1.1, batch)
        p[f"{name}_gain_db"] = rng.uniform(-12, 12, batch)
        p[f"{name}_q_factor"] = rng.uniform(0.5, 2.0, batch)
    return p


def compressor_params(rng, batch):
    return {
        "threshold_db": _uniform(rng, -30, -15, batch),
        "ratio": _uniform(rng, 2, 8, batch),
        "attack_ms": np.full(batch, INSTANT_MS),
        "release_ms": np.full(batch, INSTANT_MS),
        "knee_db": np.full(batch, DASP_KNEE_DB),
        "makeup_gain_db": _uniform(rng, 0, 6, batch),
    }


def dasp_compressor_params(rng, batch):
    """dasp's own settings, over most of its ranges (a threshold the signal
    reaches): the compressor as dasp defines it, see `fx.DaspCompressor`."""
    return {
        "threshold_db": _uniform(rng, -40, -10, batch),
        "ratio": _uniform(rng, 1, 20, batch),
        "attack_ms": _uniform(rng, 5, 100, batch),
        "release_ms": _uniform(rng, 5, 100, batch),
        "knee_db": _uniform(rng, 0, 12, batch),
        "makeup_gain_db": _uniform(rng, 0, 12, batch),
    }


def reverb_params(rng, batch):
    p = {f"band{i}_gain": _uniform(rng, 0.3, 1.0, batch) for i in range(12)}
    p |= {f"band{i}_decay": _uniform(rng, 0.1, 0.9, batch) for i in range(12)}
    p["mix"] = _uniform(rng, 0.2, 0.5, batch)
    return p


def panner_params(rng, batch):
    return {"pan": _uniform(rng, 0.15, 0.85, batch)}


def widener_params(rng, batch):
    return {"width": _uniform(rng, 0.3, 0.6, batch)}


def retrax_gain(p, sizes, noise):
    return fx.Gain(p["gain_db"])


def retrax_distortion(p, sizes, noise):
    return fx.Distortion(p["drive_db"], antialias=False)


def retrax_adaa_distortion(p, sizes, noise):
    return fx.Distortion(p["drive_db"])


def retrax_eq(p, sizes, noise):
    return ParametricEQ(
        [p[f"{n}_cutoff_freq"] for n, _ in EQ_SECTIONS],
        [p[f"{n}_gain_db"] for n, _ in EQ_SECTIONS],
        [p[f"{n}_q_factor"] for n, _ in EQ_SECTIONS],
        sample_rate=SR,
    )


def retrax_compressor(p, sizes, noise):
    return Compressor(
        threshold_db=p["threshold_db"],
        ratio=p["ratio"],
        attack_ms=p["attack_ms"],
        release_ms=p["release_ms"],
        makeup_db=p["makeup_gain_db"],
        rms_ms=INSTANT_MS,  # the detector's level is |x|, dasp's peak level
        # knee_db=KNEE_DB,  (once Compressor has a knee)
        sample_rate=SR,
    )


def retrax_dasp_compressor(p, sizes, noise):
    # dasp's `makeup_gain_db` is retrax's `makeup_db`
    p = {("makeup_db" if k == "makeup_gain_db" else k): v for k, v in p.items()}
    return fx.DaspCompressor(**p, sample_rate=SR)


def reverb_t60(decay: float, length: int) -> float:
    """dasp's decay parameter `d` as a T60: its envelope is
    `exp(-(10 d + 1) n / (length - 1))`."""
    return 3 * math.log(10) * (length - 1) / (SR * (10 * decay + 1))


def retrax_reverb(p, sizes, noise):
    return fx.NoiseShapedReverb(
        [p[f"band{i}_gain"] for i in range(12)],
        [reverb_t60(p[f"band{i}_decay"], sizes.reverb_length) for i in range(12)],
        p["mix"],
        white_noise=noise,
        length=sizes.reverb_length,
        n_taps=sizes.reverb_taps,
        sample_rate=SR,
    )


def retrax_panner(p, sizes, noise):
    # dasp's and faustax's pan law: left sqrt((1 - p) cos(p pi/2)), right
    # sqrt(p sin(p pi/2)); as a constant-power pan by the angle of
    # (left, right) and a gain of their norm.
    theta = p["pan"] * math.pi / 2
    left = math.sqrt((1 - p["pan"]) * math.cos(theta))
    right = math.sqrt(p["pan"] * math.sin(theta))
    angle = math.atan2(right, left)
    return fx.Chain(
        [
            fx.StereoPanner(4 * angle / math.pi - 1),
            fx.Gain(20 * math.log10(math.hypot(left, right))),
        ]
    )


def retrax_widener(p, sizes, noise):
    # dasp's and faustax's widener: 2 (1 - w) mid + 2 w side, i.e. retrax's
    # mid + (w / (1 - w)) side times 2 (1 - w)
    w = p["width"]
    return fx.Chain(
        [fx.StereoWidener(w / (1 - w)), fx.Gain(20 * math.log10(2 * (1 - w)))]
    )


def np_sos(p: dict) -> np.ndarray:
    """The equaliser's sections from the RBJ cookbook in float64 (numpy),
    low shelf, peaks, high shelf."""
    rows = []
    for name, _ in EQ_SECTIONS:
        f, g, q = (p[f"{name}_{k}"] for k in ("cutoff_freq", "gain_db", "q_factor"))
        A, w0 = 10 ** (g / 40), 2 * np.pi * f / SR
        cos, alpha = np.cos(w0), np.sin(w0) / (2 * q)
        if name.startswith("band"):
            b = [1 + alpha * A, -2 * cos, 1 - alpha * A]
            a = [1 + alpha / A, -2 * cos, 1 - alpha / A]
        else:
            s = 1 if name == "low_shelf" else -1
            root = 2 * np.sqrt(A) * alpha
            b = [
                A * ((A + 1) - s * (A - 1) * cos + root),
                A * s * 2 * ((A - 1) - s * (A + 1) * cos),
                A * ((A + 1) - s * (A - 1) * cos - root),
            ]
            a = [
                (A + 1) + s * (A - 1) * cos + root,
                -s * 2 * ((A - 1) + s * (A + 1) * cos),
                (A + 1) + s * (A - 1) * cos - root,
            ]
        rows.append(np.concatenate([b, a]) / a[0])
    return np.stack(rows)


def float64_reference(setup) -> np.ndarray | None:
    """The effect in float64 where the check quotes it (the equaliser, by
    `scipy.signal.sosfilt`), else None."""
    if setup.effect.name != "parametric EQ":
        return None
    import scipy.signal

    x = setup.x.astype(np.float64)
    ys = [scipy.signal.sosfilt(np_sos(p), x[i, 0]) for i, p in enumerate(setup.params)]
    return np.stack(ys)[:, None]


@dataclasses.dataclass
class Effect:
    name: str
    channels_in: int
    channels_out: int
    params: Callable
    retrax: Callable
    dasp: str | None  # the name in dasp_pytorch.functional
    faustax: str | None  # the processor's name in faustax
    # per peer: (relative tolerance, why) or a reason the outputs differ
    tolerance: dict
    differs: dict = dataclasses.field(default_factory=dict)
    noise: bool = False


ROUNDING = (2e-6, "float32 rounding of the same arithmetic (a few ulps)")
EQ_ROUNDING = (
    1e-3,
    "float32 rounding of the sections' coefficients, which moves the 150 Hz "
    "shelf's poles near z = 1 (dasp filters by frequency sampling, its "
    "2^17-point FFT equal to the IIR but for the response's tail beyond 1 s, "
    "below 1e-12 here; faustax runs per-sample biquads)",
)
FFT_CONV = (
    1e-4,
    "a 65,536-tap convolution in float32 (dasp: direct, faustax and retrax: "
    "by FFT); rounding grows with the length",
)

EFFECTS = [
    Effect("gain", 1, 1, gain_params, retrax_gain, "gain", "Gain", {}),
    Effect(
        "distortion",
        1,
        1,
        distortion_params,
        retrax_distortion,
        "distortion",
        "Distortion",
        {},
    ),
    Effect(
        "distortion (antialiased)",
        1,
        1,
        distortion_params,
        retrax_adaa_distortion,
        "distortion",
        "Distortion",
        {},
        differs={
            "*": "retrax's Distortion is antialiased (first-order ADAA: the mean "
            "of tanh over each sample step), the peers' is plain tanh(G x); "
            "checked within ADAA's bound |G dx| / 2 per sample"
        },
    ),
    Effect(
        "parametric EQ", 1, 1, eq_params, retrax_eq, "parametric_eq", "ParametricEQ", {}
    ),
    Effect(
        "compressor",
        1,
        1,
        compressor_params,
        retrax_compressor,
        "compressor",
        "Compressor",
        {},
        differs={
            "faustax": "faustax smooths the dB gain with switched ballistics "
            "whose times cannot go below 0.1 ms attack and 5 ms release (its "
            "sliders), so it cannot be made instantaneous; timed at those "
            "times"
        },
    ),
    Effect(
        "dasp compressor",
        1,
        1,
        dasp_compressor_params,
        retrax_dasp_compressor,
        "compressor",
        None,
        {},
    ),
    Effect(
        "noise-shaped reverb",
        1,
        2,
        reverb_params,
        retrax_reverb,
        "noise_shaped_reverberation",
        "NoiseShapedReverb",
        {},
        noise=True,
    ),
    Effect(
        "panner",
        1,
        2,
        panner_params,
        retrax_panner,
        "stereo_panner",
        "StereoPanner",
        {},
    ),
    Effect(
        "widener",
        2,
        2,
        widener_params,
        retrax_widener,
        "stereo_widener",
        "StereoWidener",
        {},
    ),
]
TOLERANCES = {
    "gain": {"dasp": ROUNDING, "faustax": ROUNDING},
    "distortion": {"dasp": ROUNDING, "faustax": ROUNDING},
    "parametric EQ": {"dasp": EQ_ROUNDING, "faustax": EQ_ROUNDING},
    "compressor": {
        "dasp": (
            5e-5,
            "float32 rounding, and dasp's 1e-3 dB knee (within 1e-4 dB of the "
            "hard knee)",
        )
    },
    "dasp compressor": {
        "dasp": (
            5e-5,
            "dasp's own float32 rounding: its float32 FFT of the one-pole's "
            "denominator is 1e-5 to 2e-5 of max |y| off its float64 values, "
            "which retrax's float32 matches to 1e-5",
        )
    },
    "noise-shaped reverb": {"dasp": FFT_CONV, "faustax": FFT_CONV},
    "panner": {"dasp": ROUNDING, "faustax": ROUNDING},
    "widener": {"dasp": ROUNDING, "faustax": ROUNDING},
}
for _effect in EFFECTS:
    _effect.tolerance = TOLERANCES.get(_effect.name, {})


# --- one library's callables ---------------------------------------------------


def trainable(module):
    """The filter of the leaves to differentiate: every float array but a
    reverb's fixed noise."""
    spec = jax.tree.map(eqx.is_inexact_array, module)
    if isinstance(module, fx.NoiseShapedReverb):
        spec = eqx.tree_at(lambda m: m.noise, spec, False)
    return spec


def stack(modules):
    return jax.tree.map(lambda *v: jnp.stack(v), *modules)


class Setup:
    """Inputs, parameters and weights of one effect at one batch size, shared
    by every library (the reverb's white noise too)."""

    def __init__(self, effect: Effect, batch: int, sizes: Sizes, torch=None):
        self.effect, self.batch, self.sizes = effect, batch, sizes
        self.x = signals(batch, effect.channels_in, sizes.length)
        rng = np.random.default_rng(1)
        columns = effect.params(rng, batch)
        self.params = [
            {k: float(v[i]) for k, v in columns.items()} for i in range(batch)
        ]
        self.columns = {k: np.asarray(v, np.float32) for k, v in columns.items()}
        shape = (batch, effect.channels_out, sizes.length)
        self.w = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
        self.noise = None
        if effect.noise:
            taps = sizes.reverb_taps
            shape = (batch * 2, 12, sizes.reverb_length + taps - 1)
            if torch is not None:
                # the draw dasp makes first in its call, after the same seed
                torch.manual_seed(0)
                self.noise = torch.randn(*shape).numpy()
            else:
                self.noise = np.random.default_rng(3).standard_normal(shape)
                self.noise = self.noise.astype(np.float32)
        self.modules = [
            effect.retrax(
                p,
                sizes,
                None if self.noise is None else self.noise[2 * i : 2 * i + 2],
            )
            for i, p in enumerate(self.params)
        ]


def retrax_case(setup: Setup, mode: str, per_call_noise: bool = False):
    """The retrax callable (and, for the check, its output `(B, C, T)`)."""
    effect = setup.effect
    if per_call_noise:
        # draws and filters the reverb's noise inside the call, as dasp does
        key = jax.random.key(0)

        def build(p, key):
            sizes = setup.sizes
            return fx.NoiseShapedReverb(
                p.band_gains,
                p.t60s,
                p.mix,
                key=key,
                length=sizes.reverb_length,
                n_taps=sizes.reverb_taps,
                sample_rate=SR,
            )

    batched = setup.batch > 1
    module = stack(setup.modules) if batched else setup.modules[0]
    x = jnp.asarray(setup.x if batched else setup.x[0])
    if effect.channels_in == 1:
        x = x[..., 0, :]
    w = jnp.asarray(setup.w if batched else setup.w[0])
    if effect.channels_out == 1:
        w = w[..., 0, :]
    params, static = eqx.partition(module, trainable(module))

    def apply(params, x):
        m = eqx.combine(params, static)
        if per_call_noise:
            keys = jax.random.split(key, setup.batch) if batched else key
            run = lambda m, x, k: build(m, k)(x)  # noqa: E731
            if batched:
                return eqx.filter_vmap(run)(m, x, keys)
            return run(m, x, keys)
        if batched:
            return eqx.filter_vmap(lambda m, x: m(x))(m, x)
        return m(x)

    if mode == "fwd":
        f = jax.jit(apply)
        return lambda: jax.block_until_ready(f(params, x))

    def loss(params, x):
        return jnp.sum(apply(params, x) * w)

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return lambda: jax.block_until_ready(g(params, x))


def retrax_output(setup: Setup) -> np.ndarray:
    effect = setup.effect
    x = jnp.asarray(setup.x)
    if effect.channels_in == 1:
        x = x[:, 0]
    y = eqx.filter_jit(eqx.filter_vmap(lambda m, x: m(x)))(stack(setup.modules), x)
    y = np.asarray(y)
    return y[:, None] if effect.channels_out == 1 else y


def dasp_call(dasp, torch, setup: Setup, x, params):
    effect = setup.effect
    f = getattr(dasp.functional, effect.dasp)
    if effect.name == "widener":
        # its width multiplies (B, T) tensors: it must be (B, 1)
        params = {k: v.view(-1, 1) for k, v in params.items()}
    if effect.noise:
        sizes = setup.sizes
        params = params | {
            "num_samples": sizes.reverb_length,
            "num_bandpass_taps": sizes.reverb_taps,
        }
    y = f(x, SR, **params)
    if effect.name == "panner":
        y = y[:, :, 0]  # (B, 2, tracks=1, T)
    return y


def dasp_case(dasp, torch, setup: Setup, mode: str):
    x = torch.from_numpy(setup.x)
    params = {k: torch.from_numpy(v) for k, v in setup.columns.items()}
    if mode == "fwd":

        def run():
            with torch.no_grad():
                return dasp_call(dasp, torch, setup, x, params)

        return run
    w = torch.from_numpy(setup.w)
    leaves = [x.clone().requires_grad_(True)] + [
        v.clone().requires_grad_(True) for v in params.values()
    ]
    names = list(params)

    def run():
        for v in leaves:
            v.grad = None
        p = dict(zip(names, leaves[1:], strict=True))
        (dasp_call(dasp, torch, setup, leaves[0], p) * w).sum().backward()

    return run


def dasp_output(dasp, torch, setup: Setup) -> np.ndarray:
    x = torch.from_numpy(setup.x)
    params = {k: torch.from_numpy(v) for k, v in setup.columns.items()}
    torch.manual_seed(0)  # the noise of Setup, for the reverb
    with torch.no_grad():
        return dasp_call(dasp, torch, setup, x, params).numpy()


def faustax_processor(faustax, setup: Setup):
    name = setup.effect.faustax
    if name == "NoiseShapedReverb":
        sizes = setup.sizes
        return faustax.NoiseShapedReverb(
            SR, num_samples=sizes.reverb_length, num_bandpass_taps=sizes.reverb_taps
        )
    return getattr(faustax, name)(SR)


def faustax_matrix(proc, setup: Setup):
    """The `(B, P)` normalised matrix of the setup's parameters; the
    compressor's times are clipped to its sliders' ranges."""
    cols = []
    for i, name in enumerate(proc.param_names):
        low, high = proc.param_ranges[name]
        value = jnp.asarray(np.clip(setup.columns[name], low, high))
        if hasattr(proc, "_scale_modes"):
            value = proc.module.normalize_value(value, low, high, proc._scale_modes[i])
        cols.append(value)
    return jnp.stack(cols, axis=1).astype(jnp.float32)


def faustax_rng(setup: Setup):
    """The key whose noise draw is the setup's, for the reverb (faustax draws
    `normal(rng, (2 B, 12, L + taps - 1))` in its call)."""
    return jax.random.key(0)


def faustax_case(faustax, setup: Setup, mode: str):
    proc = faustax_processor(faustax, setup)
    matrix = faustax_matrix(proc, setup)
    x = jnp.asarray(setup.x)
    rng = faustax_rng(setup)
    impl = proc._process_normalized_impl
    if mode == "fwd":
        f = jax.jit(impl)
        return lambda: jax.block_until_ready(f(x, matrix, rng))
    w = jnp.asarray(setup.w)

    def loss(matrix, x):
        return jnp.sum(impl(x, matrix, rng) * w)

    g = jax.jit(jax.grad(loss, argnums=(0, 1)))
    return lambda: jax.block_until_ready(g(matrix, x))


def faustax_output(faustax, setup: Setup) -> np.ndarray:
    proc = faustax_processor(faustax, setup)
    y = jax.jit(proc._process_normalized_impl)(
        jnp.asarray(setup.x), faustax_matrix(proc, setup), faustax_rng(setup)
    )
    return np.asarray(y)


# --- the losses: retrax's against auraloss's, on the same signals ---------------


@dataclasses.dataclass
class Loss:
    name: str
    retrax: Callable  # () -> a retrax.losses module
    auraloss: Callable  # (auraloss) -> the auraloss module of the same settings
    # relative tolerance of the loss's value, and why
    tolerance: tuple[float, str]


LOSS_ROUNDING = (
    1e-5,
    "float32 rounding of the same sums over every sample or STFT bin",
)
RESOLUTIONS = ([1024, 2048, 512], [120, 240, 50], [600, 1200, 240])
LOSSES = [
    Loss("ESR loss", lambda: rl.ESRLoss(), lambda a: a.time.ESRLoss(), LOSS_ROUNDING),
    Loss(
        "SI-SDR loss",
        lambda: rl.SISDRLoss(),
        lambda a: a.time.SISDRLoss(),
        LOSS_ROUNDING,
    ),
    Loss(
        "mel STFT loss",
        lambda: rl.MelSTFTLoss(SR, n_mels=128),
        lambda a: a.freq.MelSTFTLoss(SR, n_mels=128),
        LOSS_ROUNDING,
    ),
    Loss(
        "sum and difference STFT loss",
        lambda: rl.SumAndDifferenceSTFTLoss(*RESOLUTIONS),
        lambda a: a.freq.SumAndDifferenceSTFTLoss(*RESOLUTIONS),
        LOSS_ROUNDING,
    ),
]


class LossSetup:
    """Stereo `(B, 2, T)` predictions and targets of one loss at one batch
    size, shared by both libraries: the target is the prediction with noise,
    scaled by 0.8."""

    def __init__(self, loss: Loss, batch: int, sizes: Sizes):
        self.loss, self.batch, self.sizes = loss, batch, sizes
        self.pred = signals(batch, 2, sizes.loss_length, seed=4)
        noise = np.random.default_rng(5).standard_normal(self.pred.shape)
        self.target = (0.8 * (self.pred + 0.1 * noise)).astype(np.float32)


def retrax_loss_case(setup: LossSetup, mode: str):
    loss = setup.loss.retrax()
    pred, target = jnp.asarray(setup.pred), jnp.asarray(setup.target)
    # eager: the loss called as it is, on arrays (retrax compiles the
    # time-domain losses as a whole; its gradient eagerly is `jax.grad`'s
    # transformation of that call)
    if mode == "eager fwd":
        return lambda: jax.block_until_ready(loss(pred, target))
    if mode == "eager grad":
        grad = jax.grad(lambda p: loss(p, target))
        return lambda: jax.block_until_ready(grad(pred))
    # the loss's settings are constants of the compiled call, as inside a
    # training step (eqx.filter_jit's flattening of the module per call would
    # cost more than these losses at B = 1)
    if mode == "fwd":
        f = jax.jit(lambda p, t: loss(p, t))
        return lambda: jax.block_until_ready(f(pred, target))
    g = jax.jit(jax.grad(lambda p, t: loss(p, t)))
    return lambda: jax.block_until_ready(g(pred, target))


def retrax_loss_output(setup: LossSetup) -> float:
    loss = setup.loss.retrax()
    f = jax.jit(lambda p, t: loss(p, t))
    return float(f(jnp.asarray(setup.pred), jnp.asarray(setup.target)))


def auraloss_loss_case(auraloss, torch, setup: LossSetup, mode: str):
    loss = setup.loss.auraloss(auraloss)
    pred, target = torch.from_numpy(setup.pred), torch.from_numpy(setup.target)
    # torch is eager: its eager rows are its only rows
    mode = mode.removeprefix("eager ")
    if mode == "fwd":

        def run():
            with torch.no_grad():
                return loss(pred, target)

        return run
    leaf = pred.clone().requires_grad_(True)

    def run():
        leaf.grad = None
        loss(leaf, target).backward()

    return run


def auraloss_loss_output(auraloss, torch, setup: LossSetup) -> float:
    loss = setup.loss.auraloss(auraloss)
    with torch.no_grad():
        return float(loss(torch.from_numpy(setup.pred), torch.from_numpy(setup.target)))


def check_loss(loss: Loss, value_peer: float, value: float) -> tuple[bool, str]:
    """Whether auraloss's value matched retrax's, and a note saying how."""
    err = abs(value_peer - value) / max(abs(value), 1e-30)
    tol, why = loss.tolerance
    ok = err <= tol
    verdict = "matched" if ok else "DID NOT MATCH"
    return ok, (
        f"{verdict}: loss {value:.6g}, relative difference {err:.1e} "
        f"(tolerance {tol:g}: {why})"
    )


# --- checks --------------------------------------------------------------------


def check(
    effect: Effect, peer: str, setup: Setup, y_peer, y_retrax
) -> tuple[bool, str]:
    """Whether the peer's output matched retrax's, and a note saying how."""
    if y_peer.shape != y_retrax.shape:
        return False, f"output shape {y_peer.shape}, retrax {y_retrax.shape}"
    scale = float(np.max(np.abs(y_retrax)))
    err = float(np.max(np.abs(y_peer - y_retrax)))
    reason = effect.differs.get(peer, effect.differs.get("*"))
    if effect.name == "distortion (antialiased)":
        drive = 10 ** (setup.columns["drive_db"][:, None, None] / 20)
        x = setup.x.astype(np.float64)
        step = np.abs(np.diff(x, axis=-1, prepend=0.0)) * drive
        excess = float(np.max(np.abs(y_peer - y_retrax) - step / 2))
        within = excess <= 1e-5
        return False, (
            f"differs: {reason}; max |difference| {err:.2e}, "
            f"{'within' if within else 'NOT within'} the bound"
        )
    if reason is not None:
        return False, f"differs: {reason}; max relative difference {err / scale:.2e}"
    tol, why = effect.tolerance[peer]
    ok = err <= tol * scale
    verdict = "matched" if ok else "DID NOT MATCH"
    exact = float64_reference(setup)
    if exact is not None:
        s64 = np.max(np.abs(exact))
        why += (
            f"; against float64 (scipy.signal.sosfilt): retrax "
            f"{np.max(np.abs(y_retrax - exact)) / s64:.1e}, {peer} "
            f"{np.max(np.abs(y_peer - exact)) / s64:.1e}"
        )
    return (
        ok,
        f"{verdict}: max |difference| {err / scale:.1e} of max |y| "
        f"(tolerance {tol:g}: {why})",
    )


# --- the run -----------------------------------------------------------------------


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument(
        "--budget", type=float, default=1.0, help="seconds per median, at most"
    )
    # one torch thread: with two, its pool and XLA's collide on two shared cores
    # (dasp's widener B=1 took 75 ms instead of 0.12 ms in one measurement)
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--no-peers", action="store_true")
    parser.add_argument(
        "--smoke", action="store_true", help="tiny sizes, B = 1 and 2, one repeat"
    )
    parser.add_argument("--effects", default=None, help="comma-separated names")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    parser.add_argument(
        "--check-only", action="store_true", help="compare the outputs, time nothing"
    )
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin the process to (e.g. 1): on a 2-core "
        "machine, XLA's programs and torch then run on the same core",
    )
    args = parser.parse_args(argv)
    affinity = pin_cpus(args.cpus)

    sizes = Sizes()
    batches = (1, 8)
    if args.smoke:
        # the losses' signals are longer than the 2,048-sample FFT (reflected
        # by 1,024 samples at each end)
        sizes = Sizes(length=512, reverb_length=4096, reverb_taps=31, loss_length=4096)
        batches = (1, 2)
        args.repeats, args.number = 1, 2
    effects = EFFECTS
    if args.effects:
        wanted = args.effects.split(",")
        effects = [e for e in EFFECTS if e.name in wanted]
    losses = LOSSES
    if args.effects:
        losses = [loss for loss in LOSSES if loss.name in wanted]

    notes = []
    torch = dasp = faustax = auraloss = None
    if not args.no_peers:
        torch = optional_import("torch", notes)
        dasp = optional_import("dasp_pytorch", notes) if torch else None
        faustax = optional_import("faustax", notes)
        auraloss = optional_import("auraloss", notes) if torch else None
        if torch is not None:
            torch.set_num_threads(args.torch_threads)
    if dasp is None and auraloss is None:
        torch = None

    setups, checks = {}, {}
    for effect in effects:
        for b in batches:
            setup = Setup(effect, b, sizes, torch if dasp is not None else None)
            setups[effect.name, b] = setup
            y = retrax_output(setup)
            peers = {}
            if dasp is not None and effect.dasp:
                peers["dasp"] = lambda s=setup: dasp_output(dasp, torch, s)
            if faustax is not None and effect.faustax:
                if effect.noise:
                    # faustax draws its own noise: give retrax the same draw
                    taps = sizes.reverb_taps
                    shape = (2 * b, 12, sizes.reverb_length + taps - 1)
                    noise = np.asarray(jax.random.normal(faustax_rng(setup), shape))
                    twin = copy.copy(setup)
                    twin.modules = [
                        effect.retrax(p, sizes, noise[2 * i : 2 * i + 2])
                        for i, p in enumerate(setup.params)
                    ]
                    y_f = retrax_output(twin)
                else:
                    y_f = y
                peers["faustax"] = lambda s=setup, y_f=y_f: (
                    faustax_output(faustax, s),
                    y_f,
                )
            for peer, out in peers.items():
                result = out()
                y_peer, y_ref = result if isinstance(result, tuple) else (result, y)
                checks[effect.name, b, peer] = check(effect, peer, setup, y_peer, y_ref)
    for loss in losses:
        for b in batches:
            setup = LossSetup(loss, b, sizes)
            setups[loss.name, b] = setup
            if auraloss is not None:
                checks[loss.name, b, "auraloss"] = check_loss(
                    loss,
                    auraloss_loss_output(auraloss, torch, setup),
                    retrax_loss_output(setup),
                )

    if args.check_only:
        for (name, b, peer), (_, note) in checks.items():
            print(f"- {name}, B={b}, {peer}: {note}")
        return None, checks

    cases = []
    for effect in effects:
        for b in batches:
            for mode in ("fwd", "grad"):
                cases.append(
                    Case(
                        f"{effect.name} B={b} {mode}",
                        {"e": effect, "B": b, "mode": mode},
                    )
                )
                if effect.noise:
                    cases.append(
                        Case(
                            f"{effect.name} (retrax draws the noise per call) "
                            f"B={b} {mode}",
                            {"e": effect, "B": b, "mode": mode, "per_call": True},
                        )
                    )

    for loss in losses:
        for b in batches:
            for mode in ("fwd", "grad", "eager fwd", "eager grad"):
                cases.append(
                    Case(f"{loss.name} B={b} {mode}", {"l": loss, "B": b, "mode": mode})
                )

    def setup_of(case):
        item = case.params.get("e", case.params.get("l"))
        return setups[item.name, case.params["B"]]

    def counted(case, peer):
        item = case.params.get("e", case.params.get("l"))
        return checks.get((item.name, case.params["B"], peer), (False,))[0]

    def retrax_lib(case):
        if "l" in case.params:
            return retrax_loss_case(setup_of(case), case.params["mode"])
        return retrax_case(
            setup_of(case), case.params["mode"], case.params.get("per_call", False)
        )

    def effect_peer(make):
        """A peer of the effects only: no callable for a loss or for the
        reverb drawing its noise per call."""
        return lambda c: (
            None if "l" in c.params or c.params.get("per_call") else make(c)
        )

    libraries = {"retrax": retrax_lib}
    if dasp is not None:
        libraries["dasp"] = effect_peer(
            lambda c: (
                dasp_case(dasp, torch, setup_of(c), c.params["mode"])
                if c.params["e"].dasp
                else None
            )
        )
    if faustax is not None:
        libraries["faustax"] = effect_peer(
            lambda c: (
                faustax_case(faustax, setup_of(c), c.params["mode"])
                if c.params["e"].faustax
                else None
            )
        )
    if auraloss is not None:
        libraries["auraloss"] = lambda c: (
            auraloss_loss_case(auraloss, torch, setup_of(c), c.params["mode"])
            if "l" in c.params
            else None
        )

    header = (
        f"jax {jax.__version__}, {os.cpu_count()} CPU cores ({affinity}), float32, "
        "T = "
        f"{sizes.length} ({sizes.length / SR:.3g} s at 44.1 kHz), median ms over "
        f"{args.repeats} interleaved repeats of up to {args.number} calls"
    )
    if torch is not None:
        header += f"; torch {torch.__version__} ({args.torch_threads} threads)"
    print(header, file=sys.stderr)
    start = time.perf_counter()
    rows = run_table(
        cases,
        libraries,
        repeats=args.repeats,
        number=args.number,
        budget_s=args.budget,
        warmup=1,
    )
    elapsed = time.perf_counter() - start
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    lines = table(rows, cases, list(libraries), counted)
    lines += [
        "",
        "Checks (each peer's output against retrax's, same inputs and parameters):",
        "",
    ]
    for (name, b, peer), (_, note) in checks.items():
        lines.append(f"- {name}, B={b}, {peer}: {note}")
    lines.append("")
    lines.append(
        f"{header}. Timed in {elapsed:.0f} s; load average "
        + (f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f}" if load else "unknown")
        + f" at the end; {platform.python_version()}."
    )
    for note in notes:
        lines.append(f"note: {note}")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    return rows, checks


def table(rows, cases, libraries, counted):
    peers = [lib for lib in libraries if lib != "retrax"]
    head = ["case", "retrax ms"] + [f"{p} ms (ratio)" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, case in zip(rows, cases, strict=True):
        cells = [row["case"], f"{row['retrax']:.3f}" if "retrax" in row else "-"]
        for p in peers:
            if p not in row or "retrax" not in row:
                cells.append("-")
                continue
            ratio = row[p] / row["retrax"]
            mark = "" if counted(case, p) else " differs"
            cells.append(f"{row[p]:.3f} ({ratio:.2f}x{mark})")
        lines.append("| " + " | ".join(cells) + " |")
    lines.insert(
        0,
        "Ratio = peer / retrax (above 1: retrax is faster); 'differs': the "
        "peer's output did not match retrax's (see the checks), so its time is "
        "not a like-for-like comparison.\n",
    )
    return lines


if __name__ == "__main__":
    main()
