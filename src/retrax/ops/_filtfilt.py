"""Zero-phase forward-backward filtering."""

from typing import Literal

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._misc import as_inexact, result_dtype
from ._lfilter import lfilter, lfilter_zi
from ._validate import check_signal


def _extend(x: Array, padtype: str | None, edge: int) -> Array:
    if edge == 0:
        return x
    left = x[edge:0:-1]
    right = x[-2 : -edge - 2 : -1]
    if padtype == "odd":
        return jnp.concatenate([2 * x[0] - left, x, 2 * x[-1] - right])
    if padtype == "even":
        return jnp.concatenate([left, x, right])
    return jnp.concatenate(
        [jnp.full(edge, x[0], x.dtype), x, jnp.full(edge, x[-1], x.dtype)]
    )


def filtfilt(
    b: Shaped[ArrayLike, " taps"],
    a: Shaped[ArrayLike, " order"],
    x: Shaped[ArrayLike, " time"],
    *,
    padtype: Literal["odd", "even", "constant"] | None = "odd",
    padlen: int | None = None,
) -> Inexact[Array, " time"]:
    r"""Zero-phase filtering: `lfilter` forwards, then backwards in time.

    The method of `scipy.signal.filtfilt` (Gustafsson's steady-state
    initialisation, `method="pad"`), with the same defaults, and it equals
    `scipy.signal.filtfilt(b, [1, *a], x, padtype=padtype, padlen=padlen)`:
    **`a` excludes the leading 1**, as in `lfilter`. The signal is extended
    by `padlen` samples at both ends (odd: `2 x[0] - x[padlen:0:-1]`, even:
    a mirror, constant: the edge value, `None`: no extension), filtered
    forwards from the steady state of the first sample (`lfilter_zi` scaled
    by it), reversed, filtered again from the steady state of its first
    sample, reversed, and trimmed. The effective response is $|H|^2$ with no
    phase shift. It cannot stream (it needs the whole signal).

    **Arguments:**

    - `b`: numerator taps, shape `(M+1,)`, constant.
    - `a`: denominator coefficients without the leading 1, shape `(K,)`.
    - `x`: the input signal, shape `(T,)`. Batch with `jax.vmap`.
    - `padtype`: `"odd"` (default), `"even"`, `"constant"` or `None`.
    - `padlen`: samples of extension at each end; defaults to
      `3 * max(K + 1, M + 1)` as in scipy. Ignored (0) if `padtype` is None.

    **Returns:**

    `y` of shape `(T,)`.

    Raises `ValueError` if `x` is not longer than `padlen`. For high-order
    filters, see the note in `lfilter`.
    """
    if padtype not in ("odd", "even", "constant", None):
        raise ValueError(
            f"`padtype` must be 'odd', 'even', 'constant' or None, got {padtype!r}."
        )
    b = as_inexact("b", b)
    a = as_inexact("a", a)
    x = as_inexact("x", x)
    check_signal("x", x)
    for name, c in (("b", b), ("a", a)):
        if c.ndim != 1:
            raise ValueError(
                f"`{name}` must be constant, shape (n,), got shape {c.shape}."
            )
    if padtype is None:
        edge = 0
    elif padlen is None:
        edge = 3 * max(a.shape[0] + 1, b.shape[0])
    else:
        edge = int(padlen)
        if edge < 0:
            raise ValueError(f"`padlen` must be non-negative, got {padlen}.")
    if x.shape[0] <= edge:
        raise ValueError(
            f"`x` must be longer than `padlen` = {edge} samples, got "
            f"{x.shape[0]}; pass a smaller `padlen` or `padtype=None`."
        )
    dtype = result_dtype(b, a, x)
    b, a, x = b.astype(dtype), a.astype(dtype), x.astype(dtype)
    ext = _extend(x, padtype, edge)
    zi = lfilter_zi(b, a)
    y = lfilter(b, a, ext, zi * ext[0])[::-1]
    y = lfilter(b, a, y, zi * y[0])[::-1]
    if edge > 0:
        y = y[edge:-edge]
    return y
