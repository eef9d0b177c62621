"""Stable parametrisations: reflection coefficients and pole pairs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close, check_grads, stable_poly, unchecked
from retrax.filters import biquad_denominator, lpc2rc, rc2lpc


def _levinson_step_up(k):
    # Reference: the textbook recursion, one polynomial at a time, in numpy.
    poly = np.array([1.0])
    for km in k:
        ext = np.concatenate([poly, [0.0]])
        poly = ext + km * ext[::-1]
    return poly[1:]


def test_rc2lpc_matches_reference_and_is_stable():
    rng = np.random.default_rng(0)
    for order in (1, 2, 5, 10):
        k = rng.uniform(-0.99, 0.99, order)
        a = rc2lpc(jnp.asarray(k))
        assert_close(a, _levinson_step_up(k))
        assert np.all(np.abs(np.roots(np.concatenate([[1.0], a]))) < 1)


def test_lpc2rc_inverts_rc2lpc():
    rng = np.random.default_rng(1)
    for order in (1, 3, 8):
        a = stable_poly(rng, order, 0.95)
        k = lpc2rc(jnp.asarray(a))
        assert np.all(np.abs(k) < 1)
        assert_close(rc2lpc(k), a, rtol=1e-10)
    # Batched over leading axes (e.g. time-varying coefficients).
    k = jnp.asarray(rng.uniform(-0.9, 0.9, (4, 3)))
    assert_close(lpc2rc(rc2lpc(k)), k, rtol=1e-12)
    assert_close(rc2lpc(k)[2], rc2lpc(k[2]))


def test_unstable_filter_shows_in_reflection_coefficients():
    a = np.poly([1.2, 0.5])[1:]  # one pole outside the unit circle
    assert np.max(np.abs(lpc2rc(jnp.asarray(a)))) > 1


def test_biquad_denominator():
    r, theta = 0.9, 0.7
    a = biquad_denominator(r, theta)
    poles = np.roots(np.concatenate([[1.0], a]))
    assert_close(np.sort(np.abs(poles)), [r, r])
    assert_close(np.sort(np.angle(poles)), [-theta, theta])
    assert biquad_denominator(jnp.ones(5) * 0.5, 0.1).shape == (5, 2)


@pytest.mark.full
def test_gradients():
    k = jnp.asarray([0.3, -0.5, 0.2])
    check_grads(rc2lpc, (k,))
    # A rational function: a smaller finite-difference step keeps the
    # second-order truncation error below the tolerance.
    check_grads(lpc2rc, (rc2lpc(k),), eps=1e-5)
    check_grads(biquad_denominator, (jnp.asarray(0.8), jnp.asarray(1.1)))
    assert rc2lpc(k.astype(jnp.float32)).dtype == jnp.float32
    jax.jit(jax.vmap(rc2lpc))(jnp.zeros((2, 3)))


def test_bad_input():
    # The library's own messages (jaxtyping's hook would answer first here).
    with pytest.raises(ValueError, match=r"`k` must have shape \(\.\.\., order\)"):
        unchecked(rc2lpc)(jnp.zeros(()))
