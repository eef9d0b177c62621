"""Zero-phase forward-backward filtering: scipy's `filtfilt` and `sosfiltfilt`."""

from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._compiled import compiled
from .._errors import error_if
from ._lfilter import steady_state, tdf2_apply
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
from ._sosfilt import checked_sos, sos_array, sos_cascade, sos_steady_state


PadType = Literal["odd", "even", "constant"] | None


def _check_padtype(padtype) -> None:
    if padtype not in ("odd", "even", "constant", None):
        raise ValueError(
            f"`padtype` must be 'odd', 'even', 'constant' or None, got {padtype!r}."
        )


def _static_edge(padtype: PadType, padlen: int | None, ntaps: int) -> int:
    """scipy's extension length: `padlen`, by default `3 * ntaps`, 0 if no padding."""
    if padtype is None:
        return 0
    if padlen is None:
        return 3 * ntaps
    if isinstance(padlen, bool) or not isinstance(padlen, int) or padlen < 0:
        raise ValueError(f"`padlen` must be a non-negative integer, got {padlen!r}.")
    return padlen


def _check_length(length: int, edge: int) -> None:
    if length <= edge:
        raise ValueError(
            f"`x` must be longer than `padlen` = {edge} samples along `axis`, got "
            f"{length}; pass a smaller `padlen` (or `padtype=None`)."
        )


def _extend(x: Array, padtype: PadType, total: int, edge) -> Array:
    """`x` with `total` samples at each end; the `edge` nearest are scipy's extension.

    `edge <= total` may be traced. The `total - edge` outermost samples repeat
    the outermost sample of the extension: a filter started from its steady
    state for that value stays there, so they change nothing.
    """
    if total == 0:
        return x
    length = x.shape[0]
    dist = jnp.minimum(jnp.arange(1, total + 1), edge)
    if padtype == "constant":
        left = jnp.broadcast_to(x[0], (total,))
        right = jnp.broadcast_to(x[-1], (total,))
    else:
        left = x[dist][::-1]
        right = x[length - 1 - dist]
        if padtype == "odd":
            left = 2 * x[0] - left
            right = 2 * x[-1] - right
    return jnp.concatenate([left, x, right])


def _forward_backward(
    run: Callable, zi: Array, x: Array, padtype: PadType, total: int, edge
) -> Array:
    """scipy's pad method on one signal; `run(signal, state)` filters forwards."""
    length = x.shape[0]
    ext = _extend(x, padtype, total, edge)
    y = run(ext, zi * ext[0])
    if isinstance(edge, int) and edge == total:
        last = y[-1]
    else:
        stop = total + length + edge - 1
        last = y[stop]
        y = jnp.where(jnp.arange(y.shape[0]) > stop, last, y)
    y = run(y[::-1], zi * last)[::-1]
    return y[total : total + length]


def _lstsq(matrix: Array, rhs: Array) -> Array:
    # Imported here: lineax takes about 40 ms to import (most of what
    # `import retrax.ops` adds to jax), for Gustafsson's method alone.
    import lineax as lx

    operator = lx.MatrixLinearOperator(matrix)
    return lx.linear_solve(operator, rhs, lx.QR()).value


def _gust(b: Array, a: Array, x: Array, irlen: int | None) -> Array:
    """Gustafsson's forward-backward filter of one signal, as scipy's `_filtfilt_gust`.

    `b`, `a` normalised (`a` without its leading 1). The initial states of
    the forward and backward passes are chosen so that filtering forwards
    then backwards equals filtering backwards then forwards, in the least
    squares sense (F. Gustafsson, "Determining the initial states in
    forward-backward filtering", IEEE Trans. Signal Processing, 1996).
    """
    order = max(a.shape[0], b.shape[0] - 1)
    if order == 0:
        return b[0] ** 2 * x
    n = x.shape[0]
    m = n if irlen is None or n <= 2 * irlen else irlen

    def run(signal, state=None):
        return tdf2_apply(b, a, signal, state)[0]

    first = run(jnp.zeros(m, x.dtype), jnp.zeros(order, x.dtype).at[0].set(1))
    obs = jnp.stack(
        [
            jnp.concatenate([jnp.zeros(k, x.dtype), first[: m - k]])
            for k in range(order)
        ],
        axis=1,
    )
    s = jax.vmap(run, in_axes=1, out_axes=1)(obs[::-1])
    if m == n:
        matrix = jnp.concatenate([s[::-1] - obs, obs[::-1] - s], axis=1)
        weights = jnp.concatenate([s[::-1], obs[::-1]], axis=1)
    else:
        zeros = jnp.zeros((m, order), x.dtype)
        matrix = jnp.block([[s[::-1] - obs, zeros], [zeros, obs[::-1] - s]])
        weights = jnp.block([[s[::-1], zeros], [zeros, obs[::-1]]])
    y_fb = run(run(x)[::-1])[::-1]
    y_bf = run(run(x[::-1])[::-1])
    delta = y_bf - y_fb
    if m != n:
        delta = jnp.concatenate([delta[:m], delta[-m:]])
    correction = weights @ _lstsq(matrix, delta)
    if m == n:
        return y_fb + correction
    return y_fb.at[:m].add(correction[:m]).at[-m:].add(correction[m:])


def filtfilt(
    b: Shaped[ArrayLike, " taps"] | list | tuple | float | int,
    a: Shaped[ArrayLike, " order"] | list | tuple | float | int,
    x: Shaped[ArrayLike, " *signal"] | list | tuple,
    axis: int = -1,
    padtype: PadType = "odd",
    padlen: int | None = None,
    method: Literal["pad", "gust"] = "pad",
    irlen: int | None = None,
) -> Inexact[Array, " *signal"]:
    r"""Zero-phase filtering forwards then backwards, as `scipy.signal.filtfilt`.

    **Convention: scipy's.** `a` includes `a[0]` (both are normalised by it;
    `a[0] == 0` is an error, see below). The effective response is
    $|H|^2$ with no phase shift. It cannot stream (it needs the whole signal).

    `method="pad"` (default): the signal is extended by `padlen` samples at
    both ends (odd: `2 x[0] - x[padlen:0:-1]`, even: a mirror, constant: the
    edge value, `None`: no extension), filtered forwards from the steady
    state of its first sample ([`lfilter_zi`][retrax.ops.lfilter_zi] scaled by
    it), reversed, filtered again from the steady state of its first sample,
    reversed and trimmed. `method="gust"`: Gustafsson's method, which picks
    the initial states of both passes so that forward-backward equals
    backward-forward (least squares); `padtype` and `padlen` are then ignored
    and `irlen` (if given) truncates the impulse response used to
    `irlen` samples, as in scipy.

    **Arguments:**

    - `b`: the numerator coefficients, shape `(M+1,)`.
    - `a`: the denominator coefficients including `a[0]`, shape `(N+1,)`.
    - `x`: the signal, any number of dimensions.
    - `axis`: the axis of `x` to filter along (default: the last).
    - `padtype`: `"odd"` (default), `"even"`, `"constant"` or `None`.
    - `padlen`: samples of extension at each end; defaults to
      `3 * max(len(a), len(b))` as in scipy.
    - `method`: `"pad"` or `"gust"`.
    - `irlen`: with `method="gust"`, the length of the impulse response used.

    **Returns:**

    `y`, the shape of `x`, in the dtype of [`lfilter`][retrax.ops.lfilter]
    (float16 and bfloat16 compute in float32).

    Raises `ValueError`, as scipy does, if `x` is not longer than `padlen`
    along `axis`, or if `a[0] == 0` or `b` or `a` has a non-finite entry;
    under `jax.jit`, the checks on the values of `b` and `a` are run-time
    errors.
    """
    if method not in ("pad", "gust"):
        raise ValueError(f"`method` must be 'pad' or 'gust', got {method!r}.")
    if method == "gust":
        if irlen is not None and (
            isinstance(irlen, bool) or not isinstance(irlen, int) or irlen < 1
        ):
            raise ValueError(f"`irlen` must be a positive integer, got {irlen!r}.")
        padtype = padlen = None  # ignored, as in scipy
    else:
        _check_padtype(padtype)
        _static_edge(padtype, padlen, 0)  # a bad `padlen` raises here
        irlen = None
    dtype = scipy_dtype(b, a, x)
    b, a, x = host_arrays(compute_dtype(dtype), b=b, a=a, x=x)
    return _filtfilt(
        b,
        a,
        x,
        axis=axis,
        padtype=padtype,
        padlen=padlen,
        method=method,
        irlen=irlen,
        dtype=dtype,
    )


@compiled(static=("axis", "padtype", "padlen", "method", "irlen", "dtype"))
def _filtfilt(b, a, x, *, axis, padtype, padlen, method, irlen, dtype):
    """`filtfilt` after its arguments' checks and `host_arrays`, compiled as a
    whole."""
    work = compute_dtype(dtype)
    b = coefficients("b", b, work)
    a = coefficients("a", a, work)
    x = as_array("x", x, work)
    axis = normalise_axis(axis, x.ndim)
    if method == "gust":
        b, a = normalise(b, a)
        y = along_axis(lambda s: (_gust(b, a, s, irlen),), x, axis)[0]
        return in_dtype(dtype, y)
    edge = _static_edge(padtype, padlen, max(a.shape[0], b.shape[0]))
    _check_length(x.shape[axis], edge)
    b, a = normalise(b, a)
    zi = steady_state(b, a)

    def run(signal, state):
        return tdf2_apply(b, a, signal, state)[0]

    def one(signal):
        return (_forward_backward(run, zi, signal, padtype, edge, edge),)

    return in_dtype(dtype, along_axis(one, x, axis)[0])


def _first_order(xp, sos):
    """scipy's count of first-order sections for the default `padlen`: the
    fewer of the zero `b2` and the zero `a2`; `xp` is numpy or jnp."""
    if xp is np:  # counted on the host: a fifth of `np.sum`'s cost
        return min(np.count_nonzero(sos[:, 2] == 0), np.count_nonzero(sos[:, 5] == 0))
    return xp.minimum(xp.sum(sos[:, 2] == 0), xp.sum(sos[:, 5] == 0))


def sosfiltfilt(
    sos: Shaped[ArrayLike, "sections 6"] | list | tuple,
    x: Shaped[ArrayLike, " *signal"] | list | tuple,
    axis: int = -1,
    padtype: PadType = "odd",
    padlen: int | None = None,
) -> Inexact[Array, " *signal"]:
    r"""Zero-phase filtering with second-order sections, as `scipy.signal.sosfiltfilt`.

    **Convention: scipy's.** The rows are `[b0, b1, b2, a0, a1, a2]` with
    `a0 == 1` (an error otherwise, see below; differentiated as in
    [`sosfilt`][retrax.ops.sosfilt]). The method of
    [`filtfilt`][retrax.ops.filtfilt] (`method="pad"`) on the cascade, started
    from [`sosfilt_zi`][retrax.ops.sosfilt_zi] scaled by the edge samples.

    As in scipy, the default `padlen` is `3 * ntaps` with
    `ntaps = 2 * n_sections + 1`, less the number of sections whose `b2` and
    `a2` are both zero (first-order sections, e.g. in odd-order designs).
    That count depends on the values of `sos`, so under `jax.jit` the
    extension is built to the largest possible length and the filters are
    held in their steady state over the unused part, which gives scipy's
    result; a signal too short for the default `padlen` then raises at run
    time (at once if it is too short for any values of `sos`).

    **Arguments:**

    - `sos`: the sections, shape `(n_sections, 6)`.
    - `x`: the signal, any number of dimensions.
    - `axis`: the axis of `x` to filter along (default: the last).
    - `padtype`: `"odd"` (default), `"even"`, `"constant"` or `None`.
    - `padlen`: samples of extension at each end (default: see above).

    **Returns:**

    `y`, the shape of `x`, in the dtype of [`sosfilt`][retrax.ops.sosfilt]
    (float16 and bfloat16 compute in float32).

    Raises `ValueError`, as scipy does, if `x` is not longer than `padlen`
    along `axis`, or if `sos` has a non-finite entry or a row whose `a0` is
    not 1; under `jax.jit`, the checks on the values of `sos` are run-time
    errors.
    """
    _check_padtype(padtype)
    _static_edge(padtype, padlen, 0)  # a bad `padlen` raises here
    dtype = scipy_dtype(sos, x)
    sos, x = host_arrays(compute_dtype(dtype), sos=sos, x=x)
    if padtype is not None and padlen is None and not isinstance(sos, jax.core.Tracer):
        # scipy's default, known now: the sections' values are concrete
        rows = np.atleast_2d(np.asarray(sos))
        if rows.ndim == 2 and rows.shape[1] == 6:
            padlen = 3 * (2 * rows.shape[0] + 1 - int(_first_order(np, rows)))
    return _sosfiltfilt(sos, x, axis=axis, padtype=padtype, padlen=padlen, dtype=dtype)


@compiled(static=("axis", "padtype", "padlen", "dtype"))
def _sosfiltfilt(sos, x, *, axis, padtype, padlen, dtype):
    """`sosfiltfilt` after its arguments' checks and `host_arrays`, compiled as
    a whole."""
    work = compute_dtype(dtype)
    sos = sos_array(sos, work)
    x = as_array("x", x, work)
    axis = normalise_axis(axis, x.ndim)
    length = x.shape[axis]
    n_sections = sos.shape[0]
    sos = checked_sos(sos)
    if padtype is None or padlen is not None:
        total = edge = _static_edge(padtype, padlen, 2 * n_sections + 1)
        _check_length(length, edge)
    elif not isinstance(sos, jax.core.Tracer):
        # scipy's default, known now: the sections' values are concrete
        total = edge = 3 * (2 * n_sections + 1 - int(_first_order(np, np.asarray(sos))))
        _check_length(length, edge)
    else:
        total = 3 * (2 * n_sections + 1)
        if length <= 3 * (n_sections + 1):  # too short whatever the values
            raise ValueError(
                f"`x` must be longer than the default `padlen` along `axis`, "
                f"{total} less 3 per first-order section of `sos`, at least "
                f"{3 * (n_sections + 1)}; got {length} samples. Pass a smaller "
                "`padlen` (or `padtype=None`)."
            )
        edge = total - 3 * _first_order(jnp, sos)
        if length <= total:
            sos = error_if(
                sos,
                length <= edge,
                "`x` must be longer than the default `padlen` (3 * (2 * "
                "n_sections + 1), less 3 per first-order section) along `axis`; "
                "pass a smaller `padlen` (or `padtype=None`).",
            )
    # `checked_sos` normalised the rows by their a0 (the derivative of a0 is
    # that normalisation's): the steady state's own division by a0 is by 1
    zi = sos_steady_state(sos)

    def run(signal, state):
        return sos_cascade(sos, signal, state, False)[0]

    def one(signal):
        return (_forward_backward(run, zi, signal, padtype, total, edge),)

    return in_dtype(dtype, along_axis(one, x, axis)[0])
