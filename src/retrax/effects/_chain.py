"""Effects in series, with the processor interface of one effect."""

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Shaped

from .._effect import AbstractEffect, check_normalised
from .._signal import output, signal
from .._unconstrained import unconstrained


class Chain(AbstractEffect):
    """Effects applied in sequence, itself an effect.

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

    The state `zi` is a tuple with one entry per effect (`None` for a
    stateless one); `return_zf=True` returns the tuple of their final
    states, so that a chain streams in blocks.
    """

    effects: tuple[AbstractEffect, ...]

    def __init__(self, effects: Sequence[AbstractEffect]):
        effects = tuple(effects)
        if not effects:
            raise ValueError("`effects` must hold at least one effect.")
        for i, effect in enumerate(effects):
            if not isinstance(effect, AbstractEffect):
                raise TypeError(
                    f"`effects[{i}]` must be an effect (a retrax.effects."
                    f"AbstractEffect), got {type(effect).__name__}."
                )
        self.effects = effects

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
            ]
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
            ]
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
        zf = []
        for effect, state in zip(self.effects, zi, strict=True):
            x, state = effect(x, zi=state, return_zf=True)
            zf.append(state)
        return output(x, tuple(zf), return_zf)


def _bounds(sizes: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where each effect's part of a chain's vector starts and ends."""
    bounds = np.cumsum([0, *sizes])
    return bounds[:-1], bounds[1:]
