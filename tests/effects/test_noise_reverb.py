"""`retrax.effects.NoiseShapedReverb`: the filtered-noise reverb.

Its band filters against `scipy.signal.firwin` (dasp-pytorch's octave bank),
its output against a numpy construction (valid correlations of the white
noise with the band filters, the envelopes, `np.convolve`), streaming in
blocks against one call, derivatives against finite differences (second
order, both modes), the normalised parameters and ensembles, and bad
arguments, eagerly and under `jit`.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from helpers import assert_close, check_grads, raises_eagerly_and_under_jit, unchecked
from retrax import effects as fx
from retrax.effects._noise_reverb import fft_size, firwin, octave_fir_bank


SR = 44_100.0
L, TAPS, T = 24, 7, 40


def np_bank(taps, sr):
    """dasp-pytorch's `octave_band_filterbank`, with scipy."""
    centres = [31.5, 63, 125, 250, 500, 1000, 2000, 4000, 8000, 16000]
    bank = [scipy.signal.firwin(taps, 12, fs=sr)]
    for fc in centres:
        band = [fc / np.sqrt(2), np.clip(fc * np.sqrt(2), 0, 0.999 * sr / 2)]
        bank.append(scipy.signal.firwin(taps, band, fs=sr, pass_zero=False))
    bank.append(scipy.signal.firwin(taps, 18000, fs=sr, pass_zero=False))
    return np.stack(bank)


def np_reverb(x, white, gains, t60s, mix, sr, taps):
    """`(channels, T)` for a mono `x` `(T,)` and white noise `(C, 12, L + taps - 1)`."""
    bank = np_bank(taps, sr)
    noise = np.stack(
        [
            [np.correlate(w_b, f_b, "valid") for w_b, f_b in zip(w, bank, strict=True)]
            for w in white
        ]
    )
    n = np.arange(noise.shape[-1])
    envelopes = gains[:, None] * 10.0 ** (-3 * n / (sr * t60s[:, None]))
    ir = np.mean(envelopes * noise, axis=1)
    return np.stack([(1 - mix) * x + mix * np.convolve(x, h)[: len(x)] for h in ir])


RNG = np.random.default_rng(0)
WHITE = RNG.standard_normal((2, 12, L + TAPS - 1))
GAINS = RNG.uniform(0.2, 1.0, 12)
T60S = np.exp(RNG.uniform(np.log(0.05), np.log(10.0), 12))
MIX = 0.45
# the decay times give envelopes of 0.1 to 1 over the 24 samples at 44.1 kHz
T60S[:4] = [0.06, 0.08, 0.1, 0.2]


def _reverb(**kwargs):
    options = dict(white_noise=WHITE, length=L, n_taps=TAPS, sample_rate=SR)
    options.update(kwargs)
    return fx.NoiseShapedReverb(GAINS, T60S, MIX, **options)


@eqx.filter_jit
def apply(effect, x, zi=None):
    return effect(x, zi=zi, return_zf=True)


def test_band_filters_are_scipys_firwin_and_dasps_bank():
    for sr in (44_100, 48_000):
        for taps in (7, 1023):
            assert_close(octave_fir_bank(taps, sr), np_bank(taps, sr), rtol=1e-13)
    assert_close(
        firwin(9, [100.0, 3000.0], pass_zero=True, sample_rate=8000),
        scipy.signal.firwin(9, [100.0, 3000.0], pass_zero=True, fs=8000),
        rtol=1e-13,
    )
    assert [fft_size(n) for n in (1, 7, 88_199, 109_635)] == [1, 8, 90_000, 110_592]


@pytest.mark.full
def test_matches_the_numpy_construction():
    x = RNG.standard_normal(T)
    want = np_reverb(x, WHITE, GAINS, T60S, MIX, SR, TAPS)
    reverb = _reverb()
    y, zf = apply(reverb, jnp.asarray(x))
    assert_close(y, want, rtol=1e-12)
    assert zf.shape == (2, L - 1)
    # without the state: the short-convolution path
    assert_close(eqx.filter_jit(lambda e, x: e(x))(reverb, jnp.asarray(x)), want)
    # stereo input: each channel through its own response
    x2 = RNG.standard_normal((2, T))
    y2 = eqx.filter_jit(lambda e, x: e(x))(reverb, jnp.asarray(x2))
    for c in range(2):
        one = np_reverb(x2[c], WHITE, GAINS, T60S, MIX, SR, TAPS)[c]
        assert_close(y2[c], one, rtol=1e-12)
    # a mono reverb on a mono signal stays mono
    mono = _reverb(white_noise=WHITE[:1], channels=1)
    assert_close(mono(jnp.asarray(x)), want[0], rtol=1e-12)
    ir = reverb.impulse_response()
    assert ir.shape == (2, L)
    assert_close(y[:, 0], (1 - MIX) * x[0] + MIX * ir[:, 0] * x[0], rtol=1e-12)


def test_streaming_in_blocks_equals_one_call():
    reverb = _reverb()
    x = jnp.asarray(RNG.standard_normal(T))
    whole, zf = apply(reverb, x)
    _, zi = apply(reverb, x[:0])
    parts = []
    # blocks shorter than the response, so the state carries whole blocks
    for start in range(0, T, 10):
        y, zi = apply(reverb, x[start : start + 10], zi)
        parts.append(y)
    assert_close(jnp.concatenate(parts, axis=-1), whole, rtol=1e-12)
    assert_close(zi, zf, rtol=0)
    mono = _reverb(white_noise=WHITE[:1], channels=1)
    _, z1 = apply(mono, x[:25])
    y2, _ = apply(mono, x[25:], z1)
    assert z1.shape == (L - 1,)
    assert_close(y2, apply(mono, x)[0][25:], rtol=1e-12)


def _check_derivatives(order):
    reverb = _reverb()
    x = jnp.asarray(RNG.standard_normal(T))

    def f(p, x):
        return reverb.with_normalised(p)(x)

    check_grads(f, (reverb.to_normalised(), x), order=order, eps=1e-6)
    return reverb, x


@pytest.mark.slow
def test_second_order_derivatives():
    _check_derivatives(order=2)


@pytest.mark.full
def test_derivatives():
    reverb, x = _check_derivatives(order=1)
    # no gradient reaches the fixed noise
    grad = eqx.filter_grad(lambda e: jnp.sum(e(x) ** 2))(reverb)
    assert not np.any(grad.noise)
    assert np.all(np.abs(grad.band_gains) > 0)


@pytest.mark.full
def test_normalised_parameters_and_ensembles():
    reverb = _reverb()
    p = reverb.to_normalised()
    assert p.shape == (reverb.n_params,) == (25,)
    back = reverb.with_normalised(p)
    assert_close(back.t60s, T60S, rtol=1e-13)
    assert_close(back.band_gains, GAINS, rtol=1e-13)
    built = fx.NoiseShapedReverb.from_normalised(
        jnp.full(25, 0.5), key=jax.random.key(1), length=L, n_taps=TAPS
    )
    assert_close(built.t60s, np.full(12, math.sqrt(0.05 * 10.0)), rtol=1e-14)
    assert built.noise.shape == (2, 12, L)
    # an ensemble of rooms, one key each, built under jit
    keys = jax.random.split(jax.random.key(2), 3)
    rooms = eqx.filter_jit(
        eqx.filter_vmap(
            lambda k: fx.NoiseShapedReverb(key=k, length=L, n_taps=TAPS, channels=1)
        )
    )(keys)
    x = jnp.asarray(RNG.standard_normal(T))
    ys = eqx.filter_vmap(lambda e: e(x))(rooms)
    one = fx.NoiseShapedReverb(key=keys[1], length=L, n_taps=TAPS, channels=1)
    assert_close(ys[1], one(x), rtol=1e-12)
    assert np.max(np.abs(ys[0] - ys[1])) > 1e-3


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match=r"`band_gains` must be finite and lie in"):
        fx.NoiseShapedReverb(1.5, white_noise=WHITE, length=L, n_taps=TAPS)
    with pytest.raises(ValueError, match=r"`t60s` must be a scalar or hold one value"):
        fx.NoiseShapedReverb(0.5, np.ones(3), key=jax.random.key(0))
    with pytest.raises(ValueError, match=r"`n_taps` must be odd"):
        fx.NoiseShapedReverb(key=jax.random.key(0), n_taps=8)
    with pytest.raises(ValueError, match=r"`sample_rate` must exceed 36 kHz"):
        fx.NoiseShapedReverb(key=jax.random.key(0), sample_rate=16_000)
    with pytest.raises(ValueError, match=r"exactly one of `key` and `white_noise`"):
        fx.NoiseShapedReverb()
    with pytest.raises(ValueError, match=r"`white_noise` must have shape"):
        _reverb(white_noise=WHITE[:, :, :-1])
    reverb = _reverb()
    with pytest.raises(ValueError, match=r"this reverb's 2 channels"):
        unchecked(type(reverb).__call__)(reverb, jnp.zeros((3, T)))
    with pytest.raises(ValueError, match=r"`zi` must have shape \(2, 23\)"):
        unchecked(type(reverb).__call__)(reverb, jnp.zeros(T), zi=jnp.zeros(23))
    # traced constructor values and parameters moved out of range: run-time errors
    raises_eagerly_and_under_jit(
        lambda m: (
            fx.NoiseShapedReverb(
                0.5, 1.0, m, white_noise=WHITE, length=L, n_taps=TAPS
            ).mix
        ),
        1.5,
        match="`mix` must be",
    )
    bad = eqx.tree_at(lambda e: e.t60s, reverb, jnp.full(12, 20.0))
    raises_eagerly_and_under_jit(
        lambda e, x: e(x), bad, jnp.zeros(T), match="`t60s` must be"
    )
    raises_eagerly_and_under_jit(
        lambda p: reverb.with_normalised(p), jnp.full(25, 1.5), match=r"`p`"
    )


@pytest.mark.float32
def test_float32_values_and_gradient():
    x = RNG.standard_normal(T)
    want = np_reverb(x, WHITE, GAINS, T60S, MIX, SR, TAPS)
    reverb = _reverb(white_noise=WHITE.astype(np.float32))
    y = reverb(jnp.asarray(x, jnp.float32))
    assert y.dtype == jnp.float32
    assert_close(y, want, rtol=1e-5)
    w = jnp.asarray(RNG.standard_normal((2, T)), jnp.float32)
    grad = jax.grad(lambda p: jnp.sum(reverb.with_normalised(p)(x) * w))

    with jax.enable_x64(True):
        reverb64 = _reverb()
        grad64 = jax.grad(
            lambda p: jnp.sum(reverb64.with_normalised(p)(x) * np.asarray(w, float))
        )(reverb64.to_normalised())
    assert_close(grad(reverb.to_normalised()), grad64, rtol=1e-4)
