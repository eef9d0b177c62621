"""Oscillators: phase accumulation without drift, sine, FM operators."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import signal_cases
from helpers import assert_close, check_grads
from retrax.synth import fm_operator, phase, sine


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


SR = 44_100


def _circular_error(a, b):
    d = np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    return float(np.max(np.minimum(d, 1.0 - d)))


def _quantised_sweep(seconds, dtype=np.float32):
    """A vibrato plus a glide, in exact multiples of 1/1024 Hz.

    On that grid the exact phase is integer arithmetic: the reference below
    has no rounding error at all.
    """
    t = np.arange(round(seconds * SR))
    f = 440 + 30 * np.sin(2 * np.pi * 5 * t / SR) + 2000 * t / len(t)
    f = np.round(f * 1024) / 1024
    ticks = (f * 1024).astype(np.int64)
    den = SR * 1024
    exact = (np.concatenate([[0], np.cumsum(ticks)[:-1]]) % den) / den
    return f.astype(dtype), exact


def test_float32_phase_does_not_drift_over_minutes():
    f, exact = _quantised_sweep(180.0)
    p = jax.jit(lambda f: phase(f, SR))(jnp.asarray(f))
    assert p.dtype == jnp.float32
    assert float(jnp.min(p)) >= 0.0 and float(jnp.max(p)) < 1.0
    # Three minutes, 7.9 million samples: within two float32 roundings of 1.
    err = _circular_error(p, exact)
    assert err <= 2 * float(np.finfo(np.float32).eps), err
    # The case is a hard one: wrapping every sample without carrying the
    # rounding errors drifts by thousands of times more.
    inc = jnp.asarray(f) / jnp.float32(SR)

    def step(p, i):
        s = p + i
        return s - jnp.floor(s), p

    naive = jax.lax.scan(step, jnp.float32(0.0), inc)[1]
    assert _circular_error(naive, exact) > 1000 * err


def test_float64_phase():
    f, exact = _quantised_sweep(5.0, np.float64)
    p = phase(jnp.asarray(f), float(SR), 0.0)
    assert p.dtype == jnp.float64
    assert _circular_error(p, exact) <= 4 * float(np.finfo(np.float64).eps)


def test_phase0_negative_frequency_and_streaming():
    rng = np.random.default_rng(0)
    f = jnp.asarray(rng.uniform(-3000, 3000, 1000))
    p = phase(f, SR, 2.25)
    ref = np.concatenate([[2.25], 2.25 + np.cumsum(np.asarray(f) / SR)[:-1]])
    assert _circular_error(p, ref - np.floor(ref)) <= 1e-14
    assert float(p[0]) == 0.25
    full, zf = phase(f, SR, 2.25, return_zf=True)
    first, state = phase(f[:300], SR, 2.25, return_zf=True)
    second, zf_blocks = phase(f[300:], SR, state, return_zf=True)
    assert _circular_error(jnp.concatenate([first, second]), full) <= 1e-14
    assert _circular_error(zf_blocks, zf) <= 1e-14
    end = 2.25 + np.sum(np.asarray(f)) / SR
    assert _circular_error(zf, end - np.floor(end)) <= 1e-14


def test_sine_and_fm_operator_values():
    t = np.arange(2000)
    f = jnp.full(2000, 441.0)
    assert_close(sine(f, SR), np.sin(2 * np.pi * 441 * t / SR), atol=1e-12)
    # A two-operator stack against the closed form.
    mod = fm_operator(jnp.full(2000, 882.0), SR, level=2.0)
    out = fm_operator(f, SR, modulation=mod, level=0.5, phase0=0.25)
    ref = 0.5 * np.sin(
        2 * np.pi * (441 * t / SR + 0.25) + 2.0 * np.sin(2 * np.pi * 882 * t / SR)
    )
    assert_close(out, ref, atol=1e-11)


def test_float32_stays_float32():
    f = jnp.full(64, 440.0, jnp.float32)
    assert phase(f, SR).dtype == jnp.float32
    assert sine(f, 48_000.0, 0.5).dtype == jnp.float32
    assert fm_operator(f, SR, jnp.zeros(64, jnp.float32), 0.3).dtype == jnp.float32


# ---------------------------------------------------------------- derivatives


def test_phase_tangent_is_the_running_sum():
    rng = np.random.default_rng(1)
    f = jnp.asarray(rng.uniform(100, 5000, 300))
    df = jnp.asarray(rng.standard_normal(300))
    _, dp = jax.jvp(lambda f: phase(f, SR, 0.1), (f,), (df,))
    assert_close(dp, np.concatenate([[0.0], np.cumsum(np.asarray(df))[:-1]]) / SR)
    grad = jax.grad(lambda f: phase(f, SR)[-1])(f)
    assert_close(grad, np.concatenate([np.full(299, 1 / SR), [0.0]]))


@pytest.mark.full
def test_oscillator_check_grads():
    rng = np.random.default_rng(2)
    length = 12
    f = jnp.asarray(rng.uniform(1000, 4000, length))
    mod = jnp.asarray(rng.standard_normal(length))
    env = jnp.asarray(rng.uniform(0.1, 1.0, length))
    sr, p0 = jnp.asarray(8000.0), jnp.asarray(0.3)
    check_grads(fm_operator, (f, sr, mod, env, p0))
    check_grads(lambda f, p0: phase(f, SR, p0, return_zf=True)[1], (f, p0))


def test_vmap_and_jit():
    rng = np.random.default_rng(3)
    f = jnp.asarray(rng.uniform(100, 2000, (4, 100)))
    p0 = jnp.asarray(rng.uniform(0, 1, 4))
    batched = jax.jit(jax.vmap(lambda f, p: sine(f, SR, p)))(f, p0)
    for i in range(4):
        assert_close(batched[i], sine(f[i], SR, p0[i]), rtol=1e-14)


def test_bad_input():
    f = jnp.full(16, 440.0)
    # ValueError or TypeError from retrax; in this suite jaxtyping's runtime
    # checker may reject a wrong shape first, with a TypeError naming it.
    bad = (ValueError, TypeError)
    with pytest.raises(bad, match="freq"):
        phase(jnp.ones((2, 16)), SR)
    with pytest.raises(TypeError, match="freq"):
        phase(f.astype(jnp.complex128), SR)
    with pytest.raises(ValueError, match="sample_rate"):
        phase(f, -44_100.0)
    with pytest.raises(bad, match="sample_rate"):
        phase(f, jnp.ones(2))
    with pytest.raises(bad, match="phase0"):
        sine(f, SR, jnp.zeros(3))
    with pytest.raises(bad, match="modulation"):
        fm_operator(f, SR, modulation=jnp.zeros(15))
    with pytest.raises(bad, match="level"):
        fm_operator(f, SR, level=jnp.ones(3))
    # A non-finite frequency is a bad parameter, not a signal: it raises.
    with pytest.raises(eqx.EquinoxRuntimeError, match="`freq` must be finite"):
        eqx.filter_jit(phase)(f.at[5].set(jnp.nan), SR)


class TestInputPolicy(signal_cases.InputPolicy):
    """The input policy shared by the signal-processing areas
    (signal_cases.py), over this area's functions."""

    area = "synth"
