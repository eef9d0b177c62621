import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, check_grads, np_ballistics, unchecked
from retrax import _native
from retrax.ops import ballistics, linear_recurrence
from retrax.ops._ballistics import _switched_kernel, _switched_loop


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
        return linear_recurrence(1 - cc, cc * x, zi) @ v

    def ours(x, at_scale):
        at_, rt_ = at * at_scale, rt * at_scale
        return ballistics(x, at_, rt_, zi) @ v

    one = jnp.asarray(1.0)
    for argnum in (0, 1):
        grads = [jax.jit(jax.grad(f, argnum))(x, one) for f in (ours, frozen)]
        assert_close(*grads)
    hessians = [jax.jit(jax.hessian(f, 1))(x, one) for f in (ours, frozen)]
    assert_close(*hessians)


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


@kernels
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_kernel_matches_loop(dtype):
    """The compiled loop and the `lax.scan` fallback give the same values, for
    batches that fill every lane group (8 + 4 + 2 + 1 signals), scalar and
    per-sample coefficients, under nested `vmap`."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(np.abs(rng.normal(size=(15, 300))), dtype)
    at = jnp.asarray(rng.uniform(0.1, 0.9, 15), dtype)
    at_t = jnp.asarray(rng.uniform(0.1, 0.9, (15, 300)), dtype)
    rt = jnp.asarray(0.05, dtype)
    zi = jnp.asarray(rng.uniform(0, 2, 15), dtype)
    tol = 1e-5 if dtype == jnp.float32 else 1e-13
    run = jax.vmap(_switched_kernel, (0, 0, None, 0))
    loop = jax.vmap(_switched_loop, (0, 0, None, 0))
    for coef in (at, at_t):
        rt_b = jnp.broadcast_to(rt, coef.shape[1:])
        y = jax.jit(run)(x, coef, rt_b, zi)
        assert y.dtype == dtype
        assert_close(y, loop(x, coef, rt_b, zi), rtol=tol)
    nested = jax.vmap(
        jax.vmap(_switched_kernel, (0, None, None, None)), (None, 0, 0, 0)
    )
    looped = jax.vmap(jax.vmap(_switched_loop, (0, None, None, None)), (None, 0, 0, 0))
    rts = jnp.full(15, rt)
    assert_close(nested(x, at, rts, zi), looped(x, at, rts, zi), rtol=tol)


@kernels
def test_kernel_replaces_the_loop_on_cpu():
    """On the CPU the forward pass is one custom call, with no while loop."""
    x = jnp.linspace(0.0, 1.0, 64)
    hlo = jax.jit(ballistics).lower(x, 0.3, 0.05).compile().as_text()
    assert _native.BALLISTICS in hlo
    assert "while" not in hlo
