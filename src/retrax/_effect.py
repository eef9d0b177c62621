"""The effect interface: physical parameters in ranges, normalised parameters.

Every effect is an `eqx.Module` with physical parameters (dB, milliseconds,
seconds, ratios) that lie in documented ranges, and a vector of normalised
parameters in $[0, 1]$, one entry per physical value, as a controller
network outputs them. Signals are time-last: `(time,)` for one mono signal
or `(channels, time)` (see `_signal`).

This is the shared base of `retrax.effects` and `retrax.filters` (whose
filters are effects too): both packages import it, and neither imports the
other's private modules.
"""

import abc
import dataclasses
import math
import re
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, ArrayLike, Float, PyTree, Shaped

from ._misc import as_inexact
from ._unconstrained import SATURATION, bounded, logit, unconstrained
from ._validate import check_init_range, check_value, real_array


# A key of `ranges()` for one entry of a vector field, `field[k]`.
_ENTRY = re.compile(r"(?P<field>\w+)\[(?P<index>\d+)\]")


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
        """The physical value of the normalised value `u` in $[0, 1]$, in
        `[low, high]` (rounding at the ends is clamped away)."""
        if self.log:
            v = self.low * jnp.exp(u * math.log(self.high / self.low))
        else:
            v = self.low + u * (self.high - self.low)
        return _clamp(v, self.low, self.high)

    def normalised(self, v: Array) -> Array:
        """The normalised value in $[0, 1]$ of the physical value `v` in
        `[low, high]` (rounding at the ends is clamped away, so that a value
        at an end of its range maps exactly onto 0 or 1)."""
        if self.log:
            u = jnp.log(v / self.low) / math.log(self.high / self.low)
        else:
            u = (v - self.low) / (self.high - self.low)
        return _clamp(u, 0.0, 1.0)

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


def _clamp(x: Array, low: float, high: float) -> Array:
    """`x` clamped into `[low, high]`, with derivative 1 inside and at the ends
    (only rounding puts a checked value outside)."""
    return jnp.where(x < low, low, jnp.where(x > high, high, x))


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
    - `to_unconstrained()` and `with_unconstrained(theta)`: the same for a
      vector of any real numbers, what an optimiser that knows nothing of
      ranges (optax) trains;
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
    def to_unconstrained(self) -> Float[Array, " params"]:
        """The unconstrained vector of this effect (any real vector; as long
        as the normalised one, or longer where the effect's valid region
        needs more numbers), the inverse of `with_unconstrained`."""

    @abc.abstractmethod
    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "AbstractEffect":
        """This effect built from any finite real `theta`, its parameters in
        their valid region: what an optimiser (optax) steps on."""

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
    r"""An effect whose parameters are fields holding physical values, one
    `Range` each (`ranges()`); its normalised vector lists them in that
    order. The fields are what `eqx.tree_at` replaces and optax trains.

    `ranges()` maps a field's name to the range of all its entries, or
    `field[k]` to the range of entry `k` of a vector field whose entries lie
    in ranges of their own (the sections of an `ordered=True`
    [`ParametricEQ`][retrax.filters.ParametricEQ], one frequency band each).
    Constant ranges are a class variable,
    `RANGES: ClassVar[dict[str, Range]]`, which `ranges()` returns; ranges
    that depend on a static field (the sample rate, the number of sections)
    are built by `ranges()` from it. `n_params`, `to_normalised` and
    `with_normalised` follow from `ranges()` (through the hooks
    `checked_values` and `with_values`).

    Subclasses are final modules that implement `ranges()`, `__call__` and
    the hooks `checked_values`, `with_values`, `to_unconstrained` and
    `with_unconstrained`; an effect whose fields hold just their ranges
    implements the hooks by calling this module's helpers
    (`fields_as_they_are`, `with_values_by_tree_at`, `logit_to_unconstrained`,
    `logit_with_unconstrained`), which are the defaults described below.

    To train an effect's parameters with an optimiser that knows nothing of
    ranges (optax), train its unconstrained vector: `theta =
    effect.to_unconstrained()` is any real vector, and
    `effect.with_unconstrained(theta)` inside the loss is a valid effect for
    every finite `theta`, however large the step that produced it. By
    default the vector is the logit of the normalised one, $u =
    \sigma(\theta)$ (entries clipped to $[-15, 15]$, so that $u$ stays in
    $(0, 1)$ in float32 too). The filters `SVF`, `Biquad`, `ParametricEQ` and
    `Compressor` map it onto their whole valid regions instead (a cutoff
    anywhere below Nyquist, any ratio above 1), as their docs say.
    """

    @abc.abstractmethod
    def ranges(self) -> dict[str, Range]:
        """The documented range of each parameter, by field name (or
        `field[k]`, see the class), in the order of the normalised vector."""

    def _entries(self) -> list[tuple[str, int | None, Range]]:
        """`(field, index, range)` for each key of `ranges()`, in order; the
        index is `None` for a range that covers the whole field."""
        entries = []
        for key, r in self.ranges().items():
            match = _ENTRY.fullmatch(key)
            if match is None:
                entries.append((key, None, r))
            else:
                entries.append((match["field"], int(match["index"]), r))
        return entries

    @property
    def n_params(self) -> int:
        """The number of normalised parameters."""
        return sum(
            1 if index is not None else int(np.size(getattr(self, field)))
            for field, index, _ in self._entries()
        )

    def to_normalised(self) -> Float[Array, " params"]:
        """The normalised parameters `(P,)`, in $[0, 1]$; a parameter outside
        its range (moved there by `eqx.tree_at` or an optimiser) raises an
        error naming it (also under `jax.jit`)."""
        values = self.checked_values()
        parts = []
        for field, index, r in self._entries():
            value = values[field]
            if index is not None:
                value = as_inexact(field, value)[index]
            parts.append(jnp.ravel(r.normalised(r.check(field, value))))
        return jnp.concatenate(parts)

    def with_normalised(self, p: Shaped[ArrayLike, " params"]) -> "AbstractEffect":
        """This effect with the physical values of the normalised vector `p`
        `(P,)`; entries outside $[0, 1]$ raise an error (also under
        `jax.jit`)."""
        p = check_normalised(p, self.n_params)
        values: dict[str, Any] = {}
        start = 0
        for field, index, r in self._entries():
            shape = () if index is not None else np.shape(getattr(self, field))
            size = math.prod(shape)
            u = p[start : start + size].reshape(shape)
            start += size
            if index is None:
                values[field] = r.physical(u)
            else:
                values.setdefault(field, {})[index] = r.physical(u)
        for field, value in values.items():
            if isinstance(value, dict):
                values[field] = jnp.stack([value[k] for k in sorted(value)])
        return self.with_values(values)

    @abc.abstractmethod
    def to_unconstrained(self) -> Float[Array, " params"]:
        r"""The unconstrained vector `(P,)` of this effect, the inverse of
        `with_unconstrained`. For most effects (through
        `logit_to_unconstrained`) $\operatorname{logit}(u)$ of the normalised
        vector $u$, clipped to $[-15, 15]$ (a parameter at an end of its
        range maps to $\pm 15$); a parameter outside its range raises, as
        `to_normalised` does."""

    @abc.abstractmethod
    def with_unconstrained(
        self, theta: Shaped[ArrayLike, " params"]
    ) -> "AbstractEffect":
        r"""This effect built from any finite real `theta` `(P,)`: train
        `theta` (e.g. with optax) and build the effect from it inside the
        loss, and every step gives an effect whose parameters lie in their
        valid region. For most effects (through `logit_with_unconstrained`)
        the normalised vector $\sigma(\theta)$, entries clipped to
        $[-15, 15]$ first. A wrong shape raises `ValueError`, non-finite
        entries an error (also under `jax.jit`)."""

    # The two hooks below serve effects whose fields may hold more than their
    # ranges (a filter's cutoff anywhere below Nyquist, its ranges narrower):
    # such an effect checks its own valid region first and rebuilds through
    # its constructor, which checks and types the fields as it always does.

    @abc.abstractmethod
    def checked_values(self) -> dict[str, Any]:
        """The fields that `ranges()` names, by field name, as `to_normalised`
        reads them. For most effects (through `fields_as_they_are`) the
        fields as they are (their ranges check them); an effect with a wider
        valid region returns them checked to lie in it, so that a value
        outside it raises that region's error."""

    @abc.abstractmethod
    def with_values(self, values: dict[str, Array]) -> "AbstractEffect":
        """This effect with the physical `values` (by field name) that
        `with_normalised` computed. For most effects (through
        `with_values_by_tree_at`) through `eqx.tree_at`; an effect whose
        constructor checks and types its fields builds itself through it."""

    def param(self, name: str, dtype) -> Array:
        """The parameter `name`, checked to lie in its range (also under
        `jax.jit`; `eqx.tree_at` or an optimiser may have moved it), cast to
        the signal's `dtype`."""
        return self.ranges()[name].check(name, getattr(self, name)).astype(dtype)


# The hooks of an effect whose fields hold just their ranges. Each final
# effect calls them from its own methods: the abstract class declares the
# hooks, so no final class overrides a concrete one.


def fields_as_they_are(effect: AbstractRangedEffect) -> dict[str, Any]:
    """`effect.checked_values()` of an effect whose ranges are its valid
    region: the fields that `ranges()` names, as they are (`to_normalised`
    checks them against their ranges)."""
    return {field: getattr(effect, field) for field, _, _ in effect._entries()}


def with_values_by_tree_at(
    effect: AbstractRangedEffect, values: dict[str, Array]
) -> AbstractRangedEffect:
    """`effect.with_values(values)` of an effect whose fields take any value
    of their ranges as they are: `values` placed by `eqx.tree_at`."""
    names = list(values)
    return eqx.tree_at(
        lambda m: [getattr(m, n) for n in names],
        effect,
        [values[n] for n in names],
        is_leaf=None,
    )


def logit_to_unconstrained(effect: AbstractRangedEffect) -> Float[Array, " params"]:
    r"""`effect.to_unconstrained()` by the logit: $\operatorname{logit}(u)$
    of the normalised vector $u$, clipped to $[-15, 15]$ (a parameter at an
    end of its range maps to $\pm 15$). A parameter outside its range
    raises, as `to_normalised` does."""
    u = effect.to_normalised()
    return jnp.clip(logit(u), -SATURATION, SATURATION)


def logit_with_unconstrained(
    effect: AbstractRangedEffect, theta: Shaped[ArrayLike, " params"]
) -> AbstractEffect:
    r"""`effect.with_unconstrained(theta)` by the logistic function: the
    effect with the normalised vector $\sigma(\theta)$, from any finite real
    `theta` `(P,)` (entries clipped to $[-15, 15]$ first). A wrong shape
    raises `ValueError`, non-finite entries an error (also under
    `jax.jit`)."""
    theta = unconstrained("theta", theta, effect.n_params)
    return effect.with_normalised(bounded(theta))
