"""Bad inputs to the effects, filters and losses fail loudly, naming the
argument: eagerly with `ValueError`/`TypeError`, under `jax.jit` at trace or
run time, never with a plausible wrong number."""

import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import unchecked
from retrax import effects as fx
from retrax.filters import SVF, Biquad, Compressor, ParametricEQ


def call(effect, x, **kwargs):
    """`effect(x, **kwargs)` without the test run's type checker (so that
    the library's own messages are what is tested)."""
    return unchecked(type(effect).__call__)(effect, x, **kwargs)


def jit_call(effect, x, **kwargs):
    """`call` under `jax.jit`, with the effect, `x` and `zi` traced."""
    return eqx.filter_jit(lambda e, x, kw: call(e, x, **kw))(effect, x, kwargs)


# --- parameters moved out of range; non-scalar parameters ----------------------


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_to_normalised_refuses_a_parameter_out_of_range(dtype):
    gain = eqx.tree_at(lambda e: e.gain_db, fx.Gain(1.0), jnp.asarray(100.0, dtype))
    with pytest.raises(ValueError, match=r"`gain_db` must be finite and lie in"):
        gain.to_normalised()
    with pytest.raises(Exception, match=r"`gain_db` must be finite and lie in"):
        eqx.filter_jit(lambda e: e.to_normalised())(gain)
    # t60 = 0 is outside FDNReverb's logarithmic range [0.05, 10] (its
    # normalised value would be -inf)
    with pytest.raises(ValueError, match=r"`t60`"):
        fx.FDNReverb(t60=0.0)
    reverb = eqx.tree_at(lambda e: e.t60, fx.FDNReverb(), jnp.asarray(0.0))
    with pytest.raises(ValueError, match=r"`t60` must be finite and lie in"):
        reverb.to_normalised()
    with pytest.raises(Exception, match=r"`t60` must be finite and lie in"):
        eqx.filter_jit(lambda e: e.to_normalised())(reverb)
    # in range: unchanged
    p = fx.Gain(jnp.asarray(12.0, dtype)).to_normalised()
    np.testing.assert_allclose(np.asarray(p), [0.75], rtol=1e-6)


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


# --- states of the wrong shape ---------------------------------------------------

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


# --- signals laid out (time, channels) -------------------------------------------


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
