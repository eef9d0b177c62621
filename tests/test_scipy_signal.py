"""The scipy.signal names of retrax.ops against scipy.signal, with scipy's arguments."""

import functools

import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal as ss

from helpers import (
    allpole_eqns_in,
    assert_close,
    check_grads,
    scans_in,
    stable_poly,
    unchecked,
)
from retrax import ops


T = 48
# (len(b), len(a), signal shape, axis of time, dtype): a fixed pool, so that
# every function compiles once per entry, not once per example.
TF_POOL = [
    (3, 3, (T,), 0, np.float64),
    (1, 2, (T,), -1, np.float64),
    (5, 5, (T, 2), 0, np.float64),
    (4, 2, (3, T), 1, np.float64),
    (2, 5, (T, 2, 3), 0, np.float64),
    (3, 4, (2, T, 3), 1, np.float64),
    (5, 3, (2, 3, T), 2, np.float64),
    (3, 3, (2, T), -1, np.float32),
]
# (n_sections, signal shape, axis, dtype)
SOS_POOL = [
    (1, (T,), 0, np.float64),
    (2, (T, 2), 0, np.float64),
    (3, (2, T), -1, np.float64),
    (6, (2, 3, T), 2, np.float64),
    (6, (T, 2, 2), 0, np.float64),
    (3, (2, T, 3), 1, np.float64),
    (2, (T, 3), 0, np.float32),
]
# scipy's own functions, jitted once; compiled once per pool entry
jit = functools.partial(jax.jit, static_argnames=("axis", "padtype", "padlen"))
lfilter = jax.jit(ops.lfilter, static_argnames="axis")
lfilter_zi = jax.jit(ops.lfilter_zi)
lfiltic = jax.jit(ops.lfiltic)
filtfilt = jit(ops.filtfilt)
gust = jax.jit(ops.filtfilt, static_argnames=("axis", "method", "irlen"))
freqz = jax.jit(ops.freqz, static_argnames=("worN", "whole", "include_nyquist"))
sosfilt = jax.jit(ops.sosfilt, static_argnames="axis")
sosfilt_zi = jax.jit(ops.sosfilt_zi)
sosfiltfilt = jit(ops.sosfiltfilt)
freqz_sos = jax.jit(ops.freqz_sos, static_argnames=("worN", "whole"))
sosfreqz = jax.jit(ops.sosfreqz, static_argnames=("worN", "whole"))
allpole = jax.jit(ops.allpole)
fir = jax.jit(ops.fir)


def _tol(dtype):
    return 1e-4 if dtype == np.float32 else 1e-9


def _state_shape(shape, axis, length, lead=()):
    out = list(shape)
    out[axis] = length
    return tuple(lead) + tuple(out)


def _design(rng, n_sections):
    """A Butterworth, Chebyshev (I or II) or elliptic design of the given size."""
    order = 2 * n_sections - int(rng.integers(0, 2))
    kind = rng.choice(["butter", "cheby1", "cheby2", "ellip"])
    wn = float(rng.uniform(0.05, 0.45))
    btype = str(rng.choice(["lowpass", "highpass"]))
    if kind == "butter":
        return ss.butter(order, wn, btype, output="sos")
    if kind == "cheby1":
        return ss.cheby1(order, 1.0, wn, btype, output="sos")
    if kind == "cheby2":
        return ss.cheby2(order, 40.0, wn, btype, output="sos")
    return ss.ellip(order, 1.0, 40.0, wn, btype, output="sos")


@pytest.mark.slow
@hypothesis.settings(deadline=None, max_examples=200)
@hypothesis.given(case=st.sampled_from(TF_POOL), seed=st.integers(0, 2**32 - 1))
def test_transfer_functions_match_scipy(case, seed):
    n_b, n_a, shape, axis, dtype = case
    rng = np.random.default_rng(seed)
    a0 = rng.choice([-1.0, 1.0]) * rng.uniform(0.3, 3.0)  # never exactly 1
    a = a0 * np.r_[1.0, stable_poly(rng, n_a - 1)]
    b = rng.normal(size=n_b)
    x = rng.normal(size=shape)
    n_state = max(n_a, n_b) - 1
    zi = rng.normal(size=_state_shape(shape, axis, n_state))
    tol = _tol(dtype)
    cast = lambda v: jnp.asarray(v, dtype)

    y = lfilter(cast(b), cast(a), cast(x), axis=axis)
    assert y.dtype == dtype
    assert_close(y, ss.lfilter(b, a, x, axis=axis), rtol=tol)
    y, zf = lfilter(cast(b), cast(a), cast(x), axis=axis, zi=cast(zi))
    ref, ref_zf = ss.lfilter(b, a, x, axis=axis, zi=zi)
    assert_close(y, ref, rtol=tol)
    assert_close(zf, ref_zf, rtol=tol)
    w, h = freqz(cast(b), cast(a), 64)
    w_ref, h_ref = ss.freqz(b, a, 64)
    assert_close(w, w_ref, rtol=tol)
    assert_close(h, h_ref, rtol=tol)
    # the time-first ops through their scipy equivalents, on one signal
    signal = np.moveaxis(x, axis, 0).reshape(T, -1)[:, 0]
    a_norm = a[1:] / a[0]
    assert_close(
        allpole(cast(signal), cast(a_norm)), ss.lfilter([1.0], [1.0, *a_norm], signal),
        rtol=tol,
    )  # fmt: skip
    assert_close(fir(cast(b), cast(signal)), ss.lfilter(b, [1.0], signal), rtol=tol)
    if dtype == np.float32:
        return  # the rest in float64, the precision scipy computes in
    assert_close(lfilter_zi(b, a), ss.lfilter_zi(b, a), rtol=tol)
    past_y, past_x = rng.normal(size=n_state + 1), rng.normal(size=n_state + 1)
    assert_close(
        lfiltic(b, a, past_y, past_x), ss.lfiltic(b, a, past_y, past_x), rtol=tol
    )
    for padtype in ("odd", "even", "constant", None):
        ref = ss.filtfilt(b, a, x, axis=axis, padtype=padtype)
        assert_close(filtfilt(b, a, x, axis=axis, padtype=padtype), ref, rtol=tol)
    ref = ss.filtfilt(b, a, x, axis=axis, padlen=5)
    assert_close(filtfilt(b, a, x, axis=axis, padlen=5), ref, rtol=tol)
    for irlen in (None, 12):
        ref = ss.filtfilt(b, a, x, axis=axis, method="gust", irlen=irlen)
        y = gust(b, a, x, axis=axis, method="gust", irlen=irlen)
        assert_close(y, ref, rtol=tol)


@pytest.mark.slow
@hypothesis.settings(deadline=None, max_examples=200)
@hypothesis.given(case=st.sampled_from(SOS_POOL), seed=st.integers(0, 2**32 - 1))
def test_second_order_sections_match_scipy(case, seed):
    n_sections, shape, axis, dtype = case
    rng = np.random.default_rng(seed)
    sos = _design(rng, n_sections)
    x = rng.normal(size=shape)
    zi = rng.normal(size=_state_shape(shape, axis, 2, lead=(n_sections,)))
    tol = _tol(dtype)
    cast = lambda v: jnp.asarray(v, dtype)

    y = sosfilt(cast(sos), cast(x), axis=axis)
    assert y.dtype == dtype
    assert_close(y, ss.sosfilt(sos, x, axis=axis), rtol=tol)
    y, zf = sosfilt(cast(sos), cast(x), axis=axis, zi=cast(zi))
    ref, ref_zf = ss.sosfilt(sos, x, axis=axis, zi=zi)
    assert_close(y, ref, rtol=tol)
    assert_close(zf, ref_zf, rtol=tol)
    w, h = freqz_sos(cast(sos), 64)
    w_ref, h_ref = ss.freqz_sos(sos, 64)
    assert_close(w, w_ref, rtol=tol)
    assert_close(h, h_ref, rtol=tol)
    if dtype == np.float32:
        return
    assert_close(sosfreqz(sos, 64, whole=True)[1], ss.sosfreqz(sos, 64, whole=True)[1])
    assert_close(sosfilt_zi(sos), ss.sosfilt_zi(sos), rtol=tol)
    # the default padlen depends on the values of sos (first-order sections)
    for padtype in ("odd", "even", "constant", None):
        ref = ss.sosfiltfilt(sos, x, axis=axis, padtype=padtype)
        y = sosfiltfilt(sos, x, axis=axis, padtype=padtype)
        assert_close(y, ref, rtol=tol)
    ref = ss.sosfiltfilt(sos, x, axis=axis, padlen=7)
    assert_close(sosfiltfilt(sos, x, axis=axis, padlen=7), ref, rtol=tol)


def test_scipy_names_fast_parity():
    """Every scipy name on one case each, eagerly, with scipy's argument forms."""
    rng = np.random.default_rng(0)
    b, a = [0.2, 0.4, 0.2], [2.0, -1.2, 0.6]  # Python lists, a[0] != 1
    x = rng.normal(size=(2, 30))
    assert_close(ops.lfilter(b, a, x), ss.lfilter(b, a, x))
    zi = rng.normal(size=(2, 2))
    y, zf = ops.lfilter(b, a, x.T, axis=0, zi=zi)
    ref, ref_zf = ss.lfilter(b, a, x.T, axis=0, zi=zi)
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    # zi broadcast along the other axes, as scipy allows
    y, zf = ops.lfilter(b, a, x, zi=[[0.5, -0.2]])
    ref, ref_zf = ss.lfilter(b, a, x, zi=[[0.5, -0.2]])
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    assert_close(ops.lfilter(b, 2, x), ss.lfilter(b, 2, x))  # FIR with a scalar a
    assert_close(ops.lfilter_zi(b, a), ss.lfilter_zi(b, a))
    assert_close(ops.lfiltic(b, a, [1.0], [2.0, 3.0]), ss.lfiltic(b, a, [1.0], [2, 3]))
    assert_close(ops.filtfilt(b, a, x), ss.filtfilt(b, a, x))
    assert_close(ops.filtfilt(b, a, x.T, axis=0), ss.filtfilt(b, a, x.T, axis=0))
    gust = ops.filtfilt(b, a, x, method="gust")
    assert_close(gust, ss.filtfilt(b, a, x, method="gust"))
    for kwargs in [{}, {"whole": True}, {"fs": 1000}, {"include_nyquist": True}]:
        w, h = ops.freqz(b, a, 16, **kwargs)
        w_ref, h_ref = ss.freqz(b, a, 16, **kwargs)
        assert_close(w, w_ref)
        assert_close(h, h_ref)
    # the example: scipy's `a` includes the leading coefficient
    assert_close(ops.freqz([1.0], [1.0, -0.5], [0.0])[1], [2.0])
    sos = ss.ellip(5, 1.0, 40.0, 0.2, output="sos")  # a first-order section
    assert_close(ops.sosfilt(sos, x), ss.sosfilt(sos, x))
    assert_close(ops.sosfilt_zi(sos), ss.sosfilt_zi(sos))
    assert_close(ops.sosfiltfilt(sos, x), ss.sosfiltfilt(sos, x))
    traced = jax.jit(ops.sosfiltfilt)(sos, x)  # default padlen from traced sos
    assert_close(traced, ss.sosfiltfilt(sos, x), rtol=1e-10)
    assert_close(ops.freqz_sos(sos, 16)[1], ss.freqz_sos(sos, 16)[1])
    assert_close(ops.sosfreqz(sos, 16)[1], ss.sosfreqz(sos, 16)[1])
    # integer input computes in floating point, as in scipy
    # integer input computes in floating point (scipy itself accepts integer
    # signals only with floating-point coefficients)
    xi = np.arange(12)
    ref = ss.lfilter([1.0, 1.0], [2.0, 1.0], xi)
    assert_close(ops.lfilter([1, 1], [2, 1], xi), ref)
    assert_close(ops.lfilter([1.0, 1.0], [2.0, 1.0], xi), ref)


def test_float32_stays_float32():
    """float32 arrays with Python-list coefficients: float32 results near scipy."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(3, 200))
    x32 = jnp.asarray(x, jnp.float32)
    b, a = ss.cheby1(4, 1.0, 0.3)
    b_list, a_list = b.tolist(), a.tolist()
    sos = ss.butter(8, 0.2, output="sos")

    def check(y, ref):
        assert y.dtype == jnp.float32
        assert_close(y, ref, rtol=1e-4)

    check(ops.lfilter(b_list, a_list, x32), ss.lfilter(b, a, x))
    check(ops.filtfilt(b_list, a_list, x32), ss.filtfilt(b, a, x))
    check(jax.jit(ops.sosfilt)(jnp.asarray(sos, jnp.float32), x32), ss.sosfilt(sos, x))
    y = ops.sosfiltfilt(jnp.asarray(sos, jnp.float32), x32, axis=-1)
    check(y, ss.sosfiltfilt(sos, x))
    y, zf = ops.lfilter(b_list, a_list, x32.T, axis=0, zi=jnp.zeros((4, 3), "float32"))
    check(y, ss.lfilter(b, a, x.T, axis=0))
    assert zf.dtype == jnp.float32
    w, h = ops.freqz(jnp.asarray(b, jnp.float32), a_list, 32)
    assert w.dtype == jnp.float32 and h.dtype == jnp.complex64
    assert_close(h, ss.freqz(b, a, 32)[1], rtol=1e-4)


def _sos_with_free(free):
    """Sections from their free entries: a0 = 1 is a constraint, not a parameter."""
    ones = jnp.ones((free.shape[0], 1), free.dtype)
    return jnp.concatenate([free[:, :3], ones, free[:, 3:]], axis=1)


def _tf():
    rng = np.random.default_rng(2)
    a = jnp.asarray(1.7 * np.r_[1.0, stable_poly(rng, 2, radius=0.8)])
    b = jnp.asarray(rng.normal(size=3))
    return rng, b, a


def test_lfilter_grads_include_a0():
    rng, b, a = _tf()
    x = jnp.asarray(rng.normal(size=(2, 8)))
    zi = jnp.asarray(rng.normal(size=(2, 2)))

    def f(b, a, x, zi):
        y, zf = ops.lfilter(b, a, x, axis=-1, zi=zi)
        return jnp.concatenate([y.ravel(), zf.ravel()])

    check_grads(f, (b, a, x, zi), eps=1e-5)


def test_sosfilt_grads():
    rng = np.random.default_rng(3)
    sos = ss.butter(4, 0.3, output="sos")
    free = jnp.asarray(np.concatenate([sos[:, :3], sos[:, 4:]], axis=1))
    x = jnp.asarray(rng.normal(size=(8, 2)))
    zi = jnp.asarray(rng.normal(size=(2, 2, 2)))

    def f(free, x, zi):
        y, zf = ops.sosfilt(_sos_with_free(free), x, axis=0, zi=zi)
        return jnp.concatenate([y.ravel(), zf.ravel()])

    check_grads(f, (free, x, zi), eps=1e-5)


@pytest.mark.slow
def test_scipy_names_grads():
    rng, b, a = _tf()
    x = jnp.asarray(rng.normal(size=16))
    y = jnp.asarray(rng.normal(size=2))
    check_grads(ops.lfilter_zi, (b, a), eps=1e-5)
    check_grads(ops.lfiltic, (b, a, y, y), eps=1e-5)
    check_grads(lambda b, a, x: ops.filtfilt(b, a, x, padlen=4), (b, a, x), eps=1e-5)
    gust = lambda b, a, x: ops.filtfilt(b, a, x, method="gust")
    check_grads(gust, (b, a, x), eps=1e-5)
    check_grads(lambda b, a: ops.freqz(b, a, 8)[1], (b, a), eps=1e-5)
    sos = ss.butter(4, 0.3, output="sos")  # no zero entries: a smooth padlen
    free = jnp.asarray(np.concatenate([sos[:, :3], sos[:, 4:]], axis=1))
    check_grads(lambda f: ops.sosfilt_zi(_sos_with_free(f)), (free,), eps=1e-5)
    sosfiltfilt = lambda f, x: ops.sosfiltfilt(_sos_with_free(f), x, padlen=4)
    check_grads(sosfiltfilt, (free, x), eps=1e-5)
    check_grads(lambda f: ops.freqz_sos(_sos_with_free(f), 8)[1], (free,), eps=1e-5)


def test_gradients_run_the_adjoint_filter():
    """scipy's names differentiate through the recurrence core's rule.

    Each recursion contributes one forward recursion and one adjoint
    recursion run backwards in time (the all-pole primitive and its
    transpose) to the gradient, carrying only its lagged values; no
    per-sample history is stored and no loop of their own is unrolled.
    """
    rng, b, a = _tf()
    x = jnp.asarray(rng.normal(size=(3, 50)))
    zi = jnp.asarray(rng.normal(size=(3, 2)))

    def loss(b, a, x, zi):
        y, zf = ops.lfilter(b, a, x, axis=-1, zi=zi)
        return jnp.sum(y**2) + jnp.sum(zf**2)

    grad = jax.grad(loss, argnums=(0, 1, 2, 3))
    jaxpr = jax.make_jaxpr(grad)(b, a, x, zi).jaxpr
    assert not scans_in(jaxpr)
    eqns = allpole_eqns_in(jaxpr)
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    for eqn in eqns:  # the state: the 2 lagged values of each of 3 signals
        assert eqn.invars[2].aval.shape == (3, 2)
    sos = jnp.asarray(ss.butter(6, 0.2, output="sos"))
    grad = jax.grad(lambda sos, x: jnp.sum(ops.sosfilt(sos, x) ** 2), argnums=(0, 1))
    jaxpr = jax.make_jaxpr(grad)(sos, x).jaxpr
    eqns = allpole_eqns_in(jaxpr)
    # the sections run as one scan over them (forward, then its transpose
    # backwards over the sections), each step one section's recursion
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    assert {eqn.params["length"] for eqn in scans_in(jaxpr)} == {3}


def test_bad_input_names_the_argument():
    x = jnp.zeros((2, 20))
    b, a0_zero = jnp.array([1.0, 0.5]), jnp.array([0.0, 1.0, 0.2])
    # a[0] == 0: a value, checked at run time, eagerly and under jit
    for f in (
        lambda b, a: ops.lfilter(b, a, x),
        lambda b, a: ops.lfilter_zi(b, a),
        lambda b, a: ops.lfiltic(b, a, jnp.ones(2)),
        lambda b, a: ops.filtfilt(b, a, x),
        lambda b, a: ops.filtfilt(b, a, x, method="gust"),
    ):
        with pytest.raises(Exception, match=r"`a\[0\]` must be non-zero"):
            f(b, a0_zero)
        with pytest.raises(Exception, match=r"`a\[0\]` must be non-zero"):
            jax.jit(f)(b, a0_zero)
    # zi of the wrong shape for the given axis: a shape, checked when traced
    lfilter_, sosfilt_ = unchecked(ops.lfilter), unchecked(ops.sosfilt)
    good = jnp.zeros((2, 2))  # right for axis=-1, wrong for axis=0
    assert lfilter_(b, jnp.ones(3), x, axis=-1, zi=good)[1].shape == (2, 2)
    for f in (lfilter_, jax.jit(lfilter_, static_argnames="axis")):
        with pytest.raises(ValueError, match="`zi` must have shape"):
            f(b, jnp.ones(3), x, axis=0, zi=good)
    sos = ss.butter(4, 0.2, output="sos")
    for f in (sosfilt_, jax.jit(sosfilt_, static_argnames="axis")):
        with pytest.raises(ValueError, match="`zi` must have shape"):
            f(sos, x, axis=0, zi=jnp.zeros((2, 2, 2)))  # right for axis=-1
    # sos rows whose a0 is not 1
    scaled = sos * np.array([1, 1, 1, 2, 1, 1])
    for f in (ops.sosfilt, ops.sosfiltfilt, lambda s, x: ops.freqz_sos(s)[1]):
        with pytest.raises(Exception, match="a0"):
            f(scaled, x)
        with pytest.raises(Exception, match="a0"):
            jax.jit(f)(scaled, x)
    # padlen too long for the signal
    short = jnp.zeros((2, 9))
    for f in (
        lambda: ops.filtfilt(b, jnp.ones(3), short),
        lambda: ops.filtfilt(b, jnp.ones(3), short, padlen=9),
        lambda: ops.sosfiltfilt(sos, short, padlen=12),
        lambda: ops.sosfiltfilt(sos, jnp.zeros((2, 9))),  # default 15
        lambda: jax.jit(ops.filtfilt)(b, jnp.ones(3), short),
    ):
        with pytest.raises(ValueError, match="`padlen`"):
            f()
    # the default padlen of sosfiltfilt depends on traced values: a run-time error
    odd = ss.butter(3, 0.2, output="sos")  # two sections, one first-order: 12
    with pytest.raises(Exception, match="`padlen`"):
        jax.jit(ops.sosfiltfilt)(odd, jnp.zeros((2, 12)))
    assert jax.jit(ops.sosfiltfilt)(odd, jnp.zeros((2, 13))).shape == (2, 13)
    with pytest.raises(ValueError, match="`axis`"):
        unchecked(ops.lfilter)(b, jnp.ones(2), x, axis=2)
    with pytest.raises(ValueError, match="`method`"):
        unchecked(ops.filtfilt)(b, jnp.ones(2), x, method="fast")
