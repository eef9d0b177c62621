"""Batching and lowering a primitive whose kernel filters each signal of a
batch on its own.

Under `vmap` the batch goes to the kernel as one leading axis
(`batch_in_front`). XLA cannot see through a custom call that the signals are
independent, and would gather a batch sharded over devices onto every
device; `custom_partitioning` tells it so (`batch_partitioned`): the batch
axis keeps its sharding, every other axis is whole on each device, and each
device runs the kernel on its own signals. The primitives of the recurrence
core and `ballistics` share these.
"""

import jax.numpy as jnp
from jax.experimental.custom_partitioning import custom_partitioning
from jax.interpreters.mlir import ir
from jax.sharding import NamedSharding, PartitionSpec as P


def batch_in_front(bind, args, dims, *, signal: int, signal_rank: int):
    """A batching rule: the mapped axis of every operand in front (unmapped
    operands broadcast), whichever axis `vmap` maps, merged with a batch axis
    the operands had already (nested maps give the kernel one batch), then
    `bind(*args)`. Operand `signal` has `signal_rank` axes per signal."""
    size = next(x.shape[d] for x, d in zip(args, dims, strict=True) if d is not None)
    args = [
        jnp.broadcast_to(x, (size, *x.shape)) if d is None else jnp.moveaxis(x, d, 0)
        for x, d in zip(args, dims, strict=True)
    ]
    inner = args[signal].shape[1 : args[signal].ndim - signal_rank]
    if inner:
        args = [x.reshape(size * inner[0], *x.shape[2:]) for x in args]
    out = bind(*args)
    return out.reshape(size, *inner, *out.shape[1:]), 0


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
        return mesh, call, sharding(result_shape), args

    def infer(mesh, arg_shapes, result_shape):
        return shardings(mesh, arg_shapes)[0](result_shape)

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
