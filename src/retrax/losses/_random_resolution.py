"""The STFT loss at randomly drawn resolutions (auraloss's
`RandomResolutionSTFTLoss`)."""

import math
from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray, Real

from ._multi_resolution import MultiResolutionSTFTLoss
from ._stft import WINDOWS, Window
from ._stft_loss import Scale, Weight, check_choice, check_signals


_WINDOW_FRACTIONS = (1.0, 0.5, 0.25)


class RandomResolutionSTFTLoss(eqx.Module):
    r"""The multi-resolution STFT loss at `resolutions` resolutions drawn at
    random, as auraloss's `RandomResolutionSTFTLoss` (Steinmetz & Reiss 2020).

    Each resolution is drawn as auraloss draws it, independently:

    - the FFT size $2^k$, $k$ uniform among the integers in
      $[\lfloor \log_2 \text{min\_fft\_size} \rfloor,
      \lfloor \log_2 \text{max\_fft\_size} \rfloor)$ (numpy's `randint` of
      auraloss's float exponents, truncated; `max_fft_size` itself is never
      drawn);
    - the hop `int(fft_size * (min_hop_size + u * (max_hop_size -
      min_hop_size)))`, $u$ uniform in $[0, 1)$;
    - the window length `int(fft_size * f)`, $f$ uniform in
      $\{1, 1/2, 1/4\}$, and the window uniform among `windows`.

    auraloss draws from numpy's global generator and redraws every
    `randomize_rate` calls; here a JAX `key` draws them (`draw`), so the
    same key gives the same resolutions and a new key per step is auraloss's
    `randomize_rate=1`. The draw fixes the shapes of the computation, so
    it needs a concrete key: to compile, `jax.jit` the
    `MultiResolutionSTFTLoss` that `draw(key)` returns (as auraloss's
    resolutions stay fixed between redraws). Its value for a drawn set equals
    auraloss's for the same set.

    **Arguments:**

    - `resolutions`: the number of resolutions, a positive integer.
    - `min_fft_size`, `max_fft_size`: bounds of the FFT sizes (above),
      `2 <= min_fft_size`, with at least one power of two between them.
    - `min_hop_size`, `max_hop_size`: the hop as a fraction of the FFT size,
      `0 < min_hop_size <= max_hop_size <= 1`, every hop at least one sample.
    - `windows`: the windows drawn from (see `STFTLoss`).
    - `w_sc`, `w_log_mag`, `w_lin_mag`, `w_phs`, `sample_rate`, `scale`: as
      `STFTLoss`, for every resolution.
    - `n_mels`: the number of `scale` bands (`STFTLoss`'s `n_bins`), at most
      the smallest FFT size drawn.
    """

    resolutions: int = eqx.field(static=True)
    min_fft_size: int = eqx.field(static=True)
    max_fft_size: int = eqx.field(static=True)
    min_hop_size: float = eqx.field(static=True)
    max_hop_size: float = eqx.field(static=True)
    windows: tuple[Window, ...] = eqx.field(static=True)
    w_sc: Weight
    w_log_mag: Weight
    w_lin_mag: Weight
    w_phs: Weight
    sample_rate: float | int | None = eqx.field(static=True)
    scale: Scale | None = eqx.field(static=True)
    n_mels: int | None = eqx.field(static=True)

    def __init__(
        self,
        resolutions: int = 3,
        min_fft_size: int = 16,
        max_fft_size: int = 32768,
        min_hop_size: float = 0.1,
        max_hop_size: float = 1.0,
        windows: Sequence[Window] = WINDOWS,
        w_sc: Weight = 1.0,
        w_log_mag: Weight = 1.0,
        w_lin_mag: Weight = 0.0,
        w_phs: Weight = 0.0,
        sample_rate: float | int | None = None,
        scale: Scale | None = None,
        n_mels: int | None = None,
    ):
        for name, value in (
            ("resolutions", resolutions),
            ("min_fft_size", min_fft_size),
            ("max_fft_size", max_fft_size),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
        if min_fft_size < 2:
            raise ValueError(f"`min_fft_size` must be at least 2, got {min_fft_size}.")
        low, high = int(math.log2(min_fft_size)), int(math.log2(max_fft_size))
        if high <= low:
            raise ValueError(
                "`max_fft_size` must exceed `min_fft_size` by a power of two "
                f"(FFT sizes 2**k for int(log2(min)) <= k < int(log2(max))), got "
                f"min_fft_size={min_fft_size}, max_fft_size={max_fft_size}."
            )
        if not 0 < min_hop_size <= max_hop_size <= 1:
            raise ValueError(
                "`min_hop_size` and `max_hop_size` must satisfy 0 < min_hop_size "
                f"<= max_hop_size <= 1, got {min_hop_size!r} and {max_hop_size!r}."
            )
        if int(2**low * min_hop_size) < 1:
            raise ValueError(
                f"`min_hop_size` ({min_hop_size}) gives hops of 0 samples at the "
                f"smallest FFT size ({2**low}): raise it or `min_fft_size`."
            )
        windows = tuple(windows)
        if not windows:
            raise ValueError("`windows` must name at least one window.")
        for window in windows:
            check_choice("windows", window, WINDOWS)
        if scale is not None and n_mels is not None and n_mels > 2**low:
            raise ValueError(
                f"`n_mels` ({n_mels}) must not exceed the smallest FFT size "
                f"drawn ({2**low})."
            )
        self.resolutions = resolutions
        self.min_fft_size = min_fft_size
        self.max_fft_size = max_fft_size
        self.min_hop_size = float(min_hop_size)
        self.max_hop_size = float(max_hop_size)
        self.windows = windows
        self.w_sc = w_sc
        self.w_log_mag = w_log_mag
        self.w_lin_mag = w_lin_mag
        self.w_phs = w_phs
        self.sample_rate = sample_rate
        self.scale = scale
        self.n_mels = n_mels
        # the resolutions' own checks (weights, scale, sample rate) run once
        self.loss_at([(2**low, max(1, int(2**low * min_hop_size)), 2**low, windows[0])])

    def loss_at(
        self, resolutions: Sequence[tuple[int, int, int, Window]]
    ) -> MultiResolutionSTFTLoss:
        """The loss at given resolutions.

        **Arguments:**

        - `resolutions`: `(fft_size, hop_size, win_length, window)` of each
          resolution.

        **Returns:**

        The `MultiResolutionSTFTLoss` with this loss's weights and scale.
        """
        ffts, hops, wins, windows = zip(*resolutions, strict=True)
        return MultiResolutionSTFTLoss(
            ffts,
            hops,
            wins,
            windows,
            w_sc=self.w_sc,
            w_log_mag=self.w_log_mag,
            w_lin_mag=self.w_lin_mag,
            w_phs=self.w_phs,
            sample_rate=self.sample_rate,
            scale=self.scale,
            n_bins=self.n_mels,
        )

    def draw(self, key: PRNGKeyArray) -> MultiResolutionSTFTLoss:
        """The loss at resolutions drawn with `key`.

        **Arguments:**

        - `key`: a concrete JAX PRNG key (not traced: it fixes shapes).

        **Returns:**

        The `MultiResolutionSTFTLoss` at the drawn resolutions.
        """
        if isinstance(key, jax.core.Tracer):
            raise TypeError(
                "`key` must be concrete: the drawn resolutions fix the shapes. "
                "Draw outside `jax.jit` and jit the returned loss."
            )
        low, high = int(math.log2(self.min_fft_size)), int(math.log2(self.max_fft_size))
        drawn = []
        for k in jax.random.split(key, self.resolutions):
            k_fft, k_hop, k_win, k_window = jax.random.split(k, 4)
            fft = 2 ** int(jax.random.randint(k_fft, (), low, high))
            u = float(jax.random.uniform(k_hop, ()))
            hop = int(
                fft * (self.min_hop_size + u * (self.max_hop_size - self.min_hop_size))
            )
            fraction = _WINDOW_FRACTIONS[int(jax.random.randint(k_win, (), 0, 3))]
            window = self.windows[
                int(jax.random.randint(k_window, (), 0, len(self.windows)))
            ]
            drawn.append((fft, hop, int(fft * fraction), window))
        return self.loss_at(drawn)

    def __call__(
        self,
        pred: Real[ArrayLike, "..."],
        target: Real[ArrayLike, "..."],
        *,
        key: PRNGKeyArray,
    ) -> Float[Array, ""]:
        """The loss of `pred` against `target` at resolutions drawn with `key`.

        **Arguments:**

        - `pred`: the prediction, `(time,)`, `(channels, time)` or
          `(batch, channels, time)`, with `time > max_fft_size` (as auraloss
          requires).
        - `target`: the target, the same shape.
        - `key`: a concrete JAX PRNG key.

        **Returns:**

        A scalar in the signals' promoted float dtype.
        """
        pred, target = check_signals(pred, target, 1)
        if pred.shape[-1] <= self.max_fft_size:
            raise ValueError(
                f"`pred` and `target` have {pred.shape[-1]} samples: auraloss's "
                f"random resolutions need more than `max_fft_size` "
                f"({self.max_fft_size})."
            )
        loss = self.draw(key)
        return jnp.asarray(loss.unchecked_terms(pred, target).loss)
