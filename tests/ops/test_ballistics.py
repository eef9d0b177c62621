import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers
from helpers import (
    assert_close,
    check_float32,
    check_grads,
    np_ballistics,
    unchecked,
)
from retrax import _native
from retrax.ops import ballistics, linear_recurrence
from retrax.ops._ballistics_primitive import ballistics_p, switched, switched_loop


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def _one_pole(decay, drive, zi):
    step = lambda h, inp: (inp[0] * h + inp[1],) * 2
    return jax.lax.scan(step, jnp.asarray(zi), (decay, drive))[1]


def scan_ballistics(x, at, rt, zi):
    """The switched recursion as a plain `lax.scan`, step `(1 - c) y + (c x)`."""
    at = jnp.broadcast_to(at, x.shape)
    rt = jnp.broadcast_to(rt, x.shape)

    def step(prev, inp):
        xt, att, rtt = inp
        c = jnp.where(xt < prev, att, rtt)
        y = (1 - c) * prev + c * xt
        return y, y

    return jax.lax.scan(step, jnp.asarray(zi), (x, at, rt))[1]


def test_matches_switched_recursion():
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=200))
    for at, rt in [
        (0.3, 0.05),
        (rng.uniform(0.1, 0.9, 200), rng.uniform(0.01, 0.2, 200)),
    ]:
        for zi in (0.0, 1.5):
            ref = np_ballistics(x, at, rt, zi)
            y, zf = ballistics(x, at, rt, zi, return_zf=True)
            assert_close(y, ref, rtol=1e-15)
            assert float(zf) == float(y[-1])
            # the values are consistent with their own decisions: the one-pole
            # with the coefficients chosen by switching on the output itself
            # reproduces it (same step order as the op, torchcomp's)
            c = np.broadcast_to(
                np.where(x < np.r_[zi, np.asarray(y)[:-1]], at, rt), x.shape
            )
            prev, same = zi, np.empty_like(x)
            for t in range(len(x)):
                prev = (1 - c[t]) * prev + c[t] * x[t]
                same[t] = prev
            assert_close(y, same, rtol=1e-15)
            assert_close(y, scan_ballistics(jnp.asarray(x), at, rt, zi), rtol=1e-15)
            # the primal of the derivative path (the core's recursion with the
            # decisions held) gives the same values
            jx = jnp.asarray(x)
            y_jvp, _ = jax.jvp(ballistics, (jx, at, rt, zi), (jx, at, rt, zi))
            np.testing.assert_array_equal(np.asarray(y_jvp), np.asarray(y))
    # zi defaults to 0
    assert_close(ballistics(x, 0.3, 0.05), np_ballistics(x, 0.3, 0.05, 0.0))


def test_streaming():
    rng = np.random.default_rng(1)
    x = np.abs(rng.normal(size=50))
    at, rt = rng.uniform(0.1, 0.9, 50), rng.uniform(0.01, 0.2, 50)
    ref, ref_zf = ballistics(x, at, rt, 0.7, return_zf=True)
    z, ys = jnp.asarray(0.7), []
    for lo, hi in [(0, 1), (1, 20), (20, 50)]:
        yk, z = ballistics(x[lo:hi], at[lo:hi], rt[lo:hi], z, return_zf=True)
        ys.append(yk)
    np.testing.assert_array_equal(np.asarray(jnp.concatenate(ys)), np.asarray(ref))
    assert float(z) == float(ref_zf)


def away_from_switches(rng, length):
    """A signal whose decisions are not within a finite-difference step of a tie."""
    while True:
        x = rng.uniform(0.0, 2.0, length)
        y = np_ballistics(x, 0.4, 0.1, 0.5)
        prev = np.r_[0.5, y[:-1]]
        if np.min(np.abs(x - prev)) > 1e-2:
            return x


@pytest.mark.full
def test_grads_away_from_switches():
    rng = np.random.default_rng(2)
    length = 12
    x = away_from_switches(rng, length)
    args = (jnp.asarray(x), jnp.asarray(0.4), jnp.asarray(0.1), jnp.asarray(0.5))
    f = lambda x, at, rt, zi: jnp.stack(ballistics(x, at, rt, zi, return_zf=True)[:1])
    check_grads(jax.jit(f), args, eps=1e-5)
    per_sample = (
        args[0],
        jnp.full(length, 0.4) + 0.01 * jnp.arange(length, dtype=jnp.float64),
        jnp.full(length, 0.1),
        args[3],
    )
    check_grads(jax.jit(ballistics), per_sample, eps=1e-5)


def test_grad_is_the_frozen_one_pole():
    # with the decisions fixed, the derivative is that of the linear recursion
    rng = np.random.default_rng(3)
    x = jnp.asarray(away_from_switches(rng, 16))
    at, rt, zi = 0.4, 0.1, 0.5
    y = np_ballistics(np.asarray(x), at, rt, zi)
    c = jnp.where(x < jnp.asarray(np.r_[zi, y[:-1]]), at, rt)
    v = jnp.asarray(rng.normal(size=16))

    def frozen(x, at_scale):
        cc = c * at_scale
        return linear_recurrence(cc * x, decay=1 - cc, zi=zi) @ v

    def ours(x, at_scale):
        at_, rt_ = at * at_scale, rt * at_scale
        return ballistics(x, at_, rt_, zi) @ v

    one = jnp.asarray(1.0)
    for argnum in (0, 1):
        grads = [jax.jit(jax.grad(f, argnum))(x, one) for f in (ours, frozen)]
        assert_close(*grads)
    hessians = [jax.jit(jax.hessian(f, 1))(x, one) for f in (ours, frozen)]
    assert_close(*hessians)


def held_ballistics(x, at, rt, zi):
    """`scan_ballistics` with its decisions held (`stop_gradient`): plain
    autodiff of it is the held-decision derivative at every order."""
    at = jnp.broadcast_to(at, x.shape)
    rt = jnp.broadcast_to(rt, x.shape)

    def step(prev, inp):
        xt, att, rtt = inp
        c = jnp.where(jax.lax.stop_gradient(xt < prev), att, rtt)
        y = (1 - c) * prev + c * xt
        return y, y

    return jax.lax.scan(step, zi, (x, at, rt))[1]


@pytest.mark.parametrize("vmapped", [False, True])
def test_second_derivatives_inside_a_scan(vmapped):
    # Blocks streamed by a `lax.scan` (a chain in segments): the Hessian w.r.t.
    # the coefficients and an input gain. With the held output as a custom JVP
    # function, JAX's partial evaluation of the scan inlined that function
    # (which returns the values, constants to AD) and the Hessian lost every
    # term of the output's own derivative: 0 where the true one is 210.
    u = jnp.abs(jax.random.normal(jax.random.key(1), (2, 4, 25))) + 0.1

    def streamed(op):
        def one(q, signal):
            def step(z, block):
                y = op(block * q[2], q[0], q[1], z)
                return y[-1], y

            return jnp.sum(jax.lax.scan(step, jnp.asarray(1.0), signal)[1] ** 2)

        if vmapped:
            return lambda q: jnp.sum(jax.vmap(one, in_axes=(None, 0))(q, u))
        return lambda q: one(q, u[0])

    q = jnp.array([0.3, 0.05, 1.3])
    got = jax.jit(jax.hessian(streamed(ballistics)))(q)
    want = jax.jit(jax.hessian(streamed(held_ballistics)))(q)
    assert_close(got, want, rtol=1e-10, atol=1e-10 * float(jnp.max(jnp.abs(want))))
    assert float(jnp.max(jnp.abs(want))) > 1.0


def test_float32_jit_vmap():
    rng = np.random.default_rng(4)
    x = np.abs(rng.normal(size=(3, 64)))
    f = jax.jit(jax.vmap(ballistics, in_axes=(0, None, None)))
    y = f(jnp.asarray(x, jnp.float32), 0.3, 0.05)
    assert y.dtype == jnp.float32
    ref = np.stack([np_ballistics(xb, 0.3, 0.05, 0.0) for xb in x])
    assert_close(y, ref, rtol=1e-5)
    g = jax.jit(
        jax.vmap(jax.grad(lambda x, at: jnp.sum(ballistics(x, at, 0.05)), 1), (0, None))
    )
    assert (
        g(jnp.asarray(x, jnp.float32), jnp.asarray(0.3, jnp.float32)).dtype
        == jnp.float32
    )
    t, dt = jax.jvp(lambda at: ballistics(jnp.asarray(x[0]), at, 0.05), (0.3,), (1.0,))
    assert_close(t, np_ballistics(x[0], 0.3, 0.05, 0.0))
    eps = 1e-6
    fd = (
        np_ballistics(x[0], 0.3 + eps, 0.05, 0.0)
        - np_ballistics(x[0], 0.3 - eps, 0.05, 0.0)
    ) / (2 * eps)
    assert_close(dt, fd, rtol=1e-6)


def test_bad_input():
    x = jnp.ones(8)
    b = unchecked(ballistics)
    with pytest.raises(ValueError, match="`at`"):
        b(x, jnp.ones(7), 0.1)
    with pytest.raises(ValueError, match="`rt`"):
        b(x, 0.1, jnp.ones((8, 1)))
    with pytest.raises(ValueError, match="`zi`"):
        b(x, 0.1, 0.1, jnp.ones(1))
    with pytest.raises(ValueError, match="`x`"):
        b(jnp.ones((8, 2)), 0.1, 0.1)
    with pytest.raises(TypeError, match="`x`"):
        b(jnp.ones(8, jnp.complex64), 0.1, 0.1)
    with pytest.raises(Exception, match="`at` must be finite"):
        jax.jit(ballistics)(x, jnp.nan, 0.1)


kernels = pytest.mark.skipif(
    not _native.available(), reason="the compiled CPU kernels were not built"
)


def _signals(rng, dtype, batch, length, per_sample):
    """A batch of levels with a NaN, and coefficients per signal or per sample."""
    x = np.abs(rng.normal(size=(batch, length)))
    x[0, min(3, length - 1)] = np.nan  # takes the release update, as the scan
    shape = (batch, length) if per_sample else (batch,)
    at = rng.uniform(0.1, 0.9, shape)
    rt = rng.uniform(0.001, 0.1, shape)
    zi = rng.uniform(0.0, 2.0, batch)
    return tuple(jnp.asarray(v, dtype) for v in (x, at, rt, zi))


@pytest.fixture
def users_compiler():
    """XLA's optimisations on, as users run it, for this test (the session
    turns most of them off to compile faster). The kernel rounds each step
    as XLA's optimised CPU code rounds the scan's `(1 - c) y + c x`: fused
    into one multiply-add whose addend is the rounded `(1 - c) y`; without
    the optimisations XLA rounds the product and the sum apart."""
    with helpers.users_compiler():
        yield


def _looped(x, at, rt, zi):
    """The scan, signal by signal, with no batching rule involved."""
    return jnp.stack(
        [
            jax.jit(switched_loop)(*(v[b] for v in (x, at, rt, zi)))
            for b in range(x.shape[0])
        ]
    )


def _same(a, b):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("per_sample", [False, True])
def test_kernel_equals_loop_bitwise(dtype, per_sample, users_compiler):
    """The compiled loop gives the scan's numbers bit for bit, for batches that
    leave every number of lanes of the last group used (8 float32 or 4
    float64 signals a group, two groups at a time) and lengths that end
    inside a block of samples."""
    rng = np.random.default_rng(5)
    for batch, length in [(1, 300), (3, 7), (8, 64), (13, 301), (70, 45), (5, 1)]:
        args = _signals(rng, dtype, batch, length, per_sample)
        y = jax.jit(jax.vmap(switched))(*args)
        assert y.dtype == dtype
        _same(y, _looped(*args))
        # one signal, unbatched
        _same(jax.jit(switched)(*(v[0] for v in args)), y[0])


@kernels
def test_kernel_replaces_the_loop_on_cpu():
    """On the CPU the forward pass is one custom call, with no while loop."""
    x = jnp.linspace(0.0, 1.0, 64)
    hlo = jax.jit(ballistics).lower(x, 0.3, 0.05).compile().as_text()
    assert _native.BALLISTICS in hlo
    assert "while" not in hlo
    batched = jax.jit(jax.vmap(ballistics, (0, None, None)))
    hlo = batched.lower(jnp.stack([x, x]), 0.3, 0.05).compile().as_text()
    assert hlo.count(_native.BALLISTICS) == 1
    assert "while" not in hlo


@pytest.mark.parametrize("per_sample", [False, True])
def test_primitive_under_jit_and_vmap(per_sample, users_compiler):
    """`ballistics_p` batched over any axis, nested maps merged into one batch,
    batched and unbatched operands mixed: the scan of each signal."""
    rng = np.random.default_rng(6)
    x, at, rt, zi = _signals(rng, jnp.float64, 6, 40, per_sample)
    ref = _looped(x, at, rt, zi)
    _same(jax.jit(switched)(x[2], at[2], rt[2], zi[2]), ref[2])
    _same(switched(x[2], at[2], rt[2], zi[2]), ref[2])  # eagerly (def_impl)
    _same(jax.vmap(switched)(x, at, rt, zi), ref)
    # the batch on axis 1 of the signal, and out on axis 1
    out = jax.jit(jax.vmap(switched, (1, 0, 0, 0), 1))(x.T, at, rt, zi)
    _same(out, ref.T)
    # nested: a (2, 3) batch, the inner map over axis 1 of the outer operands
    shaped = [v.reshape(2, 3, *v.shape[1:]) for v in (x, at, rt, zi)]
    nested = jax.vmap(jax.vmap(switched))
    _same(jax.jit(nested)(*shaped), ref.reshape(2, 3, -1))
    inner_first = jax.vmap(jax.vmap(switched), in_axes=(1, 1, 1, 1), out_axes=1)
    _same(jax.jit(inner_first)(*shaped), ref.reshape(2, 3, -1))
    # shared coefficients and state with batched signals, and the other way
    shared = jax.vmap(switched, (0, None, None, None))(x, at[0], rt[0], zi[0])
    _same(shared, _looped(x, *(jnp.broadcast_to(v[0], v.shape) for v in (at, rt, zi))))
    one_signal = jax.jit(jax.vmap(switched, (None, 0, 0, 0)))(x[0], at, rt, zi)
    _same(one_signal, _looped(jnp.broadcast_to(x[0], x.shape), at, rt, zi))
    nested_mixed = jax.vmap(jax.vmap(switched, (0, None, None, None)), (None, 0, 0, 0))
    _same(
        jax.jit(nested_mixed)(x, at, rt, zi),
        jnp.stack(
            [
                _looped(x, *(jnp.broadcast_to(v[b], v.shape) for v in (at, rt, zi)))
                for b in range(x.shape[0])
            ]
        ),
    )


def test_primitive_has_no_derivative_of_its_own():
    """Differentiating the values' primitive directly is an error, not a zero;
    through `ballistics` the derivatives hold the decisions."""
    x = jnp.linspace(0.0, 1.0, 8)
    c, zero = jnp.asarray(0.3), jnp.asarray(0.0)
    with pytest.raises(TypeError, match="no derivative of its own"):
        jax.grad(lambda x: jnp.sum(switched(x, c, c, zero)))(x)
    with pytest.raises(TypeError, match="no derivative of its own"):
        jax.jvp(lambda c: switched(x, c, c, zero), (c,), (c,))
    # stop_gradient'ed operands (as `ballistics` binds it) are fine
    y = jax.grad(
        lambda x: jnp.sum(switched(*map(jax.lax.stop_gradient, (x, c, c, zero))))
    )(x)
    _same(y, jnp.zeros_like(x))
    assert ballistics_p.name == "ballistics"


def test_primitive_checks_its_operands():
    x = jnp.ones((2, 8))
    with pytest.raises(ValueError, match="bad operand ranks"):
        jax.eval_shape(switched, x, jnp.ones(2), jnp.ones((2, 8)), jnp.ones(2))
    with pytest.raises(TypeError, match="mixed dtypes"):
        jax.eval_shape(switched, x, jnp.ones(2), jnp.ones(2), jnp.ones(2, jnp.float32))


T = 64


def _away_from_switches(rng, at, rt, zi):
    """A signal none of whose attack/release decisions is near a tie."""
    while True:
        x = rng.uniform(0.0, 2.0, T)
        prev = np.r_[zi, np_ballistics(x, at, rt, zi)[:-1]]
        if np.min(np.abs(x - prev)) > 1e-2:
            return x


@pytest.mark.float32
def test_ballistics():
    rng = np.random.default_rng(5)
    x = _away_from_switches(rng, 0.4, 0.1, 0.5)
    check_float32(ballistics, (x, 0.4, 0.1, 0.5), np_ballistics(x, 0.4, 0.1, 0.5))
