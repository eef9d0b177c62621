"""Time-varying direct form II: an all-pole recursion and an FIR on one delay line."""

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
from ._fir import fir_apply, fir_state
from ._lfilter import allpole_apply


@signal_first("b", "a")
def lfilter_tv(
    x: Shaped[ArrayLike, " time"],
    *,
    b: Shaped[ArrayLike, "time taps"] | Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, "time order"] | Shaped[ArrayLike, " order"],
    zi: Shaped[ArrayLike, " state"] | None = None,
    return_zf: bool = False,
) -> Inexact[Array, " time"] | tuple[Inexact[Array, " time"], Inexact[Array, " state"]]:
    r"""IIR filter $B(z)/A(z)$ in direct form II, constant or time-varying.

    $$w_t = x_t - \sum_{k=1}^{K} a_{t,k}\, w_{t-k}, \qquad
      y_t = \sum_{k=0}^{M} b_{t,k}\, w_{t-k},$$

    i.e. `fir(allpole(x, a), b=b)` over one shared delay line $w$, the exact
    direct-form-II decomposition of philtorch (Yu et al., "Differentiable
    all-pole filters for time-varying audio systems", DAFx 2024).

    **Convention: retrax's time-first ops** (as `allpole` and `fir`, after
    torchlpc): **`a` excludes the leading 1** of the denominator, `x` is one
    signal `(T,)` (batch with `jax.vmap`), and the state is the delay line.
    With constant coefficients and zero state it equals
    `scipy.signal.lfilter(b, [1, *a], x)`; for scipy's own arguments and state
    layout use [`lfilter`][retrax.ops.lfilter]. The recursion runs on retrax's
    recurrence core, so gradients run the adjoint filter backwards in time.

    For orders above about 4, or poles close to the unit circle, direct forms
    lose precision: factor the filter into second-order sections and use
    [`sosfilt`][retrax.ops.sosfilt].

    **Arguments:**

    - `x`: the input signal, shape `(T,)`.
    - `b`: numerator taps, `(M+1,)` constant or `(T, M+1)` per sample.
    - `a`: denominator coefficients without the leading 1, `(K,)` constant or
      `(T, K)` per sample. `K = 0` gives an FIR filter.

    `b` and `a` by keyword, `lfilter_tv(x, b=b, a=a)`: for this release a
    second positional argument raises a `TypeError`, since `lfilter_tv` took
    the coefficients first until now.
    - `zi`: the delay line before the first sample, newest first,
      `zi[k] = w[-k-1]`, shape `(max(K, M),)` (see
      [`lfilter_tv_zi`][retrax.ops.lfilter_tv_zi]). Defaults to zeros.
    - `return_zf`: also return the final delay line in the same layout, so
      that a long signal can be filtered block by block.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`. The dtype is the
    promoted dtype of the inputs (float32, float64, complex64, complex128).

    Non-finite coefficients raise an error (also under `jax.jit`). Unstable
    filters are not an error: the output grows as the recursion defines it.
    """
    x = inexact("x", x)
    check_signal("x", x)
    b = inexact("b", b)
    a = inexact("a", a)
    check_coeff_rank("b", b, x.shape[0], "taps")
    check_coeff_rank("a", a, x.shape[0], "order")
    if b.shape[-1] == 0:
        raise ValueError("`b` must have at least one coefficient.")
    order = a.shape[-1]
    fir_order = b.shape[-1] - 1
    n_state = max(order, fir_order)
    zi = check_zi(zi, (n_state,), "the delay line, max(len(a), len(b) - 1) long")
    dtype = result_dtype(x, b, a, zi)
    x = x.astype(dtype)
    b = check_finite("b", b.astype(dtype))
    a = check_finite("a", a.astype(dtype))
    z0 = jnp.zeros(n_state, dtype) if zi is None else zi.astype(dtype)
    w = allpole_apply(a, x, z0[:order])
    y = fir_apply(b, w, z0[:fir_order])
    if not return_zf:
        return y
    return y, fir_state(w, z0, n_state)


def lfilter_tv_zi(
    b: Shaped[ArrayLike, " taps"], a: Shaped[ArrayLike, " order"]
) -> Inexact[Array, " state"]:
    r"""Steady state of `lfilter_tv`'s delay line for a unit step input.

    **Convention: retrax's time-first ops**: `a` excludes the leading 1 and
    the state is [`lfilter_tv`][retrax.ops.lfilter_tv]'s delay line. A unit
    step settles the delay line at $w = 1/(1 + \sum_k a_k)$, so every entry is
    that value; scale it by the first input sample to start without a
    transient. Undefined (division by zero) for a pole at $z = 1$. For
    scipy's layout use [`lfilter_zi`][retrax.ops.lfilter_zi].

    **Arguments:**

    - `b`: numerator taps, shape `(M+1,)`.
    - `a`: denominator coefficients without the leading 1, shape `(K,)`.

    **Returns:**

    The delay line, shape `(max(K, M),)`.
    """
    b = inexact("b", b)
    a = inexact("a", a)
    for name, c in (("b", b), ("a", a)):
        if c.ndim != 1:
            raise ValueError(
                f"`{name}` must be constant, shape (n,), got shape {c.shape}."
            )
    if b.shape[0] == 0:
        raise ValueError("`b` must have at least one coefficient.")
    dtype = result_dtype(b, a)
    a = a.astype(dtype)
    n_state = max(a.shape[0], b.shape[0] - 1)
    return jnp.full(n_state, 1 / (1 + jnp.sum(a)), dtype)
