"""Run-time checks that also hold inside `shard_map`."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import ArrayLike, Bool, PyTree


def varying_axes(x) -> frozenset:
    """The manual mesh axes (inside `shard_map`) that `x` varies over."""
    # `manual_axis_type.varying` in current JAX, `vma` in releases before it.
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
        return frozenset(manual.varying)
    return frozenset(getattr(aval, "vma", ()))


def _nan_like(x: jax.Array) -> jax.Array:
    if jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.full_like(x, jnp.nan)
    return jnp.full_like(x, np.iinfo(x.dtype).max)


def error_if(x: PyTree, pred: Bool[ArrayLike, "..."], msg: str) -> PyTree:
    """`eqx.error_if(x, pred, msg)`, without copying `x`, and also inside
    `shard_map`.

    `eqx.error_if` passes `x` through a `lax.cond`, whose result XLA writes
    to a new buffer: a copy of every checked array on every call, which for
    a batch of signals costs as much as the recursion that produced it. Here
    the check is made on a scalar flag instead (the same `eqx.error_if`,
    message and `EQX_ON_ERROR` modes) and the flag, zero unless the check
    failed, is subtracted from each floating leaf of `x`: exact (`v - 0` is
    `v`, signed zeros and NaN included), and fused by XLA into whatever
    reads the result next. `EQX_ON_ERROR=nan` makes the flag NaN, so `x`
    becomes NaN as it would with `eqx.error_if`; other leaves (integers,
    booleans, and weakly typed scalars, whose type the subtraction would
    make strong) take the error value through `jnp.where`.

    Inside `shard_map`, when `pred` differs per device, it is first combined
    over the devices (`lax.pmax`), so that every device raises, not only the
    one whose values are bad: the others would otherwise wait forever for it
    in the program's next collective. The flag is invariant, so the check's
    `lax.cond` types the same whether or not `x` varies over the devices.

    As with `eqx.error_if`, only the returned value carries the check.
    """
    if not any(eqx.is_array(v) for v in jax.tree.leaves(x)):
        raise ValueError("error_if: `x` has no arrays to carry the check.")
    axes = tuple(sorted(varying_axes(pred)))
    if axes:
        pred = lax.pmax(jnp.any(pred).astype(jnp.int32), axes) > 0
    zero = jnp.zeros(())
    flag = eqx.error_if(zero, pred, msg)
    if flag is zero:  # `pred` was known to be false when tracing
        return x
    bad = jnp.isnan(flag)  # only when EQX_ON_ERROR turned the flag to NaN

    def apply(v):
        if not eqx.is_array(v):
            return v
        if jnp.issubdtype(v.dtype, jnp.inexact) and not jax.typeof(v).weak_type:
            return v - flag.astype(v.dtype)
        return jnp.where(bad, _nan_like(v), v)  # keeps a weak type weak

    return jax.tree.map(apply, x)
