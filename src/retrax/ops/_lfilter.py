"""Rational (IIR) filters: direct form II as an all-pole recursion and an FIR."""

from typing import Literal

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._misc import as_inexact, result_dtype
from ._fir import fir_apply, fir_state
from ._recurrence import DEFAULT_UNROLL, recurrence
from ._validate import check_coeff_rank, check_finite, check_signal, check_zi


Form = Literal["df2", "tdf2"]


def _check_form(form: str) -> None:
    if form not in ("df2", "tdf2"):
        raise ValueError(f"`form` must be 'df2' or 'tdf2', got {form!r}.")


def _allpole_apply(a: Array, x: Array, zi: Array) -> Array:
    if a.shape[-1] == 0:
        return x
    return recurrence("allpole", DEFAULT_UNROLL, a, x, zi)


def _padded(c: Array, length: int, lead: Array | None = None) -> Array:
    """`c` (optionally after a leading entry) zero-padded to `length` entries."""
    parts = [] if lead is None else [lead[None]]
    parts.append(c)
    size = sum(p.shape[0] for p in parts)
    parts.append(jnp.zeros(length - size, c.dtype))
    return jnp.concatenate(parts)


def _hankels(b: Array, a: Array, n_state: int) -> tuple[Array, Array]:
    """`Hb[i, m] = b[i+1+m]`, `Ha[i, m] = a_full[i+1+m]` (zero past the order).

    `a_full = [1, *a]`. These map the past inputs and outputs (newest first)
    to scipy's transposed-direct-form-II state (`scipy.signal.lfiltic`).
    """
    idx = jnp.arange(n_state)[:, None] + jnp.arange(n_state)[None, :] + 1
    b_ext = _padded(b, 2 * n_state + 1)
    a_ext = _padded(a, 2 * n_state + 1, lead=jnp.ones((), a.dtype))
    return b_ext[idx], a_ext[idx]


def _past(v: Array, n_state: int) -> Array:
    """The last `n_state` samples of `v`, newest first, zero before the start."""
    return jnp.concatenate([v[::-1], jnp.zeros(n_state, v.dtype)])[:n_state]


def tdf2_apply(
    b: Array, a: Array, x: Array, zi: Array | None
) -> tuple[Array, Array | None]:
    """Constant-coefficient filter with scipy's transposed-DF2 state `zi`.

    The zero-input response of the transposed form to its state `z` is the
    all-pole filter driven by `z` itself over the first `len(z)` samples, so
    the output is one all-pole pass over `fir(b, x) + z` (zero padded). The
    final state follows `scipy.signal.lfiltic` from the last inputs and
    outputs plus the part of `zi` not yet shifted out.
    """
    n_state = max(a.shape[0], b.shape[0] - 1)
    length = x.shape[0]
    drive = fir_apply(b, x, jnp.zeros(b.shape[0] - 1, x.dtype))
    if zi is not None and n_state > 0:
        head = min(n_state, length)
        drive = drive.at[:head].add(zi[:head])
    y = _allpole_apply(a, drive, jnp.zeros(a.shape[0], x.dtype))
    if n_state == 0:
        return y, jnp.zeros(0, x.dtype)
    hb, ha = _hankels(b, a, n_state)
    zf = hb @ _past(x, n_state) - ha @ _past(y, n_state)
    if zi is not None and length < n_state:
        zf = zf + jnp.concatenate([zi[length:], jnp.zeros(length, x.dtype)])
    return y, zf


def _df2_to_tdf2(b: Array, a: Array, n_state: int) -> Array:
    """The matrix mapping the DF2 delay line (newest first) to scipy's state.

    `z[i] = sum_{k<=i} (b[p+i+1-k] a_full[k] - a_full[p+i+1-k] b[k]) w[-p-1]`,
    from writing the past inputs and outputs of `lfiltic` in terms of `w`.
    """
    size = 2 * n_state + 1
    b_ext = _padded(b, size)
    a_ext = _padded(a, size, lead=jnp.ones((), a.dtype))
    i = jnp.arange(n_state)[:, None, None]
    p = jnp.arange(n_state)[None, :, None]
    k = jnp.arange(n_state)[None, None, :]
    idx = p + i + 1 - k
    keep = (k <= i) & (idx >= 0)
    idx = jnp.clip(idx, 0, size - 1)
    terms = b_ext[idx] * a_ext[k] - a_ext[idx] * b_ext[k]
    return jnp.sum(jnp.where(keep, terms, jnp.zeros((), terms.dtype)), axis=-1)


def _prepare_ba(b, a, length: int | None):
    b = as_inexact("b", b)
    a = as_inexact("a", a)
    if length is None:
        for name, c in (("b", b), ("a", a)):
            if c.ndim != 1:
                raise ValueError(
                    f"`{name}` must be constant, shape (n,), got shape {c.shape}."
                )
    else:
        check_coeff_rank("b", b, length, "taps")
        check_coeff_rank("a", a, length, "order")
    if b.shape[-1] == 0:
        raise ValueError("`b` must have at least one coefficient.")
    return b, a


def lfilter(
    b: Shaped[ArrayLike, "time taps"] | Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, "time order"] | Shaped[ArrayLike, " order"],
    x: Shaped[ArrayLike, " time"],
    zi: Shaped[ArrayLike, " state"] | None = None,
    *,
    return_zf: bool = False,
    form: Form = "df2",
) -> Inexact[Array, " time"] | tuple[Inexact[Array, " time"], Inexact[Array, " state"]]:
    r"""IIR filter $B(z)/A(z)$ in direct form II, constant or time-varying.

    $$w_t = x_t - \sum_{k=1}^{K} a_{t,k}\, w_{t-k}, \qquad
      y_t = \sum_{k=0}^{M} b_{t,k}\, w_{t-k},$$

    i.e. `fir(b, allpole(x, a))` over one shared delay line $w$, the exact
    direct-form-II decomposition of philtorch (Yu et al., "Differentiable
    all-pole filters for time-varying audio systems", DAFx 2024). With
    constant coefficients it equals `scipy.signal.lfilter(b, [1, *a], x)`:
    note that **`a` excludes the leading 1** of the denominator (unlike
    `sosfilt`, whose rows include it). The recursion runs on retrax's
    recurrence core, so gradients run the adjoint filter backwards in time.

    High-order transfer functions are numerically fragile in any direct form
    (their coefficients lose the pole positions to rounding): for orders above
    about 4, or poles close to the unit circle, factor the filter into
    second-order sections and use `retrax.ops.sosfilt`.

    **Arguments:**

    - `b`: numerator taps, `(M+1,)` constant or `(T, M+1)` per sample.
    - `a`: denominator coefficients without the leading 1, `(K,)` constant or
      `(T, K)` per sample. `K = 0` gives an FIR filter.
    - `x`: the input signal, shape `(T,)`. Batch with `jax.vmap`.
    - `zi`: the initial state, shape `(max(K, M),)`, in the layout of `form`.
      Defaults to zeros.
    - `return_zf`: also return the final state in the same layout, so that a
      long signal can be filtered block by block.
    - `form`: the state layout. `"df2"`: the delay line, newest first,
      `zi[k] = w[-k-1]` (see `lfilter_zi`). `"tdf2"`: scipy's
      transposed-direct-form-II state, exactly as `scipy.signal.lfilter`,
      `lfilter_zi` and `lfiltic` use it, so scipy code passing `zi` ports by
      only dropping the leading 1 from `a`. `"tdf2"` requires constant
      coefficients (the layout is defined for time-invariant filters).

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` if `return_zf`. The dtype is the
    promoted dtype of the inputs (float32, float64, complex64, complex128).

    Non-finite coefficients raise an error (also under `jax.jit`). Unstable
    filters are not an error: the output grows as the recursion defines it.
    """
    _check_form(form)
    x = as_inexact("x", x)
    check_signal("x", x)
    b, a = _prepare_ba(b, a, x.shape[0])
    order = a.shape[-1]
    fir_order = b.shape[-1] - 1
    n_state = max(order, fir_order)
    if form == "tdf2" and (a.ndim == 2 or b.ndim == 2):
        raise ValueError(
            "form='tdf2' needs constant `b` and `a` (shape (n,)); use form='df2' "
            "for time-varying coefficients."
        )
    zi = check_zi(zi, (n_state,), "the delay line, max(len(a), len(b) - 1) long")
    dtype = result_dtype(x, b, a, zi)
    x = x.astype(dtype)
    b = check_finite("b", b.astype(dtype))
    a = check_finite("a", a.astype(dtype))
    zi = None if zi is None else zi.astype(dtype)
    if form == "tdf2":
        y, zf = tdf2_apply(b, a, x, zi)
    else:
        z0 = jnp.zeros(n_state, dtype) if zi is None else zi
        w = _allpole_apply(a, x, z0[:order])
        y = fir_apply(b, w, z0[:fir_order])
        zf = fir_state(w, z0, n_state)
    if not return_zf:
        return y
    return y, zf


def lfilter_zi(
    b: Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, " order"],
    form: Form = "df2",
) -> Inexact[Array, " state"]:
    r"""Steady-state initial condition of `lfilter` for a unit step input.

    Scale it by the first input sample to start a filter without a transient
    (as `filtfilt` does). The step response settles at $w = 1/(1 + \sum_k
    a_k)$ on the direct-form-II delay line, so for `form="df2"` every entry
    is that value; for `form="tdf2"` it is `scipy.signal.lfilter_zi(b, [1,
    *a])`. Undefined (division by zero) when $1 + \sum_k a_k = 0$, i.e. a pole
    at $z = 1$.

    **Arguments:**

    - `b`: numerator taps, shape `(M+1,)`.
    - `a`: denominator coefficients without the leading 1, shape `(K,)`.
    - `form`: the state layout, `"df2"` or `"tdf2"` (see `lfilter`).

    **Returns:**

    The state of shape `(max(K, M),)`.
    """
    _check_form(form)
    b, a = _prepare_ba(b, a, None)
    dtype = result_dtype(b, a)
    b = b.astype(dtype)
    a = a.astype(dtype)
    n_state = max(a.shape[0], b.shape[0] - 1)
    level = 1 / (1 + jnp.sum(a))
    if form == "df2":
        return jnp.full(n_state, level, dtype)
    hb, ha = _hankels(b, a, n_state)
    gain = jnp.sum(b) * level
    return jnp.sum(hb, axis=1) - jnp.sum(ha, axis=1) * gain


def lfiltic(
    b: Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, " order"],
    y: Shaped[ArrayLike, " past_y"],
    x: Shaped[ArrayLike, " past_x"] | None = None,
    form: Form = "df2",
) -> Inexact[Array, " state"]:
    r"""Initial state of `lfilter` from past outputs and inputs.

    As `scipy.signal.lfiltic`: `y[k] = y[-k-1]` and `x[k] = x[-k-1]` are the
    outputs and inputs before the first sample, newest first; shorter vectors
    are zero padded and longer ones truncated to `max(K, M)`. For
    `form="tdf2"` the result is `scipy.signal.lfiltic(b, [1, *a], y, x)`.
    For `form="df2"` it is the delay line $w$ that continues the same way,
    found by solving a linear system; it exists when $B$ and $A$ have no
    common root (a filter with a cancelled pole-zero pair has no unique
    delay line: use `form="tdf2"` then, or the result is `inf`/`nan`).

    **Arguments:**

    - `b`: numerator taps, shape `(M+1,)`.
    - `a`: denominator coefficients without the leading 1, shape `(K,)`.
    - `y`: past outputs, newest first.
    - `x`: past inputs, newest first. Defaults to zeros.
    - `form`: the state layout, `"df2"` or `"tdf2"` (see `lfilter`).

    **Returns:**

    The state of shape `(max(K, M),)`.
    """
    _check_form(form)
    b, a = _prepare_ba(b, a, None)
    y = as_inexact("y", y)
    if y.ndim != 1:
        raise ValueError(f"`y` must be a vector of past outputs, got shape {y.shape}.")
    if x is not None:
        x = as_inexact("x", x)
        if x.ndim != 1:
            raise ValueError(
                f"`x` must be a vector of past inputs, got shape {x.shape}."
            )
    dtype = result_dtype(b, a, y, x)
    b = b.astype(dtype)
    a = a.astype(dtype)
    n_state = max(a.shape[0], b.shape[0] - 1)

    def fit(v):
        v = v.astype(dtype)[:n_state]
        return jnp.concatenate([v, jnp.zeros(n_state - v.shape[0], dtype)])

    hb, ha = _hankels(b, a, n_state)
    past_x = jnp.zeros(n_state, dtype) if x is None else fit(x)
    z = hb @ past_x - ha @ fit(y)
    if form == "tdf2":
        return z
    return jnp.linalg.solve(_df2_to_tdf2(b, a, n_state), z)
