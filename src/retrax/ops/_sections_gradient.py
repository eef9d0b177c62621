r"""Reverse mode of a cascade of second-order sections in one pass.

The cascade's derivatives, written with its expansion (one FIR and one
all-pole filter per section, `_sections_structure`), are correct on every
path but cost one adjoint filter, one FIR and five shifted products per
section, each a pass over the signal: a gradient with respect to the
coefficients took 6-30 times the compiled forward pass. On the CPU, for
float32 and float64, the recurrence primitive's JVP for the `"sections"`
structure instead binds three primitives:

- `saved_p(a, u, zi)`: the cascade's output and its checkpoints, shape
  `(..., K, 2 S)`: every section's last two outputs at the start of each
  of the `K = ceil(T / BLOCK)` blocks of `BLOCK` samples, from the forward
  kernel (`sections.cc`, `SectionsSaved`), which lays them out for the
  adjoint kernel (a batch's groups of signals in vector lanes interleaved):
  only `cotangent_p` reads them, and they are in this layout only where
  both run on the kernels;
- `tangent_p(a, u, zi, ck, da, du, dzi)`: the tangent, linear in the last
  three operands (evaluated by the expansion's JVP, for forward mode);
- `cotangent_p(a, u, zi, ck, ct)`: its transpose, the kernel's one pass
  backwards in time, a block at a time (the block's section outputs first
  recomputed from its checkpoint, by the forward pass's arithmetic, so to
  the bit; a signal on its own recomputes W consecutive blocks at once, in
  the vector lanes that a batch's group of W signals takes), that takes
  every sample's cotangent through every
  section and sums the coefficients' cotangents as it goes (the all-pole
  adjoint $\lambda_t = g_t - a_1\lambda_{t+1} - a_2\lambda_{t+2}$, the
  input's cotangent $b_0\lambda_t + b_1\lambda_{t+1} + b_2\lambda_{t+2}$,
  $\bar b_k = \sum_t \lambda_t x_{t-k}$, $\bar a_k = -\sum_t \lambda_t
  y_{t-k}$, and the state's $(\lambda_0, \lambda_1)$): one value per
  coefficient, never one per sample. Its result is packed as
  `(..., T + 7 S)`: the input's cotangent, the coefficients' (`S` rows of
  5) and the state's (`2 S`).

So reverse mode stores the input, the output and `2 S` values per block
(not one signal per section, as the expansion's residuals are: a
gradient's peak memory does not grow with the number of sections) and runs
one pass forward and, backwards, one more forward a block at a time (into a
block-sized scratch that stays in the cache) and the adjoint. Elsewhere
(other devices and dtypes, without the compiled library) the three
primitives lower to the expansion (`section_outputs`, its JVP and its VJP),
and every derivative of theirs is the expansion's, so forward mode and every
higher order compose as before.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _native
from ._kernel_lowering import (
    DEFAULT_UNROLL,
    REAL_KERNEL_DTYPES,
    Kernel,
    batch_in_front,
    register_impl,
    register_lowerings,
    varying_like,
)
from ._linear_primitive import _bind
from ._sections_structure import SECTIONS, kernel_applies, section_outputs


def fused(a, u) -> bool:
    """Whether the cascade on `a`, `u` differentiates through the kernel."""
    return a.ndim == u.ndim + 1 and kernel_applies(u.dtype)


# ---------------------------------------------------------------- references


def _expand(a, u, zi):
    return SECTIONS.expand(_bind, a, u, zi, unroll=DEFAULT_UNROLL)


# Samples per block between the checkpoints of reverse mode: the adjoint
# kernel's scratch, a block of every section's outputs for a group of signals
# in vector lanes (BLOCK * S * 32 bytes; for a signal on its own, W blocks of
# its input, sections' outputs and cotangents, about BLOCK * (2 S + 1) * 32
# bytes), stays in a core's L2 cache, and the checkpoints (2 S values a block)
# are a small part of a signal.
BLOCK = 1024


def n_blocks(length: int) -> int:
    """The number of checkpointed blocks of a signal of `length` samples."""
    return -(-length // BLOCK)


def _saved_reference(a, u, zi):
    """The output and the checkpoints, laid out as the kernel lays out those
    of a signal on its own: at the start `t0` of every block, every
    section's outputs at `t0 - 1` and `t0 - 2` (zero before the start)."""
    ys = section_outputs(_bind, a, u, zi, unroll=DEFAULT_UNROLL)
    padded = jnp.pad(ys, [(0, 0)] * (ys.ndim - 1) + [(2, 0)])
    starts = np.arange(n_blocks(u.shape[-1])) * BLOCK
    # padded[..., t0 + 1] is the output at t0 - 1, padded[..., t0] at t0 - 2
    pairs = jnp.stack([padded[..., starts + 1], padded[..., starts]], axis=-1)
    checkpoints = jnp.swapaxes(pairs, -3, -2)  # (..., K, S, 2)
    return [ys[..., -1, :], checkpoints.reshape(*checkpoints.shape[:-2], -1)]


def _tangent_reference(a, u, zi, ck, da, du, dzi):
    del ck
    return jax.jvp(_expand, (a, u, zi), (da, du, dzi))[1]


def pack(ct_u, ct_a, ct_zi):
    """The cotangents as `cotangent_p` returns them."""
    flat = ct_a.reshape(*ct_a.shape[:-2], -1)
    return jnp.concatenate([ct_u, flat, ct_zi], axis=-1)


def unpack(packed, length: int, n_sections: int):
    """`pack`'s inverse: `(ct_u, ct_a, ct_zi)`."""
    ct_u = packed[..., :length]
    split = length + 5 * n_sections
    ct_a = packed[..., length:split].reshape(*packed.shape[:-1], n_sections, 5)
    return ct_u, ct_a, packed[..., split:]


def _cotangent_reference(a, u, zi, ck, ct):
    del ck
    _, vjp = jax.vjp(_expand, a, u, zi)
    ct_a, ct_u, ct_zi = vjp(ct)
    return pack(ct_u, ct_a, ct_zi)


# ---------------------------------------------------------------- primitives


def _saved_abstract_eval(a, u, zi):
    del zi
    shape = (n_blocks(u.shape[-1]), 2 * a.shape[-2])
    ck = u.update(shape=u.shape[:-1] + shape, weak_type=False)
    return [u.update(weak_type=False), ck]


def _tangent_abstract_eval(a, u, zi, ck, da, du, dzi):
    del a, zi, ck, da, du, dzi
    return u.update(weak_type=False)


def _cotangent_abstract_eval(a, u, zi, ck, ct):
    del zi, ck, ct
    length = u.shape[-1] + 7 * a.shape[-2]
    return u.update(shape=u.shape[:-1] + (length,), weak_type=False)


def _reference_jvp(prim, reference, primals, tangents):
    """A JVP through the pure-JAX reference (derivatives past the first).
    The saved outputs' tangents are the reference's layout: nothing reads
    them (`tangent_p` and `cotangent_p` differentiate their references)."""
    tangents = tuple(ad.instantiate_zeros(t) for t in tangents)
    out = prim.bind(*primals)
    return out, jax.jvp(reference, primals, tangents)[1]


def _primitive(name, reference, abstract_eval, multiple_results=False):
    prim = Primitive(name)
    prim.multiple_results = multiple_results
    prim.def_abstract_eval(abstract_eval)
    ad.primitive_jvps[prim] = functools.partial(_reference_jvp, prim, reference)

    def batch(args, dims):
        return batch_in_front(
            prim.bind,
            args,
            dims,
            signal=1,
            signal_rank=1,
            multiple_results=multiple_results,
        )

    batching.primitive_batchers[prim] = batch
    return prim


saved_p = _primitive(
    "sections_saved", _saved_reference, _saved_abstract_eval, multiple_results=True
)
tangent_p = _primitive("sections_tangent", _tangent_reference, _tangent_abstract_eval)
cotangent_p = _primitive(
    "sections_cotangent", _cotangent_reference, _cotangent_abstract_eval
)

register_impl(tangent_p)
mlir.register_lowering(
    tangent_p, mlir.lower_fun(_tangent_reference, multiple_results=False)
)


def _saved_kernel_call(a, u, zi):
    shape = (u.shape[0], n_blocks(u.shape[1]), 2 * a.shape[1])
    ck = jax.ShapeDtypeStruct(shape, u.dtype)
    y = jax.ShapeDtypeStruct(u.shape, u.dtype)
    call = jax.ffi.ffi_call(_native.SECTIONS_SAVED, (y, ck))
    return call(a, u, zi, block=np.int64(BLOCK))


def _cotangent_kernel_call(a, u, zi, ck, ct):
    out = jax.ShapeDtypeStruct((u.shape[0], u.shape[1] + 7 * a.shape[1]), u.dtype)
    call = jax.ffi.ffi_call(_native.SECTIONS_ADJOINT, out)
    return call(a, u, zi, ck, ct, block=np.int64(BLOCK))


def _register(prim, reference, call, rule):
    kernel = Kernel(
        name="allpole", dtypes=REAL_KERNEL_DTYPES, call=call, rule=rule, signal_rank=1
    )
    register_lowerings(
        prim,
        scan=reference,
        kernel=lambda: kernel,
        signal=1,
        multiple_results=prim.multiple_results,
    )


_register(
    saved_p,
    _saved_reference,
    _saved_kernel_call,
    lambda r: "b s c, b t, b k -> b t, b m k",
)
_register(
    cotangent_p,
    _cotangent_reference,
    _cotangent_kernel_call,
    lambda r: "b s c, b t, b k, b m k, b t -> b o",
)


def _tangent_transpose(ct, a, u, zi, ck, da, du, dzi):
    if any(ad.is_undefined_primal(v) for v in (a, u, zi, ck)):
        raise NotImplementedError("sections_tangent is linear in its tangents only")
    linear = [ad.is_undefined_primal(v) for v in (da, du, dzi)]
    if type(ct) is ad.Zero:
        cts = [
            ad.Zero(v.aval) if d else None
            for v, d in zip((da, du, dzi), linear, strict=True)
        ]
        return [None] * 4 + cts
    operands = (a, u, zi, ck, ct)
    operands = tuple(varying_like(v, *operands) for v in operands)
    packed = cotangent_p.bind(*operands)
    ct_u, ct_a, ct_zi = unpack(packed, u.shape[-1], a.shape[-2])
    cts = (ct_a, ct_u, ct_zi)
    return [None] * 4 + [c if d else None for c, d in zip(cts, linear, strict=True)]


ad.primitive_transposes[tangent_p] = _tangent_transpose


def jvp(primals, tangents):
    """The `"sections"` structure's JVP through the kernel (see the module
    docstring); `fused(a, u)` must hold."""
    a, u, zi = (varying_like(v, *primals) for v in primals)
    out, ck = saved_p.bind(a, u, zi)
    if all(type(t) is ad.Zero for t in tangents):
        return out, ad.Zero.from_primal_value(out)
    da, du, dzi = (ad.instantiate_zeros(t) for t in tangents)
    return out, tangent_p.bind(a, u, zi, ck, da, du, dzi)
