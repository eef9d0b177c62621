"""The multi-resolution STFT loss (auraloss's `MultiResolutionSTFTLoss`)."""

from collections.abc import Sequence

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from ._stft import Window
from ._stft_loss import Distance, Reduction, STFTLoss, Weight, check_signals


class MultiResolutionSTFTLoss(eqx.Module):
    r"""The mean of `STFTLoss` over several resolutions, as auraloss's
    `MultiResolutionSTFTLoss` (Yamamoto et al. 2019).

    The defaults are auraloss's: FFT sizes `(1024, 2048, 512)`, hops
    `(120, 240, 50)`, windows of `(600, 1200, 240)` samples, Hann windows,
    spectral convergence plus L1 log-magnitude distance with weight 1 each,
    `eps = 1e-8`, `reduction="mean"`. Called as `loss(pred, target)` on
    `(time,)`, `(channels, time)` or `(batch, channels, time)` signals; as in
    auraloss the norms and means run over the whole input (a `(time,)` or
    `(channels, time)` signal is treated as one batch of one example), so the
    loss of a batch is not the mean of its examples' losses; `jax.vmap` gives
    per-example losses.

    **Arguments:**

    - `fft_sizes`, `hop_sizes`, `win_lengths`: one entry per resolution, the
      same number of each (see `STFTLoss`).
    - `window`, `w_sc`, `w_log_mag`, `w_lin_mag`, `eps`, `reduction`,
      `mag_distance`: shared by every resolution (see `STFTLoss`).

    Invalid settings raise `ValueError` naming the argument. auraloss's
    phase term, mel/chroma scaling, A-weighting and scale invariance are not
    provided.
    """

    resolutions: tuple[STFTLoss, ...]

    def __init__(
        self,
        fft_sizes: Sequence[int] = (1024, 2048, 512),
        hop_sizes: Sequence[int] = (120, 240, 50),
        win_lengths: Sequence[int] = (600, 1200, 240),
        window: Window = "hann_window",
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        eps: Weight = 1e-8,
        reduction: Reduction = "mean",
        mag_distance: Distance = "L1",
    ):
        fft_sizes, hop_sizes, win_lengths = (
            tuple(fft_sizes),
            tuple(hop_sizes),
            tuple(win_lengths),
        )
        if not len(fft_sizes) == len(hop_sizes) == len(win_lengths):
            raise ValueError(
                "`fft_sizes`, `hop_sizes` and `win_lengths` must have the same "
                f"length, got {len(fft_sizes)}, {len(hop_sizes)} and "
                f"{len(win_lengths)}."
            )
        if not fft_sizes:
            raise ValueError("`fft_sizes` must name at least one resolution.")
        self.resolutions = tuple(
            STFTLoss(
                fft_size=f,
                hop_size=h,
                win_length=w,
                window=window,
                w_sc=w_sc,
                w_log_mag=w_log_mag,
                w_lin_mag=w_lin_mag,
                eps=eps,
                reduction=reduction,
                mag_distance=mag_distance,
            )
            for f, h, w in zip(fft_sizes, hop_sizes, win_lengths, strict=True)
        )

    @property
    def fft_sizes(self) -> tuple[int, ...]:
        """The FFT size of each resolution."""
        return tuple(r.fft_size for r in self.resolutions)

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""]:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time >= max(fft_sizes)`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype. Mismatched shapes, too
        short or non-finite signals raise an error naming the argument; a
        dtype other than float32 or float64 (float16, bfloat16: XLA's FFT
        has no such transform) raises `TypeError` naming it.
        """
        pred, target = check_signals(pred, target, max(self.fft_sizes))
        losses = [r.unchecked_loss(pred, target) for r in self.resolutions]
        return jnp.sum(jnp.stack(losses)) / len(losses)


def multi_resolution_stft_loss(
    pred: Real[ArrayLike, "..."],
    target: Real[ArrayLike, "..."],
    **settings,
) -> Float[Array, ""]:
    """`MultiResolutionSTFTLoss(**settings)(pred, target)`: the loss with
    auraloss's defaults unless `settings` change them.

    **Arguments:**

    - `pred`: the prediction, `(time,)`, `(channels, time)` or
      `(batch, channels, time)`, with `time >= 2048` at the default settings.
    - `target`: the target, the same shape.
    - `settings`: keyword arguments of `MultiResolutionSTFTLoss`.

    **Returns:**

    A scalar in the signals' promoted float dtype.
    """
    return MultiResolutionSTFTLoss(**settings)(pred, target)
