r"""The values of the switched attack/release recursion as a JAX primitive.

`ballistics_p` computes, for one signal (`x` of shape `(T,)`) or a batch of
them (`(B, T)`, under `vmap`),

$$c_t = \begin{cases} a_t & x_t < y_{t-1} \\ r_t & \text{otherwise}
  \end{cases}, \qquad y_t = (1 - c_t)\, y_{t-1} + c_t\, x_t,
  \qquad y_{-1} = z,$$

with `at` and `rt` one value per signal (`()`, or `(B,)`) or per sample
(`(T,)`, or `(B, T)`, both alike) and the state `zi` ($z$) one per signal.

Its rules, as JAX's documentation on defining primitives describes:

- abstract evaluation: the output is typed as `x` (its sharding and the mesh
  axes it varies over inside `shard_map`, which `switched` makes the same
  for every operand);
- lowering: on the CPU, for float32 and float64, a compiled C++ loop called
  through the XLA FFI (`retrax._native`, `ballistics.cc`) that advances the
  batch's signals together in SIMD lanes, wrapped in `custom_partitioning`
  so that a batch sharded over devices stays sharded; everywhere else
  (other devices, or without the compiled library) the `lax.scan` of the
  same recursion (registered by `_kernel_lowering.register_lowerings`, the
  skeleton of the recurrence core's primitives). On the CPU both give the
  same numbers, bit for bit: the kernel rounds each step as XLA's
  optimised CPU code rounds the scan's
  `(1 - c) * y + c * x`, `fma(c, x, (1 - c) y)` (with its optimisations
  off, `jax_disable_most_optimizations`, XLA rounds the product and the sum
  apart, and the scan's last bits differ);
- batching: the batch goes to the kernel as its leading axis, whichever
  axis `vmap` maps (nested maps merge into one batch axis);
- no JVP or transpose: `retrax.ops.ballistics` binds the primitive on
  `stop_gradient`ed operands and differentiates the recursion with its
  decisions held, on the recurrence core (`_ballistics._held`);
  differentiating the primitive itself raises an error.
"""

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .. import _native
from ._kernel_lowering import (
    DEFAULT_UNROLL,
    REAL_KERNEL_DTYPES,
    Kernel,
    batch_in_front,
    register_lowerings,
    sharded_like,
    varying_like,
)


ballistics_p = Primitive("ballistics")


def switched(x, at, rt, zi):
    """Bind `ballistics_p` (see the module docstring)."""
    if not x.shape[-1]:  # nothing to compute, and no kernel call to make
        return x
    x, at, rt, zi = (varying_like(v, x, at, rt, zi) for v in (x, at, rt, zi))
    return ballistics_p.bind(x, at, rt, zi)


# ---------------------------------------------------------------- abstract eval


def _abstract_eval(x, at, rt, zi):
    signals = x.ndim - 1
    if (
        x.ndim not in (1, 2)
        or zi.ndim != signals
        or at.ndim not in (signals, x.ndim)
        or rt.ndim != at.ndim
    ):
        raise ValueError(
            f"ballistics: bad operand ranks x{x.shape}, at{at.shape}, "
            f"rt{rt.shape}, zi{zi.shape}"
        )
    if not (x.dtype == at.dtype == rt.dtype == zi.dtype):
        raise TypeError(
            f"ballistics: mixed dtypes {x.dtype}, {at.dtype}, {rt.dtype}, {zi.dtype}"
        )
    return x.update(weak_type=False)


ballistics_p.def_abstract_eval(_abstract_eval)


# ---------------------------------------------------------------- the scan


def switched_loop(x, at, rt, zi):
    """The switched recursion of one signal as a `lax.scan`, with
    torchcomp's step `y = (1 - c) y + c x`. Scalar coefficients stay
    constants of the loop, so the scan reads only `x`."""

    def step(y, inp):
        xt, a, r = inp if at.ndim else (inp, at, rt)
        c = jnp.where(xt < y, a, r)
        y = (1 - c) * y + c * xt
        return y, y

    xs = (x, at, rt) if at.ndim else x
    zi = varying_like(zi, x, at, rt)  # inside shard_map, vary like the signal
    return lax.scan(step, zi, xs, unroll=DEFAULT_UNROLL)[1]


def _scan(x, at, rt, zi):
    """`ballistics_p` as a scan (per signal, `vmap`ped over a batch)."""
    if x.ndim == 1:
        return switched_loop(x, at, rt, zi)
    # `vmap` under an explicit mesh needs its operands' batch axes sharded
    # alike; the batching rule broadcasts unbatched ones unsharded.
    at, rt, zi = (sharded_like(v, x) for v in (at, rt, zi))
    return jax.vmap(switched_loop)(x, at, rt, zi)


# ---------------------------------------------------------------- lowering


def _kernel_call(x, at, rt, zi):
    """The compiled kernel on operands with a batch axis in front, in their
    own (batch-major) layout, which the kernel reads block by block."""
    call = jax.ffi.ffi_call(_native.BALLISTICS, jax.ShapeDtypeStruct(x.shape, x.dtype))
    return call(x, at, rt, zi)


def _sharding_rule(ranks):
    coefficient = "b t" if ranks[1] == 2 else "b"
    return f"b t, {coefficient}, {coefficient}, b -> b t"


_KERNEL = Kernel(
    name="ballistics",
    dtypes=REAL_KERNEL_DTYPES,
    call=_kernel_call,
    rule=_sharding_rule,
    signal_rank=1,
)
register_lowerings(ballistics_p, scan=_scan, kernel=lambda: _KERNEL, signal=0)


# ---------------------------------------------------------------- batching


def _batch(args, dims):
    return batch_in_front(switched, args, dims, signal=0, signal_rank=1)


batching.primitive_batchers[ballistics_p] = _batch


# ---------------------------------------------------------------- no derivative


def _no_jvp(primals, tangents):
    del primals, tangents
    raise TypeError(
        "ballistics_p (the switched recursion's values) has no derivative of its "
        "own: differentiate `retrax.ops.ballistics`, which holds the switching "
        "decisions and differentiates on the recurrence core."
    )


ad.primitive_jvps[ballistics_p] = _no_jvp
