"""The public API in the users' default precision: a float32 process.

The rest of the suite runs with x64 enabled, so these tests run in their own
session, where `conftest.py` leaves JAX's default (float32) alone:

    RETRAX_TEST_FLOAT32=1 python3 -m pytest

(the default session deselects them, and this session runs only them). Each
test evaluates a public function and the gradient of a weighted sum of its
output in float32, and compares both with float64 (values also with an
independent numpy/scipy reference) at `rtol = 1e-4` of the reference's largest
magnitude: finite differences in float32 are too noisy for recursive filters,
and the float64 derivatives are themselves checked against finite
differences and plain scans by the x64 suite.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

import retrax.diffusion as rd
from helpers import (
    assert_close,
    np_ballistics,
    np_compexp_gain,
    np_limiter_gain,
    np_state_space,
    np_svf,
    stable_poly,
    time_varying_allpole,
)
from retrax.dynamics import compexp_gain, limiter_gain
from retrax.filters import SVF, Biquad, Compressor, ParametricEQ, svf
from retrax.ops import (
    allpole,
    ballistics,
    diag_state_space,
    filtfilt,
    fir,
    freqz,
    lfilter,
    lfilter_tv,
    linear_recurrence,
    sosfilt,
    sosfiltfilt,
    state_space,
)


pytestmark = pytest.mark.float32

RTOL = 1e-4
T = 64


def test_this_process_is_float32():
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float32


def _weights(shape):
    return np.random.default_rng(123).standard_normal(shape)


def check_float32(f, args, reference=None):
    """`f(*args)` and the gradient of `sum(w * f(*args))` with respect to every
    argument: float32 against float64 (and `reference`, float64 numpy)."""
    args32 = tuple(jnp.asarray(a, jnp.float32) for a in args)
    y32 = jax.jit(f)(*args32)
    assert y32.dtype == jnp.float32
    w = _weights(y32.shape)

    def loss(*v):
        y = f(*v)
        return jnp.sum(jnp.asarray(w, y.dtype) * y)

    grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    g32 = grad(*args32)
    with jax.enable_x64(True):
        args64 = tuple(jnp.asarray(a, jnp.float64) for a in args)
        y64 = np.asarray(jax.jit(f)(*args64))
        g64 = [np.asarray(g) for g in grad(*args64)]
    assert y64.dtype == np.float64
    if reference is not None:
        assert_close(y64, reference, rtol=1e-10)
        assert_close(y32, reference, rtol=RTOL)
    assert_close(y32, y64, rtol=RTOL)
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0  # a derivative that is there to compare
        assert_close(g, r, rtol=RTOL)


def check_module_float32(make, x):
    """A module built in float32 (`make()` in this process) against the same
    module built under x64: output and parameter gradients."""
    w = _weights(np.shape(x))

    def loss(m, x):
        y = m(x)
        return jnp.sum(jnp.asarray(w, y.dtype) * y)

    m32 = make()
    for leaf in jax.tree.leaves(eqx.filter(m32, eqx.is_inexact_array)):
        assert leaf.dtype == jnp.float32
    y32 = eqx.filter_jit(lambda m, x: m(x))(m32, jnp.asarray(x, jnp.float32))
    g32 = eqx.filter_jit(eqx.filter_grad(loss))(m32, jnp.asarray(x, jnp.float32))
    assert y32.dtype == jnp.float32
    with jax.enable_x64(True):
        m64 = make()
        y64 = np.asarray(eqx.filter_jit(lambda m, x: m(x))(m64, jnp.asarray(x)))
        g64 = eqx.filter_jit(eqx.filter_grad(loss))(m64, jnp.asarray(x))
        g64 = [np.asarray(g) for g in jax.tree.leaves(g64)]
    assert_close(y32, y64, rtol=RTOL)
    g32 = jax.tree.leaves(g32)
    assert len(g32) == len(g64) > 0
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0  # a derivative that is there to compare
        assert_close(g, r, rtol=RTOL)
    return y64


# ------------------------------------------------------------------ ops


@pytest.mark.parametrize("constant", [True, False])
def test_allpole(constant):
    rng = np.random.default_rng(0)
    x, zi = rng.standard_normal(T), rng.standard_normal(2)
    if constant:
        a = stable_poly(rng, 2, 0.9)
        ref = scipy.signal.lfilter(
            [1.0], [1.0, *a], x, zi=scipy.signal.lfiltic([1.0], [1.0, *a], zi)
        )[0]
    else:
        a = time_varying_allpole(rng, T, 2)
        ref, prev = [], list(zi)
        for t in range(T):
            prev = [x[t] - a[t] @ prev] + prev[:-1]
            ref.append(prev[0])
    check_float32(allpole, (x, a, zi), np.asarray(ref))


def test_linear_recurrence():
    rng = np.random.default_rng(1)
    decay, x = rng.uniform(0.2, 0.95, T), rng.standard_normal(T)
    ref, prev = [], 0.3
    for t in range(T):
        prev = x[t] + decay[t] * prev
        ref.append(prev)
    check_float32(linear_recurrence, (decay, x, 0.3), np.asarray(ref))


@pytest.mark.parametrize("constant", [True, False])
def test_fir(constant):
    rng = np.random.default_rng(2)
    x, zi = rng.standard_normal(T), rng.standard_normal(3)
    b = rng.standard_normal(4) if constant else rng.standard_normal((T, 4))
    past = np.concatenate([zi[::-1], x])  # zi[k] = x[-k-1]
    bt = np.broadcast_to(b, (T, 4))
    ref = np.asarray([bt[t] @ past[t + 3 - np.arange(4)] for t in range(T)])
    check_float32(fir, (b, x, zi), ref)


def test_state_space():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 3))
    A = 0.9 * A / np.max(np.abs(np.linalg.eigvals(A)))
    B, C, D = (rng.standard_normal(s) for s in ((3, 2), (2, 3), (2, 2)))
    x, zi = rng.standard_normal((T, 2)), rng.standard_normal(3)
    ref = np_state_space(A, B, C, D, x, zi)[0]
    check_float32(state_space, (A, B, C, D, x, zi), ref)


def test_diag_state_space():
    rng = np.random.default_rng(4)
    a = rng.uniform(-0.95, 0.95, 3)
    B, C, D = (rng.standard_normal(s) for s in ((3, 2), (2, 3), (2, 2)))
    x, zi = rng.standard_normal((T, 2)), rng.standard_normal(3)
    ref = np_state_space(np.diag(a), B, C, D, x, zi)[0]
    check_float32(diag_state_space, (a, B, C, D, x, zi), ref)


# scipy.signal's names, with scipy's arguments (`a` with its leading
# coefficient, here not 1, so that the normalisation is in the derivative).


def _transfer_function(rng):
    a = 1.7 * np.r_[1.0, stable_poly(rng, 3, 0.9)]
    return rng.standard_normal(4), a


def test_scipy_lfilter_with_state():
    rng = np.random.default_rng(7)
    b, a = _transfer_function(rng)
    x, zi = rng.standard_normal(T), rng.standard_normal(3)
    ref = scipy.signal.lfilter(b, a, x, zi=zi)[0]
    check_float32(lambda b, a, x, zi: lfilter(b, a, x, zi=zi)[0], (b, a, x, zi), ref)


def test_scipy_filtfilt():
    rng = np.random.default_rng(8)
    b, a = _transfer_function(rng)
    x = rng.standard_normal(T)
    check_float32(filtfilt, (b, a, x), scipy.signal.filtfilt(b, a, x))


def test_scipy_sosfilt_and_sosfiltfilt():
    rng = np.random.default_rng(9)
    sos = scipy.signal.butter(6, 0.2, output="sos")
    x = rng.standard_normal((2, T))
    check_float32(sosfilt, (sos, x), scipy.signal.sosfilt(sos, x))
    check_float32(sosfiltfilt, (sos, x), scipy.signal.sosfiltfilt(sos, x))


def test_scipy_freqz():
    rng = np.random.default_rng(10)
    b, a = _transfer_function(rng)
    ref = np.abs(scipy.signal.freqz(b, a, worN=64)[1])
    check_float32(lambda b, a: jnp.abs(freqz(b, a, worN=64)[1]), (b, a), ref)


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
    check_float32(lfilter_tv, (b, a, x), np.asarray(ref))


def _away_from_switches(rng, at, rt, zi):
    """A signal none of whose attack/release decisions is near a tie."""
    while True:
        x = rng.uniform(0.0, 2.0, T)
        prev = np.r_[zi, np_ballistics(x, at, rt, zi)[:-1]]
        if np.min(np.abs(x - prev)) > 1e-2:
            return x


def test_ballistics():
    rng = np.random.default_rng(5)
    x = _away_from_switches(rng, 0.4, 0.1, 0.5)
    check_float32(ballistics, (x, 0.4, 0.1, 0.5), np_ballistics(x, 0.4, 0.1, 0.5))


def _level(length):
    # A level that crosses both thresholds of the gain computers below.
    env = np.abs(np.sin(np.linspace(0.1, 3 * np.pi, length))) + 0.01
    return env * np.random.default_rng(6).uniform(0.8, 1.2, length)


def test_compexp_gain():
    x = _level(T)
    params = (-12.0, 4.0, -30.0, 0.5, 0.3, 0.05)
    check_float32(compexp_gain, (x, *params), np_compexp_gain(x, *params))
    # with a soft knee (8 dB) around both thresholds, its width differentiated

    def soft(x, *p):
        return compexp_gain(x, *p[:-1], knee_db=p[-1])

    want = np_compexp_gain(x, *params, knee=8.0)
    check_float32(soft, (x, *params, 8.0), want)


def test_limiter_gain():
    x = _level(T) * 2.0
    check_float32(
        limiter_gain, (x, -3.0, 0.3, 0.05), np_limiter_gain(x, -3.0, 0.3, 0.05)
    )


@pytest.mark.parametrize("mode", ["lowpass", "peak"])
def test_svf(mode):
    rng = np.random.default_rng(7)
    x = rng.standard_normal(T)
    cutoff = 300 + 3000 * (1 + np.sin(np.linspace(0, 6, T))) / 2

    def f(x, cutoff, q):
        return svf(x, cutoff, q, 16_000.0, mode)

    ref = np_svf(x, cutoff, 2.0, 16_000.0, mode)[0]
    check_float32(f, (x, cutoff, 2.0), ref)


# ------------------------------------------------------------------ modules


def test_svf_module():
    x = np.random.default_rng(8).standard_normal(T)
    y = check_module_float32(lambda: SVF(1_200.0, 2.0, 16_000.0, "bandpass"), x)
    assert_close(y, np_svf(x, 1_200.0, 2.0, 16_000.0, "bandpass")[0], rtol=1e-10)


def test_biquad_module():
    x = np.random.default_rng(9).standard_normal(T)
    check_module_float32(lambda: Biquad(np.asarray([0.5, 0.2, 0.1]), 0.9, 0.6), x)


def test_parametric_eq_module():
    x = np.random.default_rng(10).standard_normal(T)
    check_module_float32(
        lambda: ParametricEQ(
            [200.0, 1_000.0, 6_000.0], [3.0, -6.0, 4.0], None, 16_000.0
        ),
        x,
    )


def test_svf_module_from_unconstrained():
    # the documented training path (fit_svf.py's): the module built from its
    # unconstrained vector, and the gradient with respect to that vector (the
    # other modules' maps are the same sigmoid and softplus)
    def make():
        return SVF(1_200.0, 2.0, 16_000.0, "bandpass")

    x = np.random.default_rng(12).standard_normal(T)
    theta = np.asarray(make().to_unconstrained())
    check_float32(lambda theta, x: make().with_unconstrained(theta)(x), (theta, x))


def test_compressor_module():
    rng = np.random.default_rng(11)
    x = rng.standard_normal(256) * np.linspace(0.01, 1.0, 256)
    # The expander acts too (on the quiet start), so every parameter matters;
    # the levels pass through the soft knee, and the gain leads by 4 samples.
    check_module_float32(
        lambda: Compressor(
            threshold_db=-20.0,
            ratio=4.0,
            exp_threshold_db=-30.0,
            sample_rate=8_000.0,
            knee_db=10.0,
            lookahead_samples=4,
        ),
        x,
    )


# ------------------------------------------------------------------ diffusion


def test_implicit_infer_on_a_mixture():
    # Three components on the unit circle; clamp x, answer y from above.
    means = np.asarray([[0.6, 0.8], [0.6, -0.8], [-1.0, 0.0]])
    z0, rho = np.asarray([0.6, 0.5]), np.asarray([np.inf, 0.0])
    zbar = np.asarray([0.3, -1.0])

    def query(means, z0):
        dtype = means.dtype
        mix = rd.GaussianMixtureEps(rd.VPSDE(), means, jnp.asarray(0.1, dtype))
        nodes = rd.field_nodes(jax.random.key(0), 2, samples=4, dtype=dtype)
        model = rd.ImplicitDiffusion(mix, nodes)
        sol = rd.implicit_infer(model, z0, jnp.asarray(rho, dtype))
        return sol.z, sol.converged & sol.stable

    def loss(means, z0):
        return jnp.dot(jnp.asarray(zbar, means.dtype), query(means, z0)[0])

    run = jax.jit(query)
    grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
    z32, ok32 = run(jnp.asarray(means, jnp.float32), jnp.asarray(z0, jnp.float32))
    g32 = grad(jnp.asarray(means, jnp.float32), jnp.asarray(z0, jnp.float32))
    with jax.enable_x64(True):
        z64, ok64 = run(jnp.asarray(means), jnp.asarray(z0))
        g64 = grad(jnp.asarray(means), jnp.asarray(z0))
        g64 = [np.asarray(g) for g in g64]
    assert bool(ok32) and bool(ok64)
    assert z32.dtype == jnp.float32
    # on the upper component, pulled slightly inside it by the smoothing
    assert 0.6 < float(z64[1]) < 0.85
    assert_close(z32, np.asarray(z64), rtol=RTOL)
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0  # a derivative that is there to compare
        assert_close(g, r, rtol=RTOL)


def test_factor_message_and_precision_gradient():
    # Two channels of a three-component mixture: a observed, b soft.
    means = np.asarray([[0.6, 0.8], [0.6, -0.8], [-1.0, 0.0]])

    def query(means, precision):
        dtype = means.dtype
        sched = rd.VPSDE()
        mix = rd.GaussianMixtureEps(sched, means, jnp.asarray(0.3, dtype))
        # noise-free nodes: the same relation in both precisions (random
        # nodes drawn in float32 and float64 differ)
        nodes = rd.noisefree_nodes(2, 0.02, dtype=dtype)
        model = rd.ImplicitDiffusion(mix, nodes, lam=rd.density_lambda(sched, nodes))
        factor = rd.Factor(model, {"a": 1, "b": 1})
        marks = {
            "a": rd.Observed(jnp.asarray(0.6, dtype)),
            "b": rd.Unobserved(jnp.asarray(0.5, dtype), precision),
        }
        sol = rd.factor_infer(factor, marks)
        message = rd.factor_messages(factor, sol, marks)["b"]
        return sol.z[1], message.precision[0, 0], sol.converged & sol.stable

    def answer(means, precision):
        return query(means, precision)[0]

    run = jax.jit(query)
    grad = jax.jit(jax.grad(answer, argnums=(0, 1)))
    args32 = (jnp.asarray(means, jnp.float32), jnp.asarray(2.0, jnp.float32))
    *v32, ok32 = run(*args32)
    g32 = grad(*args32)
    with jax.enable_x64(True):
        args64 = (jnp.asarray(means), jnp.asarray(2.0))
        *v64, ok64 = run(*args64)
        g64 = [np.asarray(g) for g in grad(*args64)]
        v64 = [np.asarray(v) for v in v64]
    assert bool(ok32) and bool(ok64)
    for v, r in zip(v32, v64, strict=True):
        assert v.dtype == jnp.float32
        assert_close(v, r, rtol=RTOL)
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0
        assert_close(g, r, rtol=RTOL)
