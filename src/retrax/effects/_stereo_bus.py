r"""dasp-pytorch's stereo bus: stereo tracks summed by send levels in dB."""

import math

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._errors import error_if
from .._signal import MAX_CHANNELS, TIME_FIRST_RATIO
from .._validate import real_array


def _check_layout(x: Array, send_db: Array) -> None:
    """`x` `(tracks, 2, time)` and `send_db` `(tracks,)`, or `ValueError`."""
    if x.ndim != 3 or x.shape[1] != 2:
        raise ValueError(
            "`x` must be a stack of stereo tracks of shape (tracks, 2, time), got "
            f"shape {x.shape}. dasp's (2, tracks, time) is `x.transpose(1, 0, 2)`."
        )
    tracks, _, time = x.shape
    if time > 0 and tracks > MAX_CHANNELS and tracks > TIME_FIRST_RATIO * time:
        raise ValueError(
            "`x` must be laid out (tracks, 2, time), got shape "
            f"{x.shape}: {tracks} tracks of {time} samples each looks like "
            "tracks laid out (time, 2, tracks). Pass `x.transpose(2, 1, 0)`."
        )
    if send_db.shape != (tracks,):
        hint = " (dasp's (tracks, 1): pass `send_db.ravel()`)" if send_db.size else ""
        raise ValueError(
            f"`send_db` must hold one level per track, shape ({tracks},), got "
            f"shape {send_db.shape}{hint}."
        )


def stereo_bus(
    x: Shaped[ArrayLike, "tracks channels time"], send_db: Shaped[ArrayLike, " sends"]
) -> Float[Array, "2 time"]:
    r"""Sum stereo tracks to a stereo bus with send levels in dB,
    dasp-pytorch's `stereo_bus`:

    $$y_{c,t} = \sum_k 10^{s_k / 20}\, x_{k,c,t}.$$

    **Arguments:**

    - `x`: the tracks, `(tracks, 2, time)`: a stack of stereo signals, as
      `jax.vmap` of a stereo effect (e.g.
      [`StereoPanner`][retrax.effects.StereoPanner]) over tracks returns
      them. dasp lays one example out `(2, tracks, time)`: pass
      `x.transpose(1, 0, 2)`. A non-finite sample passes through to the
      same sample of the bus, as non-finite signals do everywhere in
      retrax.
    - `send_db`: the send level $s_k$ of each track in dB, `(tracks,)`
      (dasp's `(tracks, 1)` of one example, raveled). dasp gives it no
      range; any finite level whose gain $10^{s_k / 20}$ is finite in the
      dtype of `x` is valid (below about 770 dB in float32; mute a track with
      a very low level, not `-inf`). It is cast to the dtype of `x`.

    **Returns:**

    The bus, `(2, time)`. Batch examples with `jax.vmap`.

    A wrong layout raises `ValueError` naming the argument; a level that is
    not finite, or whose gain overflows the dtype, raises an error naming
    `send_db` (eagerly, and at run time under `jax.jit`, `vmap` and `grad`).
    """
    x = real_array("x", x)
    send_db = real_array("send_db", send_db)
    _check_layout(x, send_db)
    send_db = send_db.astype(x.dtype)
    sends = 10 ** (send_db / 20.0)
    sends = error_if(
        sends,
        ~jnp.all(jnp.isfinite(send_db) & jnp.isfinite(sends)),
        f"`send_db` must be finite send levels in dB whose gains 10**(send_db / 20) "
        f"are finite in {x.dtype} (levels below about "
        f"{20 * math.log10(float(jnp.finfo(x.dtype).max)):.0f} dB).",
    )
    return jnp.einsum("k,kct->ct", sends, x)
