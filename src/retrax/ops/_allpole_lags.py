r"""The lagged products of the all-pole recursion's derivative, as a pair of
primitives that transpose each other.

The tangent of the all-pole recursion (`_allpole_structure`) with per-sample
coefficients is the same recursion driven by

- forward: $d_t = -\sum_k \dot a_{t,k}\, y_{t-k-1}$, with $y_{-k-1} = z_k$;
- adjoint: $d_s = -\sum_k \dot a_{s+k+1,k}\, w_{s+k+1}$, zero past the end;

linear in $\dot a$ (`lag_drive_p`). Reverse mode transposes it, which gives
the coefficients' cotangent, one value per sample and lag (`lag_outer_p`):

- forward: $\bar a_{t,k} = -\bar d_t\, y_{t-k-1}$;
- adjoint: $\bar a_{t,k} = -w_t\, \bar d_{t-k-1}$, zero for $t \le k$.

Written as XLA operations, this cotangent interleaves $K$ shifted copies of a
signal along the last axis, which XLA's CPU backend compiles to a loop of
scalar index arithmetic costing more than the recursion itself; on the CPU
`lag_outer_p` runs a compiled loop instead (`allpole.cc`, for the dtypes of
the recursion's kernel). Everything else (the drive, other devices and dtypes, and
both primitives' derivatives of every order) is the XLA expression, so the
two primitives only change where the numbers are computed. The impl and
lowerings come from `_kernel_lowering` (`register_lowerings` for
`lag_outer_p`), and `lagged`, the shifted signals these products read, is
shared with the all-pole JVP for constant coefficients.

Operands: the coefficients' tangent `da` (or the cotangent produced) of
shape `(T, K)` or `(B, T, K)`, a signal (`out`, or `ct`) of shape `(T,)` or
`(B, T)`, and the state `zi` of shape `(K,)` or `(B, K)`.
"""

import functools

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching, mlir

from .. import _native
from ._kernel_lowering import (
    KERNEL_DTYPES,
    REAL_KERNEL_DTYPES,
    Kernel,
    batch_in_front,
    register_impl,
    register_lowerings,
    varying_like,
)


def lagged(values, state, k, adjoint):
    """`values` delayed by k + 1 steps (forward: $y_{t-k-1}$ with the state
    before the start) or advanced (adjoint: $w_{s+k+1}$ with the state past
    the end), along the last axis."""
    order = state.shape[-1]
    length = values.shape[-1]
    if length:
        # With an explicit mesh the operands of a concatenation must be
        # sharded alike: give the (possibly replicated) state the batch
        # sharding of the values by broadcasting it against them.
        state = state + jnp.zeros_like(values[..., :1])
    if adjoint:
        full = jnp.concatenate([values, state], axis=-1)
        return full[..., k + 1 : k + 1 + length]
    full = jnp.concatenate([state[..., ::-1], values], axis=-1)
    return full[..., order - k - 1 : order - k - 1 + length]


def _advanced(values, k):
    """`out[..., s] = values[..., s + k + 1]`, zero past the end."""
    length = values.shape[-1]
    tail = values[..., k + 1 :]
    pad = [(0, 0)] * (values.ndim - 1) + [(0, length - tail.shape[-1])]
    return jnp.pad(tail, pad)


def _drive(da, out, zi, *, adjoint):
    """$-\\sum_k \\dot a_{t,k} y_{t-k-1}$ (forward) or
    $-\\sum_k \\dot a_{s+k+1,k} w_{s+k+1}$ (adjoint), as XLA operations."""
    drive = jnp.zeros_like(out)
    for k in range(zi.shape[-1]):
        if adjoint:  # zero past the end: the state is not read
            drive = drive - _advanced(da[..., k] * out, k)
        else:
            drive = drive - da[..., k] * lagged(out, zi, k, adjoint=False)
    return drive


def _outer(ct, out, zi, *, adjoint):
    """The transpose of `_drive` in `da`, as XLA operations."""
    order = zi.shape[-1]
    if adjoint:  # -w_t ct_{t-k-1}, zero before the start
        zeros = jnp.zeros_like(zi)
        cols = [-out * lagged(ct, zeros, k, adjoint=False) for k in range(order)]
    else:
        cols = [-ct * lagged(out, zi, k, adjoint=False) for k in range(order)]
    return jnp.stack(cols, axis=-1)


# ---------------------------------------------------------------- batching


def _batch(prim, args, dims, *, adjoint):
    def bind(*args):
        return prim.bind(*args, adjoint=adjoint)

    return batch_in_front(bind, args, dims, signal=1, signal_rank=1)


_REFERENCES = {}


def _primitive(name, reference, abstract_eval):
    prim = Primitive(name)
    _REFERENCES[prim] = reference
    prim.def_abstract_eval(abstract_eval)

    def jvp(primals, tangents, *, adjoint):
        # Bilinear in the first operand and the pair (signal, state).
        first, out, zi = primals
        dfirst, dout, dzi = tangents
        value = prim.bind(first, out, zi, adjoint=adjoint)
        terms = []
        if type(dfirst) is not ad.Zero:
            terms.append(prim.bind(dfirst, out, zi, adjoint=adjoint))
        if type(dout) is not ad.Zero or type(dzi) is not ad.Zero:
            dout, dzi = (ad.instantiate_zeros(t) for t in (dout, dzi))
            terms.append(prim.bind(first, dout, dzi, adjoint=adjoint))
        if not terms:
            return value, ad.Zero.from_primal_value(value)
        return value, functools.reduce(jnp.add, terms)

    ad.primitive_jvps[prim] = jvp
    batching.primitive_batchers[prim] = functools.partial(_batch, prim)
    return prim


def _drive_abstract_eval(da, out, zi, *, adjoint):
    del da, zi, adjoint
    return out.update(weak_type=False)


def _outer_abstract_eval(ct, out, zi, *, adjoint):
    del out, adjoint
    return ct.update(shape=ct.shape + zi.shape[-1:], weak_type=False)


lag_drive_p = _primitive("allpole_lag_drive", _drive, _drive_abstract_eval)
lag_outer_p = _primitive("allpole_lag_outer", _outer, _outer_abstract_eval)
register_impl(lag_drive_p)
mlir.register_lowering(lag_drive_p, mlir.lower_fun(_drive, multiple_results=False))


def lag_drive(da, out, zi, *, adjoint: bool):
    """Bind `lag_drive_p` (see the module docstring)."""
    da, out, zi = (varying_like(v, da, out, zi) for v in (da, out, zi))
    return lag_drive_p.bind(da, out, zi, adjoint=bool(adjoint))


def lag_outer(ct, out, zi, *, adjoint: bool):
    """Bind `lag_outer_p` (see the module docstring)."""
    ct, out, zi = (varying_like(v, ct, out, zi) for v in (ct, out, zi))
    return lag_outer_p.bind(ct, out, zi, adjoint=bool(adjoint))


# ---------------------------------------------------------------- transpose


def _transpose_rule(prim, partner):
    """Transposes `prim` in its first operand by `partner`; in the others
    (as in higher orders) by transposing the XLA expression."""

    def transpose(ct, first, out, zi, *, adjoint):
        linear = [ad.is_undefined_primal(v) for v in (first, out, zi)]
        if type(ct) is ad.Zero:
            return [
                ad.Zero(v.aval) if u else None
                for v, u in zip((first, out, zi), linear, strict=True)
            ]
        if linear[0] and not any(linear[1:]):
            return [partner(ct, out, zi, adjoint=adjoint), None, None]
        if linear[0]:
            raise NotImplementedError(f"{prim.name} is bilinear, not linear")
        if prim is lag_drive_const_p and linear[1] and not linear[2]:
            # in the signal alone, the constant taps' transpose is the same
            # sum of shifted products read the other way in time (past the
            # end or before the start, zero): one fused pass over `ct`, where
            # transposing the expression gives XLA a sum of padded slices
            # that it runs at about three times the cost
            zeros = jnp.zeros_like(zi)
            return [None, lag_drive_const(first, ct, zeros, adjoint=not adjoint), None]
        reference = _REFERENCES[prim]
        avals = [v.aval for v, u in zip((out, zi), linear[1:], strict=True) if u]

        def known_first(*args):
            it = iter(args)
            full = [
                next(it) if u else v for v, u in zip((out, zi), linear[1:], strict=True)
            ]
            return reference(first, *full, adjoint=adjoint)

        cts = iter(jax.linear_transpose(known_first, *avals)(ct))
        return [None] + [next(cts) if u else None for u in linear[1:]]

    ad.primitive_transposes[prim] = transpose


_transpose_rule(lag_drive_p, lag_outer)
_transpose_rule(lag_outer_p, lag_drive)


# ---------------------------------------------------------------- the kernel


def _outer_kernel_call(ct, out, zi, *, adjoint):
    """`lag_outer_p` on the compiled kernel, for a batch `(B, T)`: it computes
    $g_{t,k} = -p_t\\, q_{t-k-1}$ with $q_{-j-1} = s_j$."""
    p, q, state = (out, ct, jnp.zeros_like(zi)) if adjoint else (ct, out, zi)
    call = jax.ffi.ffi_call(
        _native.ALLPOLE_LAGS,
        jax.ShapeDtypeStruct(ct.shape + zi.shape[-1:], ct.dtype),
    )
    return call(p, q, state)


_OUTER_KERNEL = Kernel(
    name="allpole",
    dtypes=KERNEL_DTYPES,
    call=_outer_kernel_call,
    rule=lambda ranks: "b t, b t, b k -> b t k",
    signal_rank=1,
)
register_lowerings(
    lag_outer_p, scan=_outer, kernel=lambda **params: _OUTER_KERNEL, signal=1
)


# ---------------------------------------------------------------- constant coefficients
#
# With constant coefficients (`da` of shape `(K,)`, or `(B, K)`), the drive
# is $-\sum_k \dot a_k\, y_{t-k-1}$ (`lag_drive_const_p`) and its transpose
# the coefficients' cotangent $\bar a_k = -\sum_t \bar d_t\, y_{t-k-1}$, one
# value per lag (`lag_dot_p`; adjoint: $-\sum_s \bar d_s\, w_{s+k+1}$). As
# XLA operations each lag is a reduction of shifted operands, which XLA's CPU
# backend runs as a scalar loop, a pass per lag (order 32, T = 44,100,
# float64: 1.6 ms, more than the adjoint filter; 30-60 ms for a batch of 8);
# on the CPU `lag_dot_p` is a compiled loop of vectorised dot products.


def _drive_const(da, out, zi, *, adjoint):
    """$-\\sum_k \\dot a_k y_{t-k-1}$ (forward) or $-\\sum_k \\dot a_k
    w_{s+k+1}$ (adjoint), as XLA operations."""
    drive = jnp.zeros_like(out)
    for k in range(zi.shape[-1]):
        drive = drive - da[..., k, None] * lagged(out, zi, k, adjoint)
    return drive


def _dot(ct, out, zi, *, adjoint):
    """The transpose of `_drive_const` in `da`, as XLA operations."""
    cols = [
        -jnp.sum(ct * lagged(out, zi, k, adjoint), axis=-1) for k in range(zi.shape[-1])
    ]
    return jnp.stack(cols, axis=-1)


def _dot_abstract_eval(ct, out, zi, *, adjoint):
    del out, adjoint
    return ct.update(shape=ct.shape[:-1] + zi.shape[-1:], weak_type=False)


lag_drive_const_p = _primitive(
    "allpole_lag_drive_const", _drive_const, _drive_abstract_eval
)
lag_dot_p = _primitive("allpole_lag_dot", _dot, _dot_abstract_eval)
register_impl(lag_drive_const_p)
mlir.register_lowering(
    lag_drive_const_p, mlir.lower_fun(_drive_const, multiple_results=False)
)


def lag_drive_const(da, out, zi, *, adjoint: bool):
    """Bind `lag_drive_const_p` (see above)."""
    da, out, zi = (varying_like(v, da, out, zi) for v in (da, out, zi))
    return lag_drive_const_p.bind(da, out, zi, adjoint=bool(adjoint))


def lag_dot(ct, out, zi, *, adjoint: bool):
    """Bind `lag_dot_p` (see above)."""
    ct, out, zi = (varying_like(v, ct, out, zi) for v in (ct, out, zi))
    return lag_dot_p.bind(ct, out, zi, adjoint=bool(adjoint))


_transpose_rule(lag_drive_const_p, lag_dot)
_transpose_rule(lag_dot_p, lag_drive_const)


def _dot_kernel_call(ct, out, zi, *, adjoint):
    """`lag_dot_p` on the compiled kernel, for a batch `(B, T)`: it computes
    $g_k = -\\sum_t p_t\\, q_{t-k-1}$ with $q_{-j-1} = s_j$; the adjoint's
    sums are the same, time-reversed (the state past the end)."""
    p, q = (ct[:, ::-1], out[:, ::-1]) if adjoint else (ct, out)
    call = jax.ffi.ffi_call(
        _native.ALLPOLE_LAG_DOT, jax.ShapeDtypeStruct(zi.shape, ct.dtype)
    )
    return call(p, q, zi)


_DOT_KERNEL = Kernel(
    name="allpole",
    dtypes=REAL_KERNEL_DTYPES,
    call=_dot_kernel_call,
    rule=lambda ranks: "b t, b t, b k -> b k",
    signal_rank=1,
)
register_lowerings(lag_dot_p, scan=_dot, kernel=lambda **params: _DOT_KERNEL, signal=1)
