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


# --- losses: sample rates and decay times ----------------------------------------


RATE = r"`sample_rate` must be a positive, finite number"


@pytest.mark.parametrize("rate", [np.inf, -np.inf, np.nan, 0.0, -8000.0])
def test_losses_refuse_a_sample_rate_that_is_not_finite_and_positive(rate):
    for make in [
        lambda: MelBandEnergyLoss(sample_rate=rate),
        lambda: OctaveBandEnergyLoss(rate),
        lambda: EnergyDecayLoss(sample_rate=rate),
        lambda: EnergyDecayLoss(sample_rate=rate, fraction=1),
    ]:
        with pytest.raises(ValueError, match=RATE):
            make()
    line = -60 * np.arange(400) / 8000 / 0.02
    with pytest.raises(ValueError, match=RATE):
        t60_from_edc(line, rate)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_t60_refuses_a_curve_with_nan(dtype, bad):
    fs = 48_000
    x = np.exp(-np.arange(fs) / 4000.0) * np.cos(np.arange(fs))
    edc = np.asarray(energy_decay_curve(x.astype(dtype)))
    t60 = float(t60_from_edc(edc, fs))  # the curve itself measures
    assert 0.5 < t60 < 0.6
    broken = edc.copy()
    broken[2000] = bad
    with pytest.raises(ValueError, match=r"`edc` holds NaN or \+inf entries"):
        t60_from_edc(broken, fs)
    with pytest.raises(Exception, match=r"`edc` holds NaN or \+inf entries"):
        jax.jit(lambda e: t60_from_edc(e, fs))(broken).block_until_ready()
    # -inf (no energy left, `eps=0`) is allowed
    tail = np.concatenate([edc, [-np.inf]]).astype(dtype)
    np.testing.assert_allclose(float(t60_from_edc(tail, fs)), t60, rtol=1e-6)


# --- float16 through the FFTs and the delay-network kernels -----------------------


@pytest.mark.parametrize("dtype", [jnp.float16, jnp.bfloat16])
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


def test_filter_modules_moved_out_of_range_raise_value_error_at_once():
    cases = [
        (SVF(1000.0, 1.0, 8000.0), lambda e: e.cutoff, 4_000.0, "`cutoff`"),
        (
            Biquad(jnp.asarray([0.5, 0.2, -0.1]), 0.7, 0.9),
            lambda e: e.radius,
            1.5,
            "`radius`",
        ),  # fmt: skip
        (
            ParametricEQ([20.0, 200.0, 2_000.0], sample_rate=8000.0),
            lambda e: e.qs,
            jnp.asarray([0.6, -1.0, 1.1]),
            "`qs`",
        ),  # fmt: skip
        (Compressor(), lambda e: e.ratio, 0.5, "`ratio`"),
    ]
    for effect, where, value, name in cases:
        bad = eqx.tree_at(where, effect, jnp.asarray(value))
        with pytest.raises(ValueError, match=rf"{name} must be finite and lie in"):
            bad.to_normalised()
        with pytest.raises(Exception, match=rf"{name} must be finite and lie in"):
            eqx.filter_jit(lambda e: e.to_normalised())(bad).block_until_ready()
        effect.to_normalised()  # the valid module
