"""Cascaded second-order sections, as `scipy.signal.sosfilt` and `sosfilt_zi`."""

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._compiled import compiled
from .._errors import error_if
from .._validate import check_finite
from ._lfilter import steady_state
from ._linear_primitive import sections_recurrence
from ._scipy_args import (
    along_axis,
    along_time,
    as_array,
    compute_dtype,
    host_arrays,
    in_dtype,
    normalise,
    normalise_axis,
    scipy_dtype,
    time_chunked,
)
from ._sections_structure import kernel_applies


def sos_array(sos: ArrayLike | list | tuple, dtype) -> Array:
    """`sos` as an `(n_sections, 6)` array, or a `ValueError` naming it."""
    sos = jnp.atleast_2d(as_array("sos", sos, dtype))
    if sos.ndim != 2 or sos.shape[1] != 6 or sos.shape[0] == 0:
        raise ValueError(
            "`sos` must have shape (n_sections, 6), rows [b0, b1, b2, 1, a1, a2] "
            f"as scipy.signal uses, got shape {sos.shape}."
        )
    return sos


def checked_sos(sos: Array) -> Array:
    """`sos`, checked: finite, and every `a0` is 1; `ValueError` at once on
    concrete `sos`, a run-time error under `jit`.

    Returns each row divided by its `a0`: the same values (`a0` is 1), and
    the derivative of scipy's definition of a section, the biquad
    $(b_0 + b_1 z^{-1} + b_2 z^{-2}) / (a_0 + a_1 z^{-1} + a_2 z^{-2})$,
    whose coefficients are normalised by `a0` (as `lfilter` normalises by
    `a[0]`): the `a0` column's gradient is minus the row's other gradients
    weighted by the row, where the cascade, which never reads `a0`, would
    give it none."""
    sos = check_finite("sos", sos)
    sos = error_if(
        sos,
        jnp.any(sos[:, 3] != 1),
        "`sos` rows must have a0 = sos[:, 3] = 1, as scipy.signal requires "
        "(normalise each section by its a0).",
    )
    return sos / sos[:, 3:4]


def sos_cascade(
    sos: Array, x: Array, zi: Array | None, final_state: bool = True
) -> tuple[Array, Array | None]:
    """Run the checked sections over one signal `(T,)`; `zi` `(n_sections, 2)`.

    Returns `(y, zf)`, `zf` `None` unless `final_state`. The cascade is the
    recurrence primitive's `"sections"` structure: on the CPU one compiled
    pass over the signal, elsewhere (and for its derivatives) one FIR and
    one all-pole pass per section.
    """
    n_sections = sos.shape[0]
    coefficients = jnp.concatenate([sos[:, :3], sos[:, 4:]], axis=1)
    state = jnp.zeros(2 * n_sections, x.dtype) if zi is None else zi.reshape(-1)
    if not final_state:
        return sections_recurrence(coefficients, x, state), None
    # the final state comes back after the samples (`"sections_state"`)
    out = sections_recurrence(coefficients, x, state, final_state=True)
    length = x.shape[0]
    return out[:length], out[length:].reshape(n_sections, 2)


def sosfilt(
    sos: Shaped[ArrayLike, "sections 6"] | list | tuple,
    x: Shaped[ArrayLike, " *signal"] | list | tuple,
    axis: int = -1,
    zi: Shaped[ArrayLike, " sections *state"] | list | tuple | None = None,
) -> (
    Inexact[Array, " *signal"]
    | tuple[Inexact[Array, " *signal"], Inexact[Array, " sections *state"]]
):
    r"""Filter with cascaded second-order sections, exactly as `scipy.signal.sosfilt`.

    Each row `[b0, b1, b2, a0, a1, a2]` is the biquad
    $(b_0 + b_1 z^{-1} + b_2 z^{-2}) / (a_0 + a_1 z^{-1} + a_2 z^{-2})$, and
    the sections are applied in order. This is the numerically safe way to run
    high-order IIR filters (e.g. `scipy.signal.butter(..., output="sos")`).

    **Convention: scipy's.** The rows include `a0`, which must be 1 (a
    `ValueError` otherwise, as in scipy; under `jax.jit` a run-time error),
    and whose derivative is that of the section normalised by it, as the
    biquad above defines it (and `sosfreqz` and `lfilter` differentiate);
    `zi` and `zf` are scipy's layout, each section's transposed-direct-form-II
    state. The cascade runs on retrax's recurrence core: on the CPU one
    compiled pass over the signal takes every sample through every section,
    as scipy's loop does, and gradients run each section's adjoint filter
    backwards in time.

    **Arguments:**

    - `sos`: the sections, shape `(n_sections, 6)`.
    - `x`: the signal, any number of dimensions.
    - `axis`: the axis of `x` to filter along (default: the last). A
      time-first signal (`axis=0`, as soundfile returns a multichannel
      file) is filtered where it lies by the compiled kernel (on the CPU,
      float32 and float64), and otherwise, from 65,536 samples, chunk by
      chunk along time rather than transposed whole, as is a stream with
      `zi`: the same result either way.
    - `zi`: the initial state, shape `(n_sections, *x.shape)` with 2 in place
      of the length of `axis` (e.g. from
      [`sosfilt_zi`][retrax.ops.sosfilt_zi]). When given, the final state is
      returned too.

    **Returns:**

    `y`, the shape of `x`; or `(y, zf)` when `zi` is given, `zf` in `zi`'s
    layout. The dtype is the promoted dtype of the array arguments (Python
    lists are weakly typed, so a float32 signal stays float32); float16 and
    bfloat16 compute in float32, the results rounded to their dtype, and
    dtypes JAX does not compute in are a `TypeError`, as in
    [`lfilter`][retrax.ops.lfilter].
    """
    dtype = scipy_dtype(sos, x, zi)
    sos, x, zi = host_arrays(compute_dtype(dtype), sos=sos, x=x, zi=zi)
    if _copied_in_chunks(x, axis, dtype):
        # JAX copies a NumPy signal for the call anyway: a copy of our own
        # is donated, so that the chunks' results are written over it
        # rather than into fresh memory, whose first writes (page by page)
        # cost as much as the filter
        x = jax.device_put(x, may_alias=False)
        return _sosfilt_over_x(sos, x, zi, axis=axis, dtype=dtype)
    return _sosfilt(sos, x, zi, axis=axis, dtype=dtype)


def _copied_in_chunks(x, axis, dtype) -> bool:
    """Whether `x` is a NumPy signal of the result's dtype that `sosfilt`
    filters in chunks along time (`_in_chunks`)."""
    if type(x) is not np.ndarray or x.dtype != dtype or x.ndim < 2:
        return False
    valid = isinstance(axis, int | np.integer) and -x.ndim <= axis < x.ndim
    return valid and _in_chunks(x, int(axis) % x.ndim, dtype)


def _in_chunks(x, axis: int, dtype) -> bool:
    """Whether `sosfilt` without `zi` filters `x` along `axis` in chunks
    (`along_time`): a long time-first signal that the cascade's kernel does
    not read in place (off the CPU, other dtypes, without the compiled
    library). The kernel reads a time-first signal's channels where they lie
    (`_scipy_args.along_axis`), with no copy to save."""
    return time_chunked(x, axis) and not kernel_applies(compute_dtype(dtype))


def _sosfilt_body(sos, x, zi, *, axis: int, dtype: np.dtype):
    """`sosfilt` after `host_arrays`, compiled as a whole (`_sosfilt`,
    and `_sosfilt_over_x`, which donates `x`)."""
    work = compute_dtype(dtype)
    sos = sos_array(sos, work)
    x = as_array("x", x, work)
    axis = normalise_axis(axis, x.ndim)
    n_sections = sos.shape[0]
    if zi is not None:
        zi = as_array("zi", zi, work)
        expected = (n_sections,) + x.shape[:axis] + (2,) + x.shape[axis + 1 :]
        if zi.shape != expected:
            raise ValueError(
                f"`zi` must have shape {expected} (two states per section along "
                f"axis={axis} of `x` with shape {x.shape}), got shape {zi.shape}."
            )
    sos = checked_sos(sos)
    if zi is None and not _in_chunks(x, axis, dtype):
        y = along_axis(lambda s: sos_cascade(sos, s, None, False)[:1], x, axis)[0]
        return in_dtype(dtype, y)
    if zi is None:  # a long time-first signal, in chunks from a zero state
        shape = (n_sections,) + x.shape[:axis] + (2,) + x.shape[axis + 1 :]
        zeros = jnp.zeros(shape, work)
        y = along_time(lambda s, z: sos_cascade(sos, s, z), x, axis, zeros)[0]
        return in_dtype(dtype, y)
    y, zf = along_time(lambda s, z: sos_cascade(sos, s, z), x, axis, zi)
    return in_dtype(dtype, (y, zf))


_sosfilt = compiled(static=("axis", "dtype"))(_sosfilt_body)
_sosfilt_over_x = compiled(static=("axis", "dtype"), donate=("x",))(_sosfilt_body)


def sos_steady_state(sos: Array) -> Array:
    """Each section's steady state for a unit step into the cascade: its own
    steady state scaled by the DC gain of the sections before it.

    All sections at once (`vmap`, and the gains' running product by a
    `scan`, multiplied in scipy's order): the program does not grow with the
    number of sections."""
    b, a = jax.vmap(normalise)(sos[:, :3], sos[:, 3:])
    zi = jax.vmap(steady_state)(b, a)
    gains = jnp.sum(b, axis=1) / (1 + jnp.sum(a, axis=1))
    _, before = lax.scan(
        lambda scale, g: (scale * g, scale), jnp.ones_like(gains[0]), gains
    )
    return before[:, None] * zi


def sosfilt_zi(
    sos: Shaped[ArrayLike, "sections 6"] | list | tuple,
) -> Inexact[Array, "sections 2"]:
    r"""Steady state of `sosfilt` for a unit step, as `scipy.signal.sosfilt_zi`.

    **Convention: scipy's.** Each section's state is
    `lfilter_zi(b, a)` scaled by the DC gain of the sections before it; scale
    the result by the first sample to start
    [`sosfilt`][retrax.ops.sosfilt] without a transient. As in scipy, each
    row is normalised by its `a0` here (`a0 == 0` is an error).

    **Arguments:**

    - `sos`: the sections, shape `(n_sections, 6)`.

    **Returns:**

    The state, shape `(n_sections, 2)`.
    """
    dtype = scipy_dtype(sos)
    (sos,) = host_arrays(compute_dtype(dtype), sos=sos)
    return _sosfilt_zi(sos, dtype=dtype)


@compiled(static=("dtype",))
def _sosfilt_zi(sos, *, dtype: np.dtype):
    """`sosfilt_zi` after `host_arrays`, compiled as a whole."""
    return in_dtype(dtype, sos_steady_state(sos_array(sos, compute_dtype(dtype))))
