"""The skeleton shared by the recurrence core's primitives and `ballistics`:
impl, lowering, batching and the helpers their rules need.

Each primitive (`_linear_primitive.linear_p` for the all-pole, diagonal and
dense recursions, the all-pole derivative's `_allpole_lags.lag_outer_p`, and
`_ballistics_primitive.ballistics_p`) supplies its own math, a `lax.scan`
and a compiled `Kernel` (for `linear_p`, one for each structure);
`register_lowerings` gives it the rest:

- impl: a call outside `jit` runs the primitive through a `jax.jit` cached
  per parameter set (`register_impl`);
- lowering: the scan everywhere, and on the CPU, for the kernel's dtypes,
  the compiled kernel if `retrax._native` has it (else a warning and the
  scan);
- batching: under `vmap` the batch goes to the kernel as one leading axis
  (`batch_in_front`). XLA cannot see through a custom call that the signals
  are independent, and would gather a batch sharded over devices onto every
  device; `custom_partitioning` tells it so (`batch_partitioned`): the batch
  axis keeps its sharding, every other axis is whole on each device, and
  each device runs the kernel on its own signals.

Partitioning the kernel needs the program's devices known while lowering,
for which JAX has only a private hook: `requires_devices_during_lowering`
is the one place retrax touches it.
"""

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax._src import dispatch as _dispatch  # no public hook for this yet
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters import mlir
from jax.interpreters.mlir import ir
from jax.sharding import NamedSharding, PartitionSpec as P

from .. import _native
from .._errors import varying_axes as _varying_axes


# Measured on a 2-core x86 CPU (order 2, T=44,100, float32): the forward scan
# is fastest at unroll 2 both unbatched and under `vmap`; the tangent scan,
# which reverse mode transposes into the adjoint filter, at unroll 1.
DEFAULT_UNROLL = 2
TANGENT_UNROLL = 1

# The dtypes the recurrence core's kernels compute (`ballistics` has its own).
KERNEL_DTYPES = tuple(
    np.dtype(t) for t in (np.float32, np.float64, np.complex64, np.complex128)
)
# The real ones: those of the kernels whose loops compare or use vector lanes
# of real numbers (the sections, the lag sums, `ballistics`).
REAL_KERNEL_DTYPES = KERNEL_DTYPES[:2]


def varying_like(init, *args):
    """`init` marked as varying over every manual mesh axis that `args` vary over.

    Inside `shard_map`, a scan's carry (and every operand of a primitive)
    must vary over the same mesh axes as its output.
    """
    want = frozenset().union(*(_varying_axes(a) for a in args))
    missing = tuple(sorted(want - _varying_axes(init)))
    return lax.pcast(init, missing, to="varying") if missing else init


def sharded_like(x, u):
    """`x` (batch axis first) with the batch sharding of the signal `u` (batch
    axis first) under an explicit mesh, by broadcasting it against zeros of
    `u`'s batch."""
    spec = jax.typeof(u).sharding.spec
    if not u.size or not spec or spec[0] is None:  # nothing to align
        return x
    zeros = jnp.zeros_like(u[(slice(None),) + (slice(None, 1),) * (u.ndim - 1)])
    return x + zeros.reshape(zeros.shape[:1] + (1,) * (x.ndim - 1))


def batch_in_front(
    bind, args, dims, *, signal: int, signal_rank: int, multiple_results=False
):
    """A batching rule: the mapped axis of every operand in front (unmapped
    operands broadcast), whichever axis `vmap` maps, merged with a batch axis
    the operands had already (nested maps give the kernel one batch), then
    `bind(*args)`. Operand `signal` has `signal_rank` axes per signal."""
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    moved = [
        None if d is None else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    # Under an explicit mesh the structures' own `vmap`s need every operand's
    # batch axis sharded alike: a broadcast one takes the signal's sharding
    # (or that of the first mapped operand, where the signal is unmapped).
    like = next(m for m in [moved[signal], *moved] if m is not None)
    args = [
        sharded_like(jnp.broadcast_to(x, (size, *x.shape)), like) if m is None else m
        for x, m in zip(args, moved, strict=True)
    ]
    inner = args[signal].shape[1 : args[signal].ndim - signal_rank]
    if inner:
        args = [x.reshape(size * inner[0], *x.shape[2:]) for x in args]
    outs = bind(*args)
    outs = [
        out.reshape(size, *inner, *out.shape[1:])
        for out in (outs if multiple_results else [outs])
    ]
    return (outs, [0] * len(outs)) if multiple_results else (outs[0], 0)


def batch_partitioned(call, rule, signal: int = 1):
    """`call` (on operands with the batch axis in front) partitioned over the
    batch, which operand `signal` is sharded as. `rule(ranks)` gives its
    Shardy rule from the operands' ranks, with the batch factor named `b`
    (for example `"b t, b t, b k -> b t k"`)."""

    def sharding_rule(mesh, operand_types, result_types):
        del mesh, result_types
        text = rule([len(ir.RankedTensorType(t).shape) for t in operand_types])
        # the factors that stay whole, in the order the rule first names them
        whole = dict.fromkeys(f for f in text.replace(",", " ").split() if f.isalpha())
        whole.pop("b", None)
        return text, {"need_replication_factors": tuple(whole)}

    def shardings(mesh, arg_shapes):
        # a sharding handed over without a mesh spec (one device's) is whole
        spec = getattr(arg_shapes[signal].sharding, "spec", ())
        batch = (tuple(spec) + (None,))[0]

        def sharding(x):
            return NamedSharding(mesh, P(batch, *(None,) * (len(x.shape) - 1)))

        return sharding, tuple(sharding(x) for x in arg_shapes)

    def partition(mesh, arg_shapes, result_shape):
        sharding, args = shardings(mesh, arg_shapes)
        return mesh, call, jax.tree.map(sharding, result_shape), args

    def infer(mesh, arg_shapes, result_shape):
        return jax.tree.map(shardings(mesh, arg_shapes)[0], result_shape)

    wrapped = custom_partitioning(call)
    wrapped.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer,
        sharding_rule=sharding_rule,
    )
    return wrapped


def partitioned_program(ctx) -> bool:
    """Whether a lowering is for a program over several devices (where a
    kernel needs its batch partitioned)."""
    axis_context = ctx.module_context.axis_context
    devices = getattr(axis_context, "num_devices", None)
    if devices is None:  # inside shard_map, or a mesh of its own
        devices = getattr(getattr(axis_context, "mesh", None), "size", 2)
    return devices > 1


def requires_devices_during_lowering(prim) -> None:
    """Tell JAX that lowering `prim` needs the program's devices known (its
    CPU lowering may partition a kernel's batch over them)."""
    _dispatch.prim_requires_devices_during_lowering.add(prim)


def register_impl(prim) -> None:
    """`prim` called outside `jit` runs through a `jax.jit` of itself, cached
    per set of parameters."""

    @functools.cache
    def compiled(**params):
        return jax.jit(lambda *args: prim.bind(*args, **params))

    prim.def_impl(lambda *args, **params: compiled(**params)(*args))


@dataclasses.dataclass(frozen=True)
class Kernel:
    """A compiled kernel that lowers a primitive on the CPU.

    **Fields:**

    - `name`: its name in `retrax._native` (`available(name)`).
    - `dtypes`: the dtypes of the primitive's signal operand it computes.
    - `call`: `call(*operands, **params)` with the primitive's parameters, the
      kernel on operands with a batch axis in front.
    - `rule`: `rule(ranks)`, the Shardy rule of `call` from the operands'
      ranks (see `batch_partitioned`).
    - `signal_rank`: the rank of one signal (without the batch axis): a call
      on one signal gets a batch of one.
    """

    name: str
    dtypes: tuple[np.dtype, ...]
    call: Callable
    rule: Callable[[list[int]], str]
    signal_rank: int


def register_lowerings(
    prim, *, scan, kernel, signal: int, cpu_scan=None, multiple_results=False
) -> None:
    """Register `prim`'s impl (`register_impl`) and lowerings.

    **Arguments:**

    - `scan`: `scan(*operands, **params)`, the primitive as XLA operations;
      its lowering on every platform.
    - `kernel`: `kernel(**params)`, the `Kernel` that lowers the primitive
      with these parameters on the CPU, for its dtypes, if `retrax._native`
      has it (else a warning and the scan).
    - `signal`: the operand whose dtype picks the kernel and whose batch
      sharding the partitioned kernel keeps.
    - `cpu_scan`: the CPU's fallback where it differs from `scan`.
    - `multiple_results`: the primitive returns a list of arrays (each with
      the batch axis in front).
    """
    register_impl(prim)

    @functools.cache
    def partitioned(**params):
        pieces = kernel(**params)

        def call(*args):  # positional only: custom_partitioning binds no keywords
            return pieces.call(*args, **params)

        return batch_partitioned(call, pieces.rule, signal=signal)

    def run_kernel(*args, partitioned_over, **params):
        pieces = kernel(**params)
        if args[signal].ndim == pieces.signal_rank:  # one signal: nothing to shard
            out = pieces.call(*(x[None] for x in args), **params)
            return [o[0] for o in out] if multiple_results else out[0]
        if partitioned_over:
            return partitioned(**params)(*args)
        return pieces.call(*args, **params)

    scan_lowering = mlir.lower_fun(scan, multiple_results=multiple_results)
    cpu_scan_lowering = (
        scan_lowering
        if cpu_scan is None
        else mlir.lower_fun(cpu_scan, multiple_results=multiple_results)
    )

    def cpu_lowering(ctx, *args, **params):
        pieces = kernel(**params)
        if ctx.avals_in[signal].dtype in pieces.dtypes:
            if _native.available(pieces.name):
                run = functools.partial(
                    run_kernel, partitioned_over=partitioned_program(ctx), **params
                )
                lowering = mlir.lower_fun(run, multiple_results=multiple_results)
                return lowering(ctx, *args)
            _native.warn_if_missing()
        return cpu_scan_lowering(ctx, *args, **params)

    mlir.register_lowering(prim, scan_lowering)
    requires_devices_during_lowering(prim)
    mlir.register_lowering(prim, cpu_lowering, platform="cpu")
