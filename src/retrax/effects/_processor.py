"""The processor interface of the effects: normalised parameters and signal layout.

Every effect is an `eqx.Module` with physical parameters (dB, milliseconds,
seconds, ratios) that lie in documented ranges, and a vector of normalised
parameters in $[0, 1]$, one entry per physical value, as a controller
network outputs them. Signals are time-last: `(time,)` for one mono signal
or `(channels, time)`.
"""

import abc
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Shaped

from .._misc import as_inexact, check_value
from ..ops._validate import check_init_range, real_array


@dataclasses.dataclass(frozen=True)
class Range:
    """The documented range `[low, high]` of one physical parameter and its
    map to a normalised value in $[0, 1]$.

    With `log=False` the map is affine, $v = l + u (h - l)$; with `log=True`
    it is affine in the logarithm, $v = l (h / l)^u$ (for frequencies and
    times, where equal steps of $u$ should be equal ratios), which needs
    $0 < l$.

    **Arguments:**

    - `low`, `high`: the ends of the range, Python numbers with `low < high`.
    - `log`: whether the map is logarithmic.
    """

    low: float
    high: float
    log: bool = False

    def __post_init__(self):
        if not (math.isfinite(self.low) and math.isfinite(self.high)):
            raise ValueError(f"A range needs finite ends, got {self!r}.")
        if not self.low < self.high:
            raise ValueError(f"A range needs `low < high`, got {self!r}.")
        if self.log and self.low <= 0:
            raise ValueError(f"A logarithmic range needs `low > 0`, got {self!r}.")

    def physical(self, u: Array) -> Array:
        """The physical value of the normalised value `u` in $[0, 1]$."""
        if self.log:
            return self.low * jnp.exp(u * math.log(self.high / self.low))
        return self.low + u * (self.high - self.low)

    def normalised(self, v: Array) -> Array:
        """The normalised value in $[0, 1]$ of the physical value `v`."""
        if self.log:
            return jnp.log(v / self.low) / math.log(self.high / self.low)
        return (v - self.low) / (self.high - self.low)

    def check_init(
        self, name: str, value: ArrayLike, shape: tuple[int, ...] = ()
    ) -> Array:
        """`value` as a float array of `shape` (by default a scalar), checked
        to lie in the range (a concrete value raises `ValueError` at once, a
        traced one at run time; a wrong shape raises `ValueError` at once)."""
        value = jnp.asarray(value, float)
        if value.shape != shape:
            what = "a scalar" if shape == () else "an array"
            raise ValueError(
                f"`{name}` must be {what} of shape {shape}, got shape {value.shape}."
            )
        return check_init_range(
            name, value, self.low, self.high, low_open=False, high_open=False
        )

    def check(self, name: str, value: ArrayLike) -> Array:
        """`value` as an array, checked to lie in the range: a concrete value
        raises `ValueError` at once, a traced one (under `jax.jit`) at run
        time. A Python number (as `eqx.tree_at` may set a field) becomes an
        array of the default float."""
        return check_init_range(
            name,
            as_inexact(name, value),
            self.low,
            self.high,
            low_open=False,
            high_open=False,
        )


def check_normalised(p: ArrayLike, size: int) -> Array:
    """`p` as a real array of shape `(size,)` whose entries lie in $[0, 1]$:
    a wrong shape raises `ValueError` at once, values outside $[0, 1]$ (or
    not finite) raise at once for Python and NumPy values and at run time for
    JAX arrays (also under `jax.jit`)."""
    shape = np.shape(p)
    if shape != (size,):
        raise ValueError(
            f"`p` must hold the {size} normalised parameters of this effect, shape "
            f"({size},), got shape {shape}. Build a batch with `eqx.filter_vmap`."
        )
    p = check_value(
        p,
        lambda xp, v: ~xp.isfinite(v) | (v < 0) | (v > 1),
        "`p` (normalised parameters) must be finite and lie in [0, 1].",
    )
    return real_array("p", p)


class AbstractEffect(eqx.Module):
    """An audio effect with physical parameters in documented ranges and an
    equivalent vector of normalised parameters in $[0, 1]$.

    Subclasses are final modules that implement:

    - `n_params`: the length `P` of the normalised vector (static);
    - `to_normalised()`: the normalised vector `(P,)` of the module's values;
    - `with_normalised(p)`: the same effect (same structure, sample rate,
      delay lengths) with the values of the normalised vector `p`;
    - `__call__(x, *, zi=None, return_zf=False)`: process a signal of shape
      `(time,)` or `(channels, time)`, with the state `zi` before the first
      sample (`None`: silence before the signal) and, with `return_zf=True`,
      `(y, zf)` where `zf` is the `zi` of the next block, so that a long
      signal processed block by block equals one call. Stateless effects
      take `zi=None` and return `zf=None`. A `zi` of the wrong shape or
      structure raises `ValueError` naming it, with the shape expected and
      the shape given; so does a signal laid out `(time, channels)` (see
      `signal`).

    Build an effect from a controller's output with the classmethod
    `from_normalised`; for a batch `(B, P)` of normalised vectors, map it:
    `eqx.filter_vmap(lambda p: Gain.from_normalised(p))(P)` is an ensemble
    of `B` effects whose leaves have a leading batch axis.
    """

    @property
    @abc.abstractmethod
    def n_params(self) -> int:
        """The number of normalised parameters."""

    @abc.abstractmethod
    def to_normalised(self) -> Float[Array, " params"]:
        """The normalised parameters `(P,)`, in $[0, 1]$."""

    @abc.abstractmethod
    def with_normalised(self, p: Shaped[ArrayLike, " params"]) -> "AbstractEffect":
        """This effect with the physical values of the normalised vector `p`
        `(P,)`; entries outside $[0, 1]$ raise an error (also under
        `jax.jit`)."""

    @abc.abstractmethod
    def __call__(
        self,
        x: Shaped[ArrayLike, "*channels time"],
        *,
        zi: PyTree | None = None,
        return_zf: bool = False,
    ) -> Float[Array, "*channels_out time"] | tuple[Array, PyTree]:
        """Process `x` of shape `(time,)` or `(channels, time)`."""

    @classmethod
    def from_normalised(
        cls, p: Shaped[ArrayLike, " params"], **options: Any
    ) -> "AbstractEffect":
        """The effect built from normalised parameters `p` `(P,)` in $[0, 1]$.

        `options` are the constructor's structural arguments (the sample
        rate, delay lengths, ...), which fix the effect's structure; the
        parameters' values come from `p` through the documented ranges.
        Works under `jax.jit` and `eqx.filter_vmap` (which builds a batch of
        effects from `(B, P)`).
        """
        return cls(**options).with_normalised(p)


class AbstractRangedEffect(AbstractEffect):
    """An effect whose parameters are fields holding physical values, one
    `Range` each (`ranges()`); its normalised vector lists them in that
    order. The fields are what `eqx.tree_at` replaces and optax trains."""

    @abc.abstractmethod
    def ranges(self) -> dict[str, Range]:
        """The documented range of each parameter, by field name, in the
        order of the normalised vector."""

    @property
    def n_params(self) -> int:
        """The number of normalised parameters."""
        return sum(np.size(getattr(self, name)) for name in self.ranges())

    def to_normalised(self) -> Float[Array, " params"]:
        """The normalised parameters `(P,)`, in $[0, 1]$; a parameter outside
        its range (moved there by `eqx.tree_at` or an optimiser) raises an
        error naming it (also under `jax.jit`)."""
        parts = [
            jnp.ravel(r.normalised(r.check(name, getattr(self, name))))
            for name, r in self.ranges().items()
        ]
        return jnp.concatenate(parts)

    def with_normalised(self, p: Shaped[ArrayLike, " params"]) -> "AbstractEffect":
        """This effect with the physical values of the normalised vector `p`
        `(P,)`; entries outside $[0, 1]$ raise an error (also under
        `jax.jit`)."""
        p = check_normalised(p, self.n_params)
        names = list(self.ranges())
        values, start = [], 0
        for name, r in self.ranges().items():
            old = getattr(self, name)
            size = int(np.size(old))
            u = p[start : start + size].reshape(np.shape(old))
            values.append(r.physical(u))
            start += size
        return eqx.tree_at(
            lambda m: [getattr(m, n) for n in names], self, values, is_leaf=None
        )

    def param(self, name: str, dtype) -> Array:
        """The parameter `name`, checked to lie in its range (also under
        `jax.jit`; `eqx.tree_at` or an optimiser may have moved it), cast to
        the signal's `dtype`."""
        return self.ranges()[name].check(name, getattr(self, name)).astype(dtype)


# More channels than this, and more than `TIME_FIRST_RATIO` times the samples,
# is audio laid out time first, `(time, channels)` (as `soundfile` reads it),
# not `(channels, time)`: no effect here is meant for hundreds of channels
# of a few samples each.
MAX_CHANNELS = 64
TIME_FIRST_RATIO = 8


def signal(x: ArrayLike) -> Array:
    """A real signal `x` of shape `(time,)` or `(channels, time)`.

    A `(channels, time)` signal with more than 64 channels and more than 8
    times as many channels as samples raises `ValueError`: it is audio laid
    out `(time, channels)`, which would otherwise run as thousands of
    channels of a few samples each (pass `x.T`). An empty signal passes."""
    x = real_array("x", x)
    if x.ndim not in (1, 2):
        raise ValueError(
            "`x` must be one mono signal of shape (time,) or a multichannel signal "
            f"of shape (channels, time), got shape {x.shape}. Batch several "
            "signals with `jax.vmap`."
        )
    if x.ndim == 2 and x.shape[1] > 0:
        channels, time = x.shape
        if channels > MAX_CHANNELS and channels > TIME_FIRST_RATIO * time:
            raise ValueError(
                "`x` must be laid out (channels, time), got shape "
                f"{x.shape}: {channels} channels of {time} samples each looks like "
                "audio laid out (time, channels), as soundfile reads it. Pass "
                "`x.T`."
            )
    return x


def stereo(x: ArrayLike) -> Array:
    """A signal for a stereo effect: `(time,)` (mono, sent to both channels)
    or `(2, time)`, returned as `(2, time)`."""
    x = signal(x)
    if x.ndim == 1:
        return jnp.stack([x, x])
    if x.shape[0] != 2:
        raise ValueError(
            "`x` must be mono (time,) or stereo (2, time) for a stereo effect, got "
            f"shape {x.shape}."
        )
    return x


def _is_shape(s: Any) -> bool:
    return isinstance(s, tuple) and all(isinstance(n, int) for n in s)


def check_state(zi: Any, shapes: Any, x: Array) -> None:
    """Raise `ValueError` unless the state `zi` (a pytree of arrays, or
    `None`) has the structure of `shapes` (a pytree of one channel's state
    shapes, tuples of ints) and each of its arrays the shape given there,
    with a leading channel axis when `x` is `(channels, time)`. The message
    names the entry of `zi`, the shape expected and the shape given."""
    if zi is None:
        return
    flat, treedef = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=_is_shape)
    paths = ["zi" + jax.tree_util.keystr(path) for path, _ in flat]
    expected = [shape for _, shape in flat]
    lead = x.shape[:-1]
    try:
        given = treedef.flatten_up_to(zi)
    except (TypeError, ValueError):
        want = jax.tree.unflatten(treedef, [lead + s for s in expected])
        raise ValueError(
            f"`zi` must be this effect's state, of shapes {want} for `x` of shape "
            f"{x.shape}, got {jax.tree.map(np.shape, zi)}."
        ) from None
    for path, shape, value in zip(paths, expected, given, strict=True):
        if value is not None and np.shape(value) != lead + shape:
            raise ValueError(
                f"`{path}` must have shape {lead + shape} for `x` of shape "
                f"{x.shape}, got shape {np.shape(value)}."
            )


def per_channel(
    mono: Callable[[Array, Any], tuple[Array, Any]],
    x: Array,
    zi: Any,
    shapes: Any,
) -> tuple[Array, Any]:
    """Apply `mono(x, zi) -> (y, zf)` (one channel `(time,)`; `zi=None` is
    silence) to `x` of shape `(time,)`, or to each row of `(channels, time)`
    with the state's leaves stacked along a leading channel axis. `shapes`
    are one channel's state shapes (see `check_state`), checked first."""
    check_state(zi, shapes, x)
    if x.ndim == 1:
        return mono(x, zi)
    return jax.vmap(mono, in_axes=(0, None if zi is None else 0))(x, zi)


def state_leaf(name: str, value: ArrayLike | None, shape: tuple, dtype) -> Array:
    """One array of an effect's state: zeros of `shape` if `value` is None,
    else `value` cast to `dtype`, whose shape must be `shape`."""
    if value is None:
        return jnp.zeros(shape, dtype)
    value = real_array(name, value)
    if value.shape != shape:
        raise ValueError(f"`{name}` must have shape {shape}, got shape {value.shape}.")
    return value.astype(dtype)


def output(y: Array, zf: Any, return_zf: bool) -> Array | tuple[Array, Any]:
    """`(y, zf)` if `return_zf`, else `y`."""
    return (y, zf) if return_zf else y


def no_state(zi: Any) -> None:
    """A stateless effect takes `zi=None`."""
    if zi is not None:
        raise ValueError("This effect has no state: pass `zi=None`.")
