"""The floating dtypes that retrax's FFTs and recurrence kernels compute in.

XLA's FFT takes float32 and float64 only, and the delay-network kernels are
built for those two; a float16 or bfloat16 signal would otherwise fail deep
inside with an error about an internal array. The ops that need it refuse
other dtypes at once, naming the argument and what is supported, and leave
the choice of precision (`x.astype(jnp.float32)`) to the caller.
"""

import numpy as np


SUPPORTED = (np.dtype(np.float32), np.dtype(np.float64))
# The floating and complex dtypes JAX computes in, real and complex (NumPy
# arrays of these reach `jax.jit` as the functions themselves would take them)
INEXACT = frozenset(
    np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128)
)


def check_float_dtype(names: str, dtype, what: str) -> None:
    """Raise `TypeError` unless `dtype` (that of `names`, the arguments'
    names for the message) is float32 or float64, what `what` computes in."""
    if np.dtype(dtype) not in SUPPORTED:
        raise TypeError(
            f"{names} has dtype {np.dtype(dtype).name}, but {what} computes in "
            "float32 or float64 only: cast with `.astype(jnp.float32)`."
        )
