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
    """`eqx.error_if(x, pred, msg)`, also inside `shard_map`.

    Eagerly, under `jit`, `vmap`, `grad` and with sharded inputs this is
    `eqx.error_if`. Inside `shard_map` two things change:

    - when `pred` differs per device, it is first combined over the devices
      (`lax.pmax`), so that every device raises, not only the one whose
      values are bad: the others would otherwise wait forever for it in the
      program's next collective;
    - when `x` differs per device, `eqx.error_if`'s `lax.cond` would join a
      branch typed like `x` (varying) with its error branch, a host callback
      typed as invariant, and JAX rejects the mismatch. The check is then made
      on an invariant scalar and its outcome applied to `x`
      (`EQX_ON_ERROR=nan` still gives NaN).

    As with `eqx.error_if`, only the returned value carries the check.
    """
    axes = tuple(sorted(varying_axes(pred)))
    if axes:
        pred = lax.pmax(jnp.any(pred).astype(jnp.int32), axes) > 0
    leaves = [v for v in jax.tree.leaves(x) if eqx.is_array(v)]
    if not any(varying_axes(v) for v in leaves):
        return eqx.error_if(x, pred, msg)
    flag = eqx.error_if(jnp.zeros(()), pred, msg)
    bad = jnp.isnan(flag)  # only when EQX_ON_ERROR=nan turned the flag to NaN
    return jax.tree.map(
        lambda v: jnp.where(bad, _nan_like(v), v) if eqx.is_array(v) else v, x
    )
