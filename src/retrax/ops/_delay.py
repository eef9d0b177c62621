r"""Fractional delay lines: a signal read back at a constant or moving delay.

$y_t = x(t - d_t)$ between the samples is read by a short FIR interpolator
whose taps are polynomials in the fractional part of $d_t$. The output is
linear in `x` (reverse mode scatters the cotangent back onto the taps that
read each sample) and piecewise polynomial in `d`, so JAX differentiates it
directly at every order; no recursion is involved.
"""

import math

import jax.numpy as jnp
from jax import Array
from jaxtyping import ArrayLike, Float, Shaped

from .._delay_history import (
    INTERPOLATIONS,
    Interpolation,
    history_length,
    supported_delay,
)
from .._misc import result_dtype
from .._validate import check_signal, check_value, real_array, static_float
from ._fir import fir_state


def lagrange3_weights(p: Array) -> tuple[Array, Array, Array, Array]:
    """The third-order Lagrange weights of the nodes 0, 1, 2, 3 at `p`."""
    return (
        -(p - 1) * (p - 2) * (p - 3) / 6,
        p * (p - 2) * (p - 3) / 2,
        -p * (p - 1) * (p - 3) / 2,
        p * (p - 1) * (p - 2) / 6,
    )


def delay_apply(x: Array, d: Array, zi: Array, interpolation: Interpolation) -> Array:
    """$y_t = x(t - d_t)$ read from `zi` (newest first) followed by `x`, zero
    before the start of `zi`; inputs share a dtype."""
    length = x.shape[0]
    # One zero in front stands for the (zero) history before `zi`: reads
    # further back are clipped onto it. `full[now[t]]` is `x[t]`.
    full = jnp.concatenate([jnp.zeros(1, x.dtype), zi[::-1], x])
    now = 1 + zi.shape[0] + jnp.arange(length, dtype=jnp.int32)
    whole = jnp.floor(d)  # a constant delay stays a scalar: weights computed once
    if interpolation == "linear":
        frac = d - whole
        start = whole
        weights = jnp.stack([1 - frac, frac], axis=-1)
    else:
        # The cubic through x[t-m], ..., x[t-m-3], centred on the delay
        # (m = n - 1) except below one sample, where it cannot look ahead.
        start = jnp.maximum(whole - 1, 0)
        weights = jnp.stack(lagrange3_weights(d - start), axis=-1)
    taps = jnp.arange(weights.shape[-1], dtype=jnp.int32)
    index = now[:, None] - jnp.expand_dims(start.astype(jnp.int32), -1) - taps
    return jnp.sum(weights * full[jnp.clip(index, 0, None)], axis=-1)


def delay(
    x: Shaped[ArrayLike, " time"],
    d: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    *,
    max_delay: float | int | None = None,
    interpolation: str = "linear",
    zi: Shaped[ArrayLike, " history"] | None = None,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, " history"]]:
    r"""Fractional delay line with a constant or per-sample delay.

    $$y_t = x_{t - d_t},$$

    with $d_t \ge 0$ in samples, read between the samples by an interpolator.
    Write $d = n + f$ with $n = \lfloor d \rfloor$:

    - `"linear"` (default): $y_t = (1 - f)\, x_{t-n} + f\, x_{t-n-1}$. Its
      frequency response, for a constant delay, is
      $H(e^{i\omega}) = e^{-i\omega n}\,(1 - f + f e^{-i\omega})$, with
      $|H|^2 = 1 - 2f(1-f)(1 - \cos\omega)$: flat for integer $d$, otherwise
      a lowpass, worst at half a sample ($f = 1/2$: $-3$ dB at $\omega =
      \pi/2$, $-1$ dB at $0.30\pi$, a zero at Nyquist, where
      $|H(e^{i\pi})| = |1 - 2f|$). The phase delay is $d$ at $\omega \to 0$
      (exact at all frequencies for $f \in \{0, 1/2\}$).
    - `"lagrange3"`: the third-order (cubic) Lagrange interpolator through
      four neighbouring samples, $y_t = \sum_{k=0}^{3} w_k(p)\,
      x_{t-m-k}$ with $w_k(p) = \prod_{j \ne k} (p - j)/(k - j)$,
      $m = \max(n - 1, 0)$ and $p = d - m$. For $d \ge 1$ it is centred
      ($p \in [1, 2)$); below one sample it cannot look ahead and uses
      $x_t, \dots, x_{t-3}$. Its response $H(e^{i\omega}) =
      e^{-i\omega m} \sum_k w_k(p) e^{-i\omega k}$ is maximally flat at
      $\omega = 0$ (it matches $e^{-i\omega d}$ up to an error of order
      $\omega^4$, where linear interpolation errs at order $\omega^2$). For
      $d \ge 1$, $|H| \le 1$, and at half a sample ($p = 3/2$) it keeps
      $-1$ dB up to $0.49\pi$ ($-1.1$ dB at $\omega = \pi/2$), again with a
      zero at Nyquist and linear phase. Below one sample
      the off-centre taps boost high frequencies, by up to $1.19$
      ($+1.5$ dB, near Nyquist at $d = 3/4$).

    Both are exact shifts for integer $d$ (one tap of weight 1, the others
    0) and continuous in $d$. They are polynomials in $d$ between integers,
    so the derivative with respect to `d` exists away from integers (at an
    integer JAX takes the one-sided derivative from above); with respect to
    `x` the op is linear. Derivatives of every order work in both modes, for
    `x`, `d` and `zi`, and the op streams.

    **Arguments:**

    - `x`: the input signal, real, time first, shape `(T,)`. Batch with
      `jax.vmap`.
    - `d`: the delay in samples, `>= 0`: a scalar, or one value per sample
      `(T,)` (a moving delay, as in a chorus or vibrato).
    - `max_delay`: the largest delay `d` will take, a Python number (static).
      It fixes the history the op keeps: `H = floor(max_delay) + 1` past
      inputs for `"linear"`, `max(floor(max_delay) + 2, 3)` for
      `"lagrange3"`, and `d > max_delay` is an error. Without it, the
      history is `zi`'s length (which supports a `max_delay` of `H - 1`,
      resp. `H - 2`), or, with neither, an unbounded history of zeros (then
      `return_zf` is not available).
    - `interpolation`: `"linear"` (default) or `"lagrange3"`, see above.
    - `zi`: the past inputs the definition reads before the first sample,
      newest first: `zi[k] = x[-k-1]`, shape `(H,)`. Defaults to zeros.
    - `return_zf`: also return the last `H` inputs in the same layout, the
      `zi` of the next block, so that a long signal can be delayed block by
      block with the same result as in one call.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` with `zf[k] = x[T-1-k]` (the entries
    of `zi` where `T < H`) if `return_zf`. The dtype is the promoted dtype of
    the inputs (float32 or float64).

    A `d` that is negative or not finite, or larger than `max_delay` (or the
    history `zi` holds), raises an error: a Python or NumPy `d` at once, a
    JAX array at run time (also under `jax.jit`). A bad `max_delay`,
    `interpolation` or `zi` shape raise a `ValueError` at once.
    """
    if interpolation not in INTERPOLATIONS:
        raise ValueError(
            f"`interpolation` must be one of {INTERPOLATIONS}, got {interpolation!r}."
        )
    x = real_array("x", x)
    check_signal("x", x)
    length = x.shape[0]
    d_shape = jnp.shape(d)
    if len(d_shape) > 1 or (len(d_shape) == 1 and d_shape[0] != length):
        raise ValueError(
            f"`d` must be a scalar or have one value per sample of `x` ({length},), "
            f"got shape {d_shape}."
        )
    real_array("d", d)
    if max_delay is not None:
        max_delay = static_float("max_delay", max_delay)
        if not (math.isfinite(max_delay) and max_delay >= 0):
            raise ValueError(
                f"`max_delay` must be a finite number >= 0, got {max_delay!r}."
            )
    if zi is not None:
        zi = real_array("zi", zi)
        if max_delay is not None:
            size = history_length(interpolation, max_delay)
            if zi.shape != (size,):
                raise ValueError(
                    f"`zi` must be the last {size} inputs (newest first) that a "
                    f"delay up to `max_delay` = {max_delay} reads with "
                    f"{interpolation!r} interpolation, shape ({size},), got shape "
                    f"{zi.shape}."
                )
        else:
            least = history_length(interpolation, 0.0)
            if zi.ndim != 1 or zi.shape[0] < least:
                raise ValueError(
                    f"`zi` must be the past inputs x[-1], x[-2], ... (newest first), "
                    f"shape (H,) with H >= {least} for {interpolation!r} "
                    f"interpolation, got shape {zi.shape}."
                )
            max_delay = float(supported_delay(interpolation, zi.shape[0]))
    elif max_delay is None and return_zf:
        raise ValueError(
            "`return_zf=True` needs a bounded history: pass `max_delay` (the "
            "largest delay `d` will take) or `zi`."
        )
    d = check_value(
        d,
        lambda xp, v: ~xp.isfinite(v) | (v < 0),
        "`d` must be a finite delay >= 0 (in samples).",
    )
    if max_delay is not None:
        bound = max_delay
        d = check_value(
            d,
            lambda xp, v: v > bound,
            f"`d` must be at most `max_delay` = {bound}: the op keeps only the "
            "history that delay reads (set `max_delay`, or pass a longer `zi`).",
        )
    d = real_array("d", d)
    size = 0 if max_delay is None else history_length(interpolation, max_delay)
    dtype = result_dtype(x, d, zi)
    x = x.astype(dtype)
    d = d.astype(dtype)
    zi = jnp.zeros(size, dtype) if zi is None else zi.astype(dtype)
    y = delay_apply(x, d, zi, interpolation)
    if not return_zf:
        return y
    return y, fir_state(x, zi, size)
