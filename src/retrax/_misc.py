"""Small private helpers shared across retrax: dtypes, conversions, optional
imports. Argument checks live in `_validate`."""

from types import ModuleType
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import ArrayLike

from ._float_dtypes import INEXACT


def result_dtype(*args: ArrayLike | None) -> np.dtype:
    """The dtype that `args` promote to under JAX's standard rules.

    Python scalars are weakly typed, so `float32` signals with Python-float
    coefficients stay `float32`. This is computed with standard promotion even
    when the caller runs under strict promotion, because mixing is the library's
    decision to make explicit here.
    """
    present = [a for a in args if a is not None]
    with jax.numpy_dtype_promotion("standard"):
        return jnp.result_type(*present)


def as_inexact(name: str, value: ArrayLike) -> jax.Array:
    """Convert `value` to an inexact (floating or complex) array.

    Integer and boolean values are accepted as JAX accepts them in arithmetic:
    they become JAX's default float (float32, or float64 with x64 enabled),
    weakly typed, so that they promote like Python numbers and an integer
    coefficient leaves a float32 signal float32 (as `f32 + i32` is `f32` in
    JAX). `name` is kept in the signature for the callers' messages.
    """
    del name
    # A JAX array that is already inexact is returned as it is: under an
    # eager `jax.grad` every primitive bound here, even a conversion to the
    # same dtype, costs a linearisation of its own (about 0.4 ms).
    if isinstance(value, jax.Array) and value.dtype in INEXACT:
        return value
    arr = jnp.asarray(value)
    if jnp.issubdtype(arr.dtype, jnp.inexact):
        return arr
    # Multiplying by a weak 1.0 is JAX's own integer-to-float promotion and
    # keeps the result weakly typed (`astype` would make it strong).
    with jax.numpy_dtype_promotion("standard"):
        return arr * 1.0


def cast(x: jax.Array, dtype) -> jax.Array:
    """`x.astype(dtype)`, but `x` itself when that would change nothing (the
    same dtype, strongly typed), so that no primitive is bound: under an
    eager `jax.grad` each one costs a linearisation of its own."""
    if x.dtype == dtype and not jax.typeof(x).weak_type:
        return x
    return x.astype(dtype)


def all_finite(tree: Any) -> jax.Array:
    """Whether every floating-point array of `tree` is finite, as a traced
    boolean (other leaves, integers and PRNG keys among them, are skipped)."""
    flags = [
        jnp.all(jnp.isfinite(x))
        for x in jax.tree.leaves(tree)
        if isinstance(x, jax.Array | np.ndarray)
        and jnp.issubdtype(x.dtype, jnp.inexact)
    ]
    return jnp.all(jnp.stack(flags)) if flags else jnp.asarray(True)


def scipy_signal(what: str) -> ModuleType:
    """`scipy.signal`, imported when retrax first designs `what` with it (a
    filter, named as the user asked for it): scipy is an optional dependency,
    and importing it takes most of a second, so no module imports it at
    import time."""
    try:
        import scipy.signal
    except ImportError as e:
        raise ImportError(
            f"scipy.signal is needed to design {what}, and scipy is not "
            'installed: install it with `pip install "retrax[scipy]"` (or '
            "`pip install scipy`)."
        ) from e
    return scipy.signal
