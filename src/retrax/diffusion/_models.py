"""Small noise-prediction networks for low-dimensional factors."""

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
from jax.typing import DTypeLike
from jaxtyping import Array, ArrayLike, Float, PRNGKeyArray

from .._validate import check_positive_int


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

    - `in_size`: the dimension `n` of `x`.
    - `out_size`: the output size, `in_size` by default (a noise prediction);
      `1` for the energy of an [`retrax.diffusion.EnergyNetwork`][].
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
        out_size: int | None = None,
        hidden: int = 64,
        depth: int = 2,
        embedding: TimeEmbedding | None = None,
        activation: Callable[[Array], Array] = jax.nn.swish,
        dtype: DTypeLike | None = None,
        key: PRNGKeyArray,
    ):
        check_positive_int("in_size", in_size)
        out_size = in_size if out_size is None else out_size
        check_positive_int("out_size", out_size)
        check_positive_int("hidden", hidden)
        check_positive_int("depth", depth)
        self.embedding = TimeEmbedding() if embedding is None else embedding
        sizes = [in_size + self.embedding.size] + [hidden] * depth + [out_size]
        keys = jax.random.split(key, len(sizes) - 1)
        self.layers = tuple(
            eqx.nn.Linear(a, b, dtype=dtype, key=k)
            for a, b, k in zip(sizes[:-1], sizes[1:], keys, strict=True)
        )
        self.activation = activation

    def __call__(
        self, x: Float[Array, " n"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, " out"]:
        """Predict the noise of one example.

        **Arguments:**

        - `x`: the noisy coordinates, shape `(n,)`.
        - `t`: the scalar diffusion time.

        **Returns:**

        The output, shape `(out_size,)`: the predicted noise by default.
        """
        h = jnp.concatenate([x, self.embedding(jnp.asarray(t).astype(x.dtype))])
        for layer in self.layers[:-1]:
            h = self.activation(layer(h))
        return self.layers[-1](h)


class FiLMResidualMLP(eqx.Module):
    r"""A residual MLP whose blocks are modulated by the time (FiLM).

    $h_0 = W_{\mathrm{in}} x$; each block adds
    $W_2\,\phi((1 + \gamma(t)) \odot W_1 \phi(\mathrm{LN}(h)) + \beta(t))$,
    with $(\gamma, \beta)$ a linear map of the sinusoidal time embedding
    (feature-wise linear modulation, Perez et al., AAAI 2018); the output
    layer maps back to `in_size`. The last layer of every block starts at
    zero, so an untrained network is a near-linear map of `x`.

    **Arguments:**

    - `in_size`: the dimension `n` of `x` and of the output.
    - `hidden`: the width of the residual stream.
    - `blocks`: the number of residual blocks.
    - `embedding`: the time embedding.
    - `activation`: the nonlinearity.
    - `dtype`: the parameters' dtype; JAX's default float by default.
    - `key`: a PRNG key for the initialisation.
    """

    embedding: TimeEmbedding
    inp: eqx.nn.Linear
    norms: tuple[eqx.nn.LayerNorm, ...]
    films: tuple[eqx.nn.Linear, ...]
    first: tuple[eqx.nn.Linear, ...]
    second: tuple[eqx.nn.Linear, ...]
    out: eqx.nn.Linear
    activation: Callable[[Array], Array]

    def __init__(
        self,
        in_size: int,
        *,
        hidden: int = 64,
        blocks: int = 2,
        embedding: TimeEmbedding | None = None,
        activation: Callable[[Array], Array] = jax.nn.swish,
        dtype: DTypeLike | None = None,
        key: PRNGKeyArray,
    ):
        check_positive_int("in_size", in_size)
        check_positive_int("hidden", hidden)
        check_positive_int("blocks", blocks)
        self.embedding = TimeEmbedding() if embedding is None else embedding
        k_in, k_out, *ks = jax.random.split(key, 2 + 3 * blocks)
        self.inp = eqx.nn.Linear(in_size, hidden, dtype=dtype, key=k_in)
        self.norms = tuple(eqx.nn.LayerNorm(hidden, dtype=dtype) for _ in range(blocks))
        emb = self.embedding.size
        self.films = tuple(
            eqx.nn.Linear(emb, 2 * hidden, dtype=dtype, key=k) for k in ks[0::3]
        )
        self.first = tuple(
            eqx.nn.Linear(hidden, hidden, dtype=dtype, key=k) for k in ks[1::3]
        )
        second = []
        for k in ks[2::3]:
            lin = eqx.nn.Linear(hidden, hidden, dtype=dtype, key=k)
            second.append(
                eqx.tree_at(lambda m: m.weight, lin, jnp.zeros_like(lin.weight))
            )
        self.second = tuple(second)
        self.out = eqx.nn.Linear(hidden, in_size, dtype=dtype, key=k_out)
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
        emb = self.embedding(jnp.asarray(t).astype(x.dtype))
        h = self.inp(x)
        for norm, film, first, second in zip(
            self.norms, self.films, self.first, self.second, strict=True
        ):
            gamma, beta = jnp.split(film(emb), 2)
            z = first(self.activation(norm(h)))
            h = h + second(self.activation((1 + gamma) * z + beta))
        return self.out(self.activation(h))


class ChannelTransformer(eqx.Module):
    r"""A small transformer whose tokens are the channels of one factor.

    Each coordinate $x_i$ becomes a token $x_i w + b + c_i + P e(t)$ (a
    learned per-channel embedding $c_i$ and a projection of the time
    embedding), then pre-norm transformer layers (self-attention over the
    channels and a per-token MLP, Vaswani et al. 2017) and a per-token linear
    read-out give $\hat\epsilon_i$. Attention lets the network model
    couplings between channels without a dense layer over all of them.

    **Arguments:**

    - `channels`: the number of coordinates `n`.
    - `width`: the token width.
    - `heads`: attention heads (must divide `width`).
    - `layers`: transformer layers.
    - `embedding`: the time embedding.
    - `dtype`: the parameters' dtype; JAX's default float by default.
    - `key`: a PRNG key for the initialisation.
    """

    embedding: TimeEmbedding
    value_in: eqx.nn.Linear
    channel_embedding: Float[Array, "channels width"]
    time_in: eqx.nn.Linear
    attn_norms: tuple[eqx.nn.LayerNorm, ...]
    attentions: tuple[eqx.nn.MultiheadAttention, ...]
    mlp_norms: tuple[eqx.nn.LayerNorm, ...]
    mlps: tuple[eqx.nn.MLP, ...]
    out_norm: eqx.nn.LayerNorm
    read_out: eqx.nn.Linear

    def __init__(
        self,
        channels: int,
        *,
        width: int = 32,
        heads: int = 2,
        layers: int = 2,
        embedding: TimeEmbedding | None = None,
        dtype: DTypeLike | None = None,
        key: PRNGKeyArray,
    ):
        check_positive_int("channels", channels)
        check_positive_int("width", width)
        check_positive_int("heads", heads)
        check_positive_int("layers", layers)
        if width % heads != 0:
            raise ValueError(
                f"`heads` must divide `width`: got width={width}, heads={heads}."
            )
        dtype = jnp.result_type(float) if dtype is None else dtype
        self.embedding = TimeEmbedding() if embedding is None else embedding
        k_v, k_c, k_t, k_o, *ks = jax.random.split(key, 4 + 2 * layers)
        self.value_in = eqx.nn.Linear("scalar", width, dtype=dtype, key=k_v)
        self.channel_embedding = 0.1 * jax.random.normal(k_c, (channels, width), dtype)
        self.time_in = eqx.nn.Linear(self.embedding.size, width, dtype=dtype, key=k_t)
        self.attn_norms = tuple(
            eqx.nn.LayerNorm(width, dtype=dtype) for _ in range(layers)
        )
        self.attentions = tuple(
            eqx.nn.MultiheadAttention(heads, width, dtype=dtype, key=k)
            for k in ks[0::2]
        )
        self.mlp_norms = tuple(
            eqx.nn.LayerNorm(width, dtype=dtype) for _ in range(layers)
        )
        self.mlps = tuple(
            eqx.nn.MLP(
                width, width, 2 * width, 1, activation=jax.nn.gelu, dtype=dtype, key=k
            )
            for k in ks[1::2]
        )
        self.out_norm = eqx.nn.LayerNorm(width, dtype=dtype)
        self.read_out = eqx.nn.Linear(width, "scalar", dtype=dtype, key=k_o)

    def __call__(
        self, x: Float[Array, " channels"], t: Float[ArrayLike, ""] | float
    ) -> Float[Array, " channels"]:
        """Predict the noise of one example.

        **Arguments:**

        - `x`: the noisy coordinates, shape `(channels,)`.
        - `t`: the scalar diffusion time.

        **Returns:**

        The predicted noise, shape `(channels,)`.
        """
        if x.shape != self.channel_embedding.shape[:1]:
            raise ValueError(
                f"`x` must have shape ({self.channel_embedding.shape[0]},), one "
                f"value per channel, got shape {x.shape}."
            )
        emb = self.time_in(self.embedding(jnp.asarray(t).astype(x.dtype)))
        h = jax.vmap(self.value_in)(x) + self.channel_embedding + emb
        for attn_norm, attn, mlp_norm, mlp in zip(
            self.attn_norms, self.attentions, self.mlp_norms, self.mlps, strict=True
        ):
            z = jax.vmap(attn_norm)(h)
            h = h + attn(z, z, z)
            h = h + jax.vmap(mlp)(jax.vmap(mlp_norm)(h))
        return jax.vmap(lambda v: self.read_out(self.out_norm(v)))(h)
