"""The associative (parallel-in-time) method of the recurrence core."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (
    allpole_eqns_in,
    assert_close,
    check_grads,
    naive_allpole,
    stable_poly,
    time_varying_allpole,
)
from retrax.ops import allpole, linear_recurrence
from retrax.ops._recurrence import recurrence


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def _dense_transitions(rng, shape, n):
    # Spectral norm below 0.9: every product of transitions contracts.
    A = rng.standard_normal(shape + (n, n))
    A = A / np.linalg.norm(A, ord=2, axis=(-2, -1), keepdims=True)
    return jnp.asarray(0.9 * A)


def _coeffs(rng, structure, length, constant, n=3, radius=0.95):
    shape = () if constant else (length,)
    if structure == "allpole":
        if constant:
            return jnp.asarray(stable_poly(rng, n, radius))
        return jnp.asarray(time_varying_allpole(rng, length, n, min(radius, 0.9)))
    if structure == "diagonal":
        return jnp.asarray(rng.uniform(-0.95, 0.95, shape + (n,)))
    return _dense_transitions(rng, shape, n)


def _inputs(rng, structure, length, n=3):
    u_shape = (length,) if structure == "allpole" else (length, n)
    return jnp.asarray(rng.standard_normal(u_shape)), jnp.asarray(
        rng.standard_normal(n)
    )


@pytest.mark.parametrize("structure", ["allpole", "diagonal", "dense"])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("length", [1, 2, 37, 500])
def test_associative_equals_sequential(structure, constant, length):
    rng = np.random.default_rng(length)
    coeffs = _coeffs(rng, structure, length, constant)
    u, zi = _inputs(rng, structure, length)
    seq = recurrence(structure, 2, coeffs, u, zi)
    par = recurrence(structure, 2, coeffs, u, zi, "associative")
    assert par.dtype == seq.dtype and par.shape == seq.shape
    assert_close(par, seq, rtol=1e-10)
    # The sequential core itself against a loop, so both are anchored.
    if structure == "allpole":
        assert_close(seq, naive_allpole(u, coeffs, zi), rtol=1e-12)


@pytest.mark.parametrize("order", [1, 2, 4])
@pytest.mark.parametrize("constant", [True, False])
def test_allpole_method_with_zi_and_zf(order, constant):
    rng = np.random.default_rng(order)
    length = 300
    x = jnp.asarray(rng.standard_normal(length))
    a = (
        jnp.asarray(stable_poly(rng, order, 0.95))
        if constant
        else jnp.asarray(time_varying_allpole(rng, length, order))
    )
    zi = jnp.asarray(rng.standard_normal(order))
    y_seq, zf_seq = allpole(x, a, zi, return_zf=True)
    y_par, zf_par = allpole(x, a, zi, return_zf=True, method="associative")
    assert_close(y_par, y_seq, rtol=1e-10)
    assert_close(zf_par, zf_seq, rtol=1e-10)
    # Streaming in two blocks with the associative method.
    y1, state = allpole(
        x[:100], a if constant else a[:100], zi, return_zf=True, method="associative"
    )
    y2 = allpole(x[100:], a if constant else a[100:], state, method="associative")
    assert_close(jnp.concatenate([y1, y2]), y_seq, rtol=1e-10)


def test_linear_recurrence_method():
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.standard_normal(500))
    decay = jnp.asarray(rng.uniform(0.5, 0.999, 500))
    for d in (decay, jnp.asarray(0.99)):
        y_seq, zf_seq = linear_recurrence(x, decay=d, zi=0.3, return_zf=True)
        y_par, zf_par = linear_recurrence(
            x, decay=d, zi=0.3, return_zf=True, method="associative"
        )
        assert_close(y_par, y_seq, rtol=1e-10)
        assert_close(zf_par, zf_seq, rtol=1e-10)


def test_complex_and_float32():
    rng = np.random.default_rng(4)
    x = jnp.asarray(rng.standard_normal(200) + 1j * rng.standard_normal(200))
    a = jnp.asarray(stable_poly(rng, 3, 0.9, complex_=True))
    assert_close(allpole(x, a, method="associative"), allpole(x, a), rtol=1e-10)
    x32 = x.real.astype(jnp.float32)
    a32 = jnp.asarray(stable_poly(rng, 2, 0.9), jnp.float32)
    y32 = allpole(x32, a32, method="associative")
    assert y32.dtype == jnp.float32
    assert_close(y32, allpole(x32, a32), rtol=1e-5)


# ---------------------------------------------------------------- derivatives


@pytest.mark.parametrize(
    "structure, constant",
    [
        ("allpole", False),  # companion matrices: the matrix combine
        ("diagonal", True),  # the elementwise combine
        # Second-order checks cost seconds each: the rest of the matrix is slow.
        pytest.param("allpole", True, marks=pytest.mark.slow),
        pytest.param("diagonal", False, marks=pytest.mark.slow),
        pytest.param("dense", True, marks=pytest.mark.slow),
        pytest.param("dense", False, marks=pytest.mark.slow),
    ],
)
@pytest.mark.full
def test_associative_check_grads(structure, constant):
    rng = np.random.default_rng(5)
    length = 8
    # Radius 0.9, as in test_recurrence.py: sharper resonances make the
    # second-order finite differences themselves inaccurate at this step size.
    coeffs = _coeffs(rng, structure, length, constant, n=2, radius=0.9)
    u, zi = _inputs(rng, structure, length, n=2)

    def f(method):
        return lambda c, u, z: recurrence(structure, 1, c, u, z, method)

    check_grads(f("associative"), (coeffs, u, zi))

    # Second order agrees with the sequential method's to rounding.
    def energy(method):
        return lambda *args: jnp.sum(jnp.sin(f(method)(*args)))

    hess = jax.hessian(energy("associative"), argnums=(0, 1, 2))(coeffs, u, zi)
    ref = jax.hessian(energy("sequential"), argnums=(0, 1, 2))(coeffs, u, zi)
    for h, r in zip(jax.tree.leaves(hess), jax.tree.leaves(ref), strict=True):
        assert_close(h, r, rtol=1e-10)


def test_associative_gradients_equal_sequential():
    rng = np.random.default_rng(7)
    length, order = 200, 3
    x = jnp.asarray(rng.standard_normal(length))
    a = jnp.asarray(time_varying_allpole(rng, length, order))
    zi = jnp.asarray(rng.standard_normal(order))
    w = jnp.asarray(rng.standard_normal(length))

    def loss(method):
        return lambda x, a, zi: jnp.sum(w * allpole(x, a, zi, method=method))

    seq = jax.grad(loss("sequential"), argnums=(0, 1, 2))(x, a, zi)
    par = jax.grad(loss("associative"), argnums=(0, 1, 2))(x, a, zi)
    for g, r in zip(par, seq, strict=True):
        assert_close(g, r, rtol=1e-10)


def test_tangent_uses_the_same_method():
    # Neither the primal nor the tangent recursion falls back to a sequential
    # recursion: the gradient's jaxpr holds no `scan` and no sequential
    # all-pole primitive at all; the default (sequential) method's holds the
    # primitive.
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal(64))
    a = jnp.asarray(time_varying_allpole(rng, 64, 2))

    def loss(x, a):
        return jnp.sum(allpole(x, a, method="associative") ** 2)

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(x, a)
    text = str(jaxpr)
    assert " scan[" not in text and "scan(" not in text
    assert not allpole_eqns_in(jaxpr.jaxpr)
    seq = jax.make_jaxpr(
        jax.grad(lambda x, a: jnp.sum(allpole(x, a) ** 2), argnums=(0, 1))
    )(x, a)
    assert allpole_eqns_in(seq.jaxpr)


# ---------------------------------------------------------------- transforms


def test_vmap_and_jit():
    rng = np.random.default_rng(9)
    batch, length = 5, 120
    x = jnp.asarray(rng.standard_normal((batch, length)))
    a = jnp.asarray(
        np.stack([np.stack([stable_poly(rng, 2)] * length) for _ in range(batch)])
    )
    zi = jnp.asarray(rng.standard_normal((batch, 2)))

    def f(x, a, zi):
        return allpole(x, a, zi, method="associative")

    batched = jax.jit(jax.vmap(f))(x, a, zi)
    for i in range(batch):
        assert_close(batched[i], naive_allpole(x[i], a[i], zi[i]), rtol=1e-10)
    # Shared constant coefficients, and the gradient under vmap.
    shared = jax.vmap(lambda x: allpole(x, a[0, 0], method="associative"))(x)
    assert_close(shared[2], naive_allpole(x[2], a[0, 0]), rtol=1e-10)
    grads = jax.jit(jax.vmap(jax.grad(lambda x, a, z: jnp.sum(f(x, a, z) ** 2), 1)))(
        x, a, zi
    )
    ref = jax.vmap(jax.grad(lambda x, a, z: jnp.sum(naive_allpole(x, a, z) ** 2), 1))(
        x, a, zi
    )
    assert_close(grads, ref, rtol=1e-10)


def test_bad_method():
    x = jnp.ones(8)
    # ValueError from retrax; in this suite jaxtyping's runtime checker may
    # reject the `Literal` annotation first, with a TypeError naming `method`.
    bad = (ValueError, TypeError)
    with pytest.raises(bad, match="method"):
        allpole(x, jnp.asarray([0.5]), method="parallel")
    with pytest.raises(bad, match="method"):
        linear_recurrence(x, decay=0.5, method="Associative")
    with pytest.raises(bad, match="method"):
        recurrence("diagonal", 1, jnp.ones(2), jnp.ones((3, 2)), jnp.ones(2), "fast")
