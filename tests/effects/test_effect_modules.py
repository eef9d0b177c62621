"""The effect modules of `retrax.effects` and their processor interface.

Values against independent numpy sample loops of each effect's definition
(Freeverb's combs as in Jezar's code, the allpasses through
scipy.signal.lfilter), derivatives against finite differences (second
order, both modes), streaming in blocks against one call, the normalised
parameters' round trip and batching, parameter errors eagerly and under
`jit`, and chains of mono and stereo effects.
"""

import math
import re

import equinox as eqx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from helpers import (
    assert_close,
    check_grads,
    np_compexp_gain,
    raises_eagerly_and_under_jit,
    unchecked,
)
from retrax import effects as fx
from retrax.filters import SVF, Biquad, Compressor, ParametricEQ, rbj_section
from retrax.losses import (
    EnergyDecayLoss,
    MelBandEnergyLoss,
    MultiResolutionSTFTLoss,
    OctaveBandEnergyLoss,
    STFTLoss,
    energy_decay_curve,
    t60_from_edc,
)
from retrax.ops import fdn, fdn_frequency_response, fdn_impulse_response


# --- numpy references ----------------------------------------------------------


def np_distortion(x, drive_db, previous=0.0):
    u = 10 ** (drive_db / 20) * np.asarray(x)
    before = np.concatenate([[10 ** (drive_db / 20) * previous], u[:-1]])
    F = lambda v: np.logaddexp(v, -v) - np.log(2)  # noqa: E731
    h = u - before
    same = h == 0
    return np.where(same, np.tanh(u), (F(u) - F(before)) / np.where(same, 1, h))


def np_delay(x, d, mix):
    """Linear interpolation, zero history."""
    y = np.zeros(len(x))
    get = lambda t: x[t] if t >= 0 else 0.0  # noqa: E731
    n = math.floor(d)
    f = d - n
    for t in range(len(x)):
        y[t] = (1 - f) * get(t - n) + f * get(t - n - 1)
    return (1 - mix) * x + mix * y


def np_feedback_delay(x, D, g, mix):
    w = np.zeros(len(x))
    for t in range(len(x)):
        w[t] = x[t] + (g * w[t - D] if t >= D else 0.0)
    wet = np.array([w[t - D] if t >= D else 0.0 for t in range(len(x))])
    return (1 - mix) * x + mix * wet


def np_ping_pong(x, D, g, mix):
    u = x.mean(axis=0)
    T = x.shape[1]
    sl, sr = np.zeros(T), np.zeros(T)
    wet = np.zeros((2, T))
    for t in range(T):
        ol = sl[t - D] if t >= D else 0.0
        orr = sr[t - D] if t >= D else 0.0
        sl[t] = u[t] + g * orr
        sr[t] = g * ol
        wet[:, t] = ol, orr
    return (1 - mix) * x + mix * wet


def _lagrange3(p):
    return [np.prod([(p - j) / (k - j) for j in range(4) if j != k]) for k in range(4)]


def np_chorus(x, rate, depth_ms, centre_ms, mix, sr):
    y = np.zeros(len(x))
    get = lambda t: x[t] if t >= 0 else 0.0  # noqa: E731
    for t in range(len(x)):
        d = (centre_ms + depth_ms * np.sin(2 * np.pi * rate * t / sr)) * sr / 1000
        m = max(math.floor(d) - 1, 0)
        w = _lagrange3(d - m)
        y[t] = sum(w[k] * get(t - m - k) for k in range(4))
    return (1 - mix) * x + mix * y


def np_fdn_reverb(x, delays, v, b, c, t60, hf, mix, sr):
    """Delay lines, one-pole absorption filters designed from the T60s, a
    Householder matrix: the definition, sample by sample."""
    m = np.array(delays)
    N, T = len(delays), len(x)
    g0 = 10 ** (-3 * m / (sr * t60))
    gpi = 10 ** (-3 * m / (sr * hf * t60))
    rho = gpi / g0
    p = (1 - rho) / (1 + rho)
    u = v / np.linalg.norm(v)
    A = np.eye(N) - 2 * np.outer(u, u)
    s = np.zeros((T, N))
    f = np.zeros(N)
    wet = np.zeros(T)
    for t in range(T):
        o = np.array([s[t - m[j], j] if t >= m[j] else 0.0 for j in range(N)])
        f = p * f + g0 * (1 - p) * o
        s[t] = b * x[t] + A @ f
        wet[t] = c @ f
    return (1 - mix) * x + mix * wet


def np_freeverb(x, combs, allpasses, room_size, damping, mix):
    """Jezar's comb code; Schroeder allpasses by scipy.signal.lfilter."""
    feedback, damp = 0.7 + 0.28 * room_size, 0.4 * damping
    inp = 0.015 * 3 * x
    out = np.zeros(len(x))
    for m in combs:
        buf, idx, store = np.zeros(m), 0, 0.0
        for t in range(len(x)):
            o = buf[idx]
            store = o * (1 - damp) + store * damp
            buf[idx] = inp[t] + store * feedback
            idx = (idx + 1) % m
            out[t] += o
    for d in allpasses:
        b = np.zeros(d + 1)
        a = np.zeros(d + 1)
        b[0], b[d], a[0], a[d] = -0.5, 1.0, 1.0, -0.5
        out = scipy.signal.lfilter(b, a, out)
    return (1 - mix) * x + mix * out


def np_compressor(x, c):
    """`Compressor` `c` on one signal: the RMS detector, the soft-knee gain
    computer and the ballistics sample by sample (`np_compexp_gain`), the
    gain applied to the signal `c.lookahead_samples` late."""
    sr, x = c.sample_rate, np.asarray(x)
    coef = lambda ms: 1 - np.exp(-2200 / (float(ms) * sr))  # noqa: E731
    power, prev, rms_coef = np.zeros(len(x)), 0.0, coef(c.rms_ms)
    for t in range(len(x)):
        prev = rms_coef * x[t] ** 2 + (1 - rms_coef) * prev
        power[t] = prev
    rms = np.sqrt(np.maximum(power, np.finfo(float).tiny))
    params = [float(v) for v in (c.threshold_db, c.ratio, c.exp_threshold_db)]
    gain = np_compexp_gain(
        rms,
        *params,
        float(c.exp_ratio),
        coef(c.attack_ms),
        coef(c.release_ms),
        float(c.knee_db),
    )
    late = np.concatenate([np.zeros(c.lookahead_samples), x])[: len(x)]
    return late * gain * 10 ** (float(c.makeup_db) / 20)


# --- the cases -------------------------------------------------------------------

T = 40
FDN_DELAYS = (3, 5, 7, 11)


def _cases():
    """(name, effect, reference(x) for mono x, or None); small sample rates
    keep the delays a few samples long, shorter than the signals."""
    v = np.array([1.0, 0.7, -0.4, 1.3])
    b = np.array([0.6, -0.5, 0.4, 0.45])
    c = np.array([0.5, 0.3, -0.6, 0.4])
    return [
        ("gain", fx.Gain(-4.5), lambda x: 10 ** (-4.5 / 20) * x),
        ("distortion", fx.Distortion(14.0), lambda x: np_distortion(x, 14.0)),
        (
            "delay",
            fx.Delay(3.3, 0.6, max_delay_ms=8.0, sample_rate=1000),
            lambda x: np_delay(x, 3.3, 0.6),
        ),
        (
            "feedback_delay",
            fx.FeedbackDelay(0.6, 0.4, delay_samples=5),
            lambda x: np_feedback_delay(x, 5, 0.6, 0.4),
        ),
        (
            "chorus",
            # its delay (7.16 to 7.40 samples) stays 0.36 samples from whole
            # numbers, where the interpolators' derivative jumps
            fx.Chorus(3.7, 0.3, 7.4, 0.55, sample_rate=1000),
            lambda x: np_chorus(x, 3.7, 0.3, 7.4, 0.55, 1000),
        ),
        (
            "fdn_reverb",
            fx.FDNReverb(0.08, 0.4, 0.7, v, b, c, delays=FDN_DELAYS, sample_rate=1000),
            lambda x: np_fdn_reverb(x, FDN_DELAYS, v, b, c, 0.08, 0.4, 0.7, 1000),
        ),
        (
            "freeverb",
            fx.Freeverb(0.6, 0.45, 0.5, sample_rate=441),
            lambda x: np_freeverb(
                x,
                fx.Freeverb(sample_rate=441).comb_delays,
                fx.Freeverb(sample_rate=441).allpass_delays,
                0.6,
                0.45,
                0.5,
            ),
        ),
    ]


MONO = _cases()
MONO_IDS = [name for name, _, _ in MONO]


def _stereo_cases():
    """(name, effect, reference(x) for stereo x `(2, T)`)."""
    pan = 0.35
    theta = (pan + 1) * np.pi / 4
    return [
        (
            "panner",
            fx.StereoPanner(pan),
            lambda x: np.sqrt(2) * np.array([[np.cos(theta)], [np.sin(theta)]]) * x,
        ),
        (
            "widener",
            fx.StereoWidener(1.6),
            lambda x: np.stack(
                [
                    (x[0] + x[1]) / 2 + 1.6 * (x[0] - x[1]) / 2,
                    (x[0] + x[1]) / 2 - 1.6 * (x[0] - x[1]) / 2,
                ]
            ),
        ),
        (
            "ping_pong",
            fx.PingPongDelay(0.7, 0.45, delay_samples=3),
            lambda x: np_ping_pong(x, 3, 0.7, 0.45),
        ),
    ]


STEREO = _stereo_cases()
STEREO_IDS = [name for name, _, _ in STEREO]


def _compressor(**changes):
    """The compressor of the effect cases: its knee (-26 to -14 dB) holds
    some of the test signal's levels, and it looks 3 samples ahead."""
    args = dict(threshold_db=-20.0, ratio=3.0, attack_ms=2.0, release_ms=50.0)
    args.update(makeup_db=2.0, sample_rate=8_000.0, knee_db=12.0)
    return Compressor(**(args | changes), lookahead_samples=3)


# The filter modules of `retrax.filters` as effects (their values are tested
# against scipy and the TPT equations in test_filters.py).
FILTERS = [
    ("svf", SVF(300.0, 1.3, 8_000.0, "bandpass")),
    ("biquad", Biquad(jnp.asarray([0.5, 0.2, -0.1]), 0.7, 0.9)),
    (
        "parametric_eq",
        ParametricEQ([20.0, 200.0, 2_000.0], [3.0, -4.0, 2.0], [0.8, 1.5, 0.9], 8_000),
    ),
    ("compressor", _compressor()),
]
FILTER_IDS = [name for name, _ in FILTERS]
ALL = [(n, e) for n, e, _ in MONO + STEREO] + FILTERS
ALL_IDS = MONO_IDS + STEREO_IDS + FILTER_IDS


@eqx.filter_jit
def apply(effect, x, zi=None):
    """`effect(x, zi=zi, return_zf=True)`, compiled once per effect and shape."""
    return effect(x, zi=zi, return_zf=True)


def run(effect, x):
    return apply(effect, jnp.asarray(x))[0]


def call_unchecked(effect, *args, **kwargs):
    """`effect(*args, **kwargs)` without the test run's type checker."""
    return unchecked(type(effect).__call__)(effect, *args, **kwargs)


def _signal(channels=None, length=T, seed=0):
    rng = np.random.default_rng(seed)
    shape = (length,) if channels is None else (channels, length)
    return rng.standard_normal(shape)


# --- values ------------------------------------------------------------------


@pytest.mark.parametrize(("name", "effect", "reference"), MONO, ids=MONO_IDS)
def test_mono_effects_match_numpy_references(name, effect, reference):
    x = _signal()
    assert_close(run(effect, x), reference(x), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "effect", "reference"), MONO, ids=MONO_IDS)
def test_mono_effects_channel_by_channel(name, effect, reference):
    x2 = _signal(2, seed=1)
    y2 = run(effect, x2)
    assert_close(y2, np.stack([reference(x2[0]), reference(x2[1])]), rtol=1e-12)


@pytest.mark.parametrize(("name", "effect", "reference"), STEREO, ids=STEREO_IDS)
def test_stereo_effects_match_numpy_references(name, effect, reference):
    x = _signal(2)
    assert_close(run(effect, x), reference(x), rtol=1e-12)
    # mono in: the same signal on both channels (a panner pans it instead)
    m = _signal(seed=2)
    y = run(effect, m)
    assert y.shape == (2, T)
    if name != "panner":
        assert_close(y, reference(np.stack([m, m])), rtol=1e-12)


def test_panner_is_constant_power_on_mono():
    x = jnp.asarray(_signal())
    for pan in (-1.0, -0.3, 0.0, 0.8, 1.0):
        y = run(fx.StereoPanner(pan), x)
        assert_close(jnp.sum(y**2, axis=0), x**2, rtol=1e-12)
    assert_close(run(fx.StereoPanner(-1.0), x)[1], jnp.zeros(T), atol=1e-15)


def test_distortion_where_consecutive_samples_are_equal():
    # Constant runs and near-repeats take the midpoint expansion: tanh of the
    # midpoint to within the expansion's O(h^4) error, with finite gradients.
    base = np.array([0.3, 0.3, 0.3, -0.2, -0.2, 0.5])
    x = np.concatenate([base, base[-1:] + 1e-9, base[-1:] - 3e-9])
    dist = fx.Distortion(20.0)
    u = 10.0 * x
    mid = 0.5 * (u + np.concatenate([[0.0], u[:-1]]))
    y = run(dist, x)
    near = np.abs(np.diff(np.concatenate([[0.0], u]))) < 1e-3
    assert near.sum() == 5
    assert_close(y[near], np.tanh(mid[near]), rtol=1e-13)
    grad = jax.grad(lambda x, d: jnp.sum(d(x) ** 2), argnums=(0, 1))(
        jnp.asarray(x), dist
    )
    assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grad))
    # a signal of tanh's flat part: the divided difference of log cosh with
    # no cancellation (|u| - |u_prev| is exact), against float64 closed form
    x = np.array([4.0, 4.5, -5.0, -5.25, 3.0])
    assert_close(run(fx.Distortion(30.0), x), np_distortion(x, 30.0), rtol=1e-12)


def test_distortion_without_antialiasing_is_tanh():
    x = _signal()
    plain = fx.Distortion(14.0, antialias=False)
    y, zf = apply(plain, jnp.asarray(x))
    assert_close(y, np.tanh(10 ** (14.0 / 20) * x), rtol=1e-12)
    assert_close(zf, x[-1], rtol=0)
    assert plain.with_normalised(plain.to_normalised()).antialias is False
    with pytest.raises(ValueError, match=r"`antialias` must be a Python bool"):
        unchecked(fx.Distortion.__init__)(fx.Distortion(), 12.0, 1)


def test_fdn_absorption_filters_meet_the_decay_times():
    # DC gain 10^(-3 m / (fs T60)), Nyquist gain 10^(-3 m / (fs h T60))
    from retrax.effects._fdn_reverb import absorption

    delays, t60, h, sr = (1109, 1559, 2801), 1.7, 0.3, 44_100.0
    p, k = absorption(delays, jnp.asarray(t60), jnp.asarray(h), sr)
    m = np.array(delays)
    assert_close(k / (1 - p), 10 ** (-3 * m / (sr * t60)), rtol=1e-13)
    assert_close(k / (1 + p), 10 ** (-3 * m / (sr * h * t60)), rtol=1e-13)


def test_fdn_reverb_is_lossless_with_full_decay_time_and_decays_otherwise():
    # The network's energy decays at the designed rate: after the input stops
    # the wet energy of a frame T60 later is about 60 dB down (broadband
    # noise, hf_ratio 1: no frequency dependence).
    sr = 2000
    rev = fx.FDNReverb(0.5, 1.0, 1.0, delays=(37, 41, 53, 61), sample_rate=sr)
    x = np.zeros(4 * sr // 2)
    x[:1] = 1.0
    y = np.asarray(run(rev, x))
    frame = 200
    e0 = np.sum(y[200 : 200 + frame] ** 2)
    e1 = np.sum(y[200 + sr // 2 : 200 + sr // 2 + frame] ** 2)
    assert abs(10 * np.log10(e1 / e0) + 60) < 3


# --- derivatives -----------------------------------------------------------------


def _normalised_grads(effect, x, order=2):
    template = effect

    def f(p, x):
        return template.with_normalised(p)(x)

    p = effect.to_normalised()
    # a small step: the drive's third derivative makes 1e-4 too coarse
    check_grads(f, (p, jnp.asarray(x)), order=order, eps=1e-6)


def test_chain_derivatives():
    # One first-order check (both modes) of six modules in one program, 4 s
    # of CPU; second order (16 s for this chain) runs per module, the reverbs
    # and filters included, in the slow set.
    cheap = ("gain", "distortion", "delay", "feedback_delay", "panner", "ping_pong")
    chain = fx.Chain([effect for name, effect in ALL if name in cheap])
    _normalised_grads(chain, _signal(length=16), order=1)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "effect"), ALL, ids=ALL_IDS)
def test_each_effect_derivatives(name, effect):
    _normalised_grads(effect, _signal(length=T))
    if name not in ("fdn_reverb", "compressor"):
        return
    # their trainable leaves outside the normalised vector too (the FDN's
    # Householder vector and gains, the expander and detector time)
    leaves = eqx.filter(effect, eqx.is_inexact_array)
    statics = eqx.filter(effect, eqx.is_inexact_array, inverse=True)
    check_grads(
        lambda e, x: eqx.combine(e, statics)(x),
        (leaves, jnp.asarray(_signal())),
        eps=1e-6,
    )


def test_delay_time_derivative_is_the_interpolators():
    # d y / d delay_ms at a fractional delay: linear interpolation's slope
    # x[t - n - 1] - x[t - n], times fs / 1000 and mix.
    x = _signal()
    effect = fx.Delay(3.3, 0.6, max_delay_ms=8.0, sample_rate=1000)
    g = eqx.filter_jit(jax.jacfwd(lambda e: e(jnp.asarray(x))))(effect).delay_ms
    xp = np.concatenate([np.zeros(5), x])
    want = 0.6 * (xp[5 - 4 : 5 - 4 + T] - xp[5 - 3 : 5 - 3 + T])
    assert_close(g, want, rtol=1e-12)


# --- streaming ---------------------------------------------------------------------


def _blocks(effect, x, sizes):
    # the zero state, from an empty block, so that every block runs the same
    # compiled program
    _, zi = apply(effect, x[..., :0])
    out, start = [], 0
    for size in sizes:
        y, zi = apply(effect, x[..., start : start + size], zi)
        out.append(y)
        start += size
    return jnp.concatenate(out, axis=-1)


@pytest.mark.parametrize(
    ("name", "effect"),
    # `svf` and `sosfilt` stream in test_filters.py and test_sos_filtfilt.py
    [
        pytest.param(n, e, marks=pytest.mark.slow if n in ("svf", "biquad") else ())
        for n, e in ALL
    ],
    ids=ALL_IDS,
)
def test_streaming_in_blocks_equals_one_call(name, effect):
    x = jnp.asarray(_signal())
    assert_close(_blocks(effect, x, (10, 10, 10, 10)), run(effect, x), rtol=1e-12)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "effect"), ALL, ids=ALL_IDS)
def test_streaming_stereo_signals(name, effect):
    for channels in (2,):
        x = jnp.asarray(_signal(channels))
        assert_close(_blocks(effect, x, (10, 10, 10, 10)), run(effect, x), rtol=1e-12)


# --- the processor interface ---------------------------------------------------------


@pytest.mark.parametrize(("name", "effect"), ALL, ids=ALL_IDS)
def test_normalised_round_trip(name, effect):
    p = effect.to_normalised()
    assert p.shape == (effect.n_params,)
    assert np.all((p >= 0) & (p <= 1))
    back = effect.with_normalised(p)
    assert_close(
        jnp.concatenate([jnp.ravel(v) for v in jax.tree.leaves(back)]),
        jnp.concatenate([jnp.ravel(v) for v in jax.tree.leaves(effect)]),
        rtol=1e-13,
    )


ENSEMBLE = ["gain", "chorus", "fdn_reverb"]


@pytest.mark.parametrize(
    ("name", "effect"),
    [
        pytest.param(n, e, marks=() if n in ENSEMBLE else pytest.mark.slow)
        for n, e in ALL
    ],
    ids=ALL_IDS,
)
def test_ensembles_from_a_batch(name, effect):
    # an ensemble from a controller's batch (B, P), built under jit
    rng = np.random.default_rng(3)
    batch = jnp.asarray(rng.uniform(size=(3, effect.n_params)))
    build = eqx.filter_jit(eqx.filter_vmap(effect.with_normalised))
    ensemble = build(batch)
    assert_close(jax.vmap(lambda e: e.to_normalised())(ensemble), batch, rtol=1e-12)
    x = jnp.asarray(_signal())
    ys = eqx.filter_jit(eqx.filter_vmap(lambda e: e(x)))(ensemble)
    assert_close(ys[1], run(effect.with_normalised(batch[1]), x), rtol=1e-12)


def test_from_normalised_uses_the_documented_ranges():
    gain = fx.Gain.from_normalised(jnp.asarray([0.25]))
    assert_close(gain.gain_db, -12.0, rtol=1e-15)
    chorus = fx.Chorus.from_normalised(
        jnp.asarray([0.5, 0.2, 1.0, 0.0]), sample_rate=8000
    )
    assert_close(chorus.rate_hz, 0.5, rtol=1e-14)  # log: sqrt(0.05 * 5)
    assert_close(chorus.depth_ms, 1.0, rtol=1e-14)
    assert_close(chorus.centre_ms, 25.0, rtol=1e-14)
    assert chorus.sample_rate == 8000
    delay = fx.Delay.from_normalised(jnp.asarray([0.5, 1.0]), max_delay_ms=40.0)
    assert_close(delay.delay_ms, 20.0, rtol=1e-15)
    # batched: filter_vmap over the classmethod
    ps = jnp.asarray([[0.0], [0.5], [1.0]])
    gains = eqx.filter_vmap(fx.Gain.from_normalised)(ps)
    assert_close(gains.gain_db, jnp.asarray([-24.0, 0.0, 24.0]), rtol=1e-15)


def test_bad_normalised_parameters_raise_under_jit():
    for bad in ([1.2], [-0.1], [np.nan]):
        raises_eagerly_and_under_jit(
            fx.Gain.from_normalised, jnp.asarray(bad), match=r"`p`.*\[0, 1\]"
        )
    with pytest.raises(ValueError, match=r"`p`.*\[0, 1\]"):
        fx.Gain.from_normalised(np.array([2.0]))
    with pytest.raises(ValueError, match=r"`p` must hold the 2 normalised"):
        unchecked(fx.FeedbackDelay.with_normalised)(fx.FeedbackDelay(), jnp.zeros(3))
    chain = fx.Chain([fx.Gain(), fx.Distortion()])
    raises_eagerly_and_under_jit(
        lambda p: chain.with_normalised(p),
        jnp.asarray([0.5, 1.5]),
        match=r"`p`.*\[0, 1\]",
    )


def test_bad_physical_parameters_raise():
    with pytest.raises(ValueError, match=r"`gain_db` must be finite and lie in"):
        fx.Gain(30.0)
    with pytest.raises(ValueError, match=r"`feedback`"):
        fx.FeedbackDelay(0.99, delay_samples=4)
    with pytest.raises(ValueError, match=r"`delay_samples` must be a Python int"):
        fx.PingPongDelay(delay_samples=0)
    with pytest.raises(ValueError, match=r"`delay_ms`"):
        fx.Delay(12.0, max_delay_ms=10.0)
    with pytest.raises(ValueError, match=r"each >= 2"):
        fx.FDNReverb(delays=(1, 5))
    with pytest.raises(ValueError, match=r"`v` must have one entry"):
        fx.FDNReverb(v=np.ones(3), delays=(3, 5))
    # built under jit from traced values: the same check at run time
    raises_eagerly_and_under_jit(lambda v: fx.Gain(v).gain_db, 30.0, match="gain_db")
    # moved out of range by tree_at (or an optimiser): the call raises
    x = jnp.asarray(_signal())
    bad = eqx.tree_at(lambda e: e.mix, fx.Freeverb(sample_rate=441), jnp.asarray(1.5))
    raises_eagerly_and_under_jit(lambda e, x: e(x), bad, x, match="`mix` must be")
    zero = eqx.tree_at(lambda e: e.v, fx.FDNReverb(delays=(3, 5)), jnp.zeros(2))
    raises_eagerly_and_under_jit(lambda e, x: e(x), zero, x, match="`v`")


def test_bad_signals_and_states_raise():
    with pytest.raises(ValueError, match=r"`x` must be one mono signal"):
        call_unchecked(fx.Gain(), jnp.zeros((2, 2, 8)))
    with pytest.raises(ValueError, match=r"`x` must be mono \(time,\) or stereo"):
        call_unchecked(fx.StereoWidener(), jnp.zeros((3, 8)))
    with pytest.raises(ValueError, match=r"`x` must be mono \(time,\) or stereo"):
        call_unchecked(fx.StereoPanner(), jnp.zeros((3, 8)))
    with pytest.raises(ValueError, match=r"no state"):
        call_unchecked(fx.Gain(), jnp.zeros(8), zi=jnp.zeros(1))
    with pytest.raises(ValueError, match=r"`zi` must have shape \(5,\)"):
        call_unchecked(fx.FeedbackDelay(delay_samples=5), jnp.zeros(8), zi=jnp.zeros(4))
    with pytest.raises(ValueError, match=r"tuple of 2 states"):
        call_unchecked(fx.Chain([fx.Gain(), fx.Gain()]), jnp.zeros(8), zi=(None,))
    with pytest.raises(TypeError, match=r"`effects\[1\]` must be an effect"):
        unchecked(fx.Chain.__init__)(object.__new__(fx.Chain), [fx.Gain(), abs])
    for bad in (0, -4, 2.5, True, "64"):
        with pytest.raises(ValueError, match=r"`segment_length` must be a Python int"):
            unchecked(fx.Chain.__init__)(
                object.__new__(fx.Chain), [fx.Gain()], segment_length=bad
            )
    # effects defined on the whole signal do not stream, so no segments
    whole = fx.Chain([fx.Gain(), fx.DaspCompressor()])
    with pytest.raises(
        ValueError, match=r"`effects\[1\]` \(DaspParametricEQ\) does not stream"
    ):
        fx.Chain([fx.Gain(), fx.DaspParametricEQ()], segment_length=64)
    with pytest.raises(ValueError, match=r"`effects\[0\]` \(Chain\)"):
        fx.Chain([whole], segment_length=64)


# --- chains ------------------------------------------------------------------


@pytest.mark.full
def test_chain_mono_and_stereo():
    sr = 1000
    mono = [
        ParametricEQ([2.0, 20.0, 200.0], [2.0, -3.0, 1.0], None, sr),
        Compressor(-15.0, 3.0, 1.0, 20.0, 1.0, sample_rate=sr),
        fx.Gain(3.0),
        fx.Distortion(6.0),
        fx.FeedbackDelay(0.3, 0.5, delay_samples=4),
        fx.FDNReverb(0.2, 0.5, 0.3, delays=FDN_DELAYS, sample_rate=sr),
    ]
    stereo = [fx.StereoPanner(-0.4), fx.PingPongDelay(0.5, 0.3, delay_samples=3)]
    x = jnp.asarray(_signal())
    chain = fx.Chain(mono + stereo)
    want = x
    for e in mono + stereo:
        want = run(e, want)
    y = run(chain, x)
    assert y.shape == (2, T)
    assert_close(y, want, rtol=1e-14)
    # stereo in, mono effects channel by channel
    x2 = jnp.asarray(_signal(2))
    stereo_chain = [mono[0], mono[2], fx.StereoWidener(1.4)]
    want2 = x2
    for e in stereo_chain:
        want2 = run(e, want2)
    assert_close(run(fx.Chain(stereo_chain), x2), want2, rtol=1e-14)
    # the normalised vector is the concatenation, and from_normalised keeps
    # each effect's structure
    p = chain.to_normalised()
    assert_close(p, jnp.concatenate([e.to_normalised() for e in mono + stereo]))
    rebuilt = fx.Chain.from_normalised(p, effects=mono + stereo)
    assert_close(run(rebuilt, x), y, rtol=1e-13)
    assert rebuilt.effects[5].delays == FDN_DELAYS
    # streaming through the chain
    assert_close(_blocks(chain, x, (20, 20)), y, rtol=1e-12)


def _segmented_chain(segment_length, sr=1000):
    return fx.Chain(
        [
            ParametricEQ([2.0, 20.0, 200.0], [2.0, -3.0, 1.0], None, sr),
            Compressor(-15.0, 3.0, 1.0, 20.0, 1.0, sample_rate=sr, lookahead_samples=2),
            fx.FDNReverb(0.2, 0.5, 0.3, delays=FDN_DELAYS, sample_rate=sr),
            fx.StereoPanner(-0.4),
        ],
        segment_length=segment_length,
    )


@pytest.mark.full
@pytest.mark.parametrize("segment_length", [2, 7])
def test_chain_in_segments_equals_one_call(segment_length):
    # Whole segments only (40 = 20 x 2, shorter than every delay line), and
    # whole segments and a shorter last one (40 = 5 x 7 + 5); mono in,
    # stereo out. Values, final states and the gradients with
    # respect to every parameter and the signal are the unsegmented chain's.
    plain, segmented = _segmented_chain(None), _segmented_chain(segment_length)
    assert segmented.segment_length == segment_length
    x = jnp.asarray(_signal())
    w = jnp.asarray(np.random.default_rng(3).standard_normal((2, T)))
    want, want_zf = apply(plain, x)
    y, zf = apply(segmented, x)
    assert_close(y, want, rtol=1e-13)
    for a, b in zip(jax.tree.leaves(zf), jax.tree.leaves(want_zf), strict=True):
        assert_close(a, b, rtol=1e-13, atol=1e-15)

    def grads(chain):
        params, static = eqx.partition(chain, eqx.is_inexact_array)

        def loss(p, x):
            return jnp.sum(w * eqx.combine(p, static)(x))

        return jax.tree.leaves(jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x))

    got, ref = grads(segmented), grads(plain)
    assert len(got) == len(ref) > 10
    for a, b in zip(got, ref, strict=True):
        assert_close(a, b, rtol=1e-12, atol=1e-14)
    # the rebuilt chain keeps its segments
    p = segmented.to_normalised()
    assert segmented.with_normalised(p).segment_length == segment_length
    theta = segmented.to_unconstrained()
    assert segmented.with_unconstrained(theta).segment_length == segment_length


@pytest.mark.full
def test_chain_in_segments_gradient_memory():
    # The compiled gradient of an EQ -> compressor -> reverb chain over 4 s
    # of stereo float32 at 48 kHz holds a few signal-sized arrays when it
    # runs in segments (measured: 38 bytes per sample of both channels in
    # XLA's temporaries) where the unsegmented chain holds every stage's
    # signals (301 bytes): bounds with margin, so that either growing back
    # fails.
    length = 4 * 48_000
    chains = {
        n: fx.Chain(
            [
                ParametricEQ(
                    [100.0, 1000.0, 6000.0], [3.0, -4.0, 2.0], [0.7, 1.0, 0.7], 48000
                ),
                Compressor(sample_rate=48000),
                fx.FDNReverb(
                    0.8, mix=0.25, delays=(113, 151, 199, 263), sample_rate=48000
                ),
            ],
            segment_length=n,
        )
        for n in (None, 8192)
    }
    x = jax.ShapeDtypeStruct((2, length), jnp.float32)
    temp = {}
    for n, chain in chains.items():
        params, static = eqx.partition(chain, eqx.is_inexact_array)
        params = jax.tree.map(lambda v: v.astype(jnp.float32), params)

        def loss(p, x, static=static):
            return jnp.mean(eqx.combine(p, static)(x) ** 2)

        compiled = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(params, x).compile()
        temp[n] = compiled.memory_analysis().temp_size_in_bytes / (2 * length)
    assert temp[8192] < 50
    assert temp[None] < 330


def _training_chain(sr=1000):
    return fx.Chain(
        [
            ParametricEQ([2.0, 20.0, 200.0], [2.0, -3.0, 1.0], None, sr),
            Compressor(-15.0, 3.0, 1.0, 20.0, 1.0, sample_rate=sr),
            fx.Distortion(6.0),
            fx.FeedbackDelay(0.3, 0.5, delay_samples=4),
            fx.StereoPanner(-0.4),
        ]
    )


@pytest.mark.full
def test_chain_trains_like_an_effect():
    # A chain has the unconstrained pair each effect has, over its effects in
    # order, with the same guarantees: round trips, and any finite vector
    # (an optimiser's step however large) gives a chain of valid effects.
    chain = _training_chain()
    theta = chain.to_unconstrained()
    assert_close(theta, jnp.concatenate([e.to_unconstrained() for e in chain.effects]))
    p = chain.to_normalised()
    assert_close(chain.with_normalised(p).to_normalised(), p, rtol=1e-6)
    again = chain.with_unconstrained(theta)
    assert_close(again.to_unconstrained(), theta, rtol=1e-6)
    x = jnp.asarray(_signal())
    assert_close(run(again, x), run(chain, x), rtol=1e-6)
    rng = np.random.default_rng(0)
    for scale in (1.0, 30.0):
        wild = chain.with_unconstrained(
            jnp.asarray(scale * rng.normal(size=theta.shape))
        )
        # each effect in its valid region (the compressor's and the EQ's are
        # wider than their documented ranges): it runs, and maps back
        assert bool(jnp.all(jnp.isfinite(wild.to_unconstrained())))
        assert bool(jnp.all(jnp.isfinite(run(wild, x))))
    # under jit, and the gradient through the whole chain
    built = jax.jit(lambda t: chain.with_unconstrained(t).to_unconstrained())(theta)
    assert_close(built, theta, rtol=1e-6)
    grad = jax.grad(lambda t: jnp.sum(run(chain.with_unconstrained(t), x) ** 2))(theta)
    assert grad.shape == theta.shape and bool(jnp.all(jnp.isfinite(grad)))
    with pytest.raises(ValueError, match="`theta`.*shape"):
        chain.with_unconstrained(theta[:-1])
    with pytest.raises(ValueError, match="`theta`.*finite"):
        chain.with_unconstrained(theta.at[0].set(jnp.nan))


@hypothesis.settings(max_examples=15, deadline=None)
@hypothesis.given(st.integers(0, 2**32 - 1))
@pytest.mark.full
def test_random_valid_chains_have_normalised_vectors_in_the_unit_interval(seed):
    chain = _training_chain()
    p = jnp.asarray(np.random.default_rng(seed).uniform(size=chain.n_params))
    drawn = chain.with_normalised(p)
    q = drawn.to_normalised()
    assert bool(jnp.all((q >= 0) & (q <= 1)))
    assert_close(q, p, rtol=1e-6, atol=1e-6)
    assert_close(
        drawn.with_unconstrained(drawn.to_unconstrained()).to_normalised(),
        q,
        rtol=1e-6,
        atol=1e-6,
    )


# --- the filter modules as effects ------------------------------------------------


@pytest.mark.parametrize(
    ("name", "effect"),
    [
        pytest.param(n, e, marks=() if n == "compressor" else pytest.mark.slow)
        for n, e in FILTERS
    ],
    ids=FILTER_IDS,
)
def test_filters_channel_by_channel(name, effect):
    x = jnp.asarray(_signal(2))
    y = run(effect, x)
    assert_close(y, jnp.stack([run(effect, x[0]), run(effect, x[1])]), rtol=1e-13)
    # the old call without state is the same function
    assert_close(effect(x[0]), y[0], rtol=1e-13)


def test_parametric_eq_takes_any_frequencies_in_any_order():
    # every section's frequency ranges over the audible band, 20 Hz (or fs /
    # 2205 where that is lower) to 0.48 fs, whatever its position:
    # dasp-pytorch's presets (a high shelf below the last peak) are valid and
    # normalise into [0, 1]
    freqs = [100.0, 400.0, 1_500.0, 5_000.0, 13_000.0, 8_000.0]
    eq = ParametricEQ(freqs, [3.0, -2.0, 1.0, 4.0, -5.0, 6.0])
    p = eq.to_normalised()
    want = np.log(np.asarray(freqs) / 20.0) / np.log(0.48 * 44_100 / 20.0)
    assert_close(p[:6], want, rtol=1e-13)
    assert bool(jnp.all((p >= 0) & (p <= 1)))
    assert_close(eq.with_normalised(p).freqs, freqs, rtol=1e-12)
    ends = ParametricEQ.from_normalised(
        jnp.asarray([0.0, 0.5, 1.0] + [0.5] * 6),
        freqs=[2_000.0, 200.0, 20.0],
        sample_rate=48_000,
    )
    top = 0.48 * 48_000
    assert_close(ends.freqs, [20.0, np.sqrt(20.0 * top), top], rtol=1e-13)
    low = ParametricEQ.from_normalised(jnp.zeros(6), freqs=[1.0, 2.0], sample_rate=1e3)
    assert_close(low.freqs, [1e3 / 2205] * 2, rtol=1e-13)
    # the order does not change what a section is: a shelf by its position
    x = jnp.asarray(_signal())
    swapped = ParametricEQ([2_000.0, 200.0, 20.0], [3.0, -4.0, 2.0], None, 8_000)
    sos = swapped.sos
    assert_close(sos[0], rbj_section("lowshelf", 2_000.0, 3.0, 0.7071, 8_000))
    assert_close(sos[2], rbj_section("highshelf", 20.0, 2.0, 0.7071, 8_000))
    assert bool(jnp.all(jnp.isfinite(run(swapped, x))))
    # a frequency outside the audible band is valid but cannot be normalised
    raises_eagerly_and_under_jit(
        lambda e: e.to_normalised(),
        ParametricEQ([10.0, 300.0, 2_000.0]),
        match="`freqs` must be finite and lie in",
    )


@pytest.mark.full
def test_parametric_eq_ordered_mode_keeps_the_bands_in_frequency_order():
    eq = ParametricEQ([20.0, 200.0, 2_000.0], sample_rate=8_000, ordered=True)
    # any normalised vector keeps the sections in increasing frequency order
    p = jnp.asarray(np.random.default_rng(4).uniform(size=(64, 9)))
    freqs = eqx.filter_jit(eqx.filter_vmap(lambda p: eq.with_normalised(p).freqs))(p)
    assert np.all(np.diff(np.asarray(freqs), axis=1) > 0)
    edges = np.geomspace(8_000 / 2205, 0.45 * 8_000, 4)
    band = ParametricEQ.from_normalised(
        jnp.asarray([0.0, 0.5, 1.0] + [0.5] * 6),
        freqs=[20.0, 200.0, 2_000.0],
        sample_rate=8_000,
        ordered=True,
    )
    assert band.ordered
    assert_close(band.freqs, [edges[0], np.sqrt(edges[1] * edges[2]), edges[3]])
    with pytest.raises(ValueError, match="`freqs` must increase strictly"):
        ParametricEQ([200.0, 100.0, 2_000.0], ordered=True)
    raises_eagerly_and_under_jit(
        lambda f: ParametricEQ(f, ordered=True).freqs,
        jnp.asarray([100.0, 100.0, 3_000.0]),
        match="`freqs` must increase strictly",
    )
    # a section outside its normalised band cannot be normalised
    raises_eagerly_and_under_jit(
        lambda e: e.to_normalised(),
        ParametricEQ([20.0, 30.0, 2_000.0], sample_rate=8_000, ordered=True),
        match="`freqs` must be finite and lie in",
    )
    # moved out of order by tree_at (or an optimiser): the call raises
    crossed = eqx.tree_at(lambda e: e.freqs, eq, jnp.asarray([20.0, 2_500.0, 2_000.0]))
    x = jnp.asarray(_signal())
    raises_eagerly_and_under_jit(
        lambda e, x: e(x), crossed, x, match="`freqs` must increase strictly"
    )
    # the ordered unconstrained map: any vector keeps the order
    theta = eq.to_unconstrained()
    back = eq.with_unconstrained(theta)
    assert_close(back.freqs, eq.freqs, rtol=1e-13)
    rng = np.random.default_rng(6)
    spread = eq.with_unconstrained(theta + rng.uniform(-4, 4, theta.shape))
    assert bool(jnp.all(jnp.diff(spread.freqs) > 0))
    assert bool(jnp.all(jnp.isfinite(run(spread, x))))
    # Before: entries pushed past the logits' clipping (or a step's softplus
    # rounding to 0) put two sections on one frequency, which the call
    # refused. Far beyond any optimiser step, in float32 too, the sections
    # stay at least 0.1% apart and inside (0, fs/2).
    for value in (1e30, -1e30, 40.0, -40.0):
        for dtype in (jnp.float32, jnp.float64):
            theta = jnp.full((9,), value, dtype).at[1].set(-value)
            far = eq.with_unconstrained(theta)
            f = np.asarray(far.checked_values()["freqs"], np.float64)
            assert np.all(f[1:] / f[:-1] >= 1 + 0.99e-3) and 0 < f[0] < f[-1] < 4_000
    with pytest.raises(TypeError, match="`ordered` must be a Python bool"):
        unchecked(ParametricEQ.__init__)(
            object.__new__(ParametricEQ), [20.0, 200.0], ordered=1
        )


# Each filter module, one physical field and a valid new value for it, and
# the module built with that value.
TREE_AT = [
    ("svf", lambda e: e.cutoff, 450.0, lambda v: SVF(v, 1.3, 8_000.0, "bandpass")),
    ("svf", lambda e: e.q, 4.0, lambda v: SVF(300.0, v, 8_000.0, "bandpass")),
    (
        "biquad",
        lambda e: e.radius,
        0.95,
        lambda v: Biquad(jnp.asarray([0.5, 0.2, -0.1]), v, 0.9),
    ),
    (
        "biquad",
        lambda e: e.b,
        [1.0, -0.3, 0.2],
        lambda v: Biquad(jnp.asarray(v), 0.7, 0.9),
    ),
    (
        "parametric_eq",
        lambda e: e.freqs,
        [50.0, 300.0, 1_500.0],
        lambda v: ParametricEQ(v, [3.0, -4.0, 2.0], [0.8, 1.5, 0.9], 8_000),
    ),
    (
        "parametric_eq",
        lambda e: e.qs,
        [0.6, 3.0, 1.1],
        lambda v: ParametricEQ([20.0, 200.0, 2_000.0], [3.0, -4.0, 2.0], v, 8_000),
    ),
]


def test_filter_modules_physical_fields_with_tree_at():
    x = jnp.asarray(_signal())
    modules = dict(FILTERS)
    for name, where, value, build in TREE_AT:
        moved = eqx.tree_at(where, modules[name], jnp.asarray(value))
        assert_close(run(moved, x), run(build(value), x), rtol=1e-13)
    # a Python number, as the field's value
    svf = eqx.tree_at(lambda e: e.cutoff, modules["svf"], 450.0)
    assert_close(run(svf, x), run(TREE_AT[0][3](450.0), x), rtol=1e-13)
    # invalid values set by tree_at (or an optimiser) raise when the module
    # runs, naming the field, eagerly and under jit (the sections' modules
    # through their `sos`, which their call runs: a cheaper compilation)
    for name, where, value, match in [
        ("svf", lambda e: e.cutoff, 4_000.0, r"`cutoff` must be finite and lie in"),
        ("svf", lambda e: e.q, 0.0, r"`q` must be finite and lie in \(0.0, inf\)"),
        ("biquad", lambda e: e.radius, 0.999, r"`radius` must be finite and lie in"),
        ("parametric_eq", lambda e: e.qs, [0.6, -1.0, 1.1], r"`qs` must be finite"),
    ]:
        bad = eqx.tree_at(where, modules[name], jnp.asarray(value))
        if name == "svf":
            raises_eagerly_and_under_jit(lambda e, x: e(x), bad, x, match=match)
        else:
            raises_eagerly_and_under_jit(lambda e: e.sos, bad, match=match)
    for name, where, value, match in [
        ("biquad", lambda e: e.b, [1.0, np.inf, 0.0], r"`b` must be finite"),
        ("parametric_eq", lambda e: e.gains_db, [0.0, np.nan, 1.0], r"`gains_db`"),
    ]:
        with pytest.raises(Exception, match=match):
            _ = eqx.tree_at(where, modules[name], jnp.asarray(value)).sos
    with pytest.raises(ValueError, match=r"`cutoff` must be a scalar"):
        eqx.tree_at(lambda e: e.cutoff, modules["svf"], jnp.ones(T))(x)


@pytest.mark.parametrize(("name", "effect"), FILTERS[:3], ids=FILTER_IDS[:3])
def test_unconstrained_parameters(name, effect):
    # the documented training map: a round trip, and any real vector is a
    # valid module
    theta = effect.to_unconstrained()
    assert theta.shape == (effect.n_params,)
    back = effect.with_unconstrained(theta)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(effect), strict=True):
        assert_close(got, want, rtol=1e-13)
    x = jnp.asarray(_signal())
    rng = np.random.default_rng(6)
    shift = rng.uniform(-2, 2, theta.shape)
    moved = effect.with_unconstrained(theta + shift)
    assert bool(jnp.all(jnp.isfinite(run(moved, x))))
    assert_close(moved.to_unconstrained(), theta + shift, rtol=1e-10)
    # far out too (the entries clipped where float32 would saturate; the
    # equaliser's sections in any order, see the ordered mode's test for one
    # that keeps them in order)
    far = effect.with_unconstrained(theta + 40 * rng.standard_normal(theta.shape))
    assert bool(jnp.all(jnp.isfinite(run(far, x))))
    with pytest.raises(ValueError, match=r"`theta` must be the"):
        unchecked(type(effect).with_unconstrained)(effect, theta[:-1])
    raises_eagerly_and_under_jit(
        lambda t: effect.with_unconstrained(t).to_unconstrained(),
        theta.at[-1].set(jnp.nan),
        match=r"`theta` \(unconstrained parameters\) must be finite",
    )


def test_filter_modules_build_under_tracing():
    # constructors take traced values: filter_vmap builds an ensemble, and
    # filter_vmap runs it, as the modules built one by one run
    x = jnp.asarray(_signal())
    cases = [
        (lambda c: SVF(c, 0.9, 8_000.0), "cutoff", [200.0, 500.0, 1_000.0]),
        (
            lambda r: Biquad(jnp.asarray([0.5, 0.2, -0.1]), r, 0.9),
            "radius",
            [0.3, 0.7, 0.95],
        ),
        (
            lambda f: ParametricEQ(f, [3.0, -4.0, 2.0], [0.8, 1.5, 0.9], 8_000),
            "freqs",
            [[20.0, 200.0, 2_000.0], [50.0, 400.0, 3_000.0]],
        ),
    ]
    for build, field, values in cases:
        ensemble = eqx.filter_vmap(build)(jnp.asarray(values))
        assert_close(getattr(ensemble, field), values, rtol=1e-15)
        ys = eqx.filter_jit(eqx.filter_vmap(lambda e: e(x)))(ensemble)
        want = jnp.stack([run(build(jnp.asarray(v)), x) for v in values])
        assert_close(ys, want, rtol=1e-13)
    comps = eqx.filter_vmap(lambda t: Compressor(t, sample_rate=8_000.0))(
        jnp.asarray([-30.0, -10.0])
    )
    assert comps.threshold_db.shape == (2,)
    raises_eagerly_and_under_jit(
        lambda c: SVF(c, 0.9, 8_000.0).cutoff, 5_000.0, match="`cutoff`"
    )


def test_compressor_matches_numpy_reference():
    # A signal swelling from -46 dB to 0 dB and back, so that the level
    # passes through both knees; the cases' compressor (soft knee,
    # lookahead), and a faster one without lookahead whose expander acts
    # (below -30 dB), with a soft knee and with a hard one.
    rng = np.random.default_rng(6)
    env = 10 ** (
        np.concatenate([np.linspace(-46, 0, T // 2), np.linspace(0, -46, T // 2)]) / 20
    )
    x = rng.standard_normal((2, T)) * env
    comp = _compressor()
    assert_close(run(comp, x[0]), np_compressor(x[0], comp), rtol=1e-12)
    fast = Compressor(-15.0, 4.0, 1.0, 5.0, -1.5, -30.0, 0.6, 0.5, 8_000.0, knee_db=8.0)
    want = np.stack([np_compressor(v, fast) for v in x])
    assert_close(run(fast, x), want, rtol=1e-12)
    hard = eqx.tree_at(lambda c: c.knee_db, fast, jnp.asarray(0.0))
    want = np.stack([np_compressor(v, hard) for v in x])
    assert_close(run(hard, x), want, rtol=1e-12)
    assert np.max(np.abs(run(hard, x) - run(fast, x))) > 1e-3
    # the lookahead: the undelayed signal's gain on the delayed signal
    g = comp.gain(jnp.asarray(x[0]))
    late = np.concatenate([np.zeros(3), x[0, :-3]])
    assert_close(run(comp, x[0]), late * g * 10 ** (2 / 20), rtol=1e-13)


def test_compressor_streams_in_blocks_shorter_than_its_lookahead():
    x = jnp.asarray(_signal(2))
    comp = _compressor()
    y, zf = apply(comp, x)
    assert [np.shape(z) for z in zf] == [(2,), (2,), (2, 3)]
    assert_close(zf[2], x[:, -3:], rtol=0)
    assert_close(_blocks(comp, x, (2,) * (T // 2)), y, rtol=1e-12)


def test_compressor_parameters_are_fields_for_tree_at():
    x = jnp.asarray(_signal())
    comp = _compressor()
    # the example, a Python number in the field
    eight = eqx.tree_at(lambda c: c.ratio, comp, 8.0)
    assert eight.ratio == 8.0
    assert_close(run(eight, x), run(_compressor(ratio=8.0), x), rtol=1e-13)
    assert np.max(np.abs(run(eight, x) - run(comp, x))) > 1e-3
    # every parameter is a field holding its physical value
    names = ["threshold_db", "ratio", "attack_ms", "release_ms", "makeup_db"]
    names += ["knee_db", "exp_threshold_db", "exp_ratio", "rms_ms"]
    values = [-20.0, 3.0, 2.0, 50.0, 2.0, 12.0, -120.0, 0.5, 10.0]
    assert [float(getattr(comp, n)) for n in names] == values
    assert comp.n_params == 6 and comp.lookahead_samples == 3
    # moved out of its range, a field raises when the module is called
    bad_cases = [
        ("ratio", 1.0, r"`ratio` must be finite and lie in \(1.0, inf\)"),
        ("attack_ms", 0.0, r"`attack_ms` must be finite and lie in \(0.0, inf\)"),
        ("knee_db", -1.0, r"`knee_db` must be finite and lie in \[0.0, inf\)"),
        ("exp_ratio", 1.5, r"`exp_ratio` must be finite and lie in \(0.0, 1.0\)"),
        ("rms_ms", np.nan, r"`rms_ms` must be finite"),
    ]

    def call(c, x):  # one function: jit compiles it once for every case
        return c(x)

    for name, value, match in bad_cases:
        bad = eqx.tree_at(lambda c, n=name: getattr(c, n), comp, jnp.asarray(value))
        raises_eagerly_and_under_jit(call, bad, x, match=match)


def test_compressor_ensemble_and_bad_construction():
    # an ensemble built by filter_vmap over the constructor, traced values
    # checked at run time
    x = jnp.asarray(_signal())
    thresholds = jnp.asarray([-30.0, -10.0, -20.0])
    knees = jnp.asarray([0.0, 6.0, 12.0])
    comps = eqx.filter_jit(
        eqx.filter_vmap(lambda t, k: _compressor(threshold_db=t, knee_db=k))
    )(thresholds, knees)
    assert comps.knee_db.shape == (3,) and comps.lookahead_samples == 3
    ys = eqx.filter_jit(eqx.filter_vmap(lambda c: c(x)))(comps)
    for y, t, k in zip(ys, [-30.0, -10.0, -20.0], [0.0, 6.0, 12.0], strict=True):
        assert_close(y, run(_compressor(threshold_db=t, knee_db=k), x), rtol=1e-13)
    raises_eagerly_and_under_jit(
        lambda k: _compressor(knee_db=k).knee_db,
        -2.0,
        match=r"`knee_db` must be finite and lie in \[0.0, inf\)",
    )

    # the lookahead fixes the state's shape: a Python int >= 0, never traced
    with pytest.raises(ValueError, match=r"`lookahead_samples` must be a Python int"):
        Compressor(lookahead_samples=-1)
    # (the test run's type checker rejects other types before the check;
    # users' calls reach it)
    from retrax._validate import check_delay

    def check_lookahead(value):
        # the compressors' check of their lookahead
        return check_delay("lookahead_samples", value, minimum=0)

    for bad in (2.5, True, None, -3):
        with pytest.raises(ValueError, match=r"`lookahead_samples` must be a Python"):
            check_lookahead(bad)
    raises_eagerly_and_under_jit(
        check_lookahead, -1, match=r"`lookahead_samples` must be a Python int >= 0"
    )
    with pytest.raises(ValueError, match=r"`lookahead_samples` must be a Python"):
        jax.jit(check_lookahead)(3)  # traced
    # states of the wrong structure or shape
    with pytest.raises(ValueError, match=r"`zi` must be the triple"):
        call_unchecked(_compressor(), x, zi=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"`zi\[2\]` must have shape \(3,\)"):
        call_unchecked(_compressor(), x, zi=(None, None, jnp.zeros(2)))


# --- float32 ---------------------------------------------------------------------


@pytest.mark.float32
def test_chain_in_float32():
    # The users' default precision: output and the gradient with respect to
    # the normalised parameters against the same chain under x64, to 1e-4 of
    # the largest magnitude (the x64 suite checks those against finite
    # differences and numpy).
    assert not jax.config.jax_enable_x64
    names = [n for n, _ in ALL if n not in ("svf", "biquad", "freeverb")]

    def make():
        return fx.Chain([e for n, e in _rebuilt_cases() if n in names])

    w = np.random.default_rng(5).standard_normal((2, T))

    def loss(p, chain, x):
        y = chain.with_normalised(p)(x)
        return jnp.sum(jnp.asarray(w, y.dtype) * y), y

    step = eqx.filter_jit(jax.grad(loss, has_aux=True))
    x = _signal()
    chain32 = make()
    p32 = chain32.to_normalised()
    assert p32.dtype == jnp.float32
    g32, y32 = step(p32, chain32, jnp.asarray(x, jnp.float32))
    assert y32.dtype == g32.dtype == jnp.float32
    with jax.enable_x64(True):
        chain64 = make()
        g64, y64 = step(chain64.to_normalised(), chain64, jnp.asarray(x))
        g64, y64 = np.asarray(g64), np.asarray(y64)
    assert y64.dtype == np.float64
    assert_close(y32, y64, rtol=1e-4)
    assert_close(g32, g64, rtol=1e-4)


def _rebuilt_cases():
    """The cases built in the current precision (the module-level ones were
    built when the module was imported)."""
    return [(n, e) for n, e, _ in _cases() + _stereo_cases()] + [
        (
            "parametric_eq",
            ParametricEQ(
                [20.0, 200.0, 2_000.0], [3.0, -4.0, 2.0], [0.8, 1.5, 0.9], 8_000
            ),
        ),
        ("compressor", _compressor()),
    ]


def test_effect_fields_set_to_python_numbers_by_tree_at():
    # eqx.tree_at may put a Python float where the constructor stored an array;
    # the call-time range check must take it (it used to fail inside
    # equinox's error threading) and give the same output as a module built
    # with that value.
    from retrax.effects import Delay, FeedbackDelay, Gain, StereoPanner

    x = jnp.sin(jnp.arange(256.0) / 7.0)
    cases = [
        (Gain(0.0), lambda m: m.gain_db, 6.0, Gain(6.0)),
        (
            Delay(2.0, 0.5, max_delay_ms=5.0, sample_rate=8_000.0),
            lambda m: m.mix,
            0.25,
            Delay(2.0, 0.25, max_delay_ms=5.0, sample_rate=8_000.0),
        ),
        (
            FeedbackDelay(0.5, 0.5, delay_samples=8),
            lambda m: m.feedback,
            0.3,
            FeedbackDelay(0.3, 0.5, delay_samples=8),
        ),
        (StereoPanner(0.0), lambda m: m.pan, 0.5, StereoPanner(0.5)),
    ]
    for module, where, value, expected in cases:
        moved = eqx.tree_at(where, module, value)
        assert_close(moved(x), expected(x), rtol=1e-12, atol=1e-12)


def call(effect, x, **kwargs):
    """`effect(x, **kwargs)` without the test run's type checker (so that
    the library's own messages are what is tested)."""
    return unchecked(type(effect).__call__)(effect, x, **kwargs)


def jit_call(effect, x, **kwargs):
    """`call` under `jax.jit`, with the effect, `x` and `zi` traced."""
    return eqx.filter_jit(lambda e, x, kw: call(e, x, **kw))(effect, x, kwargs)


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_to_normalised_refuses_a_parameter_out_of_range(dtype):
    gain = eqx.tree_at(lambda e: e.gain_db, fx.Gain(1.0), jnp.asarray(100.0, dtype))
    with pytest.raises(ValueError, match=r"`gain_db` must be finite and lie in"):
        gain.to_normalised()
    with pytest.raises(Exception, match=r"`gain_db` must be finite and lie in"):
        eqx.filter_jit(lambda e: e.to_normalised())(gain).block_until_ready()
    # t60 = 0 is outside FDNReverb's logarithmic range [0.05, 10] (its
    # normalised value would be -inf)
    with pytest.raises(ValueError, match=r"`t60`"):
        fx.FDNReverb(t60=0.0)
    reverb = eqx.tree_at(lambda e: e.t60, fx.FDNReverb(), jnp.asarray(0.0))
    with pytest.raises(ValueError, match=r"`t60` must be finite and lie in"):
        reverb.to_normalised()
    with pytest.raises(Exception, match=r"`t60` must be finite and lie in"):
        eqx.filter_jit(lambda e: e.to_normalised())(reverb).block_until_ready()
    # in range: unchanged
    p = fx.Gain(jnp.asarray(12.0, dtype)).to_normalised()
    np.testing.assert_allclose(np.asarray(p), [0.75], rtol=1e-6)


@pytest.mark.loud
def test_scalar_parameters_refuse_arrays():
    init = unchecked(fx.Gain.__init__)
    with pytest.raises(ValueError, match=r"`gain_db` must be a scalar of shape \(\)"):
        init(object.__new__(fx.Gain), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match=r"`gain_db` must be a scalar"):
        jax.jit(lambda g: init(object.__new__(fx.Gain), g).gain_db)(jnp.ones(2))
    with pytest.raises(ValueError, match=r"`mix` must be a scalar"):
        fx.Range(0.0, 1.0).check_init("mix", np.ones(2))
    # the per-band fields of NoiseShapedReverb take one value per band
    with pytest.raises(ValueError, match=r"`t60s` must be a scalar or hold one"):
        fx.NoiseShapedReverb(t60s=np.ones(3), key=jax.random.key(0), length=8)


X2 = np.random.default_rng(0).standard_normal((2, 64))


def _effects():
    """Every effect with a state, with the shape of one channel's `zi`."""
    return [
        (fx.Distortion(), ()),
        (fx.Delay(max_delay_ms=1.0), (45,)),
        (fx.FeedbackDelay(delay_samples=5), (5,)),
        (fx.FDNReverb(delays=(3, 5)), (4, 4)),
        (fx.Chorus(), None),
        (Compressor(lookahead_samples=3), None),
        (fx.Freeverb(sample_rate=4410), None),
        (SVF(1000.0, 1.0, 8000.0), (2,)),
        (Biquad(jnp.asarray([0.5, 0.2, -0.1]), 0.7, 0.9), (1, 2)),
        (ParametricEQ([20.0, 200.0, 2_000.0], sample_rate=8000.0), (3, 2)),
    ]


@pytest.mark.loud
@pytest.mark.parametrize("index", range(10))
def test_a_state_of_the_wrong_shape_names_zi(index):
    effect, shape = _effects()[index]
    _, zf = call(effect, X2, return_zf=True)
    # the right state streams
    call(effect, X2, zi=zf)
    # one channel too many on every leaf
    bad = jax.tree.map(lambda z: jnp.concatenate([z, z[:1]]), zf)
    for f in (call, jit_call):
        with pytest.raises(ValueError, match=r"`zi(\[\d\])*` must have shape \(2,"):
            f(effect, X2, zi=bad)
    # a one-channel state for a two-channel signal
    mono = jax.tree.map(lambda z: z[0], zf)
    for f in (call, jit_call):
        with pytest.raises(ValueError, match=r"`zi.*` must have shape .* got shape"):
            f(effect, X2, zi=mono)
    if shape is not None:
        with pytest.raises(
            ValueError,
            match=rf"`zi` must have shape {re.escape(str((2,) + shape))} for `x` of "
            rf"shape \(2, 64\), got shape {re.escape(str(np.shape(mono)))}",
        ):
            call(effect, X2, zi=mono)


@pytest.mark.loud
def test_a_state_of_the_wrong_structure_names_zi():
    reverb = fx.Freeverb(sample_rate=4410)
    _, (zc, zp, za) = call(reverb, X2, return_zf=True)
    for f in (call, jit_call):
        with pytest.raises(ValueError, match=r"`zi` must be this effect's state"):
            f(reverb, X2, zi=(zc, zp, za[:3]))
    compressor = Compressor(lookahead_samples=3)
    _, (power, gain, delayed) = call(compressor, X2, return_zf=True)
    with pytest.raises(ValueError, match=r"`zi\[2\]` must have shape \(2, 3\)"):
        jit_call(compressor, X2, zi=(power, gain, delayed[:, :2]))


def _layout_effects():
    return [
        fx.Gain(6.0),
        fx.Distortion(),
        fx.FeedbackDelay(delay_samples=5),
        fx.Chain([fx.Gain(), fx.Distortion()]),
        ParametricEQ([20.0, 200.0, 2_000.0], sample_rate=44_100.0),
        Compressor(),
        SVF(1000.0, 1.0, 44_100.0),
        Biquad(jnp.asarray([0.5, 0.2, -0.1]), 0.7, 0.9),
    ]


@pytest.mark.loud
@pytest.mark.parametrize("index", range(8))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_time_first_audio_is_refused(index, dtype):
    effect = _layout_effects()[index]
    x = np.zeros((4410, 2), dtype)  # as soundfile reads a stereo file
    for f in (call, jit_call):
        with pytest.raises(ValueError, match=r"\(channels, time\).*Pass `x.T`"):
            f(effect, x)
    # the same audio laid out (channels, time), and short or many-channel
    # signals, run
    assert call(effect, x.T).shape == (2, 4410)
    for shape in [(1, 8), (64, 1), (16, 2), (200, 25), (3, 0)]:
        assert jit_call(effect, np.zeros(shape, dtype)).shape == shape


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
@pytest.mark.full
def test_half_precision_is_refused_where_it_is_not_computed(dtype):
    x = jnp.ones((2, 600), dtype)
    effects = [
        fx.FDNReverb(delays=(3, 5)),
        fx.Freeverb(sample_rate=4410),
        fx.NoiseShapedReverb(key=jax.random.key(0), length=64),
    ]
    for effect in effects:
        for f in (call, jit_call):
            with pytest.raises(TypeError, match=rf"`x` has dtype {dtype.__name__}"):
                f(effect, x)
    for loss in [
        STFTLoss(fft_size=64, hop_size=16, win_length=64),
        MultiResolutionSTFTLoss(fft_sizes=[64], hop_sizes=[16], win_lengths=[64]),
        MelBandEnergyLoss(16_000, fft_size=64, hop_size=16, n_mels=8),
        OctaveBandEnergyLoss(16_000, fft_size=512, hop_size=256, fraction=1),
    ]:
        for f in (loss, jax.jit(loss)):
            with pytest.raises(TypeError, match=r"`pred` \(with `target`\) has dtype"):
                f(x, x)
    A, b, c = jnp.eye(2, dtype=dtype) / 2, jnp.ones(2, dtype), jnp.ones(2, dtype)
    for f in [
        lambda: fdn(x[0], (3, 5), A, b, c),
        lambda: fdn_frequency_response((3, 5), A, b, c, n_fft=64),
        lambda: fdn_impulse_response((3, 5), A, b, c, length=64),
    ]:
        with pytest.raises(TypeError, match=r"float32 or float64 only"):
            f()
    # where half precision is computed, it still is
    assert fx.Gain(1.0)(x).dtype == dtype
    assert EnergyDecayLoss()(x, x).dtype == dtype
    # and float32 runs through every one of them
    x32 = x.astype(jnp.float32)
    for effect in effects:
        assert call(effect, x32).dtype == jnp.float32
    assert fdn(x32[0], (3, 5), A.astype(jnp.float32), b, c).dtype == jnp.float32


@pytest.mark.loud
@pytest.mark.float32
def test_loud_errors_at_the_users_default_precision():
    # x64 off: the users' default, where every array is float32
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    gain = eqx.tree_at(lambda e: e.gain_db, fx.Gain(1.0), jnp.asarray(100.0))
    with pytest.raises(ValueError, match=r"`gain_db` must be finite and lie in"):
        gain.to_normalised()
    with pytest.raises(Exception, match=r"`gain_db` must be finite and lie in"):
        eqx.filter_jit(lambda e: e.to_normalised())(gain).block_until_ready()
    delay = fx.FeedbackDelay(delay_samples=5)
    for f in (call, jit_call):
        with pytest.raises(ValueError, match=r"`zi` must have shape \(2, 5\)"):
            f(delay, x, zi=jnp.zeros((3, 5)))
        with pytest.raises(ValueError, match=r"Pass `x.T`"):
            f(ParametricEQ([100.0, 1000.0]), np.zeros((4410, 2), np.float32))
    y, zf = call(delay, x, return_zf=True)
    assert y.dtype == zf.dtype == jnp.float32
    assert call(delay, x, zi=zf).dtype == jnp.float32
    edc = np.array(energy_decay_curve(np.exp(-np.arange(8000) / 400.0)))
    edc[100] = np.nan
    with pytest.raises(Exception, match=r"`edc` holds NaN"):
        jax.jit(lambda e: t60_from_edc(e, 8000))(edc).block_until_ready()


# The gradient of a mean loss w.r.t. a replicated equaliser, 16 signals split
# over 8 devices, against one device, under both of JAX's meshes: automatic
# axes (`Mesh`, no mesh set) and explicit ones (`jax.make_mesh` and
# `jax.set_mesh`, the docs' recipe). Run in a subprocess: the device count
# is fixed when JAX starts.
_SHARDED_EQ = """
import json
import jax, jax.numpy as jnp, numpy as np
jax.config.update("jax_enable_x64", True)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from retrax.effects import ParametricEQ

eq = ParametricEQ([100.0, 1000.0, 8000.0], [3.0, -4.0, 2.0], [0.7, 1.2, 0.7])
x = jnp.asarray(np.random.default_rng(0).standard_normal((16, 256)))

def loss(eq, x):
    return jnp.mean(jax.vmap(eq)(x) ** 2)

grad = jax.jit(jax.grad(loss))
want = grad(eq, x)

def error(got):
    return max(
        float(jnp.max(jnp.abs(g - w)) / jnp.max(jnp.abs(w)))
        for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want))
    )

errors = {}
mesh = Mesh(np.array(jax.devices()), ("batch",))
put = lambda v, spec: jax.device_put(v, NamedSharding(mesh, spec))
errors["auto"] = error(grad(put(eq, P()), put(x, P("batch"))))
mesh = jax.make_mesh((8,), ("batch",))
with jax.set_mesh(mesh):
    eq_r, x_s = jax.device_put(eq, P()), jax.device_put(x, P("batch"))
    errors["explicit"] = error(grad(eq_r, x_s))
print("RESULT " + json.dumps({"devices": jax.device_count(), "errors": errors}))
"""


@pytest.mark.full
def test_sharded_gradient_of_a_replicated_eq_equals_one_devices():
    # Under an explicit mesh the sections' expansion `vmap`ped a broadcast
    # (unsharded) coefficient batch against the sharded signals: "Mapped
    # away dimension of inputs passed to vmap should be sharded the same".
    import json
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).parents[2]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env["XLA_FLAGS"] = " ".join(
        [env.get("XLA_FLAGS", ""), "--xla_force_host_platform_device_count=8"]
    ).strip()
    env["PYTHONPATH"] = os.pathsep.join(
        [str(root / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    proc = subprocess.run(
        [sys.executable, "-c", _SHARDED_EQ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert result["devices"] == 8
    for mesh, err in result["errors"].items():
        assert err <= 1e-12, (mesh, err)
