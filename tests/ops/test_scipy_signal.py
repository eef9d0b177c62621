"""The scipy.signal names of retrax.ops against scipy.signal, with scipy's arguments."""

import decimal
import functools

import equinox as eqx
import hypothesis
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal
import scipy.signal as ss

from helpers import (
    allpole_eqns_in,
    assert_close,
    check_float32,
    check_grads,
    primitive_eqns_in,
    scans_in,
    stable_poly,
    unchecked,
)
from retrax import _native, ops
from retrax.ops._sections_gradient import cotangent_p, saved_p
from retrax.ops._sections_structure import kernel_applies


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


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
    assert_close(fir(cast(signal), b=cast(b)), ss.lfilter(b, [1.0], signal), rtol=tol)
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


@pytest.mark.full
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


@pytest.mark.full
def test_lfilter_grads_include_a0():
    rng, b, a = _tf()
    x = jnp.asarray(rng.normal(size=(2, 8)))
    zi = jnp.asarray(rng.normal(size=(2, 2)))

    def f(b, a, x, zi):
        y, zf = ops.lfilter(b, a, x, axis=-1, zi=zi)
        return jnp.concatenate([y.ravel(), zf.ravel()])

    check_grads(f, (b, a, x, zi), eps=1e-5)


@pytest.mark.full
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
    if _native.available("allpole"):
        # the sections' kernels: one pass forward keeping checkpoints, one
        # backward through every section (the batch of 3 signals in one call
        # each)
        assert len(primitive_eqns_in(jaxpr, saved_p)) == 1
        assert len(primitive_eqns_in(jaxpr, cotangent_p)) == 1
        assert not eqns and not scans_in(jaxpr)
        return
    # the sections run as one scan over them (forward, then its transpose
    # backwards over the sections), each step one section's recursion
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    assert {eqn.params["length"] for eqn in scans_in(jaxpr)} == {3}


@pytest.mark.full
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


F32_T = 64


def _transfer_function(rng):
    a = 1.7 * np.r_[1.0, stable_poly(rng, 3, 0.9)]
    return rng.standard_normal(4), a


@pytest.mark.float32
def test_scipy_lfilter_with_state():
    rng = np.random.default_rng(7)
    b, a = _transfer_function(rng)
    x, zi = rng.standard_normal(F32_T), rng.standard_normal(3)
    ref = scipy.signal.lfilter(b, a, x, zi=zi)[0]
    check_float32(lambda b, a, x, zi: lfilter(b, a, x, zi=zi)[0], (b, a, x, zi), ref)


@pytest.mark.float32
def test_scipy_filtfilt():
    rng = np.random.default_rng(8)
    b, a = _transfer_function(rng)
    x = rng.standard_normal(F32_T)
    check_float32(filtfilt, (b, a, x), scipy.signal.filtfilt(b, a, x))


@pytest.mark.float32
def test_scipy_freqz():
    rng = np.random.default_rng(10)
    b, a = _transfer_function(rng)
    ref = np.abs(scipy.signal.freqz(b, a, worN=64)[1])
    check_float32(lambda b, a: jnp.abs(freqz(b, a, worN=64)[1]), (b, a), ref)


RUNTIME = eqx.EquinoxRuntimeError


SOS4 = ss.butter(4, 0.2, output="sos")  # two sections: scipy's padlen is 15


def _under_jit(f, args, match):
    """`f(*args)` with traced arguments raises at run time with `match`."""
    with pytest.raises(RUNTIME, match=match):
        eqx.filter_jit(f)(*args)
    with pytest.raises(Exception, match=match):
        jax.jit(f)(*args)


A0_ZERO = [
    ("lfilter", lambda b, a: ops.lfilter(b, a, jnp.ones(20))),
    ("lfilter_zi", ops.lfilter_zi),
    ("lfiltic", lambda b, a: ops.lfiltic(b, a, jnp.ones(2))),
    ("filtfilt", lambda b, a: ops.filtfilt(b, a, jnp.ones(20))),
    ("filtfilt gust", lambda b, a: ops.filtfilt(b, a, jnp.ones(20), method="gust")),
]


@pytest.mark.loud
@pytest.mark.parametrize("f", [f for _, f in A0_ZERO], ids=[n for n, _ in A0_ZERO])
def test_a0_zero_is_a_value_error(f):
    b, a = jnp.array([1.0, 2.0]), jnp.array([0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"`a\[0\]` must be non-zero"):
        f(b, a)
    _under_jit(f, (b, a), r"`a\[0\]` must be non-zero")


@pytest.mark.loud
def test_scipy_lfiltic_a0_zero():
    # scipy's test_lfiltic_bad_coeffs, with retrax's lfiltic
    with pytest.raises(ValueError):
        ops.lfiltic([1, 2], [0, 1], [1, 2])
    with pytest.raises(ValueError):
        ss.lfiltic([1, 2], [0, 1], [1, 2])


@pytest.mark.loud
@pytest.mark.parametrize("name", ["b", "a"])
def test_nonfinite_coefficients_are_a_value_error(name):
    coeffs = {"b": jnp.array([1.0, 0.5]), "a": jnp.array([1.0, -0.5])}
    coeffs[name] = coeffs[name].at[1].set(jnp.nan)
    for f in (
        lambda b, a: ops.lfilter(b, a, jnp.ones(20)),
        lambda b, a: ops.filtfilt(b, a, jnp.ones(20)),
        lambda b, a: ops.freqz(b, a, 8)[1],
    ):
        with pytest.raises(ValueError, match=f"`{name}` has non-finite"):
            f(coeffs["b"], coeffs["a"])
        _under_jit(f, (coeffs["b"], coeffs["a"]), f"`{name}` has non-finite")


SOS_FUNCTIONS = [
    ("sosfilt", lambda sos: ops.sosfilt(sos, jnp.ones(40))),
    ("sosfiltfilt", lambda sos: ops.sosfiltfilt(sos, jnp.ones(40))),
    ("freqz_sos", lambda sos: ops.freqz_sos(sos, 8)[1]),
    ("sosfreqz", lambda sos: ops.sosfreqz(sos, 8)[1]),
]


@pytest.mark.loud
@pytest.mark.parametrize(
    "f", [f for _, f in SOS_FUNCTIONS], ids=[n for n, _ in SOS_FUNCTIONS]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sos_a0_not_one_is_a_value_error(f, dtype):
    # scipy's test_bad_sos: a0 = sos[:, 3] must be 1
    sos = SOS4.astype(dtype).copy()
    sos[0, 3] = 0.0
    with pytest.raises(ValueError, match="a0"):
        f(sos)
    with pytest.raises(ValueError):
        ss.sosfilt(sos, np.ones(40))
    _under_jit(f, (jnp.asarray(sos),), "a0")
    nan = SOS4.astype(dtype).copy()
    nan[1, 4] = np.nan
    with pytest.raises(ValueError, match="`sos` has non-finite"):
        f(nan)
    _under_jit(f, (jnp.asarray(nan),), "`sos` has non-finite")


@pytest.mark.loud
@pytest.mark.parametrize("length", range(10, 16))
def test_sosfiltfilt_too_short_quotes_scipys_padlen(length):
    x = np.ones(length)
    with pytest.raises(ValueError, match="padlen, which is 15"):
        ss.sosfiltfilt(SOS4, x)
    with pytest.raises(ValueError, match="`padlen` = 15 samples"):
        ops.sosfiltfilt(SOS4, x)
    with pytest.raises(ValueError, match="`padlen` = 15 samples"):
        ops.sosfiltfilt(jnp.asarray(SOS4, jnp.float32), jnp.asarray(x, jnp.float32))
    # traced sections: the default padlen depends on their values
    _under_jit(ops.sosfiltfilt, (jnp.asarray(SOS4), jnp.asarray(x)), "`padlen`")


@pytest.mark.loud
def test_sosfiltfilt_default_padlen_counts_first_order_sections():
    odd = ss.butter(3, 0.2, output="sos")  # one first-order section: padlen 12
    with pytest.raises(ValueError, match="`padlen` = 12 samples"):
        ops.sosfiltfilt(odd, np.ones(12))
    x = np.random.default_rng(0).normal(size=13)
    assert_close(ops.sosfiltfilt(odd, x), ss.sosfiltfilt(odd, x), rtol=1e-10)
    assert_close(jax.jit(ops.sosfiltfilt)(odd, x), ss.sosfiltfilt(odd, x), rtol=1e-10)


@pytest.mark.loud
def test_sosfiltfilt_too_short_for_any_sections_names_the_bound_under_jit():
    with pytest.raises(ValueError, match="at least 9; got 9 samples"):
        jax.jit(ops.sosfiltfilt)(SOS4, jnp.ones(9))


@pytest.mark.loud
def test_worN_zero_d_integer_array_is_a_count():  # noqa: N802
    # scipy's test_freqz (worN=np.array(7)) and test_sos_freqz (np.array(8))
    w, h = ops.freqz([1.0], worN=np.array(7))
    assert w.shape == h.shape == (7,)
    assert_close(w, ss.freqz([1.0], worN=np.array(7))[0], rtol=1e-12)
    w, h = ops.freqz_sos(SOS4, worN=np.array(8))
    assert w.shape == h.shape == (8,)
    assert_close(h, ss.freqz_sos(SOS4, worN=np.array(8))[1], rtol=1e-10)
    assert ops.freqz([1.0], worN=jnp.array(7))[0].shape == (7,)
    # a float (0-d) is one frequency, as in scipy
    w, h = ops.freqz([1.0, 0.5], worN=np.array(0.25))
    w_ref, h_ref = ss.freqz([1.0, 0.5], worN=np.array(0.25))
    assert_close(w, w_ref, rtol=1e-12)
    assert_close(h, h_ref, rtol=1e-12)
    # under jit a concrete count (closed over) works; a traced one cannot fix
    # the result's shape
    n = np.array(7)
    assert jax.jit(lambda b: ops.freqz(b, worN=n)[1])(jnp.ones(2)).shape == (7,)
    with pytest.raises(TypeError, match="`worN`"):
        jax.jit(lambda n: ops.freqz([1.0], worN=n))(jnp.array(7))


WIDE = [np.longdouble, np.clongdouble]


@pytest.mark.loud
@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here"
)
@pytest.mark.parametrize("dtype", WIDE, ids=["float128", "complex256"])
def test_long_double_is_a_type_error_naming_the_dtype(dtype):
    name = np.dtype(dtype).name
    x = np.ones(8, dtype)
    for f, arg in (
        (lambda x: ops.lfilter([1.0], [1.0, -0.5], x), "x"),
        (lambda x: ops.filtfilt([1.0], [1.0, -0.5], x, padlen=2), "x"),
        (lambda x: ops.sosfilt(SOS4, x), "x"),
        (lambda b: ops.lfilter(b, [1.0, -0.5], np.ones(8)), "b"),
        (lambda b: ops.freqz(b), "b"),
        (lambda sos: ops.sosfilt(sos, np.ones(8)), "sos"),
    ):
        value = SOS4.astype(dtype) if arg == "sos" else x
        with pytest.raises(TypeError, match=f"`{arg}` has dtype {name}"):
            f(value)


@pytest.mark.loud
@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here"
)
def test_long_double_in_retraxs_own_linear_ops():
    x = np.ones(8, np.longdouble)
    for f, arg in (
        (lambda v: ops.fir(v, b=jnp.ones(2)), "x"),
        (lambda v: ops.fir(jnp.ones(8), b=v[:2]), "b"),
        (lambda v: ops.lfilter_tv(jnp.ones(8), b=jnp.ones(2), a=v[:1]), "a"),
        (lambda v: ops.lfilter_tv(v, b=jnp.ones(2), a=jnp.ones(1) * 0.5), "x"),
        (lambda v: ops.fir(jnp.ones(8), b=jnp.ones(2), zi=v[:1]), "zi"),
    ):
        with pytest.raises(TypeError, match=f"`{arg}` has dtype float128"):
            f(x)
    with pytest.raises(TypeError, match="`x` must be numeric, got dtype object"):
        ops.fir(np.array([decimal.Decimal(1)] * 4), b=jnp.ones(2))


@pytest.mark.loud
def test_object_arrays_are_a_type_error_naming_the_dtype():
    decimals = np.array([decimal.Decimal(1)] * 4)
    with pytest.raises(TypeError, match="`x` must be numeric, got dtype object"):
        ops.lfilter([1.0], [1.0, -0.5], decimals)
    with pytest.raises(TypeError, match="`a` must be numeric, got dtype object"):
        ops.lfilter([1.0], decimals, np.ones(4))
    with pytest.raises(TypeError, match="`b` must be numeric, got dtype object"):
        ops.freqz([decimal.Decimal(1), decimal.Decimal(2)])


def _big_unsigned():
    return np.array([2**63 + 1, 2**40 + 3, 7], np.uint64)


@pytest.mark.loud
@pytest.mark.parametrize("x64", [True, False])
def test_uint64_converts_as_scipy_converts(x64):
    """scipy converts integer input to float; without x64 JAX would first
    narrow 64-bit integers to 32 bits (2**63 + 1 became 1)."""
    x = _big_unsigned()
    ref = ss.lfilter([1.0], [1.0, -0.5], x)
    with jax.enable_x64(x64):
        y = ops.lfilter([1.0], [1.0, -0.5], x)
        assert y.dtype == (np.float64 if x64 else np.float32)
        assert_close(y, ref, rtol=1e-15 if x64 else 1e-7)
        # under jit, closed over (a jit argument is converted by JAX itself,
        # which without x64 narrows it to uint32 before retrax sees it)
        y = jax.jit(lambda a: ops.lfilter([1.0], a, x))(jnp.array([1.0, -0.5]))
        assert_close(y, ref, rtol=1e-15 if x64 else 1e-7)
        y = ops.lfilter([1.0], [1.0], np.array([2**62 + 1], np.int64))
        assert_close(y, [2.0**62], rtol=1e-15 if x64 else 1e-7)


@pytest.mark.loud
@pytest.mark.float32
def test_uint64_converts_as_scipy_converts_float32_session():
    x = _big_unsigned()
    y = ops.lfilter([1.0], [1.0, -0.5], x)
    assert y.dtype == np.float32
    assert_close(y, ss.lfilter([1.0], [1.0, -0.5], x), rtol=1e-7)
    y = ops.sosfilt(SOS4.astype(np.float32), x)
    assert_close(y, ss.sosfilt(SOS4, x.astype(np.float64)), rtol=1e-5)


BAD_FS = [np.inf, -np.inf, np.nan, 0.0, -1.0, -1, jnp.asarray(-1.0), np.float32(0)]


@pytest.mark.loud
@pytest.mark.parametrize("fs", BAD_FS, ids=[repr(v) for v in BAD_FS])
@pytest.mark.parametrize(
    "f",
    [
        lambda fs: ops.freqz([1.0, 0.5], [1.0, -0.3], 8, fs=fs),
        lambda fs: ops.freqz_sos(SOS4, 8, fs=fs),
        lambda fs: ops.freqz([1.0, 0.5], worN=[0.1, 0.2], fs=fs),
    ],
    ids=["freqz", "freqz_sos", "freqz at frequencies"],
)
def test_bad_fs_is_a_value_error(f, fs):
    with pytest.raises(ValueError, match="`fs` must be a positive, finite number"):
        f(fs)
    if not isinstance(fs, jax.Array):  # a Python or NumPy number: also under jit
        with pytest.raises(ValueError, match="`fs` must be a positive, finite"):
            jax.jit(lambda: f(fs))()


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_traced_bad_fs_is_a_run_time_error(dtype):
    def freqz(fs):
        return ops.freqz(jnp.ones(2, dtype), worN=8, fs=fs)

    def freqz_sos(fs):
        return ops.freqz_sos(jnp.asarray(SOS4, dtype), worN=[1.0, 2.0], fs=fs)

    for f in (freqz, freqz_sos):
        for fs in (-1.0, 0.0, jnp.inf, jnp.nan):
            _under_jit(f, (jnp.asarray(fs, dtype),), "`fs` must be a positive")
        w, h = jax.jit(f)(jnp.asarray(100.0, dtype))  # a good one still works
        assert jnp.all(w >= 0) and jnp.all(jnp.isfinite(h))


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_float16_freqz_computes_in_float32(dtype):
    b = np.array([0.25, 0.5, 0.25], dtype)
    a = np.array([1.0, -0.5], dtype)
    for f in (ops.freqz, jax.jit(ops.freqz, static_argnums=2)):
        w, h = f(b, a, 16)
        assert h.dtype == jnp.complex64 and w.dtype == jnp.float32
        w_ref, h_ref = ss.freqz(b.astype(np.float32), a.astype(np.float32), 16)
        assert_close(h, h_ref, rtol=1e-6)
        assert_close(w, w_ref, rtol=1e-6)
    if dtype == np.float16:
        assert ss.freqz(b, a, 16)[1].dtype == np.complex64  # as scipy
    sos = SOS4.astype(dtype)
    w, h = ops.freqz_sos(sos, 16)
    assert h.dtype == jnp.complex64
    assert_close(h, ss.freqz_sos(sos.astype(np.float32), 16)[1], rtol=1e-5)


NARROW_FILTERS = [
    ("lfilter", lambda b, a, sos, x: ops.lfilter(b, a, x), ss.lfilter, "ba"),
    ("filtfilt", lambda b, a, sos, x: ops.filtfilt(b, a, x), ss.filtfilt, "ba"),
    ("lfilter_zi", lambda b, a, sos, x: ops.lfilter_zi(b, a), ss.lfilter_zi, "ba0"),
    ("sosfilt", lambda b, a, sos, x: ops.sosfilt(sos, x), ss.sosfilt, "sos"),
    (
        "sosfiltfilt",
        lambda b, a, sos, x: ops.sosfiltfilt(sos, x),
        ss.sosfiltfilt,
        "sos",
    ),
]


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    "name, f, ref, args",
    NARROW_FILTERS,
    ids=[n for n, *_ in NARROW_FILTERS],
)
def test_narrow_floats_filter_to_their_own_precision(name, f, ref, args, dtype):
    """float16 input is filtered in float32 and rounded once: the error is
    the output's rounding, not a recursion's accumulated rounding (about 20
    times more for this filter in float16)."""
    del name
    b, a = (c.astype(dtype) for c in ss.butter(2, 0.05))
    sos = ss.butter(4, 0.05, output="sos").astype(dtype)
    x = np.random.default_rng(0).normal(size=200).astype(dtype)
    wide = {
        "ba": (b.astype(np.float64), a.astype(np.float64), x.astype(np.float64)),
        "ba0": (b.astype(np.float64), a.astype(np.float64)),
        "sos": (sos.astype(np.float64), x.astype(np.float64)),
    }[args]
    expected = ref(*wide)
    eps = float(jnp.finfo(dtype).eps)
    for g in (f, jax.jit(f)):
        y = g(b, a, sos, x)
        assert y.dtype == dtype
        assert_close(np.asarray(y, np.float64), expected, rtol=eps)


@pytest.mark.float32
def test_float64_input_without_x64_warns_once(monkeypatch):
    # Without x64, NumPy float64 input computes in float32 (as jnp.asarray
    # converts it), 1e-5 from scipy's float64: said once a process, not silent.
    import warnings

    from retrax.ops import _scipy_args

    monkeypatch.setattr(_scipy_args, "_NARROWED", [False])
    sos = ss.butter(4, [0.1, 0.3], btype="band", output="sos")
    x = np.random.default_rng(0).standard_normal((3, 256))
    with pytest.warns(UserWarning, match="x64 mode is off") as record:
        y = ops.sosfiltfilt(sos, x)
    assert record[0].filename == __file__  # points at the caller's line
    assert y.dtype == jnp.float32
    assert_close(y, ops.sosfiltfilt(sos.astype(np.float32), x.astype(np.float32)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ops.lfilter([1.0], [1.0, -0.5], x)  # once a process
        ops.sosfiltfilt(sos.astype(np.float32), x.astype(np.float32))


def _scipy_named_calls(b, a, sos, x):
    """Every op of `retrax.ops` named after a `scipy.signal` function, called
    on `b`, `a`, `sos` and the signal `x`."""
    return {
        "lfilter": lambda: ops.lfilter(b, a, x),
        "lfilter_zi": lambda: ops.lfilter_zi(b, a),
        "lfiltic": lambda: ops.lfiltic(b, a, x[..., :3].ravel()),
        "filtfilt": lambda: ops.filtfilt(b, a, x),
        "sosfilt": lambda: ops.sosfilt(sos, x),
        "sosfilt_zi": lambda: ops.sosfilt_zi(sos),
        "sosfiltfilt": lambda: ops.sosfiltfilt(sos, x),
        "freqz": lambda: ops.freqz(b, a, 64)[1],
        "freqz_sos": lambda: ops.freqz_sos(sos, 64)[1],
        "sosfreqz": lambda: ops.sosfreqz(sos, 64)[1],
    }


def test_every_scipy_name_has_a_float64_warning_case():
    public = {n for n in dir(ops) if not n.startswith("_") and hasattr(ss, n)}
    assert public == set(_scipy_named_calls(None, None, None, None))


@pytest.mark.float32
@pytest.mark.parametrize("name", list(_scipy_named_calls(None, None, None, None)))
def test_every_scipy_name_warns_of_float64_input_without_x64(monkeypatch, name):
    import warnings

    from retrax.ops import _scipy_args

    b, a = ss.butter(4, 0.2)
    sos = ss.butter(4, 0.2, output="sos")
    x = np.random.default_rng(0).standard_normal(128)
    monkeypatch.setattr(_scipy_args, "_NARROWED", [False])
    with pytest.warns(UserWarning, match="x64 mode is off") as record:
        y = _scipy_named_calls(b, a, sos, x)[name]()
    (warning,) = [w for w in record if "x64 mode is off" in str(w.message)]
    assert warning.filename == __file__
    narrow = _scipy_named_calls(*(v.astype(np.float32) for v in (b, a, sos, x)))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        want = narrow[name]()
        assert y.dtype == want.dtype
        assert_close(y, want)
        _scipy_named_calls(b, a, sos, x)[name]()  # once a process


def test_float64_input_with_x64_does_not_warn(monkeypatch):
    import warnings

    from retrax.ops import _scipy_args

    monkeypatch.setattr(_scipy_args, "_NARROWED", [False])
    sos = ss.butter(4, [0.1, 0.3], btype="band", output="sos")
    x = np.random.default_rng(0).standard_normal((3, 256))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        y = ops.sosfiltfilt(sos, x)
    assert y.dtype == jnp.float64
    assert_close(y, ss.sosfiltfilt(sos, x), rtol=1e-9)


# ---------------------------------------------------------------- layouts and streams


def _small_chunks(monkeypatch):
    """Filter time-first signals from 40 samples on in chunks of 16 (the
    defaults take 65,536 samples), so that a short signal takes the chunked
    route with a last chunk of its own length."""
    from retrax.ops import _scipy_args

    monkeypatch.setattr(_scipy_args, "TIME_CHUNK", 16)
    monkeypatch.setattr(_scipy_args, "CHUNKED_FROM", 40)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_time_first_signals_match_scipy_in_chunks(monkeypatch, dtype):
    """A long time-first signal (`axis=0`, as soundfile returns a
    multichannel file) is filtered chunk by chunk along time; `y` and `zf`
    are scipy's, with and without `zi`, for several channel axes, eagerly
    (where the result is written over the call's own copy of a NumPy
    signal, which stays as it was) and under `jax.jit`."""
    import warnings

    _small_chunks(monkeypatch)
    rng = np.random.default_rng(5)
    sos = ss.butter(4, 0.2, output="sos")
    jitted = jax.jit(ops.sosfilt, static_argnames="axis")
    # lengths and channel shapes unique to this test: its programs compile here
    for shape in [(53, 2), (57, 3, 2)]:
        x = rng.standard_normal(shape).astype(dtype)
        given = x.copy()
        zi = rng.standard_normal((2, 2) + shape[1:]).astype(dtype)
        want = ss.sosfilt(sos, given.astype(np.float64), axis=0)
        want_y, want_zf = ss.sosfilt(sos, given.astype(np.float64), axis=0, zi=zi)
        for sosfilt in (ops.sosfilt, jitted):
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # e.g. an unusable donation
                y = sosfilt(sos.astype(dtype), x, axis=0)
                y_zi, zf = sosfilt(sos.astype(dtype), x, axis=0, zi=zi)
            np.testing.assert_array_equal(x, given)
            assert y.dtype == dtype
            assert_close(y, want, _tol(dtype))
            assert_close(y_zi, want_y, _tol(dtype))
            assert_close(zf, want_zf, _tol(dtype))


def test_time_first_signals_move_chunks_not_the_signal(monkeypatch):
    """The chunked route (a stream with `zi`, and without the cascade's
    kernel every long time-first signal) transposes chunks, never the whole
    signal (as `axis=-1` of the same signal stored channels-first transposes
    nothing). With the kernel, a signal without `zi` is not chunked: the
    kernel reads it where it lies (the next test)."""
    _small_chunks(monkeypatch)
    sos = jnp.asarray(ss.butter(2, 0.3, output="sos"))
    in_place = kernel_applies(jnp.float64)
    for axis, shape, with_zi in [
        (0, (51, 2), False),
        (0, (51, 1), False),
        (0, (51, 2), True),
        (-1, (2, 51), False),
    ]:
        x = jnp.zeros(shape)
        zi = jnp.zeros(
            (1,) + tuple(2 if i == axis % 2 else n for i, n in enumerate(shape))
        )
        f = functools.partial(ops.sosfilt, axis=axis, zi=zi if with_zi else None)
        jaxpr = jax.make_jaxpr(f)(sos, x).jaxpr
        chunked = axis == 0 and (with_zi or not in_place)
        moved = [
            eqn
            for eqn in primitive_eqns_in(jaxpr, jax.lax.transpose_p)
            if eqn.invars[0].aval.size >= x.size
        ]
        if chunked or axis != 0:
            assert not moved, (axis, shape)
        assert bool(scans_in(jaxpr)) == chunked, (axis, shape, with_zi)


def _time_first_cases(name, dtype):
    """`(coefficients, shape)` of `name`'s time-first cases: stereo
    `(T, 2)` as soundfile returns a file, channels of several axes, more
    channels than vector lanes, orders past the kernels' specialised loops
    (9 sections; an order-12 transfer function in float64)."""
    if name == "sosfilt":
        design = [(4, (70_001, 2)), (4, (301, 3, 2)), (18, (300, 9))]
        return [((ss.butter(n, 0.2, output="sos"),), s) for n, s in design]
    orders = [(4, (70_001, 2)), (2, (301, 3, 2)), (1, (300, 9)), (4, (300, 5))]
    if dtype == np.float64:
        orders.append((12, (300, 3)))
    return [(ss.butter(n, 0.2), s) for n, s in orders]


@pytest.mark.skipif(
    not _native.available("allpole"), reason="the compiled kernel's layouts"
)
@pytest.mark.parametrize("name", ["sosfilt", "lfilter"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_time_first_signals_are_filtered_where_they_lie(name, dtype):
    """With the compiled kernels, `sosfilt` and `lfilter` along `axis=0` of a
    time-first array compile to the kernel reading the array (or the
    numerator's pass over it) as it lies and writing the result as it is
    returned: the optimised program has no transpose or copy of the
    signal. The values are scipy's, eagerly and under `jax.jit`."""
    rng = np.random.default_rng(11)
    ours, theirs = getattr(ops, name), getattr(ss, name)
    for coefficients, shape in _time_first_cases(name, dtype):
        coefficients = tuple(c.astype(dtype) for c in coefficients)
        jitted = jax.jit(functools.partial(ours, axis=0))
        lowered = jitted.lower(*coefficients, jnp.zeros(shape, dtype))
        text = lowered.compile().as_text()
        assert "retrax_" in text
        moved = [
            line
            for line in text.splitlines()
            if (" transpose(" in line or " copy(" in line) and f"{shape[0]}" in line
        ]
        assert not moved, (shape, moved)
        x = rng.standard_normal(shape).astype(dtype)
        wide = tuple(c.astype(np.float64) for c in coefficients)
        want = theirs(*wide, x.astype(np.float64), axis=0)
        for call in (functools.partial(ours, axis=0), jitted):
            y = call(*coefficients, x)
            assert y.dtype == dtype and y.shape == shape
            assert_close(y, want, _tol(dtype))


@pytest.mark.full
def test_time_first_chunks_gradient(monkeypatch):
    """The chunked route's gradient against finite differences."""
    _small_chunks(monkeypatch)
    sos = jnp.asarray(ss.butter(2, 0.3, output="sos"))
    x = jnp.asarray(np.random.default_rng(6).standard_normal((51, 2)))
    free = jnp.concatenate([sos[:, :3], sos[:, 4:]], axis=1)
    sosfilt = lambda f, x: ops.sosfilt(_sos_with_free(f), x, axis=0)
    check_grads(sosfilt, (free, x), eps=1e-6)


def _stream(step, coefficients, x, zi, block):
    """`x` (channels, T) through `step` in blocks of `block` samples."""
    ys = []
    for start in range(0, x.shape[-1], block):
        y, zi = step(*coefficients, x[:, start : start + block], zi)
        ys.append(y)
    return np.concatenate([np.asarray(y) for y in ys], axis=-1), zi


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_streaming_with_zi_matches_one_call(dtype):
    """A stream of blocks through a jitted step that donates its state, as a
    user's loop `y, zi = step(b, a, block, zi)` runs it, gives scipy's output
    and final state of the whole signal."""
    rng = np.random.default_rng(7)
    b, a = (v.astype(dtype) for v in ss.butter(4, 0.2))
    sos = ss.butter(4, 0.2, output="sos").astype(dtype)
    x = rng.standard_normal((3, 300)).astype(dtype)
    steps = [
        (
            lambda b, a, x, zi: ops.lfilter(b, a, x, zi=zi),
            (b, a),
            rng.standard_normal((3, 4)).astype(dtype),
            lambda zi: ss.lfilter(b, a, x.astype(np.float64), zi=zi),
        ),
        (
            lambda sos, x, zi: ops.sosfilt(sos, x, zi=zi),
            (sos,),
            rng.standard_normal((2, 3, 2)).astype(dtype),
            lambda zi: ss.sosfilt(sos, x.astype(np.float64), zi=zi),
        ),
    ]
    for f, coefficients, zi, reference in steps:
        want_y, want_zf = reference(zi)
        donated = jax.jit(f, donate_argnums=len(coefficients) + 1)
        for step in (f, jax.jit(f), donated):
            y, zf = _stream(step, coefficients, x, jnp.asarray(zi), block=100)
            assert y.dtype == zf.dtype == dtype
            assert_close(y, want_y, _tol(dtype))
            assert_close(zf, want_zf, _tol(dtype))


def test_lfilter_drive_is_not_a_padded_copy():
    """`lfilter` computes its FIR drive in one pass over `x`: each tap reads
    `x` through its own pad, which XLA fuses, where a zero-padded copy of the
    whole signal shared by the taps was written out first (and made a block
    of 64 channels take three times its recursion)."""
    b, a = (jnp.asarray(v) for v in ss.butter(4, 0.2))
    x = jnp.zeros((8, 1000))
    hlo = jax.jit(ops.lfilter).lower(b, a, x).compile().as_text()
    assert "[8,1004]" not in hlo
