"""Arguments of the ops named after scipy.signal: dtypes, axes and `a[0]`.

scipy's functions take Python lists and integers, filter along any `axis` of
an N-D signal, and normalise `b` and `a` by `a[0]`. These helpers do that the
same way for every scipy-named op, so that each op's own code only handles
one signal of shape `(T,)`.
"""

import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import ArrayLike

from .._deprecated import warn_at_caller
from .._errors import error_if
from .._float_dtypes import INEXACT
from .._misc import result_dtype
from .._validate import check_dtype, check_finite, unsupported_dtype


def _python_kind(value) -> type | None:
    """`bool`/`int`/`float`/`complex` if `value` is Python numbers (nested lists).

    Python numbers and lists of them are weakly typed, as a Python scalar is
    in JAX: they do not widen a `float32` signal. `None` for anything else.
    """
    if isinstance(value, bool | int | float | complex):
        return type(value)
    if isinstance(value, list | tuple) and len(value) > 0:
        kinds = [_python_kind(v) for v in value]
        if any(k is None for k in kinds):
            return None
        for kind in (complex, float, int, bool):
            if kind in kinds:
                return kind
    return None


_WIDE = (np.dtype(np.float64), np.dtype(np.complex128))
_NARROWED = [False]  # whether the warning below has been given in this process


def _warn_if_narrowed(args) -> None:
    """Warn, once a process, that NumPy float64 (or complex128) input computes
    in float32 (complex64) because JAX's x64 mode is off: scipy would compute
    in float64, and the results differ in the 5th to 7th digit."""
    if _NARROWED[0] or jax.config.jax_enable_x64:
        return
    if any(type(arg) is np.ndarray and arg.dtype in _WIDE for arg in args):
        _NARROWED[0] = True
        warn_at_caller(
            "retrax.ops: float64 input computes in float32 because JAX's x64 "
            "mode is off (JAX's default; scipy computes in float64). Enable it "
            'with `jax.config.update("jax_enable_x64", True)` at the start of '
            "the program for scipy's precision, or pass float32 arrays to "
            "silence this warning. It is given once a process.",
            UserWarning,
        )


def scipy_dtype(*args: ArrayLike | list | tuple | None) -> np.dtype:
    """The dtype scipy-style arguments compute in.

    Arrays count with their dtype, Python numbers and lists of them weakly
    (`jnp.result_type` rules), and an integer or boolean result becomes the
    default float, as scipy computes integer input in floating point. NumPy
    float64 input without x64 warns once a process (`_warn_if_narrowed`).
    """
    _warn_if_narrowed(args)
    fast = _inexact_arrays_dtype(args)
    if fast is not None:
        return fast
    kinds = []
    for arg in args:
        if arg is None:
            continue
        kind = _python_kind(arg)
        if kind is bool or kind is int:
            continue  # weak integers never decide a floating dtype
        source = kind(0) if kind is not None else _dtype_source(arg)
        if isinstance(source, np.dtype) and unsupported_dtype(source) is not None:
            continue  # `as_array` raises, naming the argument
        kinds.append(source)
    dtype = result_dtype(*kinds) if kinds else None
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        dtype = result_dtype(*(kinds or [1.0]), 1.0)
    return np.dtype(dtype)


def _inexact_arrays_dtype(args) -> np.dtype | None:
    """`scipy_dtype(*args)` when every argument is `None` or a NumPy or JAX
    array (not weakly typed) of float32, float64, complex64 or complex128, the
    usual call, on which NumPy's promotion and JAX's agree; `None` otherwise."""
    dtypes = []
    for arg in args:
        if arg is None:
            continue
        if type(arg) is not np.ndarray and not (
            isinstance(arg, jax.Array) and not arg.weak_type
        ):
            return None
        if arg.dtype not in INEXACT:
            return None
        dtypes.append(arg.dtype)
    if not dtypes:
        return None
    return np.dtype(jax.dtypes.canonicalize_dtype(np.result_type(*dtypes)))


def _host(value) -> np.ndarray | None:
    """A non-JAX `value` (NumPy, Python numbers, lists) as a NumPy array, or
    `None` for JAX arrays and lists that NumPy cannot hold (e.g. of tracers)."""
    if isinstance(value, jax.Array):
        return None
    try:
        return np.asarray(value)
    except Exception:  # e.g. a list of tracers: JAX converts it
        return None


def _dtype_source(value):
    """What `value` contributes to the result dtype, without converting its data."""
    host = _host(value)
    if host is None:
        return jnp.asarray(value)
    if unsupported_dtype(host.dtype) is not None:
        return host.dtype
    # an empty array of the dtype JAX would compute in: no data converted, and
    # no warning for 64-bit dtypes without x64
    return np.empty(0, jax.dtypes.canonicalize_dtype(host.dtype))


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the ops compute in for results of `dtype`: `dtype` itself, or
    float32 for narrower floats (float16, bfloat16), whose rounding errors a
    recursion would accumulate sample after sample (and whose complex type
    JAX lacks). The results are rounded back to `dtype` (`in_dtype`)."""
    if dtype in INEXACT:  # the usual call, at the cost of one set lookup
        return dtype
    if jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return np.dtype(np.float32)
    return dtype


def in_dtype(dtype: np.dtype, out):
    """The arrays of `out` (a pytree) rounded to `dtype` where they differ."""
    return jax.tree.map(lambda v: v if v.dtype == dtype else v.astype(dtype), out)


def as_array(name: str, value: ArrayLike | list | tuple, dtype: np.dtype) -> jax.Array:
    """`value` as an array of `dtype`; a clear error for non-numeric input.

    NumPy and Python input is converted by NumPy, as scipy converts it:
    JAX without x64 would first narrow 64-bit integers to 32 bits, which
    wraps large values (`uint64` `2**63 + 1` would become 1) instead of
    rounding them to the nearest float.
    """
    host = _host(value)
    arr = jnp.asarray(value) if host is None else host
    _check_kind(name, arr, dtype)
    if host is not None:
        return jnp.asarray(host.astype(dtype))
    return arr.astype(dtype)


def _check_kind(name: str, arr, dtype: np.dtype) -> None:
    if arr.dtype in INEXACT:  # the usual call: no other dtype check applies
        complex_ = arr.dtype.kind == "c"
    else:
        check_dtype(name, arr)
        complex_ = jnp.issubdtype(arr.dtype, jnp.complexfloating)
    if complex_ and not jnp.issubdtype(dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` is complex but the result dtype is {dtype}.")


def host_arrays(dtype: np.dtype, **values):
    """The arguments `values` (by name) ready for a compiled op that computes
    in `dtype`: host values (NumPy arrays, Python numbers and lists) become
    NumPy arrays of `dtype`, checked and converted as `as_array` does it, so
    that the op receives one array of the dtype it computes in (a list of
    Python integers would otherwise reach `jax.jit` as `int64`); JAX arrays,
    tracers and `None` pass unchanged. Returns them in order."""
    out = []
    for name, value in values.items():
        host = None if value is None else _host(value)
        if host is not None:
            _check_kind(name, host, dtype)
            value = host.astype(dtype, copy=False)
        out.append(value)
    return tuple(out)


def coefficients(
    name: str, value: ArrayLike | list | tuple, dtype: np.dtype
) -> jax.Array:
    """A non-empty 1-D coefficient vector (a scalar counts as one coefficient)."""
    arr = jnp.atleast_1d(as_array(name, value, dtype))
    if arr.ndim != 1 or arr.shape[0] == 0:
        raise ValueError(
            f"`{name}` must be a non-empty 1-D array of coefficients, got shape "
            f"{arr.shape}."
        )
    return arr


def normalise(b: jax.Array, a: jax.Array) -> tuple[jax.Array, jax.Array]:
    """`b / a[0]` and `a[1:] / a[0]`; `ValueError` if `a[0] == 0` or an entry is
    not finite (a run-time error under `jit`).

    The second result is the denominator without its leading 1, the layout
    of retrax's recurrence core.
    """
    a = check_finite("a", a)
    b = check_finite("b", b)
    a0 = error_if(
        a[0],
        a[0] == 0,
        "`a[0]` must be non-zero: `b` and `a` are normalised by it.",
    )
    return b / a0, a[1:] / a0


def normalise_axis(axis: int, ndim: int) -> int:
    """A non-negative axis of an `ndim`-dimensional signal `x`."""
    if ndim == 0:
        raise ValueError("`x` must have at least one dimension (time).")
    if not isinstance(axis, int | np.integer) or not -ndim <= axis < ndim:
        raise ValueError(
            f"`axis` must be an integer in [{-ndim}, {ndim}) for `x` with {ndim} "
            f"dimensions, got {axis!r}."
        )
    return int(axis) % ndim


def along_axis(
    fn: Callable, x: jax.Array, axis: int, *states: jax.Array | None
) -> tuple:
    """Apply `fn(signal, *states)` to every 1-D signal of `x` along `axis`.

    A state has scipy's layout: `extra + x.shape` with the length of `axis`
    replaced by the state's own length (`extra` is `()` for `lfilter`,
    `(n_sections,)` for `sosfilt`); `fn` sees `extra + (length,)`. `fn`
    returns `(y, *finals)` in the same per-signal layouts, and they come
    back in the full layouts. One signal goes straight to `fn`; several are
    flattened and mapped with `jax.vmap`, as a caller's own `vmap` would. A
    time-first array (`axis=0`) is mapped where its signals lie, along its
    last axes (`_time_first`), so that a kernel that reads a time-major batch
    takes it in place.
    """
    if x.ndim == 1:
        return fn(x, *states)
    if axis == 0:
        return _time_first(fn, x, *states)
    batch = jnp.moveaxis(x, axis, -1).shape[:-1]
    size = int(np.prod(batch))

    def split(s):
        extra = s.ndim - x.ndim
        s = jnp.moveaxis(s, extra + axis, -1)
        s = jnp.moveaxis(s, tuple(range(extra)), tuple(range(-extra - 1, -1)))
        return s.reshape((size,) + s.shape[-extra - 1 :])

    def join(out):
        extra = out.ndim - 2
        out = out.reshape(batch + out.shape[1:])
        nb = len(batch)
        out = jnp.moveaxis(out, tuple(range(nb, nb + extra)), tuple(range(extra)))
        return jnp.moveaxis(out, -1, extra + axis)

    flat_states = [None if s is None else split(s) for s in states]
    in_axes = tuple(None if s is None else 0 for s in flat_states)
    outs = jax.vmap(fn, in_axes=(0,) + in_axes)(split(x), *flat_states)
    return tuple(None if out is None else join(out) for out in outs)


def _time_first(fn: Callable, x: jax.Array, *states: jax.Array | None) -> tuple:
    """`along_axis` along `axis=0` of an array of several dimensions: its
    channels flattened (a free reshape) and mapped with `jax.vmap` along the
    last axis of every operand and result (a state `extra + (n,) +
    x.shape[1:]` is one `extra + (n,)` per channel). The recursions' batching
    rule sees a batch along a signal's last axis, time-major in memory, and
    the kernels that read that layout (`_sections_structure`,
    `_allpole_structure`) take the
    signal where it lies: no transposed copy in or out (stereo `(T, 2)`
    along `axis=0`, jitted `sosfilt`: about the time of `(2, T)` along
    `axis=-1`, where moving the channels first and back took 1.5 times it)."""

    def full(out):
        return out.reshape(out.shape[:-1] + x.shape[1:])

    flat, flat_states = _channels_flattened(x, states)
    in_axes = (-1,) + tuple(None if s is None else -1 for s in flat_states)
    outs = jax.vmap(fn, in_axes=in_axes, out_axes=-1)(flat, *flat_states)
    return tuple(None if out is None else full(out) for out in outs)


def _channels_flattened(x: jax.Array, states) -> tuple:
    """A time-first `x` as `(T, channels)` and each state (`extra + (n,) +
    x.shape[1:]`, or `None`) as `extra + (n, channels)`: free reshapes."""
    size = int(np.prod(x.shape[1:]))
    flat_states = tuple(
        None if s is None else s.reshape(s.shape[: s.ndim - x.ndim + 1] + (size,))
        for s in states
    )
    return x.reshape(x.shape[0], size), flat_states


# Samples of one chunk of a time-first signal (`along_time`), and the length
# from which such a signal is filtered chunk by chunk.
TIME_CHUNK = 16_384
CHUNKED_FROM = 4 * TIME_CHUNK


def time_chunked(x: jax.Array | np.ndarray, axis: int) -> bool:
    """Whether `along_time` filters `x` along `axis` chunk by chunk: a
    time-first signal (time on axis 0 of several dimensions, as soundfile
    returns a multichannel file) of at least `CHUNKED_FROM` samples."""
    return axis == 0 and x.ndim > 1 and x.shape[0] >= CHUNKED_FROM


def along_time(fn: Callable, x: jax.Array, axis: int, *states: jax.Array) -> tuple:
    """`along_axis(fn, x, axis, *states)` for a `fn` that threads its states:
    it returns the final states in the layouts it takes them (every state
    given), so that a signal can be filtered in consecutive chunks, for
    recursions whose kernel cannot read a time-first signal where it lies
    (`sosfilt` with `zi`, whose kernel appends the final state, and every
    `sosfilt` off the compiled kernel).

    A long time-first signal (`time_chunked`) is, chunk by chunk of
    `TIME_CHUNK` samples: each chunk of every channel is moved time-last
    into a buffer that stays in the cache, filtered from the states the
    previous chunk left, and its result written over the chunk (in place
    when `x` is donated, as the eager `sosfilt` donates its own copy of a
    NumPy signal). `along_axis` would instead move the whole signal
    time-last and the whole result back: two transposed copies of the
    signal, which XLA writes to fresh memory. For 10 minutes of stereo at
    48 kHz in float64, `sosfilt` along `axis=0` took 1,038 ms with them and
    takes 850 ms in chunks (along `axis=-1` of the same samples stored
    channels-first: 392 ms; a loaded 2-core x86 CPU). What remains is the
    result's own fresh memory, whose pages the kernel, writing
    channels-first, asks the system for in huge pages and XLA does not;
    with `x` donated there is none (eager, 817 -> 487 ms; channels-first
    512-587 ms). The values are the same (the recursions run over the same
    samples in the same order); only the layout of the work changes, and
    derivatives follow the loop over chunks.
    """
    if not time_chunked(x, axis):
        return along_axis(fn, x, axis, *states)
    length = x.shape[0]
    flat, flat_states = _channels_flattened(x, states)
    run = functools.partial(_time_first, fn)

    def body(i, carry):
        # each chunk is read from the signal, and its result written over it
        out, carried = carry
        at = i * TIME_CHUNK
        y, *carried = run(lax.dynamic_slice_in_dim(out, at, TIME_CHUNK), *carried)
        return lax.dynamic_update_slice_in_dim(out, y, at, 0), tuple(carried)

    full, rest = divmod(length, TIME_CHUNK)
    out, carried = lax.fori_loop(0, full, body, (flat, flat_states))
    if rest:  # the last samples: a chunk of their own length
        y, *carried = run(out[full * TIME_CHUNK :], *carried)
        out = lax.dynamic_update_slice_in_dim(out, y, full * TIME_CHUNK, 0)
    finals = (f.reshape(s.shape) for f, s in zip(carried, states, strict=True))
    return (out.reshape(x.shape), *finals)
