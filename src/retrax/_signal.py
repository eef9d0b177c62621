"""The signal layout and the streaming state of the effects.

Signals are time-last: `(time,)` for one mono signal or `(channels, time)`;
an effect that streams takes the state `zi` before the first sample and
returns the state `zf` after the last. These helpers check both and apply a
one-channel definition channel by channel; `retrax.effects` and
`retrax.filters` share them.
"""

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike

from ._validate import real_array


# More channels than this, and more than `TIME_FIRST_RATIO` times the samples,
# is audio laid out time first, `(time, channels)` (as `soundfile` reads it),
# not `(channels, time)`: no effect here is meant for hundreds of channels
# of a few samples each.
MAX_CHANNELS = 64
TIME_FIRST_RATIO = 8


def signal(x: ArrayLike) -> Array:
    """A real signal `x` of shape `(time,)` or `(channels, time)`.

    A `(channels, time)` signal with more than 64 channels and more than 8
    times as many channels as samples raises `ValueError`: it is audio laid
    out `(time, channels)`, which would otherwise run as thousands of
    channels of a few samples each (pass `x.T`). An empty signal passes."""
    x = real_array("x", x)
    if x.ndim not in (1, 2):
        raise ValueError(
            "`x` must be one mono signal of shape (time,) or a multichannel signal "
            f"of shape (channels, time), got shape {x.shape}. Batch several "
            "signals with `jax.vmap`."
        )
    if x.ndim == 2 and x.shape[1] > 0:
        channels, time = x.shape
        if channels > MAX_CHANNELS and channels > TIME_FIRST_RATIO * time:
            raise ValueError(
                "`x` must be laid out (channels, time), got shape "
                f"{x.shape}: {channels} channels of {time} samples each looks like "
                "audio laid out (time, channels), as soundfile reads it. Pass "
                "`x.T`."
            )
    return x


def stereo(x: ArrayLike) -> Array:
    """A signal for a stereo effect: `(time,)` (mono, sent to both channels)
    or `(2, time)`, returned as `(2, time)`."""
    x = signal(x)
    if x.ndim == 1:
        return jnp.stack([x, x])
    if x.shape[0] != 2:
        raise ValueError(
            "`x` must be mono (time,) or stereo (2, time) for a stereo effect, got "
            f"shape {x.shape}."
        )
    return x


def _is_shape(s: Any) -> bool:
    return isinstance(s, tuple) and all(isinstance(n, int) for n in s)


def check_state(zi: Any, shapes: Any, x: Array) -> None:
    """Raise `ValueError` unless the state `zi` (a pytree of arrays, or
    `None`) has the structure of `shapes` (a pytree of one channel's state
    shapes, tuples of ints) and each of its arrays the shape given there,
    with a leading channel axis when `x` is `(channels, time)`. The message
    names the entry of `zi`, the shape expected and the shape given."""
    if zi is None:
        return
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)
    paths = ["zi" + jax.tree_util.keystr(path) for path, _ in flat]
    expected = [shape for _, shape in flat]
    lead = x.shape[:-1]
    try:
        given = treedef.flatten_up_to(zi)
    except (TypeError, ValueError):
        want = jax.tree.unflatten(treedef, [lead + s for s in expected])
        raise ValueError(
            f"`zi` must be this effect's state, of shapes {want} for `x` of shape "
            f"{x.shape}, got {jax.tree.map(np.shape, zi)}."
        ) from None
    for path, shape, value in zip(paths, expected, given, strict=True):
        if value is not None and np.shape(value) != lead + shape:
            raise ValueError(
                f"`{path}` must have shape {lead + shape} for `x` of shape "
                f"{x.shape}, got shape {np.shape(value)}."
            )


def per_channel(
    mono: Callable[[Array, Any], tuple[Array, Any]],
    x: Array,
    zi: Any,
    shapes: Any,
) -> tuple[Array, Any]:
    """Apply `mono(x, zi) -> (y, zf)` (one channel `(time,)`; `zi=None` is
    silence) to `x` of shape `(time,)`, or to each row of `(channels, time)`
    with the state's leaves stacked along a leading channel axis. `shapes`
    are one channel's state shapes (see `check_state`), checked first."""
    check_state(zi, shapes, x)
    if x.ndim == 1:
        return mono(x, zi)
    return jax.vmap(mono, in_axes=(0, None if zi is None else 0))(x, zi)


def state_leaf(name: str, value: ArrayLike | None, shape: tuple, dtype) -> Array:
    """One array of an effect's state: zeros of `shape` if `value` is None,
    else `value` cast to `dtype`, whose shape must be `shape`."""
    if value is None:
        return jnp.zeros(shape, dtype)
    value = real_array(name, value)
    if value.shape != shape:
        raise ValueError(f"`{name}` must have shape {shape}, got shape {value.shape}.")
    return value.astype(dtype)


def output(y: Array, zf: Any, return_zf: bool) -> Array | tuple[Array, Any]:
    """`(y, zf)` if `return_zf`, else `y`."""
    return (y, zf) if return_zf else y


def no_state(zi: Any) -> None:
    """A stateless effect takes `zi=None`."""
    if zi is not None:
        raise ValueError("This effect has no state: pass `zi=None`.")
