"""Shared test utilities: comparisons, references and finite differences."""

import jax
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (explicit import: not loaded by `import jax`)
import numpy as np
import pytest
from jax import lax


def tree_allclose(x, y, *, rtol=1e-12, atol=0.0):
    """Leaf-wise closeness with the tolerance relative to each leaf's scale."""
    leaves_x, tree_x = jax.tree.flatten(x)
    leaves_y, tree_y = jax.tree.flatten(y)
    if tree_x != tree_y:
        return False
    for a, b in zip(leaves_x, leaves_y, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        scale = max(np.max(np.abs(b), initial=0.0), 1e-300)
        if np.max(np.abs(a - b), initial=0.0) > rtol * scale + atol:
            return False
    return True


def assert_close(x, y, rtol=1e-12, atol=0.0):
    """`tree_allclose` with a message giving the relative error."""
    a, b = np.asarray(x), np.asarray(y)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(np.max(np.abs(b), initial=0.0), 1e-300)
    err = np.max(np.abs(a - b), initial=0.0)
    assert err <= rtol * scale + atol, f"max error {err:.3e}, scale {scale:.3e}"


def raises_eagerly_and_under_jit(f, *args, match):
    """`f(*args)` raises an error whose message matches `match`, both when
    called directly and under `jax.jit` (where the arguments are traced)."""
    with pytest.raises(Exception, match=match):
        f(*args)
    with pytest.raises(Exception, match=match):
        jax.jit(f)(*args)


def ring_radius(schedule, nodes, scale, radius=1.0):
    r"""Where the implicit field of a ring of data puts its stable roots.

    Data on a circle of radius `radius`, smoothed by Gaussians of standard
    deviation `scale`: the spec's smoothing bias puts the mode of the data
    smoothed to variance $v$ at $r = R - v/(2r)$ (the radial Gaussian profile
    and the $-\tfrac12\log r$ of the polar measure), with
    $v = s^2 + \sigma^2/\alpha^2$ for a noise-free node. A node with a noise
    draw evaluates the predictor at $\alpha z + \sigma e$, which smooths once
    more by $\sigma^2/\alpha^2$: $v_k = s^2 + 2\sigma_k^2/\alpha_k^2$. The field
    sums the nodes' scores with weights $a_k = w_k\sigma_k^2/\alpha_k^2$, so its
    root solves $\sum_k a_k ((r - R)/v_k + 1/(2r)) = 0$, i.e. the same rule
    with the weighted harmonic mean $v = \sum_k a_k / \sum_k (a_k/v_k)$.
    Neglected: terms of order $v^2/R^3$, the lumps of a ring made of finitely
    many components, and the sampling error of finitely many noise draws.
    """
    t = np.asarray(nodes.t, np.float64)
    alpha = np.asarray(schedule.alpha(jnp.asarray(t)), np.float64)
    sigma = np.asarray(schedule.sigma(jnp.asarray(t)), np.float64)
    u = sigma**2 / alpha**2
    noisy = np.any(np.asarray(nodes.eps) != 0, axis=1)
    v = scale**2 + np.where(noisy, 2.0, 1.0) * u
    a = np.asarray(nodes.w, np.float64) * u
    v_eff = np.sum(a) / np.sum(a / v)
    # r = R - v / (2 r): the larger root of r^2 - R r + v / 2 = 0
    return 0.5 * (radius + np.sqrt(radius**2 - 2 * v_eff))


def naive_allpole(x, a, zi=None):
    """All-pole filter as a plain `lax.scan`, differentiated by JAX directly."""
    a = jnp.broadcast_to(a, x.shape + a.shape[-1:])
    order = a.shape[-1]
    zi = jnp.zeros(order, x.dtype) if zi is None else zi

    def step(state, inp):
        xt, at = inp
        y = xt - jnp.dot(at, state)
        return jnp.concatenate([y[None], state[:-1]]), y

    _, y = lax.scan(step, zi, (x, a))
    return y


def check_grads(f, args, **kwargs):
    """`jax.test_util.check_grads` to second order in both modes, on `jit(f)`.

    Jitting `f` makes every derivative program compile once instead of running
    op by op, which halves the cost of these checks.
    """
    options = dict(order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    options.update(kwargs)
    jax.test_util.check_grads(jax.jit(f), args, **options)


def stable_poly(rng, order, radius=0.95, complex_=False):
    """Denominator coefficients, leading 1 dropped, with poles inside `radius`."""
    if complex_:
        r = radius * np.sqrt(rng.uniform(0.0, 1.0, order))
        poles = r * np.exp(2j * np.pi * rng.uniform(size=order))
    else:
        n_pairs, n_real = divmod(order, 2)
        r = radius * np.sqrt(rng.uniform(0.0, 1.0, n_pairs))
        theta = np.pi * rng.uniform(size=n_pairs)
        poles = np.concatenate(
            [r * np.exp(1j * theta), r * np.exp(-1j * theta)]
            + [rng.uniform(-radius, radius, n_real)]
        )
    coeffs = np.poly(poles)[1:]
    return coeffs if complex_ else coeffs.real
