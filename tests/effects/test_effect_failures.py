"""Quiet failures of the effects, each one loud now: a bad send level of the
stereo bus, a feedback gain out of range on a signal shorter than the
delay, an infinite longest delay, and equalisers built from huge
unconstrained vectors."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.effects as fx
from helpers import assert_close, raises_eagerly_and_under_jit, unchecked
from retrax.filters import ParametricEQ


def raises_eagerly_under_jit_and_grad(f, *args, match):
    """`raises_eagerly_and_under_jit`, and also under `jax.grad` of the sum
    of `f`'s output with respect to the first argument."""
    raises_eagerly_and_under_jit(f, *args, match=match)
    with pytest.raises(Exception, match=match):
        jax.grad(lambda a, *rest: jnp.sum(f(a, *rest)))(*args)


def _tracks(dtype=jnp.float64, tracks=3, time=64):
    rng = np.random.default_rng(0)
    return jnp.asarray(rng.standard_normal((tracks, 2, time)), dtype)


SEND = r"`send_db` must be finite send levels in dB"


@pytest.mark.loud
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1000.0])
def test_stereo_bus_refuses_sends_that_are_not_finite_gains(bad):
    # Before: an all-NaN or all-inf bus, eagerly and under jit (1000 dB:
    # 10**50 overflows float32, so the bus was inf there).
    x = _tracks(jnp.float32)
    send = jnp.asarray([0.0, bad, 0.0], jnp.float32)
    raises_eagerly_under_jit_and_grad(
        lambda s, x: fx.stereo_bus(x, s), send, x, match=SEND
    )


@pytest.mark.loud
def test_stereo_bus_send_limit_is_the_dtypes():
    # 1000 dB is a finite gain in float64 (1e50), 7000 dB is not; 700 dB is
    # one in float32 (1e35).
    x64 = _tracks(jnp.float64)
    y = fx.stereo_bus(x64, jnp.asarray([0.0, 1000.0, 0.0]))
    assert_close(y, 1e50 * x64[1], rtol=1e-12, atol=1e-12 * 1e50)
    raises_eagerly_and_under_jit(
        lambda s: fx.stereo_bus(x64, s), jnp.asarray([0.0, 7000.0, 0.0]), match=SEND
    )
    x32 = _tracks(jnp.float32)
    y32 = fx.stereo_bus(x32, jnp.asarray([0.0, 700.0, 0.0], jnp.float32))
    assert bool(jnp.all(jnp.isfinite(y32)))


@pytest.mark.loud
def test_stereo_bus_non_finite_sample_passes_through_to_its_sample():
    # A NaN sample of one track is that sample of the bus, nothing more: the
    # documented pass-through of non-finite signals.
    x = _tracks().at[1, 0, 5].set(jnp.nan)
    y = jax.jit(fx.stereo_bus)(x, jnp.zeros(3))
    finite = np.isfinite(np.asarray(y))
    assert not finite[0, 5]
    finite[0, 5] = True
    assert finite.all()
    clean = x.at[1, 0, 5].set(0.0)
    want = np.asarray(jnp.sum(clean, axis=0))
    got = np.asarray(y).copy()
    got[0, 5] = want[0, 5]
    assert_close(got, want, rtol=1e-12)


@pytest.mark.loud
def test_stereo_bus_layout():
    with pytest.raises(ValueError, match=r"`x` must be a stack of stereo tracks"):
        fx.stereo_bus(jnp.ones((2, 3, 8)), jnp.zeros(2))
    # time first: 100 tracks of 2 samples each
    with pytest.raises(ValueError, match=r"laid out \(tracks, 2, time\)"):
        fx.stereo_bus(jnp.ones((100, 2, 2)), jnp.zeros(100))
    # dasp's per-example sends (tracks, 1)
    with pytest.raises(ValueError, match=r"`send_db.ravel\(\)`"):
        unchecked(fx.stereo_bus)(jnp.ones((3, 2, 8)), jnp.zeros((3, 1)))


FEEDBACK = r"`feedback` must be finite and lie in \[0.0, 0.95\]"


@pytest.mark.loud
@pytest.mark.parametrize("length", [2048, 11_025, 11_026])
def test_feedback_delay_checks_feedback_on_short_signals(length):
    # Before: a signal no longer than the delay never reads the feedback, so
    # under jit the check was optimised away and the call returned.
    x = jnp.asarray(np.random.default_rng(1).standard_normal((2, length)))
    for bad in (10.45, jnp.asarray(10.45), jnp.asarray(np.nan)):
        effect = eqx.tree_at(lambda m: m.feedback, fx.FeedbackDelay(), bad)
        with pytest.raises(Exception, match=FEEDBACK):
            effect(x)
        with pytest.raises(Exception, match=FEEDBACK):
            eqx.filter_jit(lambda m, x: m(x))(effect, x)
    effect = eqx.tree_at(lambda m: m.feedback, fx.FeedbackDelay(), jnp.asarray(2.0))
    with pytest.raises(Exception, match=FEEDBACK):
        jax.grad(lambda x: jnp.sum(eqx.filter_jit(lambda m, x: m(x))(effect, x)))(x)


def test_feedback_delay_short_signal_is_the_dry_mix():
    # the output a valid gain gives on a short signal: no echo yet
    x = jnp.asarray(np.random.default_rng(2).standard_normal(300))
    effect = fx.FeedbackDelay(feedback=0.7, mix=0.25, delay_samples=300)
    assert_close(jax.jit(lambda x: effect(x))(x), 0.75 * x, rtol=1e-14)


@pytest.mark.loud
@pytest.mark.parametrize("bad", [np.inf, np.nan, -np.inf, 0.0, -1.0])
def test_delay_max_delay_ms_names_the_argument(bad):
    # Before: "A range needs finite ends, got Range(...)", naming nothing.
    with pytest.raises(ValueError, match=r"`max_delay_ms` must be a finite number"):
        fx.Delay(max_delay_ms=bad)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_eq_huge_unconstrained_entries_give_finite_sections(ordered, dtype):
    # Before: the gains were the entries themselves, and 1e6 dB made the
    # sections' 10**(g / 40) overflow (and, ordered, float32 rounded the top
    # frequency onto Nyquist, which the call refused).
    eq = ParametricEQ(
        [100.0, 1_000.0, 5_000.0], [3.0, -6.0, 12.0], [0.7, 2.0, 0.7], ordered=ordered
    )
    x = jnp.asarray(np.random.default_rng(3).standard_normal(256), dtype)
    for value in (1e6, -1e6, 3e38, -3e38):
        theta = jnp.full((9,), value, dtype).at[4].set(-value)
        built = eq.with_unconstrained(theta)
        assert bool(jnp.all(jnp.isfinite(built.sos)))
        assert bool(jnp.all(jnp.isfinite(built(x))))
        gains = np.asarray(built.gains_db)
        assert np.all(np.abs(gains) <= 60.0) and abs(gains[0]) == pytest.approx(60)


def test_eq_unconstrained_gains_round_trip_and_are_near_identity():
    eq = ParametricEQ([100.0, 1_000.0, 5_000.0], [3.0, -6.0, 40.0], [0.7, 2.0, 0.7])
    theta = eq.to_unconstrained()
    # G artanh(g / G), G = 60 dB: about the gain itself near 0 dB
    want = 60.0 * np.arctanh(np.asarray([3.0, -6.0, 40.0]) / 60.0)
    assert_close(theta[3:6], want, rtol=1e-13)
    assert_close(eq.with_unconstrained(theta).gains_db, eq.gains_db, rtol=1e-13)
    # a gain set beyond the map's reach comes back at its end
    far = eqx.tree_at(lambda e: e.gains_db, eq, jnp.asarray([0.0, 80.0, -80.0]))
    back = eq.with_unconstrained(far.to_unconstrained())
    assert_close(back.gains_db, jnp.asarray([0.0, 60.0, -60.0]), rtol=1e-12)
