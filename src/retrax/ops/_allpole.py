"""All-pole filters and first-order linear recurrences on the recurrence core."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._compiled import compiled
from .._deprecated import signal_first
from .._misc import as_inexact, result_dtype
from .._validate import (
    check_coeff_rank,
    check_finite,
    check_finite_by_output,
    check_signal,
    check_zi,
)
from ._recurrence import DEFAULT_UNROLL, Method, check_method, recurrence


@compiled(static=("return_zf", "method"))
def allpole(
    x: Shaped[ArrayLike, " time"],
    a: Shaped[ArrayLike, "time order"] | Shaped[ArrayLike, " order"],
    zi: Shaped[ArrayLike, " order"] | None = None,
    *,
    return_zf: bool = False,
    method: Method = "sequential",
) -> Inexact[Array, " time"] | tuple[Inexact[Array, " time"], Inexact[Array, " order"]]:
    r"""All-pole (LPC) filter with time-varying or constant coefficients.

    $$y_t = x_t - \sum_{k=0}^{K-1} a_{t,k}\, y_{t-k-1},$$

    the filter $1 / (1 + \sum_k a_k z^{-k-1})$, per sample. This is
    `torchlpc.sample_wise_lpc` for one signal and, with constant `a`,
    `scipy.signal.lfilter([1], [1, *a], x)`. Note that `a` excludes the
    leading 1 of the denominator.

    Its derivatives never back-propagate through the per-sample loop: the
    tangent of the output is the same filter driven by
    $\dot x_t - \sum_k \dot a_{t,k} y_{t-k-1}$, and reverse mode is the
    transpose of that, the adjoint filter run backwards in time (Yu et al.,
    "Differentiable all-pole filters for time-varying audio systems",
    DAFx 2024). Forward mode, reverse mode and higher orders all work, for
    every argument.

    An unstable filter (poles on or outside the unit circle) is not an error:
    the output grows geometrically and overflows to `inf`/`nan` on long
    signals, exactly as the recursion defines it. Check the poles (e.g. with
    `jnp.roots`) or use a stable parametrisation when training.

    **Arguments:**

    - `x`: the input signal, shape `(T,)`. Batch with `jax.vmap`.
    - `a`: the coefficients without the leading 1: `(T, K)` per sample or
      `(K,)` constant.
    - `zi`: the state before the first sample, the past outputs newest first:
      `zi[k] = y[-k-1]`, shape `(K,)`. Defaults to zeros.
    - `return_zf`: also return the final state in the same layout, so that a
      long signal can be filtered block by block.
    - `method`: `"sequential"` (default) runs one step per sample, the least
      arithmetic and the fastest on a CPU. `"associative"` runs a parallel
      prefix scan over $K \times K$ companion matrices, $O(\log T)$ steps
      deep but about $K^2$ times more arithmetic: for accelerators, where the
      sequential loop's latency dominates, and small orders $K$. Both give
      the same result up to rounding, and their derivatives use the same
      method. See [Running at scale](../scale.md).

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` with `zf[k] = y[T-1-k]` if `return_zf`.
    The dtype is the promoted dtype of the inputs (float32, float64,
    complex64 or complex128).

    Non-finite coefficients raise an error (also under `jax.jit`); non-finite
    samples of `x` (or `zi`) pass through, as in `scipy.signal.lfilter`.
    """
    return _allpole(x, a, zi, return_zf, method, "a")


def _allpole(x, a, zi, return_zf: bool, method: Method, a_name: str):
    check_method(method)
    x = as_inexact("x", x)
    a = as_inexact(a_name, a)
    check_signal("x", x)
    check_coeff_rank("a", a, x.shape[0], "order")
    order = a.shape[-1]
    if order == 0:
        raise ValueError("`a` must have at least one coefficient (order >= 1).")
    zi = check_zi(zi, (order,), f"the last {order} outputs")
    dtype = result_dtype(x, a, zi)
    x = x.astype(dtype)
    a = a.astype(dtype)
    # per-sample coefficients of the sequential loop are checked through its
    # output, which costs nothing when it is finite (see the helper)
    by_output = a.ndim == 2 and method == "sequential"
    if not by_output:
        a = check_finite(a_name, a)
    zi = jnp.zeros(order, dtype) if zi is None else zi.astype(dtype)
    y = recurrence("allpole", DEFAULT_UNROLL, a, x, zi, method)
    if by_output:
        y = check_finite_by_output(a_name, a, y)
    if not return_zf:
        return y
    zf = jnp.concatenate([y[::-1], zi])[:order]
    return y, zf


@signal_first("decay")
@compiled(static=("return_zf", "method"))
def linear_recurrence(
    x: Shaped[ArrayLike, " time"],
    *,
    decay: Shaped[ArrayLike, " time"] | Shaped[ArrayLike, ""] | float | complex,
    zi: Shaped[ArrayLike, ""] | float | complex | None = None,
    return_zf: bool = False,
    method: Method = "sequential",
) -> Inexact[Array, " time"] | tuple[Inexact[Array, " time"], Inexact[Array, ""]]:
    r"""First-order linear recurrence $y_t = x_t + d_t\, y_{t-1}$.

    The one-pole building block of envelope followers, leaky integrators and
    smoothers; it is `allpole(x, -decay[:, None], zi)` and shares its
    derivative rule.

    **Arguments:**

    - `x`: the input, shape `(T,)`.
    - `decay`: the per-sample decay $d_t$, shape `(T,)`, or a scalar. By
      keyword, `linear_recurrence(x, decay=d)`: for this release a second
      positional argument raises a `TypeError`, since `linear_recurrence`
      took the decay first until now.
    - `zi`: the previous output $y_{-1}$, a scalar. Defaults to 0.
    - `return_zf`: also return the last output, to stream in blocks.
    - `method`: `"sequential"` (default, a scan) or `"associative"` (a
      parallel prefix scan of elementwise products, for accelerators); see
      [`allpole`][retrax.ops.allpole].

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` with the scalar `zf = y[T-1]`.

    A non-finite `decay` raises an error (also under `jax.jit`).
    """
    decay = as_inexact("decay", decay)
    x = as_inexact("x", x)
    check_signal("x", x)
    if decay.ndim > 1 or (decay.ndim == 1 and decay.shape != x.shape):
        raise ValueError(
            f"`decay` must be a scalar or have the shape of `x` {x.shape}, "
            f"got shape {decay.shape}."
        )
    if zi is not None:
        zi = as_inexact("zi", zi)
        if zi.ndim != 0:
            raise ValueError(f"`zi` must be a scalar, got shape {zi.shape}.")
        zi = zi[None]
    out = _allpole(x, -decay[..., None], zi, return_zf, method, "decay")
    if not return_zf:
        return out
    y, zf = out
    return y, zf[0]
