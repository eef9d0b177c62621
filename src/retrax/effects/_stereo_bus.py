r"""dasp-pytorch's stereo bus: stereo tracks summed by send levels in dB."""

import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._validate import real_array


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
      `x.transpose(1, 0, 2)`.
    - `send_db`: the send level $s_k$ of each track in dB, `(tracks,)`
      (dasp's `(tracks, 1)` of one example, raveled). dasp gives it no
      range; any finite value is a level. It is cast to the dtype of `x`.

    **Returns:**

    The bus, `(2, time)`. Batch examples with `jax.vmap`.
    """
    x = real_array("x", x)
    send_db = real_array("send_db", send_db)
    if x.ndim != 3 or x.shape[1] != 2:
        raise ValueError(
            "`x` must be a stack of stereo tracks of shape (tracks, 2, time), got "
            f"shape {x.shape}. dasp's (2, tracks, time) is `x.transpose(1, 0, 2)`."
        )
    if send_db.shape != (x.shape[0],):
        raise ValueError(
            f"`send_db` must hold one level per track, shape ({x.shape[0]},), got "
            f"shape {send_db.shape}."
        )
    sends = 10 ** (send_db.astype(x.dtype) / 20.0)
    return jnp.einsum("k,kct->ct", sends, x)
