"""Shared test utilities: comparisons, references and finite differences."""

import jax
import jax.extend.core
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (explicit import: not loaded by `import jax`)
import numpy as np
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


def scans_in(jaxpr):
    """Every `scan` equation in `jaxpr`, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(scans_in(sub))
    return found
