"""Finite impulse response filters (no recursion: a sum of shifted products)."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._deprecated import signal_first
from .._misc import result_dtype
from .._validate import (
    check_coeff_rank,
    check_finite,
    check_signal,
    check_zi,
    inexact,
)
from ._allpole_lags import lag_drive_const


def fir_apply(b: Array, x: Array, zi: Array) -> Array:
    """$y_t = \\sum_k b_{t,k} x_{t-k}$ with `zi[k] = x[-k-1]`; inputs share a dtype.

    Constant taps past the first are the all-pole core's lagged drive
    (`_allpole_lags.lag_drive_const`): the same sum of shifted products, whose
    transpose in the taps (their gradient, a sum over time per tap) runs as
    vectorised dot products on the CPU instead of a reduction per tap."""
    if b.ndim == 1 and b.shape[0] > 1:
        return b[0] * x + lag_drive_const(-b[1:], x, zi, adjoint=False)
    n_taps = b.shape[-1]
    order = n_taps - 1
    length = x.shape[0]
    full = jnp.concatenate([zi[::-1], x]) if order > 0 else x
    y = None
    for k in range(n_taps):
        shifted = full[order - k : order - k + length]
        term = (b[k] if b.ndim == 1 else b[:, k]) * shifted
        y = term if y is None else y + term
    return y


def fir_state(x: Array, zi: Array, order: int) -> Array:
    """The last `order` inputs, newest first, after the block `x`."""
    return jnp.concatenate([x[::-1], zi])[:order]


@signal_first("b")
def fir(
    x: Shaped[ArrayLike, " time"],
    *,
    b: Shaped[ArrayLike, "time taps"] | Shaped[ArrayLike, " taps"],
    zi: Shaped[ArrayLike, " fir_order"] | None = None,
    return_zf: bool = False,
) -> (
    Inexact[Array, " time"]
    | tuple[Inexact[Array, " time"], Inexact[Array, " fir_order"]]
):
    r"""Finite impulse response filter with constant or time-varying taps.

    $$y_t = \sum_{k=0}^{M} b_{t,k}\, x_{t-k},$$

    i.e. `scipy.signal.lfilter(b, [1], x)` for constant taps, and the
    per-sample (time-varying) FIR of philtorch for `b` of shape `(T, M+1)`.
    There is no recursion, so it is computed as a vectorised sum of shifted
    products and differentiated by JAX directly.

    **Arguments:**

    - `x`: the input signal, shape `(T,)`. Batch with `jax.vmap`.
    - `b`: the taps, `(M+1,)` constant or `(T, M+1)` per sample. By keyword,
      `fir(x, b=b)`: for this release a second positional argument raises a
      `TypeError`, since `fir` took the taps first until now.
    - `zi`: the past inputs, newest first: `zi[k] = x[-k-1]`, shape `(M,)`.
      Defaults to zeros.
    - `return_zf`: also return the last `M` inputs (newest first), the `zi` of
      the next block, so that a long signal can be filtered block by block.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`. The dtype is the
    promoted dtype of the inputs (float32, float64, complex64 or complex128).

    Non-finite taps raise an error (also under `jax.jit`).
    """
    b = inexact("b", b)
    x = inexact("x", x)
    check_signal("x", x)
    check_coeff_rank("b", b, x.shape[0], "taps")
    n_taps = b.shape[-1]
    if n_taps == 0:
        raise ValueError("`b` must have at least one tap.")
    order = n_taps - 1
    zi = check_zi(zi, (order,), f"the last {order} inputs (len(b) - 1)")
    dtype = result_dtype(x, b, zi)
    x = x.astype(dtype)
    b = check_finite("b", b.astype(dtype))
    zi = jnp.zeros(order, dtype) if zi is None else zi.astype(dtype)
    y = fir_apply(b, x, zi)
    if not return_zf:
        return y
    return y, fir_state(x, zi, order)
