"""Dynamics: conversions and gain computers against closed forms and naive loops."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import signal_cases
from helpers import (
    assert_close,
    check_float32,
    check_grads,
    np_compexp_gain,
    np_gain_computer,
    np_limiter_gain,
    raises_eagerly_and_under_jit,
    unchecked,
)
from retrax.dynamics import (
    amp2db,
    avg,
    coef2ms,
    compexp_gain,
    db2amp,
    limiter_gain,
    ms2coef,
)
from retrax.ops import (
    ballistics,
)


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def test_conversions():
    assert_close(amp2db(jnp.asarray([1.0, 10.0, 0.5])), [0.0, 20.0, 20 * np.log10(0.5)])
    assert_close(db2amp(jnp.asarray([-6.0, 0.0])), [10 ** (-6 / 20), 1.0])
    assert_close(db2amp(amp2db(jnp.asarray([0.3, 2.0]))), [0.3, 2.0])
    assert float(amp2db(jnp.asarray(0.0))) == -np.inf
    assert_close(amp2db(jnp.asarray(0.0), floor=1e-10), -200.0)
    ms = jnp.asarray([1.0, 10.0, 250.0])
    assert_close(ms2coef(ms, 44_100), 1 - np.exp(-2200 / (np.asarray(ms) * 44_100)))
    assert_close(coef2ms(ms2coef(ms, 48_000), 48_000), ms, rtol=1e-12)
    check_grads(lambda m: coef2ms(ms2coef(m, 16_000), 16_000), (ms,))


@pytest.mark.full
def test_avg_matches_loop_and_streams():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0, 1, 64))
    c = 0.2
    expected, prev = [], 0.0
    for v in np.asarray(x):
        prev = c * v + (1 - c) * prev
        expected.append(prev)
    assert_close(avg(x, c), np.asarray(expected))
    y1, z = avg(x[:20], c, return_zf=True)
    y2 = avg(x[20:], c, z)
    assert_close(jnp.concatenate([y1, y2]), np.asarray(expected))
    check_grads(lambda x, c: avg(x, c), (x[:10], jnp.asarray(0.3)))


def _level_signal(rng, length):
    # A level that crosses both thresholds, away from exact corners.
    env = np.abs(np.sin(np.linspace(0, 3 * np.pi, length))) + 0.01
    return jnp.asarray(env * rng.uniform(0.8, 1.2, length))


def test_compexp_gain_matches_reference():
    rng = np.random.default_rng(1)
    x = _level_signal(rng, 400)
    params = (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05)
    assert_close(compexp_gain(x, *params), np_compexp_gain(x, *params))


def test_compexp_gain_soft_knee_matches_reference():
    # Levels through both knees, some at (up to rounding) the thresholds and
    # the knees' ends; widths below, at and above the thresholds' distance
    # (18 dB), where the two knees meet.
    rng = np.random.default_rng(5)
    levels = np.concatenate(
        [
            np.linspace(-60.0, 6.0, 200),
            [-12.0, -9.0, -15.0, -30.0, -27.0, -33.0, -24.0],
            rng.uniform(-50.0, 0.0, 50),
        ]
    )
    x = jnp.asarray(10 ** (levels / 20))
    params = (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05)
    f = jax.jit(lambda x, k: compexp_gain(x, *params, knee_db=k))
    for knee in (0.0, 6.0, 18.0, 30.0):
        assert_close(f(x, knee), np_compexp_gain(x, *params, knee=knee), rtol=1e-12)
    # inside the knee the curve differs from the hard one; outside it does not
    hard, soft = np.asarray(f(x, 0.0)), np.asarray(f(x, 6.0))
    assert np.max(np.abs(soft - hard)) > 1e-3
    # per-sample widths, the static curve alone (instant ballistics)
    knees = rng.uniform(0.0, 20.0, x.shape[0])
    static = jax.jit(lambda x, k: compexp_gain(x, *params[:4], 1.0, 1.0, knee_db=k))
    want = 10 ** (np_gain_computer(levels, *params[:4], knees) / 20)
    assert_close(static(x, jnp.asarray(knees)), want, rtol=1e-12)


def test_limiter_gain_matches_reference():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(400)) * 0.8
    params = (-6.0, 0.4, 0.02)
    assert_close(limiter_gain(x, *params), np_limiter_gain(x, *params))


@pytest.mark.full
def test_streaming_gain_computers():
    rng = np.random.default_rng(3)
    x = _level_signal(rng, 100)
    params = (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05)
    full = compexp_gain(x, *params)
    g1, z = compexp_gain(x[:37], *params, return_zf=True)
    g2 = compexp_gain(x[37:], *params, zi=z)
    assert_close(jnp.concatenate([g1, g2]), full)
    y = jnp.asarray(rng.standard_normal(100))
    full = limiter_gain(y, -3.0, 0.3, 0.05)
    l1, z = limiter_gain(y[:50], -3.0, 0.3, 0.05, return_zf=True)
    l2 = limiter_gain(y[50:], -3.0, 0.3, 0.05, zi=z)
    assert_close(jnp.concatenate([l1, l2]), full)


@pytest.mark.full
def test_gradients_of_every_parameter():
    rng = np.random.default_rng(4)
    x = _level_signal(rng, 12)
    args = tuple(jnp.asarray(v) for v in (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05))
    # The dB curve (log10, then 10**) is strongly curved: the default step's
    # second-order truncation error is ~1e-5, a step of 1e-6 brings it to ~1e-9.
    check_grads(compexp_gain, (x, *args), eps=1e-6)
    y = jnp.asarray(rng.standard_normal(12))
    check_grads(
        limiter_gain, (y, jnp.asarray(-4.0), jnp.asarray(0.3), jnp.asarray(0.05))
    )


@pytest.mark.slow
def test_soft_knee_gradients():
    # Second order, both modes, in every argument, with levels inside both
    # knees (-12 +- 4 dB and -30 +- 4 dB) and outside them.
    levels = np.array([-20.0, -13.0, -10.5, -8.5, -6.0, -29.0, -31.5, -40.0, -11.0])
    x = jnp.asarray(10 ** (levels / 20))
    args = tuple(jnp.asarray(v) for v in (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05, 8.0))

    def f(x, ct, cr, et, er, at, rt, knee):
        return compexp_gain(x, ct, cr, et, er, at, rt, knee_db=knee)

    check_grads(f, (x, *args), eps=1e-6)


@pytest.mark.parametrize("signal", ["silent", "silent_start", "constant"])
def test_gradients_finite_on_silence_and_constants(signal):
    x = {
        "silent": jnp.zeros(64),
        "silent_start": jnp.concatenate([jnp.zeros(16), jnp.ones(48) * 0.9]),
        "constant": jnp.full(64, 0.5),
    }[signal]

    def loss(x, thr, at, rt):
        return jnp.sum(limiter_gain(x, thr, at, rt)) + jnp.sum(
            compexp_gain(jnp.abs(x), thr, 3.0, -40.0, 0.5, at, rt)
        )

    grads = jax.grad(loss, argnums=(0, 1, 2, 3))(x, -6.0, 0.3, 0.05)
    for g in grads:
        assert bool(jnp.all(jnp.isfinite(g)))


def test_float32_and_vmap():
    x = jnp.abs(jax.random.normal(jax.random.key(0), (3, 50), jnp.float32)) + 0.01
    out = jax.jit(
        jax.vmap(lambda x: compexp_gain(x, -10.0, 4.0, -40.0, 0.5, 0.2, 0.05))
    )(x)
    assert out.dtype == jnp.float32 and out.shape == (3, 50)
    thr = jnp.asarray([-3.0, -6.0, -9.0], jnp.float32)
    out = jax.vmap(lambda x, t: limiter_gain(x, t, 0.3, 0.05))(x, thr)
    assert out.dtype == jnp.float32


def test_bad_input():
    x = jnp.ones(8)
    with pytest.raises(eqx.EquinoxRuntimeError, match="comp_ratio"):
        compexp_gain(x, -10.0, 0.5, -40.0, 0.5, 0.2, 0.05)
    with pytest.raises(eqx.EquinoxRuntimeError, match="exp_ratio"):
        compexp_gain(x, -10.0, 4.0, -40.0, 2.0, 0.2, 0.05)
    for knee in (-1.0, np.nan, np.inf):
        raises_eagerly_and_under_jit(
            lambda k: compexp_gain(x, -10.0, 4.0, -40.0, 0.5, 0.2, 0.05, knee_db=k),
            jnp.asarray(knee),
            match=r"`knee_db` must be finite and lie in \[0.0, inf\)",
        )
    with pytest.raises(eqx.EquinoxRuntimeError, match="threshold"):
        limiter_gain(x, 3.0, 0.2, 0.05)
    with pytest.raises(eqx.EquinoxRuntimeError, match="coef"):
        avg(x, 0.0)
    with pytest.raises(ValueError, match="`x` must be one signal"):
        unchecked(limiter_gain)(jnp.ones((2, 8)), -3.0, 0.2, 0.05)


T = 64


def _level(length):
    # A level that crosses both thresholds of the gain computers below.
    env = np.abs(np.sin(np.linspace(0.1, 3 * np.pi, length))) + 0.01
    return env * np.random.default_rng(6).uniform(0.8, 1.2, length)


@pytest.mark.float32
def test_compexp_gain():
    x = _level(T)
    params = (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05)
    check_float32(compexp_gain, (x, *params), np_compexp_gain(x, *params))
    # with a soft knee (8 dB) around both thresholds, its width differentiated

    def soft(x, *p):
        return compexp_gain(x, *p[:-1], knee_db=p[-1])

    want = np_compexp_gain(x, *params, knee=8.0)
    check_float32(soft, (x, *params, 8.0), want)


@pytest.mark.float32
def test_limiter_gain():
    x = _level(T) * 2.0
    check_float32(
        limiter_gain, (x, -3.0, 0.3, 0.05), np_limiter_gain(x, -3.0, 0.3, 0.05)
    )


SR = 8_000.0


V_T = 16


RUNTIME = eqx.EquinoxRuntimeError


X = jnp.asarray(np.random.default_rng(0).normal(size=V_T))


A_ = jnp.asarray  # noqa: N816


def _both(f, args, eager_exc, jit_exc, match):
    """`f(*args)` raises `eager_exc` eagerly and `jit_exc` under `filter_jit`,
    both with a message matching `match`."""
    with pytest.raises(eager_exc, match=match):
        f(*args)
    with pytest.raises(jit_exc, match=match):
        eqx.filter_jit(f)(*args)


@pytest.mark.loud
def test_zero_time_constant_is_instantaneous():
    # documented: ms = 0 gives c = 1 (no smoothing), and back
    assert float(ms2coef(0.0, 44_100)) == 1.0
    assert float(coef2ms(1.0, 44_100)) == 0.0
    x = jnp.abs(X)
    assert_close(ballistics(x, ms2coef(0.0, SR), ms2coef(0.0, SR)), x)


@pytest.mark.loud
def test_amp2db_checks():
    with pytest.raises(ValueError, match="`floor`"):
        amp2db(jnp.ones(3), floor=-1.0)
    _both(amp2db, (A_([1.0, -0.5]),), RUNTIME, RUNTIME, "`x` must be non-negative")


class TestInputPolicy(signal_cases.InputPolicy):
    """The input policy shared by the signal-processing areas
    (signal_cases.py), over this area's functions."""

    area = "dynamics"
