import re

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal as ss

from helpers import (
    assert_close,
    check_float32,
    check_grads,
    check_signal_first,
    np_df2,
    stable_poly,
    unchecked,
)
from retrax.ops import fir, lfilter, lfilter_tv, lfilter_tv_zi, lfilter_zi, lfiltic


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def np_fir(b, x, zi):
    """y[t] = sum_k b[t, k] x[t - k] as a plain loop."""
    length = len(x)
    b = np.broadcast_to(b, (length, b.shape[-1]))
    past = list(zi)
    y = np.zeros(length, np.result_type(b, x, zi))
    for t in range(length):
        line = [x[t]] + past
        y[t] = sum(b[t, k] * line[k] for k in range(b.shape[1]))
        past = line[: len(zi)]
    return y


def jnp_df2(b, a, x, zi):
    """Direct form II unrolled in Python: differentiated by JAX step by step."""
    line = list(zi)
    ys = []
    for t in range(x.shape[0]):
        w = x[t] - sum(a[k] * line[k] for k in range(a.shape[0]))
        line = [w] + line
        ys.append(sum(b[k] * line[k] for k in range(b.shape[0])))
        line = line[: zi.shape[0]]
    return jnp.stack(ys)


def test_fir_matches_loop(getkey):
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    for b in (rng.normal(size=4), rng.normal(size=(12, 4)), rng.normal(size=1)):
        zi = rng.normal(size=b.shape[-1] - 1)
        assert_close(fir(x, b=b), np_fir(b, x, np.zeros_like(zi)))
        y, zf = fir(x, b=b, zi=zi, return_zf=True)
        assert_close(y, np_fir(b, x, zi))
        assert_close(zf, np.r_[x[::-1], zi][: len(zi)])
    b = rng.normal(size=3)
    assert_close(fir(x, b=b), ss.lfilter(b, [1.0], x))


def test_fir_streaming():
    rng = np.random.default_rng(1)
    x = rng.normal(size=20)
    for b in (rng.normal(size=5), rng.normal(size=(20, 5))):
        zi = rng.normal(size=4)
        ref, ref_zf = fir(x, b=b, zi=zi, return_zf=True)
        bs = [b[:2], b[2:9], b[9:]] if b.ndim == 2 else [b] * 3
        z = zi
        ys = []
        for bk, xk in zip(bs, (x[:2], x[2:9], x[9:]), strict=True):
            yk, z = fir(xk, b=bk, zi=z, return_zf=True)
            ys.append(yk)
        assert_close(jnp.concatenate(ys), ref)
        assert_close(z, ref_zf)


@hypothesis.settings(deadline=None, max_examples=15)
@hypothesis.given(
    order=st.integers(0, 4),
    n_zeros=st.integers(0, 4),
    seed=st.integers(0, 2**31),
    with_zi=st.booleans(),
)
@pytest.mark.full
def test_lfilter_matches_scipy(order, n_zeros, seed, with_zi):
    rng = np.random.default_rng(seed)
    a = stable_poly(rng, order) if order else np.zeros(0)
    b = rng.normal(size=n_zeros + 1)
    x = rng.normal(size=64)
    n_state = max(order, n_zeros)
    a0 = rng.uniform(0.5, 2.0)
    a_full = a0 * np.r_[1.0, a]
    if with_zi and n_state:
        zi = rng.normal(size=n_state)
        ref, ref_zf = ss.lfilter(b, a_full, x, zi=zi)
        y, zf = lfilter(b, a_full, x, zi=zi)
        assert_close(y, ref)
        assert_close(zf, ref_zf)
        # the time-varying form's delay line, with the same filter
        ref, ref_zf = np_df2(b / a0, a, x, zi)
        y, zf = lfilter_tv(x, b=b / a0, a=a, zi=zi, return_zf=True)
        assert_close(y, ref)
        assert_close(zf, ref_zf)
        past_y, past_x = rng.normal(size=n_state), rng.normal(size=n_state)
        ref = ss.lfiltic(b, a_full, past_y, past_x)
        assert_close(lfiltic(b, a_full, past_y, past_x), ref)
        assert_close(
            lfilter(b, a_full, x, zi=lfiltic(b, a_full, past_y, past_x))[0],
            ss.lfilter(b, a_full, x, zi=ref)[0],
        )
    else:
        ref = ss.lfilter(b, a_full, x)
        assert_close(lfilter(b, a_full, x), ref)
        assert_close(lfilter_tv(x, b=b / a0, a=a), ref)


def test_lfilter_tv_time_varying_matches_loop():
    rng = np.random.default_rng(2)
    length = 40
    a = np.stack([stable_poly(rng, 3) for _ in range(length)])
    b = rng.normal(size=(length, 3))
    x = rng.normal(size=length)
    zi = rng.normal(size=3)
    ref, ref_zf = np_df2(b, a, x, zi)
    y, zf = lfilter_tv(x, b=b, a=a, zi=zi, return_zf=True)
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    # mixed: constant numerator, time-varying denominator and the reverse
    assert_close(lfilter_tv(x, b=b[0], a=a, zi=zi), np_df2(b[0], a, x, zi)[0])
    assert_close(lfilter_tv(x, b=b, a=a[0], zi=zi), np_df2(b, a[0], x, zi)[0])


@pytest.mark.parametrize("time_varying", [False, True])
def test_lfilter_tv_streaming(time_varying):
    rng = np.random.default_rng(3)
    length = 30
    if time_varying:
        a = np.stack([stable_poly(rng, 2) for _ in range(length)])
        b = rng.normal(size=(length, 4))
    else:
        a, b = stable_poly(rng, 2), rng.normal(size=4)
    x = rng.normal(size=length)
    zi = rng.normal(size=3)
    ref, ref_zf = lfilter_tv(x, b=b, a=a, zi=zi, return_zf=True)
    cuts = [(0, 1), (1, 3), (3, 17), (17, 30)]
    z, ys = zi, []
    for lo, hi in cuts:
        ak, bk = (a[lo:hi], b[lo:hi]) if time_varying else (a, b)
        yk, z = lfilter_tv(x[lo:hi], b=bk, a=ak, zi=z, return_zf=True)
        ys.append(yk)
    assert_close(jnp.concatenate(ys), ref)
    assert_close(z, ref_zf)


def test_lfilter_streaming():
    rng = np.random.default_rng(3)
    a, b = np.r_[1.5, 1.5 * stable_poly(rng, 2)], rng.normal(size=4)
    x = rng.normal(size=(2, 30))
    zi = rng.normal(size=(2, 3))
    ref, ref_zf = lfilter(b, a, x, zi=zi)
    z, ys = zi, []
    for lo, hi in [(0, 1), (1, 3), (3, 17), (17, 30)]:
        yk, z = lfilter(b, a, x[:, lo:hi], zi=z)
        ys.append(yk)
    assert_close(jnp.concatenate(ys, axis=1), ref)
    assert_close(z, ref_zf)


@pytest.mark.full
def test_lfilter_zi_and_lfiltic_match_scipy():
    rng = np.random.default_rng(4)
    for order, n_zeros in [(2, 2), (4, 1), (1, 4), (3, 0)]:
        a = stable_poly(rng, order)
        b = rng.normal(size=n_zeros + 1)
        a_full = 0.7 * np.r_[1.0, a]
        n_state = max(order, n_zeros)
        assert_close(lfilter_zi(b, a_full), ss.lfilter_zi(b, a_full))
        df2 = lfilter_tv_zi(b, a)
        assert_close(df2, np.full(n_state, 1 / (1 + a.sum())))
        # a unit step from the steady state stays at the DC gain
        step = np.ones(16)
        dc = np.full(16, b.sum() / a_full.sum())
        assert_close(lfilter_tv(step, b=b, a=a, zi=df2), 0.7 * dc)
        assert_close(lfilter(b, a_full, step, zi=lfilter_zi(b, a_full))[0], dc)
        past_y = rng.normal(size=n_state - 1)  # shorter: zero padded
        past_x = rng.normal(size=n_state + 2)  # longer: truncated
        assert_close(
            lfiltic(b, a_full, past_y, past_x), ss.lfiltic(b, a_full, past_y, past_x)
        )
        assert_close(lfiltic(b, a_full, past_y), ss.lfiltic(b, a_full, past_y))


def test_lfilter_complex():
    rng = np.random.default_rng(5)
    a = stable_poly(rng, 3, complex_=True)
    b = rng.normal(size=3) + 1j * rng.normal(size=3)
    x = rng.normal(size=32) + 1j * rng.normal(size=32)
    zi = rng.normal(size=3) + 1j * rng.normal(size=3)
    ref, ref_zf = ss.lfilter(b, np.r_[1.0, a], x, zi=zi)
    y, zf = lfilter(b, np.r_[1.0, a], x, zi=zi)
    assert y.dtype == jnp.complex128
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    assert_close(lfilter_tv(x, b=b, a=a, zi=zi), np_df2(b, a, x, zi)[0])
    assert_close(fir(x, b=b), ss.lfilter(b, [1.0], x))
    # real coefficients with a complex signal promote to complex
    assert lfilter_tv(x, b=b.real, a=a.real).dtype == jnp.complex128
    assert lfilter(b.real, np.r_[1.0, a.real], x).dtype == jnp.complex128


def test_float32_jit_vmap():
    rng = np.random.default_rng(6)
    b, a = ss.butter(2, 0.2)
    x = rng.normal(size=(3, 128))
    ref = ss.lfilter(b, a, x)
    b32, a32, x32 = (jnp.asarray(v, jnp.float32) for v in (b, a, x))
    y = jax.jit(jax.vmap(lambda xx: lfilter_tv(xx, b=b32, a=a32[1:])))(x32)
    assert y.dtype == jnp.float32
    assert_close(y, ref, rtol=1e-5)
    y = jax.jit(lfilter)(b32, a32, x32)
    assert y.dtype == jnp.float32
    assert_close(y, ref, rtol=1e-5)
    y = jax.jit(jax.vmap(lambda x, b: fir(x, b=b), in_axes=(0, None)))(x32, b32)
    assert y.dtype == jnp.float32
    assert_close(y, ss.lfilter(b, [1.0], x), rtol=1e-5)


@pytest.mark.full
def test_fir_grads():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.normal(size=10))
    zi = jnp.asarray(rng.normal(size=2))
    for b in (rng.normal(size=3), rng.normal(size=(10, 3))):
        check_grads(
            jax.jit(lambda x, b, zi: fir(x, b=b, zi=zi)), (x, jnp.asarray(b), zi)
        )
    f = lambda b, x, zi: jnp.concatenate(fir(x, b=b, zi=zi, return_zf=True))
    check_grads(jax.jit(f), (jnp.asarray(rng.normal(size=3)), x, zi))


@pytest.mark.parametrize("batched", [False, True])
def test_constant_taps_transpose_in_the_signal_as_one_pass(batched):
    # The signal's cotangent of constant taps is the same sum of shifted
    # products read backwards in time (one fused pass), not the transpose of
    # padded slices (about three times the forward's cost): `lfilter`'s
    # gradient with respect to everything was 3.4x its forward at order 8.
    rng = np.random.default_rng(3)
    b = jnp.asarray(rng.normal(size=5))
    a = jnp.asarray([1.0, -0.5, 0.2, 0.0, 0.0])
    x = jnp.asarray(rng.normal(size=(3, 40) if batched else (40,)))

    def loss(x):
        y = jax.vmap(lambda s: lfilter(b, a, s))(x) if batched else lfilter(b, a, x)
        return jnp.sum(jnp.sin(y))

    grad = jax.grad(loss)(x)
    reference = jax.grad(
        lambda x: (
            jnp.sum(jnp.sin(jax.vmap(lambda s: np_df2_jax(b, a, s))(x)))
            if batched
            else jnp.sum(jnp.sin(np_df2_jax(b, a, x)))
        )
    )(x)
    assert_close(grad, reference, rtol=1e-12, atol=1e-12)
    text = str(jax.make_jaxpr(jax.grad(loss))(x))
    assert re.search(r"allpole_lag_drive_const\[\s*adjoint=True", text)


def np_df2_jax(b, a, x):
    """`lfilter` as a plain scan of direct form II transposed."""

    def step(z, xt):
        yt = b[0] * xt + z[0]
        z = jnp.concatenate([z[1:], jnp.zeros(1, x.dtype)]) + b[1:] * xt - a[1:] * yt
        return z, yt

    return jax.lax.scan(step, jnp.zeros(b.shape[0] - 1, x.dtype), x)[1]


@pytest.mark.parametrize("time_varying", [False, True])
@pytest.mark.full
def test_lfilter_tv_grads(time_varying):
    rng = np.random.default_rng(8)
    length = 10
    if time_varying:
        a = np.stack([stable_poly(rng, 2, radius=0.8) for _ in range(length)])
        b = rng.normal(size=(length, 3))
    else:
        a, b = stable_poly(rng, 2, radius=0.8), rng.normal(size=3)
    x = rng.normal(size=length)
    zi = rng.normal(size=2)

    def f(b, a, x, zi):
        y, zf = lfilter_tv(x, b=b, a=a, zi=zi, return_zf=True)
        return jnp.concatenate([y, zf])

    # second differences of a recursion have large third derivatives: a smaller
    # step keeps the finite-difference truncation error below the tolerance
    check_grads(jax.jit(f), tuple(jnp.asarray(v) for v in (b, a, x, zi)), eps=1e-5)


@pytest.mark.slow
def test_lfilter_tv_hessian_matches_naive_autodiff():
    rng = np.random.default_rng(10)
    a, b = jnp.asarray(stable_poly(rng, 2)), jnp.asarray(rng.normal(size=3))
    x, zi = jnp.asarray(rng.normal(size=10)), jnp.asarray(rng.normal(size=2))
    v = jnp.asarray(rng.normal(size=10))

    loss = lambda b, a, x, zi: lfilter_tv(x, b=b, a=a, zi=zi) @ v
    ref = lambda b, a, x, zi: jnp_df2(b, a, x, zi) @ v
    for argnum in range(4):
        assert_close(
            jax.hessian(loss, argnum)(b, a, x, zi),
            jax.hessian(ref, argnum)(b, a, x, zi),
        )


@pytest.mark.full
def test_lfilter_hessian_matches_naive_autodiff():
    """scipy's layout, with a[0]: the same filter as the unrolled loop."""
    rng = np.random.default_rng(11)
    a = jnp.asarray(1.3 * np.r_[1.0, stable_poly(rng, 2)])
    b = jnp.asarray(rng.normal(size=3))
    x = jnp.asarray(rng.normal(size=10))
    v = jnp.asarray(rng.normal(size=10))

    loss = lambda b, a, x: lfilter(b, a, x) @ v
    ref = lambda b, a, x: jnp_df2(b / a[0], a[1:] / a[0], x, jnp.zeros(2)) @ v
    for argnum in range(3):
        assert_close(
            jax.hessian(loss, argnum)(b, a, x), jax.hessian(ref, argnum)(b, a, x)
        )


def test_lfilter_tv_zi_grads():
    rng = np.random.default_rng(9)
    a, b = jnp.asarray(stable_poly(rng, 2)), jnp.asarray(rng.normal(size=3))
    check_grads(lfilter_tv_zi, (b, a), eps=1e-5)


def test_fir_and_lfilter_tv_take_the_signal_first():
    # taps as long as the signal: `fir(b, x)` read in the new order would run
    rng = np.random.default_rng(12)
    x = jnp.asarray(rng.normal(size=8))
    b = jnp.asarray(rng.normal(size=8))
    check_signal_first(fir, x, {"b": b}, jnp.asarray(rng.normal(size=7)))
    coefficients = {"b": b[:3], "a": jnp.asarray([-0.5, 0.2])}
    check_signal_first(lfilter_tv, x, coefficients, jnp.asarray(rng.normal(size=2)))


def test_bad_input():
    x = jnp.zeros(8)
    tv, fir_ = unchecked(lfilter_tv), unchecked(fir)
    with pytest.raises(ValueError, match="`x`"):
        tv(jnp.zeros((2, 8)), b=jnp.ones(2), a=jnp.ones(1))
    with pytest.raises(ValueError, match="`a`"):
        tv(x, b=jnp.ones(2), a=jnp.ones((7, 1)))
    with pytest.raises(ValueError, match="`b`"):
        tv(x, b=jnp.ones((8, 2, 1)), a=jnp.ones(1))
    with pytest.raises(ValueError, match="`zi`"):
        tv(x, b=jnp.ones(3), a=jnp.ones(1), zi=jnp.zeros(1))
    with pytest.raises(ValueError, match="`zi`"):
        tv(x, b=jnp.ones(3), a=jnp.ones(1), zi=jnp.zeros((2, 1)))
    with pytest.raises(TypeError, match="form"):
        tv(x, b=jnp.ones(3), a=jnp.ones(1), form="tdf2")
    with pytest.raises(ValueError, match="`zi`"):
        fir_(x, b=jnp.ones(3), zi=jnp.zeros(3))
    with pytest.raises(ValueError, match="`b`"):
        fir_(x, b=jnp.ones((5, 3)))
    with pytest.raises(ValueError, match="`y`"):
        unchecked(lfiltic)(jnp.ones(3), jnp.ones(1), jnp.ones((2, 2)))
    with pytest.raises(ValueError, match="`b`"):
        unchecked(lfilter_tv_zi)(jnp.ones((2, 2)), jnp.ones(1))
    bad = jnp.array([1.0, jnp.nan])
    with pytest.raises(Exception, match="`a` has non-finite"):
        lfilter_tv(x, b=jnp.ones(2), a=bad)
    with pytest.raises(Exception, match="`b` has non-finite"):
        jax.jit(fir)(x, b=jnp.array([1.0, jnp.inf]))
    with pytest.raises(Exception, match="`a` has non-finite"):
        jax.jit(lfilter_tv)(x, b=jnp.ones(2), a=bad)


T = 64


@pytest.mark.float32
@pytest.mark.parametrize("constant", [True, False])
def test_fir(constant):
    rng = np.random.default_rng(2)
    x, zi = rng.standard_normal(T), rng.standard_normal(3)
    b = rng.standard_normal(4) if constant else rng.standard_normal((T, 4))
    past = np.concatenate([zi[::-1], x])  # zi[k] = x[-k-1]
    bt = np.broadcast_to(b, (T, 4))
    ref = np.asarray([bt[t] @ past[t + 3 - np.arange(4)] for t in range(T)])
    check_float32(lambda b, x, zi: fir(x, b=b, zi=zi), (b, x, zi), ref)


@pytest.mark.float32
def test_lfilter_tv():
    rng = np.random.default_rng(11)
    b, a = (
        rng.standard_normal((T, 3)),
        np.stack([stable_poly(rng, 2, 0.9) for _ in range(T)]),
    )
    x = rng.standard_normal(T)
    # retrax's own convention: `a` without the leading 1, per-sample rows
    ref, w = [], np.zeros(2)
    for t in range(T):
        w0 = x[t] - a[t] @ w
        ref.append(b[t] @ np.r_[w0, w])
        w = np.r_[w0, w[:-1]]
    check_float32(lambda b, a, x: lfilter_tv(x, b=b, a=a), (b, a, x), np.asarray(ref))
