"""Small noise-prediction networks for low-dimensional factors."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray


def _check_size(name: str, value: int) -> None:
    if not (isinstance(value, int) and value >= 1):
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")


class TimeEmbedding(eqx.Module):
    r"""Sinusoidal features of the diffusion time.

    $e(t) = [\sin(2\pi t f_1), \dots, \sin(2\pi t f_k), \cos(2\pi t f_1),
    \dots, \cos(2\pi t f_k)]$ (the Fourier features of Vaswani et al. 2017 and
    Ho et al. 2020, at fixed frequencies). The frequencies are a tuple of
    Python floats, not an array, so training does not move them.

    **Arguments:**

    - `frequencies`: the frequencies $f$, in cycles per unit time.
    """

    frequencies: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0)

    def __check_init__(self):
        if len(self.frequencies) == 0:
            raise ValueError("`frequencies` must hold at least one frequency.")

    @property
    def size(self) -> int:
        """The number of features, twice the number of frequencies."""
        return 2 * len(self.frequencies)

    def __call__(self, t: Float[ArrayLike, ""] | float) -> Float[Array, " features"]:
        """Embed one scalar time.

        **Arguments:**

        - `t`: the scalar diffusion time.

        **Returns:**

        The `2 k` features, typed like `t`.
        """
        t = jnp.asarray(t)
        if not jnp.issubdtype(t.dtype, jnp.floating):
            t = t.astype(jnp.result_type(float))
        f = jnp.asarray(self.frequencies, dtype=t.dtype)
        phase = (2 * jnp.pi) * t * f
        return jnp.concatenate([jnp.sin(phase), jnp.cos(phase)])


class TimeMLP(eqx.Module):
    r"""An MLP on the coordinates and a sinusoidal time embedding.

    $\hat\epsilon = W_L \phi(\dots \phi(W_1 [x, e(t)] + b_1) \dots) + b_L$.
    With the defaults and `in_size=2` this is the circle model of
    VariationalDiffusion.jl: `Dense(12 -> 64, swish)`, `Dense(64 -> 64, swish)`,
    `Dense(64 -> 2)` on `[x, sin(2 pi t f), cos(2 pi t f)]`,
    `f = [0.5, 1, 2, 4, 8]`, 5,122 parameters.

    **Arguments:**

    - `in_size`: the dimension `n` of `x` (and of the output).
    - `hidden`: the width of the hidden layers.
    - `depth`: the number of hidden layers.
    - `embedding`: the time embedding.
    - `activation`: the hidden nonlinearity.
    - `dtype`: the parameters' dtype; JAX's default float by default.
    - `key`: a PRNG key for the initialisation.
    """

    embedding: TimeEmbedding
    layers: tuple[eqx.nn.Linear, ...]
    activation: Callable[[Array], Array]

    def __init__(
        self,
        in_size: int,
        *,
        hidden: int = 64,
        depth: int = 2,
        embedding: TimeEmbedding | None = None,
        activation: Callable[[Array], Array] = jax.nn.swish,
        dtype: DTypeLike | None = None,
        key: PRNGKeyArray,
    ):
        _check_size("in_size", in_size)
        _check_size("hidden", hidden)
        _check_size("depth", depth)
        self.embedding = TimeEmbedding() if embedding is None else embedding
        sizes = [in_size + self.embedding.size] + [hidden] * depth + [in_size]
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            eqx.nn.Linear(a, b, dtype=dtype, key=k)
            for a, b, k in zip(sizes[:-1], sizes[1:], keys, strict=True)
        )
        self.activation = activation

    def __call__(
        self, x: Float[Array, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, " n"]:
        """Predict the noise of one example.

        **Arguments:**

        - `x`: the noisy coordinates, shape `(n,)`.
        - `t`: the scalar diffusion time.

        **Returns:**

        The predicted noise, shape `(n,)`.
        """
        h = jnp.concatenate([x, self.embedding(jnp.asarray(t).astype(x.dtype))])
        for layer in self.layers[:-1]:
            h = self.activation(layer(h))
        return self.layers[-1](h)
