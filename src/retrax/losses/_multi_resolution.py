"""The multi-resolution STFT loss (auraloss's `MultiResolutionSTFTLoss`)."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from ._stft import Window
from ._stft_loss import (
    Distance,
    Output,
    Reduction,
    Scale,
    STFTLoss,
    STFTLossTerms,
    Weight,
    check_signals,
    compiled_terms,
    signal_peak,
)


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
    - `window`: one window for every resolution, or one per resolution (see
      `STFTLoss`).
    - `w_sc`, `w_log_mag`, `w_lin_mag`, `eps`, `reduction`, `mag_distance`,
      `w_phs`, `sample_rate`, `scale`, `n_bins`, `perceptual_weighting`,
      `scale_invariance`: shared by every resolution (see `STFTLoss`: the
      phase term, mel or chroma bands, A-weighting and the scale-invariant
      target of auraloss).
    - `output`: `"loss"` (a scalar) or `"full"`: `STFTLossTerms` whose terms
      have one entry per resolution, as auraloss's lists.

    The arguments after `mag_distance` are in a different position than in
    auraloss: pass them by keyword. Invalid settings raise `ValueError` naming
    the argument.
    """

    resolutions: tuple[STFTLoss, ...]

    def __init__(
        self,
        fft_sizes: Sequence[int] = (1024, 2048, 512),
        hop_sizes: Sequence[int] = (120, 240, 50),
        win_lengths: Sequence[int] = (600, 1200, 240),
        window: Window | Sequence[Window] = "hann_window",
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        eps: Weight = 1e-8,
        reduction: Reduction = "mean",
        mag_distance: Distance = "L1",
        w_phs: Weight = 0.0,
        sample_rate: float | int | None = None,
        scale: Scale | None = None,
        n_bins: int | None = None,
        perceptual_weighting: bool = False,
        scale_invariance: bool = False,
        output: Output = "loss",
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
        windows = (
            (window,) * len(fft_sizes) if isinstance(window, str) else tuple(window)
        )
        if len(windows) != len(fft_sizes):
            raise ValueError(
                "`window` must be one window or one per resolution, got "
                f"{len(windows)} windows for {len(fft_sizes)} resolutions."
            )
        self.resolutions = tuple(
            STFTLoss(
                fft_size=f,
                hop_size=h,
                win_length=w,
                window=win,
                w_sc=w_sc,
                w_log_mag=w_log_mag,
                w_lin_mag=w_lin_mag,
                eps=eps,
                reduction=reduction,
                mag_distance=mag_distance,
                w_phs=w_phs,
                sample_rate=sample_rate,
                scale=scale,
                n_bins=n_bins,
                perceptual_weighting=perceptual_weighting,
                scale_invariance=scale_invariance,
                output=output,
            )
            for f, h, w, win in zip(
                fft_sizes, hop_sizes, win_lengths, windows, strict=True
            )
        )

    @property
    def fft_sizes(self) -> tuple[int, ...]:
        """The FFT size of each resolution."""
        return tuple(r.fft_size for r in self.resolutions)

    @property
    def output(self) -> Output:
        """`"loss"` or `"full"`, as every resolution's."""
        return self.resolutions[0].output

    def unchecked_terms(self, pred: jax.Array, target: jax.Array) -> STFTLossTerms:
        """The loss and the resolutions' terms without `__call__`'s checks."""
        # every resolution shares `perceptual_weighting` and `sample_rate`
        weighted = self.resolutions[0].weighted
        pred, target = weighted(pred), weighted(target)
        peak = signal_peak(pred, target)
        terms = [r.weighted_terms(pred, target, peak) for r in self.resolutions]
        stacked = jax.tree.map(lambda *t: jnp.stack(t), *terms)
        return STFTLossTerms(
            jnp.sum(stacked.loss) / len(terms),
            stacked.sc_mag,
            stacked.log_mag,
            stacked.lin_mag,
            stacked.phs,
        )

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""] | STFTLossTerms:
        """The loss of `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time >= max(fft_sizes)`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype (`STFTLossTerms` with
        `output="full"`). Mismatched shapes, too short or non-finite signals
        raise an error naming the argument; a dtype other than float32 or
        float64 (float16, bfloat16: XLA's FFT has no such transform) raises
        `TypeError` naming it.
        """
        pred, target = check_signals(pred, target, max(self.fft_sizes))
        terms = compiled_terms(self, pred, target)
        return terms if self.output == "full" else terms.loss


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
