r"""The diagonal and dense recursions of the recurrence core as a JAX primitive.

`linear_p` computes, for one signal (`u` of shape `(T, N)`) or a batch of
them (`(B, T, N)`, under `vmap`), with the static `structure`
`"diagonal"` ($M_t = \operatorname{diag}(a_t)$) or `"dense"` ($M_t = A_t$),

- `adjoint=False`: $h_t = M_t h_{t-1} + u_t$ with $h_{-1} = z$,
  $t = 0, \dots, T-1$;
- `adjoint=True`: the transposed recursion, run backwards in time,
  $w_s = u_s + M_{s+1}^\top w_{s+1}$ with $w_T = z$ and, for per-sample
  coefficients, $M_T = 0$ (no coefficient past the end);

with the coefficients constant (`a` of shape `(N,)` or `A` of `(N, N)`) or
per sample (`(T, N)` or `(T, N, N)`), a leading batch axis on every operand
for a batch, and the state `z` of shape `(N,)` (or `(B, N)`). The transpose
is JAX's linear one: no complex conjugation.

Its rules, as for `allpole_p` (`_allpole_primitive`):

- abstract evaluation: the output is typed as `u` (its sharding and the mesh
  axes it varies over inside `shard_map`, which `state_recurrence` makes
  the same for every operand);
- lowering: on the CPU, for float32, float64, complex64 and complex128, a
  compiled C++ loop called through the XLA FFI (`retrax._native`,
  `linear.cc`) that reads the operands in their own layout and advances
  independent chains (channels, or signals) together in SIMD lanes;
  everywhere else (other devices, or without the compiled library) the
  `lax.scan` of the same recursion (through
  `_kernel_lowering.register_lowerings`, as for `allpole_p`);
- batching: the batch goes to the kernel as its leading axis, whichever
  axis `vmap` maps (nested maps merge into one batch axis);
- JVP: the tangent is the same primitive driven by
  $\dot u_t + \dot M_t h_{t-1}$ (or its adjoint counterpart
  $\dot u_s + \dot M_{s+1}^\top w_{s+1}$), and a symbolic zero tangent of
  the coefficients skips that term, so a derivative with respect to `u`
  alone never forms the lagged states;
- transpose: the forward recursion's transpose is the adjoint one and the
  other way round, on the same kernel; the state's cotangent is
  $M_0^\top \bar w_0$ (forward) or $M_T \bar h_{T-1}$ (adjoint, constant
  coefficients; zero for per-sample ones).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from .. import _native
from ._kernel_lowering import (
    KERNEL_DTYPES,
    TANGENT_UNROLL,
    batch_in_front,
    register_lowerings,
    sharded_like,
    varying_like,
)


STRUCTURES = ("diagonal", "dense")

linear_p = Primitive("state_recurrence")


def state_recurrence(
    structure: str, a, u, zi, *, adjoint: bool = False, unroll: int = 2
):
    """Bind `linear_p` (see the module docstring)."""
    if structure not in STRUCTURES:
        raise ValueError(f"state_recurrence: unknown structure {structure!r}")
    a, u, zi = (varying_like(v, a, u, zi) for v in (a, u, zi))
    return linear_p.bind(
        a, u, zi, structure=structure, adjoint=bool(adjoint), unroll=int(unroll)
    )


def _matrix_rank(structure) -> int:
    """The rank of one step's coefficients: 1 (a diagonal) or 2 (a matrix)."""
    return 2 if structure == "dense" else 1


def _per_sample(structure, a, u) -> bool:
    return a.ndim == u.ndim - 1 + _matrix_rank(structure)


# ---------------------------------------------------------------- abstract eval


def _abstract_eval(a, u, zi, *, structure, adjoint, unroll):
    del adjoint, unroll
    rank = _matrix_rank(structure)
    batch = u.ndim - 2
    if (
        batch not in (0, 1)
        or zi.ndim != u.ndim - 1
        or a.ndim not in (batch + rank, batch + rank + 1)
    ):
        raise ValueError(
            f"state_recurrence: bad operand ranks a{a.shape}, u{u.shape}, zi{zi.shape}"
        )
    if not (a.dtype == u.dtype == zi.dtype):
        raise TypeError(
            f"state_recurrence: mixed dtypes {a.dtype}, {u.dtype}, {zi.dtype}"
        )
    return u.update(weak_type=False)


linear_p.def_abstract_eval(_abstract_eval)


# ---------------------------------------------------------------- the scan


def _step_product(structure, m, h, transpose):
    """$M h$ (or $M^\\top h$) for one step's coefficients `m`."""
    if structure == "diagonal":
        return m * h
    return h @ m if transpose else m @ h


def scan_linear(structure, a, u, zi, unroll, adjoint=False):
    """`linear_p` of one signal as a `lax.scan` (`adjoint`: the transposed
    recursion, from the last sample to the first)."""
    zi = varying_like(zi, a, u)
    if _per_sample(structure, a, u) and adjoint:
        # step s reads M_{s+1}, absent (zero) past the end
        a = jnp.concatenate([a[1:], jnp.zeros_like(a[:1])])
    if not _per_sample(structure, a, u):

        def step(h, ut):
            h = _step_product(structure, a, h, adjoint) + ut
            return h, h

        xs = u
    else:

        def step(h, inp):
            mt, ut = inp
            h = _step_product(structure, mt, h, adjoint) + ut
            return h, h

        xs = (a, u)
    _, h = lax.scan(step, zi, xs, unroll=unroll, reverse=adjoint)
    return h


def _scan(a, u, zi, *, structure, adjoint, unroll):
    """`linear_p` as a scan (per signal, `vmap`ped over a batch)."""
    run = functools.partial(scan_linear, structure, unroll=unroll, adjoint=adjoint)
    if u.ndim == 3:
        # `vmap` under an explicit mesh needs its operands' batch axes
        # sharded alike; the batching rule broadcasts unbatched ones unsharded.
        a, zi = sharded_like(a, u), sharded_like(zi, u)
        run = jax.vmap(run)
    return run(a, u, zi)


# ---------------------------------------------------------------- lowering


def _kernel_call(a, u, zi, *, structure, adjoint, unroll):
    """The compiled kernel on operands with a batch axis in front, in their
    own (row-major) layout: `u` of shape `(B, T, N)`."""
    del unroll
    call = jax.ffi.ffi_call(_native.LINEAR, jax.ShapeDtypeStruct(u.shape, u.dtype))
    return call(a, u, zi, dense=structure == "dense", adjoint=adjoint)


def _sharding_rule(ranks, *, structure, adjoint, unroll):
    del adjoint, unroll
    per_sample = ranks[0] == 2 + _matrix_rank(structure)
    dense = structure == "dense"
    a = "b" + (" t" if per_sample else "") + " n" + (" m" if dense else "")
    return f"{a}, b t n, b n -> b t n"


register_lowerings(
    linear_p,
    scan=_scan,
    kernel_call=_kernel_call,
    rule=_sharding_rule,
    kernel="linear",
    dtypes=KERNEL_DTYPES,
    signal=1,
    signal_rank=2,
)


# ---------------------------------------------------------------- batching


def _batch(args, dims, *, structure, adjoint, unroll):
    def bind(a, u, zi):
        return state_recurrence(structure, a, u, zi, adjoint=adjoint, unroll=unroll)

    return batch_in_front(bind, args, dims, signal=1, signal_rank=2)


batching.primitive_batchers[linear_p] = _batch


# ---------------------------------------------------------------- JVP


def _neighbours(out, zi, adjoint):
    """The state each step reads: $h_{t-1}$ (forward, `zi` before the start)
    or $w_{s+1}$ (adjoint, `zi` past the end), along the time axis (-2)."""
    if out.shape[-2]:
        # With an explicit mesh the operands of a concatenation must be
        # sharded alike: give the (possibly replicated) state the batch
        # sharding of the values by broadcasting it against them.
        zi = zi + jnp.zeros_like(out[..., 0, :])
    if adjoint:
        return jnp.concatenate([out[..., 1:, :], zi[..., None, :]], axis=-2)
    return jnp.concatenate([zi[..., None, :], out[..., :-1, :]], axis=-2)


def _products(structure, m, h, per_sample, transpose):
    """$M_t h_t$ (or $M_t^\\top h_t$) at every step; `h` is `(..., T, N)`."""
    if structure == "diagonal":
        return (m if per_sample else m[..., None, :]) * h
    if per_sample:
        spec = "...tji,...tj->...ti" if transpose else "...tij,...tj->...ti"
    else:
        spec = "...ji,...tj->...ti" if transpose else "...ij,...tj->...ti"
    return jnp.einsum(spec, m, h)


def _coefficient_drive(structure, dm, out, zi, adjoint):
    """The tangent's drive from the coefficients' tangent `dm`:
    $\\dot M_t h_{t-1}$ (forward) or $\\dot M_{s+1}^\\top w_{s+1}$ (adjoint)."""
    per_sample = _per_sample(structure, dm, out)
    if adjoint and per_sample:  # zero past the end: the state is not read
        drive = _products(structure, dm, out, True, True)
        return jnp.concatenate(
            [drive[..., 1:, :], jnp.zeros_like(drive[..., :1, :])], axis=-2
        )
    return _products(structure, dm, _neighbours(out, zi, adjoint), per_sample, adjoint)


def _jvp(primals, tangents, *, structure, adjoint, unroll):
    a, u, zi = primals
    da, du, dzi = tangents
    bind = functools.partial(state_recurrence, structure, adjoint=adjoint)
    out = bind(a, u, zi, unroll=unroll)
    drive = None
    if type(da) is not ad.Zero:
        drive = _coefficient_drive(structure, da, out, zi, adjoint)
    if type(du) is not ad.Zero:
        drive = du if drive is None else drive + du
    if drive is None and type(dzi) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    drive = jnp.zeros_like(u) if drive is None else drive
    dzi = jnp.zeros_like(zi) if type(dzi) is ad.Zero else dzi
    return out, bind(a, drive, dzi, unroll=TANGENT_UNROLL)


ad.primitive_jvps[linear_p] = _jvp


# ---------------------------------------------------------------- transpose


def _transpose(ct, a, u, zi, *, structure, adjoint, unroll):
    if ad.is_undefined_primal(a):
        raise NotImplementedError("state_recurrence is not linear in its coefficients")
    u_aval = u.aval if ad.is_undefined_primal(u) else jax.typeof(u)
    zi_aval = zi.aval if ad.is_undefined_primal(zi) else jax.typeof(zi)
    if type(ct) is ad.Zero:
        ct_u = ad.Zero(u_aval) if ad.is_undefined_primal(u) else None
        ct_zi = ad.Zero(zi_aval) if ad.is_undefined_primal(zi) else None
        return None, ct_u, ct_zi
    zeros = jnp.zeros(zi_aval.shape, zi_aval.dtype)
    # The forward recursion's transpose is the adjoint one, and back.
    ct_u = state_recurrence(structure, a, ct, zeros, adjoint=not adjoint, unroll=unroll)
    ct_zi = None
    if ad.is_undefined_primal(zi):
        per_sample = a.ndim == u_aval.ndim - 1 + _matrix_rank(structure)
        length = u_aval.shape[-2]
        if length == 0 or (adjoint and per_sample):  # the state is never read
            ct_zi = zeros
        elif not adjoint:  # h_0 = M_0 z + u_0: z's cotangent is M_0^T w_0
            m = a
            if per_sample:  # the coefficients of step 0
                m = lax.index_in_dim(a, 0, a.ndim - 1 - _matrix_rank(structure), False)
            ct_zi = _products(structure, m, ct_u[..., :1, :], False, True)[..., 0, :]
        else:  # w_{T-1} = u_{T-1} + M^T z: z's cotangent is M v_{T-1}
            ct_zi = _products(structure, a, ct_u[..., -1:, :], False, False)[..., 0, :]
    return None, (ct_u if ad.is_undefined_primal(u) else None), ct_zi


ad.primitive_transposes[linear_p] = _transpose
