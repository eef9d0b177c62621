"""Numbers from a failed solve are never silent: one gating rule for all of them.

A quantity computed from a solve that did not succeed is NaN: its derivatives
when the quantity itself is the solve's answer (`never_silent`, for answers
that autodiff differentiates), and its value when the quantity is already a
derivative or a derived statistic given by an explicit formula (`nan_unless`,
for adjoint cotangents and Laplace covariances). Both scale by the same
factor: 1 where the solve succeeded, NaN where it did not.
"""

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, PyTree


def _factor(ok: Bool[Array, ""], dtype) -> Array:
    """1 where `ok`, NaN where not, of `dtype`."""
    return jnp.where(ok, jnp.ones((), dtype), jnp.array(jnp.nan, dtype))


def nan_unless(ok: Bool[Array, ""], tree: PyTree) -> PyTree:
    """`tree` with every inexact array leaf NaN unless `ok` (other leaves kept)."""

    def gate(x):
        if not eqx.is_inexact_array(x):
            return x
        return jnp.where(ok, x, jnp.array(jnp.nan, x.dtype))

    return jax.tree.map(gate, tree)


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
    nan = _factor(converged, dtype) - 1
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


@jax.custom_jvp
def _tangent_total(x):
    return _zero_of(x)


def _zero_of(x):
    # zero, computed from `x` so that it is batched wherever `x` is (as its
    # tangent is)
    return 0 * jnp.sum(jnp.where(jnp.isfinite(x), x, 0))


@_tangent_total.defjvp
def _tangent_total_jvp(primals, tangents):
    (x,) = primals
    (tx,) = tangents
    return _zero_of(x), jnp.sum(tx)


def nan_derivatives_unless(z: Array, inputs: PyTree, ok: Bool[Array, ""]) -> Array:
    """`z`, whose derivatives with respect to every inexact leaf of `inputs`
    are NaN unless `ok` (and unchanged where `ok`).

    Unlike `never_silent` the inputs may hold non-finite values (the
    derivative with respect to a NaN input is NaN too): for a query that was
    not valid, whose inputs were replaced before the solve.
    """
    dtype = z.dtype
    leaves = [x for x in jax.tree.leaves(inputs) if eqx.is_inexact_array(x)]
    if not leaves:
        return z
    total = sum(_tangent_total(x).astype(dtype) for x in leaves)
    return z + _gate(total, _factor(ok, dtype) - 1)
