"""Attack/release ballistics: a switched one-pole smoother (torchcomp)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir
from jaxtyping import Array, ArrayLike, Float, Shaped

from .._misc import as_inexact, result_dtype
from .._validate import check_in_range, check_signal
from ._ballistics_primitive import switched
from ._kernel_lowering import batch_in_front
from ._recurrence import DEFAULT_UNROLL, recurrence


def _coefficient(name: str, c, length: int) -> Array:
    c = as_inexact(name, c)
    if c.ndim > 1 or (c.ndim == 1 and c.shape[0] != length):
        raise ValueError(
            f"`{name}` must be a scalar or have one value per sample ({length},), "
            f"got shape {c.shape}."
        )
    if jnp.issubdtype(c.dtype, jnp.complexfloating):
        raise TypeError(f"`{name}` must be real, got {c.dtype}.")
    return c


def _switched(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """The values of the switched recursion: `ballistics_p` (see
    `_ballistics_primitive`). On the CPU, for float32 and float64, a compiled
    loop computes them if the build produced it (`retrax._native`): XLA's
    while loop spends several nanoseconds on each iteration of this
    inherently sequential recursion. Elsewhere, and as the fallback, a
    `lax.scan`, with the same numbers. Under `vmap` the kernel runs once on
    the whole batch, and a batch sharded over devices stays sharded.
    """
    return switched(x, at, rt, zi)


# `y`, the switched recursion's output, differentiated with its decisions
# held. `y` comes from one pass of `_switched` and is a constant to AD; the
# JVP rule reads the decisions off it (attack where `x_t < y_{t-1}`) and
# gives the derivative with respect to `x`, `at`, `rt` and `zi` as the core's
# one-pole recursion, at every order (the rule's own output is `held_p`
# again). A primitive, not a `jax.custom_jvp` whose function returns `y`:
# JAX's partial evaluation inlines a custom JVP function where it splits a
# `lax.scan` into its known and unknown parts, so inside a scan (a chain
# run in segments, a streaming loop) second derivatives lost every term of
# `y`'s own derivative (a Hessian of 0 where the true one is 28). Operands:
# `y`, `x`, `at`, `rt` of one shape `(..., T)` and `zi` of shape `(...)`.
held_p = Primitive("ballistics_held")
held_p.def_impl(lambda y, x, at, rt, zi: y)
held_p.def_abstract_eval(lambda y, x, at, rt, zi: y)
mlir.register_lowering(held_p, lambda ctx, y, x, at, rt, zi: [y])


def _held_tangent(out, x, at, rt, zi, dx, dat, drt, dzi):
    """The tangent of one signal: the one-pole recursion with the held
    decisions, `y_t = (1 - c_t) y_{t-1} + c_t x_t`, driven by
    `c_t dx_t + dc_t (x_t - y_{t-1})`."""
    prev = jnp.concatenate([zi[None], out[:-1]])
    held = x < prev
    c = jnp.where(held, at, rt)
    dc = jnp.where(held, dat, drt)
    drive = (c * dx + dc * (x - prev))[:, None]
    dy = recurrence("diagonal", DEFAULT_UNROLL, (1 - c)[:, None], drive, dzi[None])
    return dy[:, 0]


def _held_jvp(primals, tangents):
    out = held_p.bind(*primals)
    _, x, at, rt, zi = primals
    dx, dat, drt, dzi = (ad.instantiate_zeros(t) for t in tangents[1:])
    tangent = _held_tangent
    for _ in range(x.ndim - 1):  # a batch's leading axes
        tangent = jax.vmap(tangent)
    return out, tangent(out, x, at, rt, zi, dx, dat, drt, dzi)


def _held_batch(args, dims):
    # the batch in front of every operand, a broadcast one sharded as the
    # signal (with an explicit mesh, the tangent's `vmap` needs its operands
    # sharded alike), as for the switched recursion
    return batch_in_front(
        lambda *operands: held_p.bind(*operands), args, dims, signal=1, signal_rank=1
    )


ad.primitive_jvps[held_p] = _held_jvp
batching.primitive_batchers[held_p] = _held_batch


def _ballistics(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    # One pass of the switched recursion gives the values; derivatives of
    # every order run on the core with its decisions held (see `held_p`).
    y = _switched(*(lax.stop_gradient(v) for v in (x, at, rt, zi)))
    at, rt = (jnp.broadcast_to(c, x.shape) for c in (at, rt))
    return held_p.bind(y, x, at, rt, zi)


def ballistics(
    x: Shaped[ArrayLike, " time"],
    at: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    rt: Shaped[ArrayLike, ""] | Shaped[ArrayLike, " time"] | float,
    zi: Shaped[ArrayLike, ""] | float | None = None,
    *,
    return_zf: bool = False,
) -> Float[Array, " time"] | tuple[Float[Array, " time"], Float[Array, ""]]:
    r"""Attack/release one-pole smoother of dynamics processors.

    $$c_t = \begin{cases} a_t & x_t < y_{t-1} \\ r_t & \text{otherwise}
      \end{cases}, \qquad y_t = (1 - c_t)\, y_{t-1} + c_t\, x_t,$$

    the gain smoother of `torchcomp.compressor_core` (Yu et al., "Differentiable
    all-pole filters for time-varying audio systems", DAFx 2024), with the same
    argument meaning: applied to a gain, `at` acts when the gain falls
    (attack) and `rt` when it rises (release). `at` and `rt` are smoothing
    coefficients in $(0, 1]$, e.g. `retrax.dynamics.ms2coef(ms, sr)`.

    Derivatives hold the switching decisions constant (the function is
    piecewise smooth, and this is its derivative almost everywhere): the
    output is the linear recursion with decay $1 - c_t$ and input
    $c_t x_t$, run on retrax's recurrence core, so the cotangent flows
    through that time-varying one-pole backwards in time. The forward values
    are exactly those of the switched recursion: on the CPU, for float32 and
    float64, computed by a compiled loop called through the XLA FFI (see the
    FAQ; `RETRAX_DISABLE_KERNELS=1` switches it off), elsewhere by a
    `lax.scan` that gives the same numbers. Under `jax.vmap` the whole batch
    is one call of the loop, and a batch sharded over devices stays sharded.

    **Arguments:**

    - `x`: the input (e.g. a gain or level), real, shape `(T,)`.
    - `at`: attack coefficient in $(0, 1]$, a scalar or `(T,)`.
    - `rt`: release coefficient in $(0, 1]$, a scalar or `(T,)`.
    - `zi`: the previous output $y_{-1}$, a scalar. Defaults to 0.
    - `return_zf`: also return the last output, the `zi` of the next block.

    **Returns:**

    `y` of shape `(T,)`, or `(y, zf)` with the scalar `zf = y[T-1]` (`zi`
    for an empty `x`).

    `at` or `rt` outside $(0, 1]$ or non-finite raise an error (also under
    `jax.jit`); non-finite samples of `x` pass through.
    """
    x = as_inexact("x", x)
    check_signal("x", x)
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        raise TypeError(f"`x` must be real (the switch compares), got {x.dtype}.")
    length = x.shape[0]
    at = _coefficient("at", at, length)
    rt = _coefficient("rt", rt, length)
    if zi is not None:
        zi = _coefficient("zi", zi, length)
        if zi.ndim != 0:
            raise ValueError(f"`zi` must be a scalar, got shape {zi.shape}.")
    dtype = result_dtype(x, at, rt, zi)
    x = x.astype(dtype)
    at = check_in_range("at", at.astype(dtype), 0.0, 1.0, high_open=False)
    rt = check_in_range("rt", rt.astype(dtype), 0.0, 1.0, high_open=False)
    if at.ndim or rt.ndim:  # per-sample coefficients: both per sample
        at, rt = (jnp.broadcast_to(c, (length,)) for c in (at, rt))
    zi = jnp.zeros((), dtype) if zi is None else zi.astype(dtype)
    y = _ballistics(x, at, rt, zi)
    if not return_zf:
        return y
    return y, (y[-1] if length else zi)
