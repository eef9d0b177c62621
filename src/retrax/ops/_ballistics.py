"""Attack/release ballistics: a switched one-pole smoother (torchcomp)."""

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters.mlir import ir
from jax.sharding import NamedSharding, PartitionSpec as P
from jaxtyping import Array, ArrayLike, Float, Shaped

from .. import _native
from .._misc import as_inexact, result_dtype
from ._recurrence import DEFAULT_UNROLL, _varying_like, recurrence
from ._validate import check_in_range, check_signal


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


def _switched_loop(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """The switched recursion as a `lax.scan`, with torchcomp's step
    `y = (1 - c) y + c x`. Scalar coefficients stay constants of the loop, so
    the scan reads only `x`."""

    def step(y, inp):
        xt, a, r = inp if at.ndim else (inp, at, rt)
        c = jnp.where(xt < y, a, r)
        y = (1 - c) * y + c * xt
        return y, y

    xs = (x, at, rt) if at.ndim else x
    zi = _varying_like(zi, x, at, rt)  # inside shard_map, vary like the signal
    return lax.scan(step, zi, xs, unroll=DEFAULT_UNROLL)[1]


def _switched_kernel(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """The switched recursion as retrax's compiled CPU kernel (`_native`).

    `x` holds any number of signals, `(..., T)`; `at` and `rt` one value per
    signal, `(...)`, or per sample, `(..., T)`; `zi` one per signal.
    """
    # Inside shard_map the operands must vary over the same mesh axes, and the
    # result (typed like `x`) varies as they do.
    x, at, rt, zi = (_varying_like(v, x, at, rt, zi) for v in (x, at, rt, zi))
    call = jax.ffi.ffi_call(
        _native.BALLISTICS, jax.typeof(x), vmap_method="broadcast_all"
    )
    return call(x, at, rt, zi)


def _signals_loop(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """`_switched_loop` over every signal of `x`, shaped as for the kernel."""
    loop = _switched_loop
    for _ in range(x.ndim - 1):
        loop = jax.vmap(loop)
    return loop(x, at, rt, zi)


def _signals(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """The kernel on the CPU, the loop elsewhere; shapes as for the kernel."""
    return lax.platform_dependent(
        x, at, rt, zi, cpu=_switched_kernel, default=_signals_loop
    )


# The kernel, like the loop, filters each signal on its own. XLA cannot see
# that through a custom call, and would gather a sharded batch onto every
# device and return it replicated; `custom_partitioning` tells it so: every
# signal axis keeps its sharding, the time axis is whole on each device, and
# each device runs the kernel on its own signals.


def _sharding_rule(mesh, operand_types, result_types):
    del mesh, result_types
    ranks = [len(ir.RankedTensorType(t).shape) for t in operand_types]
    signals = " ".join(f"b{i}" for i in range(ranks[0] - 1))
    per_signal = [signals + (" t" if rank == ranks[0] else "") for rank in ranks]
    rule = ", ".join(per_signal) + " -> " + per_signal[0]
    return rule, {"need_replication_factors": ("t",)}


def _signal_shardings(mesh, arg_shapes):
    # The batch axes' partitions of `x`, the time axis whole, for every operand.
    x = arg_shapes[0]
    batch = (tuple(x.sharding.spec) + (None,) * x.ndim)[: x.ndim - 1]

    def sharding(a):
        return NamedSharding(mesh, P(*batch, *(None,) * (a.ndim - len(batch))))

    return sharding(x), tuple(sharding(a) for a in arg_shapes)


def _partition(mesh, arg_shapes, result_shape):
    del result_shape
    out, args = _signal_shardings(mesh, arg_shapes)
    return mesh, _signals, out, args


def _infer_sharding(mesh, arg_shapes, result_shape):
    del result_shape
    return _signal_shardings(mesh, arg_shapes)[0]


_signals_partitioned = custom_partitioning(_signals)
_signals_partitioned.def_partition(
    partition=_partition,
    infer_sharding_from_operands=_infer_sharding,
    sharding_rule=_sharding_rule,
)


@jax.custom_batching.custom_vmap
def _signals_batched(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    return _signals_partitioned(x, at, rt, zi)


@_signals_batched.def_vmap
def _signals_vmap(axis_size, in_batched, x, at, rt, zi):
    # One more signal axis in front (`custom_vmap` puts it at 0): the kernel
    # takes any number of them.
    args = (x, at, rt, zi)
    args = [
        v if batched else jnp.broadcast_to(v, (axis_size, *v.shape))
        for v, batched in zip(args, in_batched, strict=True)
    ]
    return _on_explicit_shards(_signals_batched, args), True


def _on_explicit_shards(fn, args):
    """`fn(*args)`, run by `shard_map` on each device's signals if the signal
    axes of `x = args[0]` are sharded over `Explicit` mesh axes (their
    sharding is then part of the types, and the pure-JAX loop's `vmap` needs
    every operand sharded alike)."""
    x = args[0]
    sharding = jax.typeof(x).sharding
    batch = (tuple(sharding.spec) + (None,) * x.ndim)[: x.ndim - 1]
    if all(p is None for p in batch):
        return fn(*args)
    specs = [P(*batch, *(None,) * (a.ndim - len(batch))) for a in args]
    args = [
        jax.sharding.reshard(a, NamedSharding(sharding.mesh, s))
        for a, s in zip(args, specs, strict=True)
    ]
    return jax.shard_map(
        fn, mesh=sharding.mesh, in_specs=tuple(specs), out_specs=specs[0]
    )(*args)


def _switched(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """The values of the switched recursion.

    On the CPU, for float32 and float64, a compiled loop computes them if the
    build produced it (`retrax._native`): XLA's while loop spends several
    nanoseconds on each iteration of this inherently sequential recursion.
    Elsewhere, and as the fallback, a `lax.scan`. Under `vmap` the kernel
    runs once on the whole batch, and a batch sharded over devices stays
    sharded (see `_signals_partitioned`).
    """
    if x.dtype in (jnp.float32, jnp.float64):
        if _native.available():
            return _signals_batched(x, at, rt, zi)
        _native.warn_if_missing()
    return _switched_loop(x, at, rt, zi)


@jax.custom_jvp
def _held(y: Array, x: Array, at: Array, rt: Array, zi: Array) -> Array:
    """`y`, the switched recursion's output, differentiated with its decisions
    held.

    `y` comes from one pass of `_switched` and is a constant to AD; the rule
    below reads the decisions off it (attack where `x_t < y_{t-1}`) and gives
    the derivative with respect to `x`, `at`, `rt` and `zi` as the core's
    one-pole recursion, at every order (the rule's own output is `_held`
    again).
    """
    del x, at, rt, zi
    return y


@_held.defjvp
def _held_jvp(primals, tangents):
    _, x, at, rt, zi = primals
    _, dx, dat, drt, dzi = tangents
    out = _held(*primals)
    prev = jnp.concatenate([zi[None], out[:-1]])
    held = x < prev
    c = jnp.where(held, at, rt)
    dc = jnp.where(held, dat, drt)
    # y_t = (1 - c_t) y_{t-1} + c_t x_t, so the tangent is the same one-pole
    # driven by c_t dx_t + dc_t (x_t - y_{t-1}).
    drive = (c * dx + dc * (x - prev))[:, None]
    dy = recurrence("diagonal", DEFAULT_UNROLL, (1 - c)[:, None], drive, dzi[None])
    return out, dy[:, 0]


def _ballistics(x: Array, at: Array, rt: Array, zi: Array) -> Array:
    # One pass of the switched recursion gives the values; derivatives of
    # every order run on the core with its decisions held (see `_held`).
    y = _switched(*(lax.stop_gradient(v) for v in (x, at, rt, zi)))
    return _held(y, x, at, rt, zi)


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
    `lax.scan`.

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
