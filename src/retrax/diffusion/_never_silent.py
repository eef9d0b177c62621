"""Derivatives that are never a silent number: NaN where a solve failed."""

import equinox as eqx
import jax
import jax.numpy as jnp


@jax.custom_jvp
def _gate(z, scale):
    return z


@_gate.defjvp
def _gate_jvp(primals, tangents):
    z, scale = primals
    tz, _ = tangents
    return z, tz * jax.lax.stop_gradient(scale)


def never_silent(z, inputs, converged):
    """`z`, whose derivatives are NaN when the solve did not converge.

    Linear in the tangents, so reverse mode transposes it. The cotangent fed to
    the implicit (adjoint) linear solve is zeroed rather than NaN'ed (lineax
    rejects non-finite right-hand sides), and NaN reaches every input through a
    separate path instead.
    """
    dtype = z.dtype
    one = jnp.where(converged, jnp.ones((), dtype), jnp.zeros((), dtype))
    nan = jnp.where(converged, jnp.zeros((), dtype), jnp.array(jnp.nan, dtype))
    leaves = [x for x in jax.tree.leaves(inputs) if eqx.is_inexact_array(x)]
    if not leaves:
        return _gate(z, one)
    # Zero, with the sum of every input tangent as its tangent; finite inputs only
    # (an infinite stiffness is a clamp, not a value).
    total = sum(
        jnp.sum(jnp.where(jnp.isfinite(x), x - jax.lax.stop_gradient(x), 0)).astype(
            dtype
        )
        for x in leaves
    )
    return _gate(z, one) + _gate(total, nan)
