"""Feedback delay networks in the time domain, on the recurrence core."""

import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._float_dtypes import check_float_dtype
from .._misc import as_inexact, result_dtype
from .._validate import check_delay, check_signal, check_value, real_array
from ._recurrence import DEFAULT_UNROLL, DelayLines, delay_line_reads, recurrence


def check_delays(delays) -> tuple[int, ...]:
    try:
        delays = tuple(delays)
    except TypeError:
        raise ValueError(
            f"`delays` must be a sequence of Python ints >= 1, got {delays!r}."
        ) from None
    if not delays:
        raise ValueError("`delays` must hold at least one delay line.")
    return tuple(check_delay(f"delays[{i}]", m) for i, m in enumerate(delays))


def _bounded_norm(xp, A):
    # Orthogonal (lossless) matrices have norm 1 up to rounding.
    if xp is jnp:
        A = lax.stop_gradient(A)
        tol = 100 * jnp.finfo(A.dtype).eps
    else:
        tol = 100 * np.finfo(np.result_type(A.dtype, np.float32)).eps
    return xp.linalg.norm(A, 2) > 1 + tol


def checked_network(delays: tuple[int, ...], A, b, c, d):
    """`(A, b, c, d)` as inexact arrays, their shapes checked at once and their
    values (finite; `A` of spectral norm at most 1) eagerly or under `jit`.
    `d=None` is 0. A dtype other than float32 or float64 raises `TypeError`."""
    lines = len(delays)
    # before the norm's SVD, which LAPACK has no float16 or bfloat16 for
    check_float_dtype(
        "`A` (with `b`, `c`, `d`)",
        result_dtype(A, b, c, d),
        "a feedback delay network",
    )
    shapes = {"A": (lines, lines), "b": (lines,), "c": (lines,)}
    params = {"A": A, "b": b, "c": c, "d": 0.0 if d is None else d}
    for name, value in params.items():
        arr = real_array(name, value)
        shape = shapes.get(name, ())
        if arr.shape != shape:
            raise ValueError(
                f"`{name}` must have shape {shape} for {lines} delay lines, got "
                f"shape {arr.shape}."
            )
        params[name] = check_value(
            value,
            lambda xp, v: ~xp.all(xp.isfinite(v)),
            f"`{name}` has non-finite (nan or inf) entries.",
        )
    params["A"] = check_value(
        params["A"],
        _bounded_norm,
        "`A` must have spectral norm at most 1 (the network would otherwise "
        "grow without bound); use an orthogonal or Householder matrix, scaled "
        "by a gain <= 1.",
    )
    return tuple(as_inexact(k, params[k]) for k in ("A", "b", "c", "d"))


def fdn(
    x: Shaped[ArrayLike, " time"],
    delays: tuple[int, ...] | list[int],
    A: Shaped[ArrayLike, "lines lines"],
    b: Shaped[ArrayLike, " lines"],
    c: Shaped[ArrayLike, " lines"],
    d: Shaped[ArrayLike, ""] | float | None = None,
    *,
    zi: Shaped[ArrayLike, "lines history"] | None = None,
    return_zf: bool = False,
) -> (
    Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, "lines history"]]
):
    r"""Feedback delay network (FDN), in the time domain.

    $N$ delay lines of integer lengths $m_i$: line $i$ holds $s_i$, its
    output is $o_i[t] = s_i[t - m_i]$, and

    $$s_i[t] = b_i\, x[t] + \sum_j A_{ij}\, o_j[t], \qquad
      y[t] = \sum_i c_i\, o_i[t] + d\, x[t],$$

    the network of Jot and Chaigne ("Digital delay networks for designing
    artificial reverberators", AES 1991), with transfer function
    $H(z) = c^\top (D(z)^{-1} - A)^{-1} b + d$, $D(z) = \operatorname{diag}
    (z^{-m_i})$. An orthogonal (or Householder) feedback matrix is lossless;
    scaling it down, or filtering, makes the response decay.

    It runs on retrax's recurrence core (the delay-network structure, stepping
    over blocks of $\min_i m_i$ samples), so its derivatives are the core's:
    the tangent is the same network driven by the tangent input, and reverse
    mode runs it backwards in time, for `x`, `A`, `b`, `c`, `d` and `zi`, at
    every order and in both modes.

    **Arguments:**

    - `x`: the input signal, real, time first, shape `(T,)`. Batch with
      `jax.vmap`.
    - `delays`: the line lengths $m_i$, a sequence of $N$ Python ints `>= 1`
      (static).
    - `A`: the feedback matrix, shape `(N, N)`, with spectral norm at most 1
      (1 is allowed: a lossless network).
    - `b`: the input gains, shape `(N,)`.
    - `c`: the output gains, shape `(N,)`.
    - `d`: the direct gain, a scalar; `None` means 0.
    - `zi`: the history the network reads before the first sample, shape
      `(N, M)` with `M = max(delays)`, newest first: `zi[i, k] = s_i[-k-1]`
      (line $i$ reads only its first $m_i$ entries). Defaults to zeros.
    - `return_zf`: also return the final state in the same layout,
      `zf[i, k] = s_i[T-1-k]`, the `zi` of the next block (streaming).

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`. The dtype is the
    promoted dtype of the inputs (float32 or float64).

    Bad `delays`, shapes or a wrong `zi` shape raise a `ValueError` at once;
    inputs that promote to a dtype other than float32 or float64 (float16,
    bfloat16) raise a `TypeError` naming it.
    A non-finite `A`, `b`, `c` or `d`, or an `A` with spectral norm above 1
    (beyond rounding, `100 eps`), raise an error: NumPy or Python values at
    once, JAX arrays at run time (also under `jax.jit`).
    """
    delays = check_delays(delays)
    lines, longest = len(delays), max(delays)
    x = real_array("x", x)
    check_signal("x", x)
    check_float_dtype(
        "`x` (with `A`, `b`, `c`, `d`, `zi`)",
        result_dtype(x, A, b, c, d, zi),
        "`fdn`",
    )
    A, b, c, dd = checked_network(delays, A, b, c, d)
    if zi is not None:
        zi = real_array("zi", zi)
        if zi.shape != (lines, longest):
            raise ValueError(
                f"`zi` must be the last {longest} values of each of the {lines} "
                f"lines (newest first), shape ({lines}, {longest}), got shape "
                f"{zi.shape}."
            )
    dtype = result_dtype(x, A, b, c, dd, zi)
    x, A, b, c, dd = (v.astype(dtype) for v in (x, A, b, c, dd))
    zi = jnp.zeros((lines, longest), dtype) if zi is None else zi.astype(dtype)
    u = x[:, None] * b
    structure = DelayLines(delays)
    s = recurrence(structure, DEFAULT_UNROLL, A, u, zi)
    y = delay_line_reads(delays, s, zi) @ c + dd * x
    if not return_zf:
        return y
    full = jnp.concatenate([zi[:, ::-1], s.T], axis=1)
    return y, full[:, ::-1][:, :longest]
