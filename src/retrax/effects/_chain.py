"""Effects in series, with the processor interface of one effect."""

from collections.abc import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Shaped

from .._effect import AbstractEffect, check_normalised
from .._signal import output, signal
from .._unconstrained import unconstrained
from .._validate import check_delay
from ._dasp_compressor import DaspCompressor
from ._dasp_eq import DaspParametricEQ


# Effects defined on the whole signal (frequency sampling over all of it):
# they do not stream, so a chain of segments would change their output.
_WHOLE_SIGNAL = (DaspCompressor, DaspParametricEQ)


class Chain(AbstractEffect):
    r"""Effects applied in sequence, itself an effect.

    `Chain([eq, compressor, distortion, delay, reverb])(x)` is
    `reverb(delay(distortion(compressor(eq(x)))))`. Its normalised vector is
    the concatenation of its effects' normalised vectors, in order, so a
    controller network that outputs `chain.n_params` numbers in $[0, 1]$
    sets the whole chain: `Chain.from_normalised(p, effects=templates)` (or
    `chain.with_normalised(p)`) keeps each effect's structure and replaces
    its parameters. Its unconstrained vector (`to_unconstrained`,
    `with_unconstrained`), what optax trains, is likewise its effects'
    unconstrained vectors in order (an effect's may be longer than its
    normalised one: a compressor's is), each with its effect's guarantee:
    every finite vector gives a chain of valid effects.

    Mono and stereo effects mix: a stereo effect (a panner, a ping-pong
    delay) turns a mono `(time,)` signal into `(2, time)`, and the effects
    after it process the two channels.

    **Arguments:**

    - `effects`: a sequence of effects (instances of
      [`AbstractEffect`][retrax.effects.AbstractEffect]), at least one.
    - `segment_length`: `None` (the default), or a Python int $\ge 1$ (static)
      to trade compute for memory in gradients over long signals: the chain
      then runs the signal in segments of that many samples, passing the
      effects' states from one to the next, and its gradient keeps only the
      states between segments (and the signal), recomputing each segment's
      forward pass when the backward pass reaches it. The gradient's memory
      is then a few signal-sized arrays (the signal, the output, their
      cotangents) plus one segment's internals instead of every stage's
      output and internal signals, for about one more forward pass of
      compute; see [Long signals](#long-signals-compute-for-memory)).
      The output equals the unsegmented chain's to rounding, as streaming
      in blocks does. Every effect must stream, so the dasp-pytorch ports
      defined on the whole signal
      ([`DaspCompressor`][retrax.effects.DaspCompressor],
      [`DaspParametricEQ`][retrax.effects.DaspParametricEQ]) are refused.

    The state `zi` is a tuple with one entry per effect (`None` for a
    stateless one); `return_zf=True` returns the tuple of their final
    states, so that a chain streams in blocks.
    """

    effects: tuple[AbstractEffect, ...]
    segment_length: int | None = eqx.field(static=True)

    def __init__(
        self,
        effects: Sequence[AbstractEffect],
        *,
        segment_length: int | None = None,
    ):
        effects = tuple(effects)
        if not effects:
            raise ValueError("`effects` must hold at least one effect.")
        for i, effect in enumerate(effects):
            if not isinstance(effect, AbstractEffect):
                raise TypeError(
                    f"`effects[{i}]` must be an effect (a retrax.effects."
                    f"AbstractEffect), got {type(effect).__name__}."
                )
        if segment_length is not None:
            segment_length = check_delay("segment_length", segment_length)
            for i, effect in enumerate(effects):
                if _whole_signal(effect):
                    raise ValueError(
                        f"`effects[{i}]` ({type(effect).__name__}) does not "
                        "stream (it is, or holds, an effect defined on the whole "
                        "signal), so it cannot run in segments: pass "
                        "`segment_length=None`."
                    )
        self.effects = effects
        self.segment_length = segment_length

    @property
    def n_params(self) -> int:
        """The total number of normalised parameters."""
        return sum(e.n_params for e in self.effects)

    def to_normalised(self) -> Float[Array, " params"]:
        """The concatenated normalised parameters of the effects."""
        return jnp.concatenate([e.to_normalised() for e in self.effects])

    def with_normalised(self, p: Shaped[ArrayLike, " params"]) -> "Chain":
        """The chain with the effects' parameters from `p` `(P,)`, split in
        order; entries outside $[0, 1]$ raise an error (also under `jax.jit`)."""
        p = check_normalised(p, self.n_params)
        return Chain(
            [
                e.with_normalised(p[lo:hi])
                for e, lo, hi in zip(
                    self.effects,
                    *_bounds([e.n_params for e in self.effects]),
                    strict=True,
                )
            ],
            segment_length=self.segment_length,
        )

    def to_unconstrained(self) -> Float[Array, " params"]:
        """The concatenated unconstrained vectors of the effects."""
        return jnp.concatenate([e.to_unconstrained() for e in self.effects])

    def with_unconstrained(self, theta: Shaped[ArrayLike, " params"]) -> "Chain":
        """The chain with each effect built from its part of `theta` `(P,)`,
        any finite real vector (split in order, as `with_normalised` splits);
        a wrong shape raises `ValueError`, non-finite entries an error (also
        under `jax.jit`)."""
        sizes = [jax.eval_shape(e.to_unconstrained).shape[0] for e in self.effects]
        theta = unconstrained("theta", theta, sum(sizes))
        return Chain(
            [
                e.with_unconstrained(theta[lo:hi])
                for e, lo, hi in zip(self.effects, *_bounds(sizes), strict=True)
            ],
            segment_length=self.segment_length,
        )

    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: tuple | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels_out time"] | tuple[Array, PyTree]:
        """Apply the effects to `x` `(time,)` or `(channels, time)` in order."""
        x = signal(x)
        if zi is None:
            zi = (None,) * len(self.effects)
        if not (isinstance(zi, tuple) and len(zi) == len(self.effects)):
            raise ValueError(
                f"`zi` must be a tuple of {len(self.effects)} states, one per effect "
                "(None for a stateless effect or silence)."
            )
        n = self.segment_length
        if n is None or x.shape[-1] <= n:
            y, zf = _run(self.effects, x, zi)
        else:
            y, zf = _segments(self.effects, n, x, zi)
        return output(y, zf, return_zf)


def _whole_signal(effect: AbstractEffect) -> bool:
    """Whether `effect` (or an effect of a chain in it) does not stream."""
    if isinstance(effect, Chain):
        return any(_whole_signal(e) for e in effect.effects)
    return isinstance(effect, _WHOLE_SIGNAL)


def _run(effects: tuple, x: Array, zi: tuple) -> tuple[Array, tuple]:
    """The effects in order on `x` from the states `zi`: `(y, zf)`."""
    zf = []
    for effect, state in zip(effects, zi, strict=True):
        x, state = effect(x, zi=state, return_zf=True)
        zf.append(state)
    return x, tuple(zf)


def _segments(effects: tuple, n: int, x: Array, zi: tuple) -> tuple[Array, tuple]:
    """`_run` over segments of `n` samples of `x` (longer than `n`), each
    recomputed in the backward pass (`eqx.filter_checkpoint`): the first one
    (whose final states fix the states' structure, `zi` may hold `None`s),
    a `lax.scan` over the whole segments after it, and the rest."""
    length = x.shape[-1]
    middle = (length // n - 1) * n
    run = eqx.filter_checkpoint(_run)
    y0, state = run(effects, x[..., :n], zi)
    parts = [y0]
    if middle:
        # (..., K n) -> (K, ..., n): the scan's leading axis
        xs = jnp.moveaxis(x[..., n : n + middle].reshape(*x.shape[:-1], -1, n), -2, 0)
        body = eqx.filter_checkpoint(_run, prevent_cse=False)

        def step(state, xk):
            yk, state = body(effects, xk, state)
            return state, yk

        state, ys = jax.lax.scan(step, state, xs)
        ys = jnp.moveaxis(ys, 0, -2)
        parts.append(ys.reshape(*ys.shape[:-2], middle))
    if n + middle < length:
        y1, state = run(effects, x[..., n + middle :], state)
        parts.append(y1)
    return jnp.concatenate(parts, axis=-1), state


def _bounds(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where each effect's part of a chain's vector starts and ends."""
    bounds = np.cumsum([0, *sizes])
    return bounds[:-1], bounds[1:]
