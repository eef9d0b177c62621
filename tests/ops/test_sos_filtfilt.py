import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
import scipy.signal as ss

from helpers import (
    assert_close,
    check_float32,
    check_grads,
    stable_poly,
    unchecked,
)
from retrax.ops import (
    filtfilt,
    freqz,
    freqz_sos,
    sosfilt,
    sosfilt_zi,
    sosfiltfilt,
    sosfreqz,
)


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def designs():
    for order in (1, 4, 12):
        yield ss.butter(order, 0.1, output="sos")
        yield ss.butter(order, [0.05, 0.3], btype="band", output="sos")
        yield ss.cheby1(order, 1.0, 0.2, btype="high", output="sos")
        yield ss.cheby2(order, 40.0, 0.25, output="sos")


@pytest.mark.slow
def test_sosfilt_matches_scipy_designs():
    rng = np.random.default_rng(0)
    x = rng.normal(size=256)
    for sos in designs():
        assert_close(sosfilt(sos, x), ss.sosfilt(sos, x))
        # steady-state start, as scipy users write it
        zi = ss.sosfilt_zi(sos) * x[0]
        assert_close(sosfilt_zi(sos), ss.sosfilt_zi(sos))
        ref, ref_zf = ss.sosfilt(sos, x, zi=zi)
        y, zf = sosfilt(sos, x, zi=zi)
        assert_close(y, ref)
        for s in range(sos.shape[0]):
            assert_close(zf[s], ref_zf[s])


@hypothesis.settings(deadline=None, max_examples=20)
@hypothesis.given(n_sections=st.integers(1, 3), seed=st.integers(0, 2**31))
def test_sosfilt_matches_scipy_random(n_sections, seed):
    rng = np.random.default_rng(seed)
    sos = np.concatenate(
        [
            rng.normal(size=(n_sections, 3)),
            np.ones((n_sections, 1)),
            np.stack([stable_poly(rng, 2) for _ in range(n_sections)]),
        ],
        axis=1,
    )
    x = rng.normal(size=64)
    zi = rng.normal(size=(n_sections, 2))
    ref, ref_zf = ss.sosfilt(sos, x, zi=zi)
    y, zf = sosfilt(sos, x, zi=zi)
    assert_close(y, ref)
    for s in range(n_sections):
        assert_close(zf[s], ref_zf[s])


def test_sosfilt_streaming():
    rng = np.random.default_rng(1)
    sos = ss.butter(6, 0.2, output="sos")
    x = rng.normal(size=40)
    zi = ss.sosfilt_zi(sos) * x[0]
    ref, ref_zf = sosfilt(sos, x, zi=zi)
    z, ys = jnp.asarray(zi), []
    for lo, hi in [(0, 1), (1, 2), (2, 15), (15, 40)]:
        yk, z = sosfilt(sos, x[lo:hi], zi=z)
        ys.append(yk)
    assert_close(jnp.concatenate(ys), ref)
    for s in range(sos.shape[0]):
        assert_close(z[s], ref_zf[s])


def test_sosfilt_float32_jit_vmap():
    rng = np.random.default_rng(2)
    sos = ss.butter(4, 0.2, output="sos")
    x = rng.normal(size=(3, 128))
    f = jax.jit(jax.vmap(sosfilt, in_axes=(None, 0)))
    y = f(jnp.asarray(sos, jnp.float32), jnp.asarray(x, jnp.float32))
    assert y.dtype == jnp.float32
    assert_close(y, ss.sosfilt(sos, x), rtol=1e-5)
    y = jax.jit(sosfilt, static_argnums=2)(
        jnp.asarray(sos, jnp.float32), jnp.asarray(x.T, jnp.float32), 0
    )
    assert y.dtype == jnp.float32
    assert_close(y, ss.sosfilt(sos, x.T, axis=0), rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.full
def test_sosfilt_one_pass_matches_scipy_batched(dtype):
    # The cascade runs as one pass over the signal (on the CPU a compiled
    # loop: a fixed number of sections up to 8, any number past them, and a
    # batch in SIMD lanes of 4 or 8 signals with the rest one by one); every
    # path gives scipy's numbers, with and without a state, down to one sample.
    rng = np.random.default_rng(5)
    rtol = 1e-5 if dtype == np.float32 else 1e-12
    for n_sections in (1, 3, 9):
        sos = ss.butter(2 * n_sections, 0.2, output="sos")
        for shape, axis in [((11, 67), -1), ((67, 3), 0), ((1,), -1), ((2,), -1)]:
            x = rng.normal(size=shape)
            zshape = list(shape)
            zshape[axis] = 2
            zi = rng.normal(size=(n_sections, *zshape))
            ref, ref_zf = ss.sosfilt(sos, x, axis=axis, zi=zi)
            run = jax.jit(functools.partial(sosfilt, axis=axis))
            y, zf = run(sos.astype(dtype), x.astype(dtype), zi=zi.astype(dtype))
            assert y.dtype == zf.dtype == dtype
            assert_close(y, ref, rtol=rtol)
            assert_close(zf, ref_zf, rtol=rtol)
            y = run(sos.astype(dtype), x.astype(dtype))
            assert_close(y, ss.sosfilt(sos, x, axis=axis), rtol=rtol)


def test_sosfilt_vmap_over_sections():
    # A batch of cascades, each with its own coefficients, as one batch.
    rng = np.random.default_rng(6)
    sos = np.stack([ss.butter(4, f, output="sos") for f in (0.1, 0.2, 0.3)])
    x = rng.normal(size=(3, 50))
    zi = rng.normal(size=(3, 2, 2))
    y, zf = jax.jit(jax.vmap(lambda s, x, z: sosfilt(s, x, zi=z)))(sos, x, zi)
    for k in range(3):
        ref, ref_zf = ss.sosfilt(sos[k], x[k], zi=zi[k])
        assert_close(y[k], ref)
        assert_close(zf[k], ref_zf)


@pytest.mark.full
def test_sosfilt_grads():
    rng = np.random.default_rng(3)
    sos = jnp.asarray(ss.butter(4, 0.3, output="sos"))
    x = jnp.asarray(rng.normal(size=10))
    zi = jnp.asarray(rng.normal(size=(2, 2)))

    def f(sos_free, x, zi):
        # a0 = 1 is a constraint, not a free parameter: perturb the rest only
        sos = jnp.concatenate([sos_free[:, :3], jnp.ones((2, 1)), sos_free[:, 3:]], 1)
        y, zf = sosfilt(sos, x, zi=zi)
        return jnp.concatenate([y, zf.ravel()])

    free = jnp.concatenate([sos[:, :3], sos[:, 4:]], axis=1)
    check_grads(jax.jit(f), (free, x, zi), eps=1e-5)


def _scipy_cascade(sos, x):
    """scipy's definition of the sections, each row its own `lfilter`, which
    normalises it by its `a0` (scipy's `sosfilt` requires `a0 == 1`)."""
    for row in sos:
        x = ss.lfilter(row[:3], row[3:], x)
    return x


@pytest.mark.parametrize(
    "op, reference",
    [
        (sosfilt, _scipy_cascade),
        pytest.param(
            sosfiltfilt,
            lambda sos, x: ss.sosfiltfilt(sos / sos[:, 3:4], x),
            marks=pytest.mark.full,
        ),
    ],
    ids=["sosfilt", "sosfiltfilt"],
)
def test_sos_gradient_differentiates_the_normalisation_by_a0(op, reference):
    # Each row is the biquad (b0 + b1 z^-1 + b2 z^-2) / (a0 + a1 z^-1 +
    # a2 z^-2): a0 must be 1, and its derivative is that of the sections
    # normalised by it, as scipy's lfilter (and retrax's lfilter and
    # sosfreqz) differentiate a0. Every column of the gradient against
    # central differences of scipy's output (the a0 column was 0).
    rng = np.random.default_rng(4)
    sos = ss.butter(4, [0.1, 0.3], btype="band", output="sos")  # 4 sections
    x, w = rng.normal(size=60), rng.normal(size=60)
    grad = jax.jit(jax.grad(lambda s: jnp.sum(w * op(s, x))))(jnp.asarray(sos))
    eps, want = 1e-6, np.zeros_like(sos)
    for index in np.ndindex(*sos.shape):
        step = np.zeros_like(sos)
        step[index] = eps
        up, down = reference(sos + step, x), reference(sos - step, x)
        want[index] = np.sum(w * (up - down)) / (2 * eps)
    assert_close(grad, want, rtol=1e-7)
    # a row scaled as a whole is the same filter: the gradient is
    # orthogonal to each row
    assert_close(jnp.sum(grad * sos, axis=1), np.zeros(len(sos)), atol=1e-9)


def test_sosfilt_bad_input():
    sos = ss.butter(2, 0.2, output="sos")
    x = jnp.zeros(8)
    sosfilt_ = unchecked(sosfilt)
    with pytest.raises(ValueError, match="`sos`"):
        sosfilt_(jnp.ones((2, 5)), x)
    with pytest.raises(ValueError, match="`zi`"):
        sosfilt_(sos, x, zi=jnp.zeros((2, 2)))
    with pytest.raises(ValueError, match="`zi`"):
        sosfilt_(sos, x, zi=jnp.zeros(2))
    with pytest.raises(ValueError, match="`zi`"):
        sosfilt_(sos, jnp.zeros((3, 8)), zi=jnp.zeros((1, 2, 2)))
    with pytest.raises(ValueError, match="`zi`"):
        sosfilt_(sos, jnp.zeros((3, 8)), axis=0, zi=jnp.zeros((1, 3, 2)))
    with pytest.raises(ValueError, match="`axis`"):
        sosfilt_(sos, jnp.zeros((3, 8)), axis=2)
    unnormalised = np.array(sos) * 2.0
    with pytest.raises(Exception, match="a0"):
        sosfilt(unnormalised, x)
    with pytest.raises(Exception, match="a0"):
        jax.jit(sosfilt)(unnormalised, x)
    with pytest.raises(Exception, match="`sos` has non-finite"):
        jax.jit(sosfilt)(np.where(np.arange(6) == 1, np.nan, sos), x)


@pytest.mark.parametrize("padtype", ["odd", "even", "constant", None])
def test_filtfilt_matches_scipy(padtype):
    rng = np.random.default_rng(4)
    x = rng.normal(size=200)
    for b, a in [
        ss.butter(4, 0.2),
        ss.cheby1(3, 1.0, 0.3, btype="high"),
        ([0.5, 0.5], [1.0]),
    ]:
        b, a = np.asarray(b), np.asarray(a)
        ref = ss.filtfilt(b, a, x, padtype=padtype)
        assert_close(filtfilt(b, a, x, padtype=padtype), ref)
        ref = ss.filtfilt(b, a, x, padtype=padtype, padlen=7)
        assert_close(filtfilt(b, a, x, padtype=padtype, padlen=7), ref)


@hypothesis.settings(deadline=None, max_examples=20)
@hypothesis.given(
    order=st.integers(1, 4), n_zeros=st.integers(0, 4), seed=st.integers(0, 2**31)
)
@pytest.mark.full
def test_filtfilt_matches_scipy_random(order, n_zeros, seed):
    rng = np.random.default_rng(seed)
    a = stable_poly(rng, order)
    b = rng.normal(size=n_zeros + 1)
    x = rng.normal(size=64)
    a_full = 1.5 * np.r_[1.0, a]
    assert_close(filtfilt(b, a_full, x), ss.filtfilt(b, a_full, x))


@pytest.mark.full
def test_filtfilt_jit_vmap_float32_grads():
    rng = np.random.default_rng(5)
    b, a = ss.butter(2, 0.25)
    x = rng.normal(size=(2, 64))
    f = jax.jit(jax.vmap(filtfilt, in_axes=(None, None, 0)))
    y = f(
        jnp.asarray(b, jnp.float32),
        jnp.asarray(a, jnp.float32),
        jnp.asarray(x, jnp.float32),
    )
    assert y.dtype == jnp.float32
    assert_close(y, ss.filtfilt(b, a, x), rtol=1e-5)
    args = (jnp.asarray(b), jnp.asarray(a), jnp.asarray(x[0, :12]))
    check_grads(jax.jit(lambda b, a, x: filtfilt(b, a, x, padlen=3)), args, eps=1e-5)


def test_filtfilt_bad_input():
    b, a = ss.butter(2, 0.2)
    filtfilt_ = unchecked(filtfilt)
    with pytest.raises(ValueError, match="`x` must be longer than `padlen` = 9"):
        filtfilt(b, a, jnp.zeros(9))
    with pytest.raises(ValueError, match="`x` must be longer"):
        filtfilt(b, a, jnp.zeros(9), padlen=20)
    filtfilt(b, a, jnp.zeros(9), padtype=None)  # no extension: fine
    with pytest.raises(ValueError, match="padtype"):
        filtfilt_(b, a, jnp.zeros(30), padtype="reflect")
    with pytest.raises(ValueError, match="`a`"):
        filtfilt_(b, jnp.ones((30, 2)), jnp.zeros(30))
    with pytest.raises(Exception, match="`a` has non-finite"):
        filtfilt(b, np.array([np.inf, 0.1]), jnp.zeros(30))


@pytest.mark.full
def test_freqz_matches_scipy():
    b, a = ss.cheby1(4, 1.0, 0.3)
    for kwargs in [{}, {"whole": True}, {"fs": 48000}, {"include_nyquist": True}]:
        w, h = freqz(b, a, 64, **kwargs)
        w_ref, h_ref = ss.freqz(b, a, 64, **kwargs)
        assert_close(w, w_ref)
        assert_close(h, h_ref)
    freqs = np.linspace(0.0, 20000.0, 7)
    w, h = freqz(b, a, freqs, fs=44100.0)
    assert_close(h, ss.freqz(b, a, freqs, fs=44100.0)[1])
    assert_close(freqz(b, 1, 16)[1], ss.freqz(b, 1.0, 16)[1])
    assert_close(freqz(b)[1], ss.freqz(b)[1])
    sos = ss.butter(8, [0.1, 0.2], btype="band", output="sos")
    for kwargs in [{}, {"whole": True}, {"fs": 48000.0}]:
        w, h = freqz_sos(sos, 64, **kwargs)
        w_ref, h_ref = ss.freqz_sos(sos, 64, **kwargs)
        assert_close(sosfreqz(sos, 64, **kwargs)[1], h_ref)
        assert_close(w, w_ref)
        assert_close(h, h_ref)
    # Horner's rule at z = exp(-jw), as scipy's polyval: every point of a
    # section cascade's response, deep stopband included, relative to that
    # point, within 1e-12 of scipy's (a cosine and a sine of every k w was
    # 5e-12 off at order 8 and 1.5e-11 at order 12)
    for order in (2, 4, 8, 12):
        sos = ss.butter(order, 0.2, output="sos")
        h, h_ref = freqz_sos(sos, 512)[1], ss.freqz_sos(sos, 512)[1]
        np.testing.assert_allclose(np.asarray(h), h_ref, rtol=1e-12, atol=0)
    # differentiable in the coefficients, e.g. for a magnitude loss
    b, a = ss.butter(2, 0.3)
    args = (jnp.asarray(b), jnp.asarray(a))
    check_grads(lambda b, a: freqz(b, a, 16)[1], args, eps=1e-5)
    sos = ss.butter(4, 0.3, output="sos")

    def response(free):
        # a0 = 1 is a constraint, not a free parameter: perturb the rest only
        sos = jnp.concatenate([free[:, :3], jnp.ones((2, 1)), free[:, 3:]], axis=1)
        return freqz_sos(sos, 16)[1]

    free = np.concatenate([sos[:, :3], sos[:, 4:]], axis=1)
    check_grads(response, (jnp.asarray(free),), eps=1e-5)


T = 64


@pytest.mark.float32
def test_scipy_sosfilt_and_sosfiltfilt():
    rng = np.random.default_rng(9)
    sos = scipy.signal.butter(6, 0.2, output="sos")
    x = rng.standard_normal((2, T))
    check_float32(sosfilt, (sos, x), scipy.signal.sosfilt(sos, x))
    check_float32(sosfiltfilt, (sos, x), scipy.signal.sosfiltfilt(sos, x))


def test_programs_do_not_grow_with_the_sections():
    # every section at once: 2 sections and 12 compile to programs of one size
    x = jnp.ones(1000)

    def lines(fn, n_sections, *args):
        sos = jnp.tile(jnp.asarray([[1.0, 0.5, 0.2, 1.0, -0.5, 0.1]]), (n_sections, 1))
        program = jax.jit(lambda s: fn(s, *args)).lower(sos)
        return program.as_text().count("\n")

    for fn, args in [(sosfilt_zi, ()), (sosfiltfilt, (x,)), (sosfreqz, (64,))]:
        assert lines(fn, 2, *args) == lines(fn, 12, *args), fn.__name__
