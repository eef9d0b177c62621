"""The recurrence core and the ops built directly on it: allpole, linear_recurrence."""

import contextlib
import functools
import io
import json
import os
import pathlib
import re
import subprocess
import sys

import equinox as eqx
import jax
import jax.ad_checkpoint
import jax.extend.core
import jax.numpy as jnp
import lineax as lx
import numpy as np
import optimistix as optx
import pytest
import scipy.signal

import signal_cases
from helpers import (
    allpole_eqns_in,
    assert_close,
    check_float32,
    check_grads,
    check_signal_first,
    copies_in,
    linear_eqns_in,
    naive_allpole,
    np_ballistics,
    scans_in,
    stable_poly,
    time_varying_allpole,
    unchecked,
)
from retrax import _native
from retrax.dynamics import (
    compexp_gain,
    limiter_gain,
)
from retrax.filters import (
    svf,
)
from retrax.ops import (
    allpole,
    ballistics,
    diag_state_space,
    fir,
    lfilter,
    lfilter_tv,
    linear_recurrence,
    sosfilt,
    state_space,
)
from retrax.ops._allpole_lags import (
    _drive as _lag_drive_reference,
    _outer as _lag_outer_reference,
    lag_drive,
    lag_outer,
)
from retrax.ops._allpole_structure import ALLPOLE
from retrax.ops._ballistics_primitive import ballistics_p, switched_loop
from retrax.ops._linear_primitive import (
    allpole_recurrence,
    linear_p,
    state_recurrence,
)
from retrax.ops._recurrence import _recurrence, recurrence
from retrax.ops._sections_gradient import cotangent_p, saved_p
from retrax.ops._state_space import chunk_length
from retrax.ops._state_structures import scan_linear
from retrax.synth import phase


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


REAL = (jnp.float32, jnp.float64)
COMPLEX = (jnp.complex64, jnp.complex128)


def _random(rng, shape, dtype):
    out = rng.standard_normal(shape)
    if jnp.issubdtype(dtype, jnp.complexfloating):
        out = out + 1j * rng.standard_normal(shape)
    return jnp.asarray(out, dtype)


def _time_varying(rng, length, order, dtype, radius=0.9):
    """Slowly varying stable coefficients: a different stable filter per sample."""
    complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
    return jnp.asarray(
        time_varying_allpole(rng, length, order, radius, complex_), dtype
    )


# ---------------------------------------------------------------- values


@pytest.mark.parametrize("order", [1, 2, 4])
def test_allpole_matches_scipy(order):
    rng = np.random.default_rng(order)
    x = rng.standard_normal(500)
    for _ in range(5):
        a = stable_poly(rng, order)
        zi = rng.standard_normal(order)
        y = allpole(jnp.asarray(x), jnp.asarray(a))
        assert_close(y, scipy.signal.lfilter([1.0], [1.0, *a], x))
        # zi[k] = y[-k-1]: scipy's lfiltic takes past outputs newest first too.
        ref_zi = scipy.signal.lfiltic([1.0], [1.0, *a], zi)
        ref = scipy.signal.lfilter([1.0], [1.0, *a], x, zi=ref_zi)[0]
        assert_close(allpole(jnp.asarray(x), jnp.asarray(a), jnp.asarray(zi)), ref)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("constant", [True, False])
def test_allpole_matches_naive_scan(dtype, constant):
    rng = np.random.default_rng(0)
    length, order = 64, 3
    x = _random(rng, length, dtype)
    zi = _random(rng, order, dtype)
    if constant:
        complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
        a = jnp.asarray(stable_poly(rng, order, 0.95, complex_), dtype)
    else:
        a = _time_varying(rng, length, order, dtype)
    y = allpole(x, a, zi)
    assert y.dtype == dtype
    rtol = 1e-12 if dtype in (jnp.float64, jnp.complex128) else 1e-5
    assert_close(y, naive_allpole(x, a, zi), rtol=rtol)


@pytest.mark.parametrize("constant", [True, False])
def test_allpole_streaming_equals_one_call(constant):
    rng = np.random.default_rng(1)
    length, order = 90, 3
    x = jnp.asarray(rng.standard_normal(length))
    a = (
        jnp.asarray(stable_poly(rng, order))
        if constant
        else _time_varying(rng, length, order, jnp.float64)
    )
    zi = jnp.asarray(rng.standard_normal(order))
    y_full, zf_full = allpole(x, a, zi, return_zf=True)
    state, blocks = zi, []
    for sl in (slice(0, 30), slice(30, 32), slice(32, 90)):
        y, state = allpole(x[sl], a if constant else a[sl], state, return_zf=True)
        blocks.append(y)
    assert_close(jnp.concatenate(blocks), y_full)
    assert_close(state, zf_full)
    assert_close(zf_full, y_full[::-1][:order])


def test_allpole_final_state_shorter_than_order():
    # A block shorter than the filter order still returns the right state.
    x = jnp.asarray([1.0, 2.0])
    a = jnp.asarray([0.1, 0.2, 0.3, 0.4])
    zi = jnp.asarray([5.0, 6.0, 7.0, 8.0])
    y, zf = allpole(x, a, zi, return_zf=True)
    assert_close(zf, jnp.concatenate([y[::-1], zi[:2]]))
    y_ref = naive_allpole(x, a, zi)
    assert_close(y, y_ref)


def test_linear_recurrence():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(50))
    decay = jnp.asarray(rng.uniform(0.1, 0.99, 50))
    expected, prev = [], 0.7
    for t in range(50):
        prev = float(x[t]) + float(decay[t]) * prev
        expected.append(prev)
    y, zf = linear_recurrence(x, decay=decay, zi=0.7, return_zf=True)
    assert_close(y, np.asarray(expected))
    assert_close(zf, expected[-1])
    assert zf.shape == ()
    assert_close(linear_recurrence(x, decay=0.5), allpole(x, jnp.asarray([-0.5])))


def test_float32_stays_float32_with_python_scalars():
    x = jnp.ones(8, jnp.float32)
    assert allpole(x, jnp.asarray([0.5], jnp.float32)).dtype == jnp.float32
    assert linear_recurrence(x, decay=0.5).dtype == jnp.float32
    assert linear_recurrence(x, decay=0.5, zi=1.0).dtype == jnp.float32


def test_jit_and_vmap():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal((4, 40)))
    a = jnp.asarray(np.stack([stable_poly(rng, 2) for _ in range(4)]))
    zi = jnp.asarray(rng.standard_normal((4, 2)))
    batched = jax.jit(jax.vmap(allpole))(x, a, zi)
    for i in range(4):
        assert_close(batched[i], naive_allpole(x[i], a[i], zi[i]))
    # Shared coefficients, batched signals.
    shared = jax.vmap(allpole, in_axes=(0, None))(x, a[0])
    assert_close(shared[1], naive_allpole(x[1], a[0]))


# ---------------------------------------------------------------- derivatives


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
@pytest.mark.parametrize("constant", [True, False])
def test_allpole_check_grads(dtype, constant):
    rng = np.random.default_rng(4)
    length, order = 10, 2
    x = _random(rng, length, dtype)
    zi = _random(rng, order, dtype)
    if constant:
        complex_ = jnp.issubdtype(dtype, jnp.complexfloating)
        a = jnp.asarray(stable_poly(rng, order, 0.9, complex_), dtype)
    else:
        a = _time_varying(rng, length, order, dtype)
    check_grads(allpole, (x, a, zi))


def test_linear_recurrence_takes_the_signal_first():
    # a decay per sample has the signal's shape: swapped, both would run
    rng = np.random.default_rng(6)
    x, decay = (jnp.asarray(rng.uniform(0.1, 0.9, 8)) for _ in range(2))
    check_signal_first(linear_recurrence, x, {"decay": decay}, jnp.asarray(0.3))
    with pytest.raises(TypeError, match=re.escape("`linear_recurrence(x, decay=")):
        linear_recurrence.lower(decay, x)
    lowered = linear_recurrence.lower(x, decay=decay)
    assert_close(lowered.compile()(x, decay=decay), linear_recurrence(x, decay=decay))


@pytest.mark.full
def test_linear_recurrence_check_grads():
    rng = np.random.default_rng(5)
    decay = jnp.asarray(rng.uniform(0.2, 0.9, 8))
    x = jnp.asarray(rng.standard_normal(8))
    f = lambda decay, x, zi: linear_recurrence(x, decay=decay, zi=zi)
    check_grads(f, (decay, x, jnp.asarray(0.3)))
    check_grads(f, (jnp.asarray(0.6), x, jnp.asarray(-0.4)))


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.complex128])
def test_gradients_equal_naive_scan_autodiff(dtype):
    rng = np.random.default_rng(6)
    length, order = 200, 3
    x = _random(rng, length, dtype)
    a = _time_varying(rng, length, order, dtype)
    zi = _random(rng, order, dtype)
    w = _random(rng, length, dtype)

    def loss(filt):
        return lambda *args: jnp.real(jnp.sum(w * filt(*args)))

    ours = jax.grad(loss(allpole), argnums=(0, 1, 2))(x, a, zi)
    ref = jax.grad(loss(naive_allpole), argnums=(0, 1, 2))(x, a, zi)
    for g, r in zip(ours, ref, strict=True):
        assert_close(g, r)
    # Forward mode and Hessian-vector products agree too.
    t = tuple(_random(rng, v.shape, dtype) for v in (x, a, zi))
    _, jvp_ours = jax.jvp(allpole, (x, a, zi), t)
    _, jvp_ref = jax.jvp(naive_allpole, (x, a, zi), t)
    assert_close(jvp_ours, jvp_ref)


@pytest.mark.full
def test_hessian_and_float32_grad():
    rng = np.random.default_rng(7)
    x = jnp.asarray(rng.standard_normal(12))
    a = jnp.asarray([-0.5, 0.2])

    def energy(filt):
        return lambda a: jnp.sum(filt(x, a) ** 2)

    assert_close(jax.hessian(energy(allpole))(a), jax.hessian(energy(naive_allpole))(a))
    g32 = jax.grad(energy(allpole))(a.astype(jnp.float32))
    assert g32.dtype == jnp.float32
    assert_close(g32, jax.grad(energy(naive_allpole))(a), rtol=1e-5)


def test_reverse_pass_is_the_adjoint_filter():
    # The gradient holds one forward recursion and one adjoint recursion (the
    # primitive's transpose, run backwards in time), and no scan: nothing is
    # unrolled and no carry history is kept (the primitive's state is the K
    # lagged values).
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal(100))
    a = _time_varying(rng, 100, 2, jnp.float64)
    zi = jnp.zeros(2)

    def loss(x, a, zi):
        return jnp.sum(allpole(x, a, zi) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, a, zi).jaxpr
    assert not scans_in(jaxpr)
    eqns = allpole_eqns_in(jaxpr)
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    # Same under vmap: one recursion each way, on the whole batch.
    batched = jax.make_jaxpr(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(
        x[None].repeat(3, 0), a[None].repeat(3, 0), zi[None].repeat(3, 0)
    ).jaxpr
    eqns = allpole_eqns_in(batched)
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    assert all(eqn.invars[1].aval.shape == (3, 100) for eqn in eqns)


def test_gradient_wrt_x_alone_forms_no_lag_matrix():
    # A symbolic zero tangent of the coefficients: the gradient with respect
    # to the signal is the adjoint recursion of the cotangent alone, with no
    # (T, K) array of lagged outputs built or multiplied.
    length, order = 100, 3
    rng = np.random.default_rng(13)
    x = jnp.asarray(rng.standard_normal(length))
    a = _time_varying(rng, length, order, jnp.float64)

    def loss(x):
        return jnp.sum(allpole(x, a) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(x).jaxpr
    shapes = [v.aval.shape for eqn in jaxpr.eqns for v in eqn.outvars]
    assert (length, order) not in shapes, shapes
    assert len(allpole_eqns_in(jaxpr)) == 2
    assert_close(
        jax.grad(loss)(x), jax.grad(lambda x: jnp.sum(naive_allpole(x, a) ** 2))(x)
    )


def _scan_reference(a, u, zi):
    """The all-pole recursion as the core ran it before it became a primitive:
    a scan with a custom JVP rule, whose transpose JAX derives."""
    return _recurrence("allpole", 2, a, u, zi)


_SLOW = pytest.mark.slow


@pytest.mark.parametrize(
    "order", [pytest.param(1, marks=_SLOW), 2, pytest.param(3, marks=_SLOW)]
)
def test_primitive_gradients_equal_the_scan_rules(order):
    # The primitive (the compiled kernel on the CPU) against the scan with the
    # custom JVP rule it replaced: values, reverse mode with respect to every
    # input or x alone, forward mode and vmap, to 1e-12 of the largest value.
    length = 1200
    rng = np.random.default_rng(20 + order)
    x = jnp.asarray(rng.standard_normal(length))
    zi = jnp.asarray(rng.standard_normal(order))
    w = jnp.asarray(rng.standard_normal(length))
    cases = {
        "constant": jnp.asarray(stable_poly(rng, order, 0.95)),
        "per sample": _time_varying(rng, length, order, jnp.float64),
    }

    def loss(filt):
        return lambda a, x, zi: jnp.sum(w * jnp.tanh(filt(a, x, zi)))

    def same(got, want):
        for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
            assert_close(g, r, rtol=0, atol=1e-12 * float(jnp.max(jnp.abs(r))))

    for a in cases.values():
        args = (a, x, zi)
        for argnums in ((0, 1, 2), (1,)):
            grads = [
                jax.jit(jax.grad(loss(f), argnums=argnums))(*args)
                for f in (allpole_recurrence, _scan_reference)
            ]
            same(*grads)
        tangents = tuple(jnp.asarray(rng.standard_normal(v.shape)) for v in args)
        same(*(jax.jit(functools.partial(jax.jvp, f))(args, tangents)
               for f in (allpole_recurrence, _scan_reference)))  # fmt: skip
        batched = tuple(jnp.stack([v, 0.5 * v]) for v in args)
        same(*(jax.jit(jax.vmap(jax.grad(loss(f), argnums=(0, 1, 2))))(*batched)
               for f in (allpole_recurrence, _scan_reference)))  # fmt: skip


@pytest.mark.parametrize(
    "dtype, constant",
    [
        (jnp.float32, True),
        (jnp.float64, False),
        (jnp.complex64, False),
        pytest.param(jnp.float32, False, marks=_SLOW),
        pytest.param(jnp.float64, True, marks=_SLOW),
        pytest.param(jnp.complex64, True, marks=_SLOW),
        pytest.param(jnp.complex128, False, marks=_SLOW),
    ],
)
def test_primitive_check_grads(dtype, constant):
    # Second order, both modes, on the kernel path (CPU, every dtype it
    # computes); single-precision differences need a larger step (rounding is
    # 1e-7, not 1e-16) and the JAX default tolerance of float32 derivatives.
    rng = np.random.default_rng(30)
    length, order = 12, 2
    x = _random(rng, length, dtype)
    zi = _random(rng, order, dtype)
    if constant:
        a = jnp.asarray(stable_poly(rng, order, 0.9), dtype)
    else:
        a = _time_varying(rng, length, order, dtype)
    single = dtype in (jnp.float32, jnp.complex64)
    tol, eps = (2e-3, 1e-3) if single else (1e-6, 1e-4)
    options = dict(atol=tol, rtol=tol, eps=eps)
    check_grads(allpole_recurrence, (a, x, zi), **options)
    adjoint = functools.partial(allpole_recurrence, adjoint=True)
    check_grads(adjoint, (a, x, jnp.zeros_like(zi)), **options)
    # nested vmap batches the kernel once, whatever axes are mapped
    batched = jax.vmap(jax.vmap(allpole_recurrence, (None, 1, None), 1), (0, 0, 0))
    xs = jnp.stack([jnp.stack([x, 2 * x], 1)] * 3)
    ys = jax.jit(batched)(jnp.stack([a] * 3), xs, jnp.stack([zi] * 3))
    assert_close(ys[2, :, 1], allpole_recurrence(a, 2 * x, zi), rtol=10 * tol)


@pytest.mark.parametrize(
    "dtype, order",
    [
        pytest.param(jnp.float64, 1, marks=_SLOW),
        (jnp.float64, 2),
        (jnp.float64, 3),
        (jnp.float64, 4),
        pytest.param(jnp.float64, 5, marks=_SLOW),  # past the tiled orders
        # orders 5 to 8 run signal by signal, their lags in registers (the
        # same loop as one signal's, checked in float32 for every order below)
        (jnp.float64, 8),
        pytest.param(jnp.float32, 2, marks=_SLOW),
    ],
)
@pytest.mark.full
def test_wide_batch_kernel_equals_the_scan(dtype, order):
    # A batch (of more than one signal) reaches the kernel in its own
    # batch-major layout: with AVX2, in register tiles of 8 (float32) or 4
    # (float64) signals by as many samples, the last group partly filled
    # (83 = 10 * 8 + 3 = 20 * 4 + 3) and the last samples one lane at a time
    # (301 = 37 * 8 + 5 = 75 * 4 + 1); otherwise in blocked groups of 8, 4
    # and 1 signals over blocks of 128 samples. Forward and adjoint,
    # constant and per-sample coefficients, against the pure-JAX lowering.
    batch, length = 83, 301
    assert batch > 1
    rng = np.random.default_rng(40 + order)
    u = _random(rng, (batch, length), dtype)
    zi = _random(rng, (batch, order), dtype)
    constant = jnp.asarray(
        np.stack([stable_poly(rng, order, 0.95) for _ in range(batch)]), dtype
    )
    per_sample = jnp.stack(
        [_time_varying(rng, length, order, dtype) for _ in range(batch)]
    )
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    for a in (constant, per_sample):
        for adjoint in (False, True):
            run = jax.jit(functools.partial(allpole_recurrence, adjoint=adjoint))
            if _native.available("allpole"):
                assert f"@{_native.ALLPOLE}(" in run.lower(a, u, zi).as_text()
            got = run(a, u, zi)
            want = jax.jit(functools.partial(ALLPOLE.scan, adjoint=adjoint, unroll=1))(
                a, u, zi
            )
            scale = float(jnp.max(jnp.abs(want)))
            assert_close(got, want, rtol=0, atol=tol * scale)
            # the pure-JAX CPU lowering, stepping through the batch in place
            in_place = jax.jit(
                functools.partial(ALLPOLE.cpu_scan, adjoint=adjoint, unroll=2)
            )(a, u, zi)
            assert_close(in_place, want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
@pytest.mark.full
def test_one_signal_kernel_equals_the_scan_for_every_order(dtype):
    # One signal runs the kernel's single-signal loop, its lags in registers
    # for orders 1 to 8 (each order its own compiled loop) and in memory past
    # them: forward and adjoint, constant and per-sample coefficients, against
    # the scan.
    length = 301
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    for order in range(1, 10):
        rng = np.random.default_rng(70 + order)
        u = _random(rng, (length,), dtype)
        zi = _random(rng, (order,), dtype)
        constant = jnp.asarray(stable_poly(rng, order, 0.95), dtype)
        # per-sample coefficients that stay near the stable ones, so that
        # float32 compares a bounded signal rather than rounding amplified by
        # growth
        wobble = 1 + 0.01 * jnp.asarray(rng.standard_normal((length, 1)), dtype)
        for a in (constant, constant * wobble):
            for adjoint in (False, True):
                run = jax.jit(functools.partial(allpole_recurrence, adjoint=adjoint))
                if _native.available("allpole"):
                    assert f"@{_native.ALLPOLE}(" in run.lower(a, u, zi).as_text()
                got = run(a, u, zi)
                want = jax.jit(
                    functools.partial(ALLPOLE.scan, adjoint=adjoint, unroll=1)
                )(a, u, zi)
                scale = float(jnp.max(jnp.abs(want)))
                assert_close(got, want, rtol=0, atol=tol * scale)


def _speech_order_case(rng, batch, length, order, dtype):
    """A batch of signals, their initial states and per-sample coefficients:
    per signal, a stable filter whose poles, of radius 0.5 to 0.6, are spread
    over the band (so that float32 compares a bounded signal, not rounding
    amplified by clustered resonances) and shrink by a factor c_t in
    [0.95, 1] at each sample (coefficient k scales by c_t^(k+1))."""
    u = _random(rng, (batch, length), dtype)
    zi = _random(rng, (batch, order), dtype)
    pairs, real = divmod(order, 2)
    base = []
    for _ in range(batch):
        theta = np.pi * (np.arange(pairs) + rng.uniform(0.25, 0.75, pairs)) / pairs
        poles = rng.uniform(0.5, 0.6, pairs) * np.exp(1j * theta)
        real_poles = rng.uniform(-0.6, 0.6, real)
        base.append(np.poly(np.concatenate([poles, poles.conj(), real_poles]))[1:].real)
    shrink = rng.uniform(0.95, 1.0, (batch, length, 1))
    a = np.stack(base)[:, None, :] * shrink ** np.arange(1, order + 1)
    return jnp.asarray(a, dtype), u, zi


def _close_to_peak(got, want, tol, case):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, (case, got.shape, want.shape)
    err = np.max(np.abs(got - want), initial=0.0)
    peak = np.max(np.abs(want), initial=0.0)
    assert err <= tol * peak, f"{case}: max error {err:.3e}, peak {peak:.3e}"


def _check_speech_orders(dtype, cases):
    """Forward and adjoint through the kernel, and the gradient of `sum(w * y)` through
    the public `allpole` (forward, adjoint and lags kernels) against the
    plain `lax.scan` of the recursion, differentiated by JAX."""
    tol = 1e-5 if dtype == jnp.float32 else 1e-12
    for order, batch, length in cases:
        rng = np.random.default_rng(order * 1000 + batch * 10 + length)
        a, u, zi = _speech_order_case(rng, batch, length, order, dtype)
        run = jax.jit(allpole_recurrence)
        if _native.available("allpole"):
            assert f"@{_native.ALLPOLE}(" in run.lower(a, u, zi).as_text()
        got = run(a, u, zi)
        want = jax.jit(jax.vmap(naive_allpole))(u, a, zi)
        case = f"order {order}, B = {batch}, T = {length}"
        _close_to_peak(got, want, tol, case)
        # the adjoint recursion, backwards in time, on its own
        adjoint = [
            jax.jit(functools.partial(f, adjoint=True, **kw))(a, u, zi)
            for f, kw in ((allpole_recurrence, {}), (ALLPOLE.scan, {"unroll": 1}))
        ]
        _close_to_peak(*adjoint, tol, f"{case}, adjoint")
        w = _random(rng, (batch, length), dtype)
        grads = [
            jax.jit(
                jax.grad(lambda u, a, zi, f=f, w=w: jnp.sum(w * f(u, a, zi)), (0, 1, 2))
            )(u, a, zi)
            for f in (jax.vmap(allpole), jax.vmap(naive_allpole))
        ]
        for name, g, r in zip(("u", "a", "zi"), *grads, strict=True):
            _close_to_peak(g, r, tol, f"{case}, gradient with respect to {name}")


def test_speech_order_kernel_equals_the_scan():
    # Per-sample coefficients of orders 9 to 64, float32, a batch: with AVX2
    # the kernel's rows path, forward and adjoint (each signal's coefficients
    # of a sample read as registers, groups of 8 signals in flight, the last
    # group partly filled and the last T mod 8 samples outside the 8 x 8
    # tiles). The first order past the register tiles' (9) and one with a
    # single coefficient in its last register (33); the full set runs every
    # order from 1 to 33.
    _check_speech_orders(jnp.float32, [(9, 11, 301), (33, 3, 17)])


def test_zero_length_batch_with_per_sample_coefficients():
    # A batch of empty signals: no step of the recursion (the pure-JAX
    # batch loop's body could not be traced on an empty time axis).
    a, u, zi = jnp.zeros((3, 0, 2)), jnp.zeros((3, 0)), jnp.ones((3, 2))
    assert jax.jit(jax.vmap(allpole))(u, a, zi).shape == (3, 0)

    def loss(u, a, zi):
        return jnp.sum(jax.vmap(allpole)(u, a, zi))

    grads = jax.jit(jax.grad(loss, (0, 1, 2)))(u, a, zi)
    assert [g.shape for g in grads] == [(3, 0), (3, 0, 2), (3, 2)]
    np.testing.assert_array_equal(grads[2], 0)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.full
def test_speech_order_kernel_equals_the_scan_for_every_order(dtype):
    # Orders 1 to 33 (the register tiles, the signal-by-signal loops and the
    # rows path, which float32 takes from order 9), batches that fill groups
    # of 8 and that do not (2, 3, 11), lengths 0 to 300: shorter than a tile
    # of 8 samples, than the order, or a few tiles and a tail.
    batches = (8, 11, 16, 3, 2)
    lengths = (300, 0, 1, 7, 9, 64, 129)
    cases = []
    for order in range(1, 34):
        cases.append((order, batches[order % len(batches)], 300))
        cases.append((order, 11, lengths[order % len(lengths)]))
    _check_speech_orders(dtype, cases)


@pytest.mark.skipif(
    not _native.available("allpole"), reason="the compiled kernel's lowering"
)
def test_one_signal_gradient_copies_nothing():
    # One signal reaches the all-pole and lags kernels in the default layout
    # (the time-major one has the same bytes, but XLA copied between the
    # two, twice a gradient).
    length = 1_000
    x = jnp.ones(length, jnp.float32)
    a = jnp.broadcast_to(jnp.asarray([-0.5, 0.2], jnp.float32), (length, 2))
    zi = jnp.zeros(2, jnp.float32)
    grad = jax.grad(lambda x, a, zi: jnp.sum(allpole(x, a, zi) ** 2), (0, 1, 2))
    lowered = jax.jit(grad).lower(x, a, zi)
    assert f"@{_native.ALLPOLE_LAGS}(" in lowered.as_text()
    copies = copies_in(lowered.compile().as_text(), str(length))  # of a signal
    assert copies == [], copies


def test_kernels_fill_outputs_past_the_huge_page_size():
    # Outputs of 4 MiB and more are marked for transparent huge pages before
    # the kernels write them (`_native/pages.h`: XLA allocates them afresh at
    # every call). Each kernel's large output, against the pure-JAX loops.
    rng = np.random.default_rng(60)
    batch, length = 24, 50_000  # 4.8 MB a signal batch, 9.6 MB of lags
    f32 = jnp.float32
    u = _random(rng, (batch, length), f32)
    zi = _random(rng, (batch, 2), f32)
    theta = rng.uniform(0.1, 3.0, (batch, 1)) + 0.3 * np.sin(np.arange(length) / 900)
    a = jnp.asarray(
        np.stack([-1.8 * np.cos(theta), np.full_like(theta, 0.81)], -1), f32
    )
    for adjoint in (False, True):
        got = jax.jit(functools.partial(allpole_recurrence, adjoint=adjoint))(a, u, zi)
        want = jax.jit(functools.partial(ALLPOLE.scan, adjoint=adjoint, unroll=1))(
            a, u, zi
        )
        assert_close(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))
        lags = jax.jit(functools.partial(lag_outer, adjoint=adjoint))
        want = _lag_outer_reference(u, got, zi, adjoint=adjoint)
        assert_close(
            lags(u, got, zi), want, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(want)))
        )
    x = jnp.abs(u)
    at = jnp.asarray(rng.uniform(0.01, 0.5, (batch, length)), f32)
    rt = jnp.asarray(rng.uniform(0.01, 0.5, (batch, length)), f32)
    got = jax.jit(jax.vmap(ballistics_p.bind))(x, at, rt, zi[:, 0])
    want = jax.jit(jax.vmap(switched_loop))(x, at, rt, zi[:, 0])
    assert_close(got, want, rtol=1e-6)
    ad = jnp.asarray(rng.uniform(-0.9, 0.9, (batch, length, 2)), f32)
    ud = _random(rng, (batch, length, 2), f32)
    got = jax.jit(jax.vmap(lambda a, u, z: state_recurrence("diagonal", a, u, z)))(
        ad, ud, zi
    )
    want = jax.jit(
        jax.vmap(lambda a, u, z: scan_linear("diagonal", a, u, z, unroll=1))
    )(ad, ud, zi)
    assert_close(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))
    # a batch of more than 16 signals is split over the threads: the dense
    # structure's chunks, complex, forward and adjoint
    c64 = jnp.complex64
    ac = _random(rng, (20, 3_000, 2, 2), c64) * 0.45
    uc = _random(rng, (20, 3_000, 2), c64)
    zc = _random(rng, (20, 2), c64)
    for adjoint in (False, True):
        kernel = functools.partial(state_recurrence, "dense", adjoint=adjoint)
        scan = functools.partial(scan_linear, "dense", unroll=1, adjoint=adjoint)
        got = jax.jit(jax.vmap(kernel))(ac, uc, zc)
        want = jax.jit(jax.vmap(scan))(ac, uc, zc)
        assert_close(got, want, rtol=0, atol=1e-5 * float(jnp.max(jnp.abs(want))))


@pytest.mark.parametrize("dtype", REAL)
@pytest.mark.parametrize("adjoint", [False, True])
@pytest.mark.full
def test_lag_products_equal_their_expressions(dtype, adjoint):
    # The coefficients' cotangent (`lag_outer`, a compiled loop on the CPU)
    # and the drive it transposes, against their XLA expressions: orders 1 to
    # 5 (past the kernel's fixed orders) and 9 and 32 (read from the reversed
    # copy), signals shorter than and as long as the order, one
    # signal and a batch; and the pair transposes each other, in every operand.
    rng = np.random.default_rng(50)
    cases = [(1, 7, 3), (2, 33, 5), (3, 2, 2), (5, 19, 0), (9, 9, 0), (32, 100, 2)]
    for order, length, batch in cases:
        shape = (batch,) if batch else ()
        ct = _random(rng, (*shape, length), dtype)
        out = _random(rng, (*shape, length), dtype)
        zi = _random(rng, (*shape, order), dtype)
        da = _random(rng, (*shape, length, order), dtype)
        run = jax.jit(lambda c, o, z: lag_outer(c, o, z, adjoint=adjoint))
        if _native.available("allpole"):
            assert f"@{_native.ALLPOLE_LAGS}(" in run.lower(ct, out, zi).as_text()
        want = _lag_outer_reference(ct, out, zi, adjoint=adjoint)
        tol = 1e-6 if dtype == jnp.float32 else 1e-15
        assert_close(
            run(ct, out, zi), want, rtol=0, atol=tol * float(jnp.max(jnp.abs(want)))
        )
        assert_close(
            lag_drive(da, out, zi, adjoint=adjoint),
            _lag_drive_reference(da, out, zi, adjoint=adjoint),
            rtol=tol,
        )
        # <outer(ct), da> = <ct, drive(da)>, and the transposes in the other
        # operands (higher orders) are the expressions'
        assert_close(
            jnp.vdot(run(ct, out, zi), da),
            jnp.vdot(ct, lag_drive(da, out, zi, adjoint=adjoint)),
            rtol=100 * tol,
        )
        for f, ref, first in [
            (lag_drive, _lag_drive_reference, da),
            (lag_outer, _lag_outer_reference, ct),
        ]:
            shape = jax.eval_shape(
                lambda *v, f=f: f(*v, adjoint=adjoint), first, out, zi
            )
            cot = _random(rng, shape.shape, dtype)
            for argnum in (0, 1, 2):
                args = [first, out, zi]

                def linear(v, f=f, argnum=argnum, args=args):
                    return f(*args[:argnum], v, *args[argnum + 1 :], adjoint=adjoint)

                def linear_ref(v, ref=ref, argnum=argnum, args=args):
                    return ref(*args[:argnum], v, *args[argnum + 1 :], adjoint=adjoint)

                got = jax.linear_transpose(linear, args[argnum])(cot)
                ref_t = jax.linear_transpose(linear_ref, args[argnum])(cot)
                assert_close(got[0], ref_t[0], rtol=100 * tol, atol=100 * tol)


def test_saved_residuals_are_inputs_output_and_lags(capsys):
    length, order = 100, 2
    rng = np.random.default_rng(9)
    x = jnp.asarray(rng.standard_normal(length))
    a = _time_varying(rng, length, order, jnp.float64)
    zi = jnp.zeros(order)

    def loss(x, a, zi):
        return jnp.sum(jnp.sin(allpole(x, a, zi)))

    jax.ad_checkpoint.print_saved_residuals(loss, x, a, zi)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    shapes = []
    for line in lines:
        match = re.match(r"\s*\w+\[([\d,]*)\]", line)
        assert match, line
        dims = tuple(int(d) for d in match.group(1).split(",") if d)
        shapes.append(dims)
    # Allowed: the inputs (as arguments), (T,)-sized signals (the output and
    # the cosine of it, which belongs to `sin`), the coefficients and at most
    # one (T, K) array of lagged outputs. Nothing of size T x carry-history.
    lag_arrays = [s for s in shapes if s == (length, order)]
    for s in shapes:
        assert s in {(length,), (length, order), (order,), ()}, (s, lines)
    # `a` itself is an input; at most one more (T, K) array (the lags).
    assert len(lag_arrays) <= 2, lines
    assert sum(int(np.prod(s)) for s in shapes) <= 3 * length + 2 * length * order + 8


def _recurrences(jaxpr):
    """The time recursions of a program, as their `reverse` flags: every scan,
    the all-pole and the diagonal/dense primitives (forward or adjoint), and
    the compiled kernel
    (`ffi_call`, forward). The branches of a `cond` that picks one
    implementation per platform count once."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn.params["reverse"])
        elif eqn.primitive is linear_p:
            found.append(eqn.params["adjoint"])
        elif eqn.primitive is ballistics_p:
            found.append(False)
        elif eqn.primitive.name == "ffi_call":
            found.append(False)
        elif eqn.primitive in (saved_p, cotangent_p):  # the sections' kernels
            found.append(eqn.primitive is cotangent_p)
        subs = [
            _recurrences(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)
        ]
        if eqn.primitive.name == "cond":
            branches = [b for b in subs if b]
            assert all(b == branches[0] for b in branches), branches
            found.extend(branches[0] if branches else [])
        else:
            for sub in subs:
                found.extend(sub)
    return found


def _residual_shapes(f, *args):
    """The shapes of what reverse mode keeps from the forward pass."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(f, *args)
    shapes = []
    for line in out.getvalue().splitlines():
        match = re.match(r"\s*\w+\[([\d,]*)\]", line)
        assert match, line
        shapes.append(tuple(int(d) for d in match.group(1).split(",") if d))
    return shapes


def _lfilter_tv(b, a, x):
    # `b` and `a` without the leading 1 (the time-first, direct form II call).
    return lfilter_tv(x, b=b, a=a)


def _diag_state_space(a, B, C, D, x):
    return diag_state_space(x, a=a, B=B, C=C, D=D)


def _adjoint_cases(length=100):
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.standard_normal(length))
    sos = jnp.asarray(scipy.signal.butter(4, 0.3, output="sos"))  # 2 sections
    b, a = scipy.signal.butter(2, 0.3)
    xm = jnp.asarray(rng.standard_normal((length, 2)))
    B, C, D = (jnp.asarray(rng.standard_normal(s)) for s in ((3, 2), (2, 3), (2, 2)))
    decay = jnp.asarray(rng.uniform(-0.9, 0.9, 3))
    xb = jnp.asarray(away_from_ties(rng, length))
    # (name, op, args, recursions each way, state size, residual shapes allowed)
    n = length
    return [
        ("lfilter_tv", _lfilter_tv, (jnp.asarray(b), jnp.asarray(a[1:]), x), 1, 2,
         {(n,), (n, 2), (2,), ()}),
        ("lfilter", lfilter, (jnp.asarray(b), jnp.asarray(a), x), 1, 2,
         {(n,), (n, 2), (2,), (3,), ()}),
        # the sections' kernels: one pass each way, the checkpoints kept
        # (one block, 2 values of each of the 2 sections: (1, 4)); elsewhere
        # the sections run as a scan over them, a residual of each stacked
        # along a leading axis of the 2 sections
        ("sosfilt", sosfilt, (sos, x), 1, 2,
         {(n,), (1, 4), (2, 1), (2, 5), (2, 6), (4,), ()})
        if _native.available("allpole")
        else ("sosfilt", sosfilt, (sos, x), 2, 2,
              {(n,), (n, 2), (2,), (), (2, n), (2, n, 2), (2, 2), (2, 1),
               (2, 6)}),
        # (`()`: the maps' checks, whose factor the backward pass reads)
        ("diag_state_space", _diag_state_space, (decay, B, C, D, xm), 1, 3,
         {(n, 2), (n, 3), (1, 3), (3,), (2, 3), (3, 2), (2, 2), ()}),
        ("ballistics", ballistics, (xb, jnp.asarray(0.4), jnp.asarray(0.1)), 1, 1,
         {(n,), (n, 1), (1,), ()}),
    ]  # fmt: skip


def away_from_ties(rng, length):
    """A level none of whose attack/release decisions is near a tie."""
    while True:
        x = rng.uniform(0.0, 2.0, length)
        prev = np.r_[0.0, np_ballistics(x, 0.4, 0.1, 0.0)[:-1]]
        if np.min(np.abs(x - prev)) > 1e-3:
            return x


@pytest.mark.parametrize("case", _adjoint_cases(), ids=lambda c: c[0])
def test_reverse_pass_is_the_adjoint_filter_for_every_op(case):
    # As for `allpole`: the gradient runs one recursion forward (scan or the
    # compiled kernel) and its adjoint backward in time, per section, each
    # carrying only the state; reverse mode keeps O(T x state) numbers (the
    # lags, the per-sample coefficients, the inputs), no history of carries.
    _, op, args, per_way, n_state, allowed = case
    length = 100

    def loss(*v):
        return jnp.sum(jnp.sin(op(*v)))

    argnums = tuple(range(len(args)))
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=argnums))(*args).jaxpr
    assert sorted(_recurrences(jaxpr)) == [False] * per_way + [True] * per_way
    for eqn in scans_in(jaxpr):
        if eqn.params["length"] != length:
            continue  # a scan over an SOS cascade's sections carries the signal
        carry = eqn.params["jaxpr"].in_avals[: eqn.params["num_carry"]]
        assert sum(int(np.prod(v.shape)) for v in carry) <= n_state
    shapes = _residual_shapes(loss, *args)
    for shape in shapes:
        assert shape in allowed, (shape, shapes)
    bound = (4 * n_state * per_way + 2) * length
    assert sum(int(np.prod(s)) for s in shapes) <= bound, shapes


def test_state_space_recomputes_blocks_within_its_memory_bound():
    # Past one block (`chunk_length` samples), `state_space` stores only the
    # state at each block's start and recomputes the block's states before
    # its adjoint: the saved numbers grow with T x inputs (the signal) and
    # T / block x state, never with T x state.
    n_state, length = 8, 8 * chunk_length(8)
    rng = np.random.default_rng(12)
    A = jnp.asarray(0.5 * np.eye(n_state) + 0.05 * rng.standard_normal((8, 8)))
    B, C = (
        jnp.asarray(rng.standard_normal((8, 1))),
        jnp.asarray(rng.standard_normal((1, 8))),
    )
    x = jnp.asarray(rng.standard_normal((length, 1)))

    def loss(A, B, C, x):
        return jnp.sum(jnp.sin(state_space(x, A=A, B=B, C=C, D=None)))

    shapes = _residual_shapes(loss, A, B, C, x)
    total = sum(int(np.prod(s)) for s in shapes)
    # the signal, its sine's cosine, the maps, and 8 block-start states
    assert total <= 3 * length + 4 * n_state**2 + 8 * n_state, shapes
    assert total < length * n_state / 2, shapes
    # a single block (short signal) keeps its states: the plain adjoint
    short = _residual_shapes(loss, A, B, C, x[:100])
    assert (100, n_state) in short
    # and the blocked gradient equals the gradient of one plain recursion
    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(A, B, C, x)

    def plain(A, B, C, x):
        h = jax.lax.scan(lambda h, u: (A @ h + B @ u, h), jnp.zeros(n_state), x)[1]
        return jnp.sum(jnp.sin(h @ C.T))

    ref = jax.jit(jax.grad(plain, argnums=(0, 1, 2)))(A, B, C, x)
    for g, r in zip(grads, ref, strict=True):
        assert_close(g, r, rtol=1e-10)


def test_root_find_through_allpole():
    # Find the constant coefficient whose filtered step response ends at 2.
    x = jnp.ones(32)

    def residual(a, _):
        return allpole(x, a)[-1:] - 2.0

    def solve(target_scale):
        sol = optx.root_find(
            lambda a, s: residual(a, None) * s,
            optx.Newton(rtol=1e-12, atol=1e-12),
            jnp.asarray([-0.3]),
            args=target_scale,
            adjoint=optx.ImplicitAdjoint(lx.AutoLinearSolver(well_posed=True)),
        )
        return sol.value

    a = solve(1.0)
    assert_close(allpole(x, a)[-1], 2.0, rtol=1e-10)

    # The implicit gradient of the root with respect to a parameter of the
    # residual: the steady gain is 1 / (1 + a), so the root of
    # allpole(x, a)[-1] = c is (almost) a = 1/c - 1.
    def root_of(c):
        sol = optx.root_find(
            lambda a, c: allpole(x, a)[-1:] - c,
            optx.Newton(rtol=1e-12, atol=1e-12),
            jnp.asarray([-0.3]),
            args=c,
            adjoint=optx.ImplicitAdjoint(lx.AutoLinearSolver(well_posed=True)),
        )
        return sol.value[0]

    c = jnp.asarray(2.0)
    grad = jax.grad(root_of)(c)
    eps = 1e-6
    fd = (root_of(c + eps) - root_of(c - eps)) / (2 * eps)
    assert_close(grad, fd, rtol=1e-6)


# ---------------------------------------------------------------- bad input


def test_bad_input():
    # The library's own checks, as a user meets them (without the test suite's
    # jaxtyping hook, which would otherwise reject some shapes first).
    x = jnp.ones(10)
    a = jnp.asarray([0.1, 0.2])
    bad = (ValueError, TypeError)
    allpole_, linrec_ = unchecked(allpole), unchecked(linear_recurrence)
    with pytest.raises(bad, match="`a` must have one row per sample of `x`"):
        allpole_(x, jnp.ones((9, 2)))  # mismatched length
    with pytest.raises(bad, match=r"`x` must be one signal of shape \(time,\)"):
        allpole_(jnp.ones((2, 10)), a)  # wrong rank
    with pytest.raises(bad, match=r"`a` must have shape \(order,\) or"):
        allpole_(x, jnp.ones((10, 2, 1)))
    with pytest.raises(bad, match="`zi` must be the last 2 outputs"):
        allpole_(x, a, jnp.ones(3))
    with pytest.raises(bad, match="`decay` must be a scalar or have the shape"):
        linrec_(x, decay=jnp.ones(9))
    with pytest.raises(bad, match="`zi` must be a scalar"):
        linrec_(x, decay=0.5, zi=jnp.ones(2))


def test_unstable_filter_is_not_a_crash():
    # Documented behaviour: the recursion grows, it does not raise. With
    # y[t] = 1 + 1.5 y[t-1] the closed form is y[t] = 2 (1.5^(t+1) - 1): the
    # values follow it while they are representable, then overflow to +inf
    # (never NaN, never a wrapped or clipped number).
    y = np.asarray(allpole(jnp.ones(2000), jnp.asarray([-1.5])))
    t = np.arange(2000)
    with np.errstate(over="ignore"):
        exact = 2.0 * (1.5 ** (t + 1.0) - 1.0)
    finite = np.isfinite(exact)
    assert 100 < finite.sum() < 2000
    assert_close(y[finite], exact[finite], rtol=1e-12)
    assert np.all(y[~finite] == np.inf)


def test_core_structures_agree():
    # The diagonal and dense transitions of the core agree with one another
    # and with a loop, including their gradients.
    rng = np.random.default_rng(10)
    length, n = 12, 3
    a = jnp.asarray(rng.uniform(-0.9, 0.9, (length, n)))
    u = jnp.asarray(rng.standard_normal((length, n)))
    zi = jnp.asarray(rng.standard_normal(n))
    diag = recurrence("diagonal", 2, a, u, zi)
    dense = recurrence("dense", 2, jax.vmap(jnp.diag)(a), u, zi)
    h, ref = np.asarray(zi), []
    for t in range(length):
        h = np.asarray(a[t]) * h + np.asarray(u[t])
        ref.append(h)
    assert_close(diag, np.stack(ref))
    assert_close(dense, np.stack(ref))
    check_grads(lambda a, u, z: recurrence("diagonal", 2, a, u, z), (a, u, zi))
    A = jnp.asarray(rng.uniform(-0.4, 0.4, (n, n)))
    check_grads(lambda A, u, z: recurrence("dense", 1, A, u, z), (A, u, zi))


def test_filter_inside_equinox_module():
    class OnePole(eqx.Module):
        pole: jax.Array

        def __call__(self, x):
            return linear_recurrence(x, decay=self.pole)

    model = OnePole(jnp.asarray(0.5))
    x = jnp.ones(16)
    grads = eqx.filter_grad(lambda m: jnp.sum(m(x)))(model)
    # y[t] = sum_{k<=t} p^k, so d sum(y) / dp = sum_t sum_{k<=t} k p^(k-1).
    p, t = 0.5, np.arange(16)
    exact = sum(np.sum(np.arange(1, n + 1) * p ** np.arange(n)) for n in t)
    assert_close(grads.pole, exact)


# ---------------------------------------------------------------- diagonal, dense


def _state_case(rng, structure, dtype, length, n, constant, batch=()):
    """Stable coefficients, a drive and a state for `state_recurrence`: every
    step's transition has norm between 0.2 and 0.8 (eigenvalues of a
    diagonal; Frobenius norm, so spectral norm at most that, of a matrix)."""
    shape = batch + (() if constant else (length,))
    shape += (n,) if structure == "diagonal" else (n, n)
    a = _random(rng, shape, dtype)
    if structure == "diagonal":
        norm = jnp.abs(a)
    else:
        norm = jnp.sqrt(jnp.sum(jnp.abs(a) ** 2, axis=(-2, -1), keepdims=True))
    scale = jnp.asarray(rng.uniform(0.2, 0.8, norm.shape), norm.dtype)
    a = a * (scale / norm).astype(dtype)
    u = _random(rng, batch + (length, n), dtype)
    zi = _random(rng, batch + (n,), dtype)
    return a, u, zi


def _naive_state_recurrence(structure, a, u, zi, adjoint=False):
    """The recursion of one signal as a plain `lax.scan`, from its definition:
    $h_t = M_t h_{t-1} + u_t$, or the adjoint $w_s = u_s + M_{s+1}^T w_{s+1}$
    (no conjugation), $w_T = z$, with $M_T = 0$ for per-sample coefficients."""
    length = u.shape[0]
    per_sample = a.ndim == (2 if structure == "diagonal" else 3)
    coeffs = a if per_sample else jnp.broadcast_to(a, (length, *a.shape))
    if structure == "diagonal":
        step_matrices = jax.vmap(jnp.diag)(coeffs)
    else:
        step_matrices = coeffs
    if not adjoint:

        def step(h, inp):
            m, ut = inp
            h = m @ h + ut
            return h, h

        return jax.lax.scan(step, zi, (step_matrices, u))[1]
    last = jnp.zeros_like(step_matrices[:1]) if per_sample else step_matrices[:1]
    following = jnp.concatenate([step_matrices[1:], last])

    def back(w, inp):
        m, ut = inp
        w = m.T @ w + ut
        return w, w

    return jax.lax.scan(back, zi, (following, u), reverse=True)[1]


_STATE_CASES = [
    (structure, n)
    for structure, sizes in (("diagonal", (1, 3, 9)), ("dense", (1, 2, 5)))
    for n in sizes
]


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("structure", ["diagonal", "dense"])
@pytest.mark.full
def test_state_kernel_matches_naive_scan(structure, dtype):
    # The primitive (the compiled kernel on the CPU) against a scan of the
    # definition, forward and adjoint, constant and per-sample coefficients,
    # for one signal (a batch of one in the kernel) and a batch of 11 (lanes
    # of 8 and a remainder); the diagonal's chains are channels (N = 9: 8 + 1
    # of one signal) or span signals (N = 1, 3), the dense sizes 1 and 2 are
    # the kernel's compiled ones and 5 one it reads at run time.
    rng = np.random.default_rng(50)
    length = 37
    single = dtype in (jnp.float32, jnp.complex64)
    tol = 1e-5 if single else 1e-12

    def both(f):
        return lambda *v: (f(structure, *v), f(structure, *v, adjoint=True))

    for n in (n for s, n in _STATE_CASES if s == structure):
        for constant in (True, False):
            for batch in ((), (11,)):
                args = _state_case(rng, structure, dtype, length, n, constant, batch)
                run, naive = both(state_recurrence), both(_naive_state_recurrence)
                if batch:
                    run, naive = jax.vmap(run), jax.vmap(naive)
                run = jax.jit(run)
                if _native.available("linear"):
                    text = run.lower(*args).as_text()
                    assert text.count(f"@{_native.LINEAR}(") == 2
                for got, want in zip(run(*args), jax.jit(naive)(*args), strict=True):
                    assert got.dtype == dtype
                    scale = float(jnp.max(jnp.abs(want)))
                    assert_close(got, want, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("dtype", REAL + COMPLEX)
@pytest.mark.parametrize("structure", ["diagonal", "dense"])
@pytest.mark.full
def test_state_primitive_check_grads(structure, dtype):
    # Second order, both modes, on the kernel path, forward and adjoint,
    # constant and per-sample coefficients; single precision needs a larger
    # step and the JAX default tolerance of float32 derivatives.
    rng = np.random.default_rng(51)
    length, n = 12, 2
    single = dtype in (jnp.float32, jnp.complex64)
    tol, eps = (2e-3, 1e-3) if single else (1e-6, 1e-5)
    options = dict(atol=tol, rtol=tol, eps=eps)
    for constant in (True, False):
        args = _state_case(rng, structure, dtype, length, n, constant)
        for adjoint in (False, True):
            run = functools.partial(state_recurrence, structure, adjoint=adjoint)
            check_grads(run, args, **options)


@pytest.mark.parametrize("structure", ["diagonal", "dense"])
def test_state_gradients_equal_naive_scan_autodiff(structure):
    # Reverse mode through the primitive (the adjoint kernel) equals JAX's
    # own derivative of the plain scan, for every input and for u alone,
    # complex included (no conjugation in the transpose).
    rng = np.random.default_rng(52)
    for dtype in (jnp.float64, jnp.complex128):
        for constant in (True, False):
            args = _state_case(rng, structure, dtype, 40, 3, constant)
            w = _random(rng, (40, 3), dtype)

            def loss(f, w=w):
                return lambda *v: jnp.sum(jnp.real(w * jnp.sin(f(structure, *v))))

            for argnums in ((0, 1, 2), (1,)):
                got, want = (
                    jax.jit(jax.grad(loss(f), argnums=argnums))(*args)
                    for f in (state_recurrence, _naive_state_recurrence)
                )
                for g, r in zip(got, want, strict=True):
                    assert_close(g, r, rtol=1e-12)


@pytest.mark.parametrize("structure", ["diagonal", "dense"])
def test_state_gradient_wrt_u_alone_forms_no_lagged_products(structure):
    # A symbolic zero tangent of the coefficients: the gradient with respect
    # to u is the adjoint recursion of the cotangent alone; no product of the
    # coefficients' tangent with the lagged states is formed.
    rng = np.random.default_rng(53)
    a, u, zi = _state_case(rng, structure, jnp.float64, 50, 3, False)

    def loss(u):
        return jnp.sum(state_recurrence(structure, a, u, zi) ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss))(u).jaxpr
    names = {eqn.primitive.name for eqn in jaxpr.eqns}
    assert not names & {"concatenate", "dot_general", "scan"}, names
    eqns = linear_eqns_in(jaxpr)
    assert sorted(eqn.params["adjoint"] for eqn in eqns) == [False, True]
    want = jax.grad(
        lambda u: jnp.sum(_naive_state_recurrence(structure, a, u, zi) ** 2)
    )(u)
    assert_close(jax.grad(loss)(u), want)


@pytest.mark.parametrize("structure", ["diagonal", "dense"])
def test_state_vmap_over_any_axis_and_nested(structure):
    # vmap over axis 1 of u and nested vmaps reach the kernel as one leading
    # batch axis; values and gradients equal the signals' one-by-one runs.
    rng = np.random.default_rng(54)
    length, n = 30, 2
    cases = [_state_case(rng, structure, jnp.float64, length, n, False)
             for _ in range(6)]  # fmt: skip
    a = jnp.stack([c[0] for c in cases]).reshape(3, 2, *cases[0][0].shape)
    u = jnp.stack([c[1] for c in cases]).reshape(3, 2, length, n)
    zi = jnp.stack([c[2] for c in cases]).reshape(3, 2, n)
    run = functools.partial(state_recurrence, structure)
    # inner map over axis 1 of u (time first), outer over the leading axis
    inner = jax.vmap(run, (0, 1, 0), 1)
    nested = jax.jit(jax.vmap(inner, (0, 0, 0), 0))
    u_time_first = jnp.moveaxis(u, 2, 1)  # (3, T, 2, n)
    got = nested(a, u_time_first, zi)
    jaxpr = jax.make_jaxpr(nested)(a, u_time_first, zi).jaxpr
    (eqn,) = linear_eqns_in(jaxpr)
    assert eqn.invars[1].aval.shape == (6, length, n)

    def loss(f):
        return lambda a, u, zi: jnp.sum(jnp.sin(f(a, u, zi)))

    grads = jax.jit(jax.grad(loss(nested), argnums=(0, 1, 2)))(a, u_time_first, zi)
    for i in range(3):
        for j in range(2):
            args = (a[i, j], u[i, j], zi[i, j])
            assert_close(got[i, :, j], run(*args))
            one = jax.grad(loss(run), argnums=(0, 1, 2))(*args)
            assert_close(grads[0][i, j], one[0])
            assert_close(grads[1][i, :, j], one[1])
            assert_close(grads[2][i, j], one[2])


_SHARD_MAP_SCRIPT = """
import json, os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P
jax.config.update("jax_enable_x64", True)
from retrax.ops._linear_primitive import state_recurrence
rng = np.random.default_rng(0)
mesh = jax.make_mesh((4,), ("batch",))
errors = {}
for structure, shape in (("diagonal", (8, 40, 3)), ("dense", (8, 40, 3, 3))):
    a = jnp.asarray(rng.uniform(-0.3, 0.3, shape))
    u = jnp.asarray(rng.standard_normal((8, 40, 3)))
    zi = jnp.asarray(rng.standard_normal((8, 3)))
    run = jax.vmap(lambda a, u, zi: state_recurrence(structure, a, u, zi))
    def loss(f):
        return lambda a, u, zi: jnp.sum(jnp.sin(f(a, u, zi)) ** 2)
    ref = (run(a, u, zi), jax.grad(loss(run), argnums=(0, 1, 2))(a, u, zi))
    sharded = jax.shard_map(run, mesh=mesh, in_specs=P("batch"),
                            out_specs=P("batch"))
    put = lambda v: jax.device_put(v, NamedSharding(mesh, P("batch")))
    args = tuple(put(v) for v in (a, u, zi))
    got = (jax.jit(sharded)(*args),
           jax.jit(jax.grad(loss(sharded), argnums=(0, 1, 2)))(*args))
    auto = jax.jit(run).lower(*args).compile().as_text()
    errors[structure] = {
        "error": max(float(jnp.max(jnp.abs(g - r)))
                     for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(ref))),
        "devices": len(got[0].sharding.device_set),
        "all_gather": "all-gather" in auto,
    }
print("RESULT " + json.dumps(errors))
"""


@pytest.mark.full
def test_state_primitive_inside_shard_map_equals_one_device():
    # On 4 simulated devices (a subprocess: the device count is fixed when
    # JAX starts), forward and gradient inside `shard_map` equal one
    # device's, and under `jit` a sharded batch is not gathered.
    env = dict(os.environ)
    env["JAX_PLATFORMS"] = "cpu"
    src = str(pathlib.Path(__file__).parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
    proc = subprocess.run(
        [sys.executable, "-c", _SHARD_MAP_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    for structure, found in result.items():
        assert found["devices"] == 4, structure
        assert found["error"] <= 1e-12, (structure, found)
        assert not found["all_gather"], structure


T = 64


@pytest.mark.float32
def test_this_process_is_float32():
    assert not jax.config.jax_enable_x64
    assert jnp.asarray(1.0).dtype == jnp.float32


@pytest.mark.float32
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


@pytest.mark.float32
def test_linear_recurrence_in_float32():
    rng = np.random.default_rng(1)
    decay, x = rng.uniform(0.2, 0.95, T), rng.standard_normal(T)
    ref, prev = [], 0.3
    for t in range(T):
        prev = x[t] + decay[t] * prev
        ref.append(prev)
    check_float32(
        lambda decay, x, zi: linear_recurrence(x, decay=decay, zi=zi),
        (decay, x, 0.3),
        np.asarray(ref),
    )


SR = 8_000.0


V_T = 16


X = jnp.asarray(np.random.default_rng(0).normal(size=V_T))


A_ = jnp.asarray  # noqa: N816


_I2 = jnp.eye(2) * 0.5


_B, _C, _D = jnp.ones((2, 1)), jnp.ones((1, 2)), jnp.ones((1, 1))


@pytest.mark.loud
def test_nonfinite_state_passes_through():
    # `zi` continues the signal (the `zf` of a previous block), so it passes too.
    zi = A_([np.nan, 0.0])
    for g in (allpole, jax.jit(allpole)):
        assert bool(jnp.all(jnp.isnan(g(X, A_([-0.5, 0.2]), zi))))
    assert bool(jnp.isnan(ballistics(X, 0.2, 0.2, A_(np.nan))[0]))
    assert bool(jnp.isnan(svf(X, 1_000.0, 1.0, SR, zi=zi)[0]))


@pytest.mark.loud
def test_integer_coefficients_keep_a_float32_signal_float32():
    # JAX promotes int32 with float32 to float32: so do the ops.
    x32 = X.astype(jnp.float32)
    assert allpole(x32, jnp.asarray([0, 0], jnp.int32)).dtype == jnp.float32
    assert fir(x32, b=np.asarray([1, 2])).dtype == jnp.float32
    assert svf(x32, 1_000, 1, 44_100).dtype == jnp.float32
    assert ballistics(jnp.abs(x32), 1, 1).dtype == jnp.float32
    assert compexp_gain(jnp.abs(x32), -10, 4, -60, 0.5, 1, 1).dtype == jnp.float32


_EMPTY = jnp.zeros(0)


@pytest.mark.loud
def test_empty_block_passes_the_state_on():
    zi = A_([0.3, -0.2])
    _, zf = allpole(_EMPTY, A_([0.5, 0.1]), zi, return_zf=True)
    assert_close(zf, zi)
    _, zf = ballistics(_EMPTY, 0.5, 0.5, A_(0.7), return_zf=True)
    assert_close(zf, A_(0.7))
    _, zf = limiter_gain(_EMPTY, -3.0, 0.5, 0.5, zi=zi, return_zf=True)
    assert_close(zf, zi)
    _, zf = svf(_EMPTY, 1_000.0, 1.0, SR, zi=zi, return_zf=True)
    assert_close(zf, zi)
    y, zf = state_space(
        jnp.zeros((0, 1)), A=_I2, B=_B, C=_C, D=_D, zi=zi, return_zf=True
    )
    assert y.shape == (0, 1)
    assert_close(zf, zi)
    _, zf = phase(_EMPTY, SR, 1.25, return_zf=True)
    assert_close(zf, A_(0.25))


class TestInputPolicy(signal_cases.InputPolicy):
    """The input policy shared by the signal-processing areas
    (signal_cases.py), over this area's functions."""

    area = "ops"
