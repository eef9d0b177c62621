"""The sum-and-difference stereo STFT loss (auraloss's
`SumAndDifferenceSTFTLoss`)."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, Real

from ._multi_resolution import MultiResolutionSTFTLoss
from ._stft import Window
from ._stft_loss import (
    Output,
    Weight,
    check_choice,
    check_signals,
    check_weight,
    compiled_terms,
)


class SumAndDifferenceTerms(eqx.Module):
    """The loss and its two terms, as auraloss's `output="full"` returns them.

    **Fields:**

    - `loss`: $(w_{sum} L_{sum} + w_{diff} L_{diff}) / 2$.
    - `sum_loss`: $L_{sum}$, the multi-resolution loss of the sum signals.
    - `diff_loss`: $L_{diff}$, that of the difference signals.
    """

    loss: Float[Array, ""]
    sum_loss: Float[Array, ""]
    diff_loss: Float[Array, ""]


class SumAndDifferenceSTFTLoss(eqx.Module):
    r"""The multi-resolution STFT loss of the stereo sum and difference
    signals, as auraloss's `SumAndDifferenceSTFTLoss` (Steinmetz et al. 2020):

    $$\frac{w_{sum} L(p_0 + p_1, t_0 + t_1) + w_{diff} L(p_0 - p_1, t_0 - t_1)}{2}$$

    with $L$ a `MultiResolutionSTFTLoss` and $p_c$, $t_c$ the channels of the
    prediction and the target. The sum (and the difference) signals of a batch
    go through $L$ together, `(batch, 1, time)`, as in auraloss.

    **Arguments:**

    - `fft_sizes`, `hop_sizes`, `win_lengths`, `window`: the resolutions (see
      `MultiResolutionSTFTLoss`).
    - `w_sum`, `w_diff`: the weights of the two terms, >= 0.
    - `output`: `"loss"` (a scalar) or `"full"` (`SumAndDifferenceTerms`).
    - `settings`: further keyword arguments of `MultiResolutionSTFTLoss`
      (`w_sc`, `w_log_mag`, `perceptual_weighting`, `scale`, ...), as
      auraloss's `**kwargs`.

    **Fields:**

    - `mrstft`: the `MultiResolutionSTFTLoss` of both terms.
    """

    mrstft: MultiResolutionSTFTLoss
    w_sum: Weight
    w_diff: Weight
    output: Output = eqx.field(static=True)

    def __init__(
        self,
        fft_sizes: Sequence[int],
        hop_sizes: Sequence[int],
        win_lengths: Sequence[int],
        window: Window | Sequence[Window] = "hann_window",
        w_sum: Weight = 1.0,
        w_diff: Weight = 1.0,
        output: Output = "loss",
        **settings,
    ):
        check_choice("output", output, ("loss", "full"))
        if "output" in settings:
            raise ValueError("`output` is this loss's, not the resolutions'.")
        self.mrstft = MultiResolutionSTFTLoss(
            fft_sizes, hop_sizes, win_lengths, window, **settings
        )
        self.w_sum = check_weight("w_sum", w_sum)
        self.w_diff = check_weight("w_diff", w_diff)
        self.output = output

    def __call__(
        self, pred: Real[ArrayLike, "..."], target: Real[ArrayLike, "..."]
    ) -> Float[Array, ""] | SumAndDifferenceTerms:
        """The loss of stereo `pred` against `target`.

        **Arguments:**

        - `pred`: the prediction, `(2, time)` or `(batch, 2, time)`, with
          `time >= max(fft_sizes)`.
        - `target`: the target, the same shape.

        **Returns:**

        A scalar in the signals' promoted float dtype
        (`SumAndDifferenceTerms` with `output="full"`). Signals that are not
        stereo raise `ValueError` naming `pred`.
        """
        pred, target = check_signals(pred, target, max(self.mrstft.fft_sizes))
        if pred.ndim < 2 or pred.shape[-2] != 2:
            raise ValueError(
                "`pred` and `target` must be stereo, (2, time) or "
                f"(batch, 2, time), got shape {pred.shape}."
            )
        terms = compiled_terms(self, pred, target)
        return terms if self.output == "full" else terms.loss

    def unchecked_terms(
        self, pred: jax.Array, target: jax.Array
    ) -> SumAndDifferenceTerms:
        """The loss and its two terms of checked stereo signals, without
        `__call__`'s checks."""

        def sum_and_difference(x):
            left, right = x[..., :1, :], x[..., 1:, :]
            return left + right, left - right

        pred_sum, pred_diff = sum_and_difference(pred)
        target_sum, target_diff = sum_and_difference(target)
        sum_loss = self.mrstft.unchecked_terms(pred_sum, target_sum).loss
        diff_loss = self.mrstft.unchecked_terms(pred_diff, target_diff).loss
        dtype = sum_loss.dtype
        loss = (
            jnp.asarray(self.w_sum).astype(dtype) * sum_loss
            + jnp.asarray(self.w_diff).astype(dtype) * diff_loss
        ) / 2
        return SumAndDifferenceTerms(loss, sum_loss, diff_loss)
