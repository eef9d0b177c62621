"""Rational (IIR) filters in scipy's conventions: `lfilter`, `lfilter_zi`, `lfiltic`.

scipy's `lfilter` keeps the transposed-direct-form-II state. Its output is one
all-pole pass over `fir(x, b=b)` plus the state, and the state is a linear map
of the last inputs and outputs (`lfiltic`), so the recursion runs on retrax's
recurrence core and its derivatives are the adjoint filter's.
"""

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._compiled import compiled
from ._fir import fir_apply
from ._recurrence import DEFAULT_UNROLL, recurrence
from ._scipy_args import (
    along_axis,
    as_array,
    coefficients,
    compute_dtype,
    host_arrays,
    in_dtype,
    normalise,
    normalise_axis,
    scipy_dtype,
)


def allpole_apply(a: Array, x: Array, zi: Array) -> Array:
    """`allpole` on the recurrence core without its checks; `a` may be empty."""
    if a.shape[-1] == 0:
        return x
    return recurrence("allpole", DEFAULT_UNROLL, a, x, zi)


@jax.custom_jvp
def fir_drive(b: Array, x: Array) -> Array:
    """$\\sum_k b_k x_{t-k}$ of one signal `x`, zero before its start.

    Each tap reads `x` through a pad of its own, which XLA fuses into the one
    loop that sums the products: one pass over `x`. `fir_apply` reads every
    tap from one zero-padded copy of `x`, which XLA writes out first, and
    reads it in rows longer than the signal's; for a block of 64 channels of
    a second (float64, a stream's step with `zi`) that made `lfilter` take
    twice its time (61 against 31 ms on a 2-core x86 CPU). The derivatives
    are `fir_apply`'s (`_fir_drive_jvp`), whose taps' transpose runs on the
    compiled lag sums."""
    length = x.shape[0]
    y = b[0] * x
    for k in range(1, min(b.shape[0], length + 1)):
        y = y + b[k] * jnp.pad(x[: length - k], (k, 0))
    return y


def _fir_drive_jvp(primals, tangents):
    """`fir_apply`'s tangent, with a symbolic zero's term left out."""
    b, x = primals
    db, dx = tangents
    zeros = jnp.zeros(b.shape[0] - 1, x.dtype)
    dy = None
    if type(db) is not SymbolicZero:
        dy = fir_apply(db, x, zeros)
    if type(dx) is not SymbolicZero:
        term = fir_apply(b, dx, zeros)
        dy = term if dy is None else dy + term
    return fir_drive(b, x), jnp.zeros_like(x) if dy is None else dy


fir_drive.defjvp(_fir_drive_jvp, symbolic_zeros=True)


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
    the output is one all-pole pass over `fir(x, b=b) + z` (zero padded). The
    final state follows `scipy.signal.lfiltic` from the last inputs and
    outputs plus the part of `zi` not yet shifted out.
    """
    n_state = max(a.shape[0], b.shape[0] - 1)
    length = x.shape[0]
    drive = fir_drive(b, x)
    if zi is not None and n_state > 0:
        head = min(n_state, length)
        drive = drive.at[:head].add(zi[:head])
    y = allpole_apply(a, drive, jnp.zeros(a.shape[0], x.dtype))
    if n_state == 0:
        return y, jnp.zeros(0, x.dtype)
    hb, ha = _hankels(b, a, n_state)
    zf = hb @ _past(x, n_state) - ha @ _past(y, n_state)
    if zi is not None and length < n_state:
        zf = zf + jnp.concatenate([zi[length:], jnp.zeros(length, x.dtype)])
    return y, zf


def scipy_zi(zi: Array, x_shape: tuple, axis: int, length: int, what: str) -> Array:
    """`zi` checked (and broadcast, as scipy does) to `x_shape` with `length` at `axis`.

    As in `scipy.signal.lfilter`: `zi` has as many dimensions as `x`, the
    length `length` along `axis`, and the size of `x` or 1 along the others.
    """
    expected = x_shape[:axis] + (length,) + x_shape[axis + 1 :]
    ok = zi.ndim == len(x_shape) and all(
        z == e or (k != axis and z == 1)
        for k, (z, e) in enumerate(zip(zi.shape, expected, strict=True))
    )
    if not ok:
        raise ValueError(
            f"`zi` must have shape {expected} ({what}, along axis={axis} of `x` "
            f"with shape {x_shape}), got shape {zi.shape}."
        )
    return jnp.broadcast_to(zi, expected)


def lfilter(
    b: Shaped[ArrayLike, " taps"] | list | tuple | float | int,
    a: Shaped[ArrayLike, " order"] | list | tuple | float | int,
    x: Shaped[ArrayLike, " *signal"] | list | tuple,
    axis: int = -1,
    zi: Shaped[ArrayLike, " *state"] | list | tuple | None = None,
) -> (
    Inexact[Array, " *signal"]
    | tuple[Inexact[Array, " *signal"], Inexact[Array, " *zf"]]
):
    r"""IIR filter $B(z)/A(z)$ along one axis, exactly as `scipy.signal.lfilter`.

    $$a_0 y_t = \sum_{k=0}^{M} b_k x_{t-k} - \sum_{k=1}^{N} a_k y_{t-k}.$$

    **Convention: scipy's.** `a` includes `a[0]`, and `b` and `a` are
    normalised by it; `zi` and `zf` are scipy's transposed-direct-form-II
    state, as `scipy.signal.lfilter_zi` and `scipy.signal.lfiltic` (and
    retrax's [`lfilter_zi`][retrax.ops.lfilter_zi] and
    [`lfiltic`][retrax.ops.lfiltic]) produce it. Replacing `scipy.signal` by
    `retrax.ops` gives the same numbers, plus `jax.jit`, `jax.vmap` and
    derivatives in both modes with respect to every array argument: the
    recursion runs on retrax's recurrence core, whose gradient is the adjoint
    filter run backwards in time. For coefficients that change every sample
    see [`lfilter_tv`][retrax.ops.lfilter_tv].

    High-order transfer functions are numerically fragile in any direct form:
    for orders above about 4, or poles close to the unit circle, use
    second-order sections with [`sosfilt`][retrax.ops.sosfilt].

    **Arguments:**

    - `b`: the numerator coefficients, shape `(M+1,)`.
    - `a`: the denominator coefficients including `a[0]`, shape `(N+1,)`.
      `a[0] == 0` is a `ValueError`, as in scipy (under `jax.jit`, a
      run-time error), as is a non-finite entry of `b` or `a`.
    - `x`: the signal, any number of dimensions.
    - `axis`: the axis of `x` to filter along (default: the last).
    - `zi`: the initial state, scipy's layout: the shape of `x` with
      `max(M, N)` along `axis` (size-1 dimensions elsewhere broadcast).
      When given, the final state is returned too.

    **Returns:**

    `y`, the shape of `x`; or `(y, zf)` when `zi` is given, `zf` the final
    state in `zi`'s layout. Python lists and numbers are weakly typed, so the
    dtype is the promoted dtype of the array arguments (a float32 signal stays
    float32); integers compute in the default float dtype, as in scipy
    (NumPy input is converted by NumPy, so 64-bit integers round to the
    nearest float also without x64). NumPy's long double (`float128`,
    `complex256`) and object or string arrays are a `TypeError` naming the
    argument and its dtype: JAX does not compute in them. float16 and
    bfloat16 compute in float32, the results rounded to their dtype (a
    recursion in 16 bits would accumulate its rounding errors; scipy refuses
    float16-only input).
    """
    dtype = scipy_dtype(b, a, x, zi)
    b, a, x, zi = host_arrays(compute_dtype(dtype), b=b, a=a, x=x, zi=zi)
    return _lfilter(b, a, x, zi, axis=axis, dtype=dtype)


@compiled(static=("axis", "dtype"))
def _lfilter(b, a, x, zi, *, axis: int, dtype: np.dtype):
    """`lfilter` after `host_arrays`, compiled as a whole."""
    work = compute_dtype(dtype)
    b = coefficients("b", b, work)
    a = coefficients("a", a, work)
    x = as_array("x", x, work)
    axis = normalise_axis(axis, x.ndim)
    n_state = max(a.shape[0], b.shape[0]) - 1
    if zi is not None:
        zi = as_array("zi", zi, work)
        zi = scipy_zi(zi, x.shape, axis, n_state, "max(len(a), len(b)) - 1")
    b, a = normalise(b, a)

    def run(signal, state=None):
        return tdf2_apply(b, a, signal, state)

    if zi is None:
        return in_dtype(dtype, along_axis(lambda s: run(s)[:1], x, axis)[0])
    y, zf = along_axis(run, x, axis, zi)
    return in_dtype(dtype, (y, zf))


def steady_state(b: Array, a: Array) -> Array:
    """The state of a unit step's steady state; `b`, `a` normalised."""
    n_state = max(a.shape[0], b.shape[0] - 1)
    hb, ha = _hankels(b, a, n_state)
    gain = jnp.sum(b) / (1 + jnp.sum(a))
    return jnp.sum(hb, axis=1) - jnp.sum(ha, axis=1) * gain


def lfilter_zi(
    b: Shaped[ArrayLike, " taps"] | list | tuple | float | int,
    a: Shaped[ArrayLike, " order"] | list | tuple | float | int,
) -> Inexact[Array, " state"]:
    r"""Steady state of `lfilter` for a unit step, as `scipy.signal.lfilter_zi`.

    **Convention: scipy's.** `a` includes `a[0]` (both are normalised by it)
    and the state is scipy's transposed-direct-form-II layout. Scale it by
    the first sample to start [`lfilter`][retrax.ops.lfilter] without a
    transient, as [`filtfilt`][retrax.ops.filtfilt] does. Undefined (division
    by zero) for a pole at $z = 1$. Unlike scipy, leading zeros of `a` are not
    stripped: `a[0] == 0` is a `ValueError` (under `jax.jit`, a run-time
    error).

    **Arguments:**

    - `b`: the numerator coefficients, shape `(M+1,)`.
    - `a`: the denominator coefficients including `a[0]`, shape `(N+1,)`.

    **Returns:**

    The state, shape `(max(M, N),)`.
    """
    dtype = scipy_dtype(b, a)
    b, a = host_arrays(compute_dtype(dtype), b=b, a=a)
    return _lfilter_zi(b, a, dtype=dtype)


@compiled(static=("dtype",))
def _lfilter_zi(b, a, *, dtype: np.dtype):
    """`lfilter_zi` after `host_arrays`, compiled as a whole."""
    work = compute_dtype(dtype)
    b, a = normalise(coefficients("b", b, work), coefficients("a", a, work))
    return in_dtype(dtype, steady_state(b, a))


def lfiltic(
    b: Shaped[ArrayLike, " taps"] | list | tuple | float | int,
    a: Shaped[ArrayLike, " order"] | list | tuple | float | int,
    y: Shaped[ArrayLike, " past_y"] | list | tuple,
    x: Shaped[ArrayLike, " past_x"] | list | tuple | None = None,
) -> Inexact[Array, " state"]:
    r"""Initial state of `lfilter` from past outputs and inputs, as scipy's `lfiltic`.

    **Convention: scipy's.** `a` includes `a[0]` (both are normalised by it);
    `y[k] = y[-k-1]` and `x[k] = x[-k-1]` are the outputs and inputs before
    the first sample, newest first, zero padded when shorter than needed and
    truncated when longer; the result is scipy's transposed-direct-form-II
    state for [`lfilter`][retrax.ops.lfilter].

    **Arguments:**

    - `b`: the numerator coefficients, shape `(M+1,)`.
    - `a`: the denominator coefficients including `a[0]`, shape `(N+1,)`.
    - `y`: past outputs, newest first, a vector.
    - `x`: past inputs, newest first, a vector. Defaults to zeros.

    **Returns:**

    The state, shape `(max(M, N),)`.

    `a[0] == 0` is a `ValueError`, as in scipy (under `jax.jit`, a run-time
    error).
    """
    dtype = scipy_dtype(b, a, y, x)
    b, a, y, x = host_arrays(compute_dtype(dtype), b=b, a=a, y=y, x=x)
    return _lfiltic(b, a, y, x, dtype=dtype)


@compiled(static=("dtype",))
def _lfiltic(b, a, y, x, *, dtype: np.dtype):
    """`lfiltic` after `host_arrays`, compiled as a whole."""
    work = compute_dtype(dtype)
    b, a = normalise(coefficients("b", b, work), coefficients("a", a, work))
    n_state = max(a.shape[0], b.shape[0] - 1)

    def fit(name, v):
        v = jnp.atleast_1d(as_array(name, v, work))
        if v.ndim != 1:
            raise ValueError(f"`{name}` must be a vector, newest first, got {v.shape}.")
        v = v[:n_state]
        return jnp.concatenate([v, jnp.zeros(n_state - v.shape[0], work)])

    past_y = fit("y", y)
    past_x = jnp.zeros(n_state, work) if x is None else fit("x", x)
    hb, ha = _hankels(b, a, n_state)
    return in_dtype(dtype, hb @ past_x - ha @ past_y)
