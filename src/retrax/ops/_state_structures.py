r"""The diagonal and dense structures of the recurrence primitive
(`_linear_primitive`).

With `structure` `"diagonal"` ($M_t = \operatorname{diag}(a_t)$) or
`"dense"` ($M_t = A_t$), `linear_p` computes, for one signal (`u` of shape
`(T, N)`) or a batch of them (`(B, T, N)`, under `vmap`),

- `adjoint=False`: $h_t = M_t h_{t-1} + u_t$ with $h_{-1} = z$,
  $t = 0, \dots, T-1$;
- `adjoint=True`: the transposed recursion, run backwards in time,
  $w_s = u_s + M_{s+1}^\top w_{s+1}$ with $w_T = z$ and, for per-sample
  coefficients, $M_T = 0$ (no coefficient past the end);

with the coefficients constant (`a` of shape `(N,)` or `A` of `(N, N)`) or
per sample (`(T, N)` or `(T, N, N)`), a leading batch axis on every operand
for a batch, and the state `z` of shape `(N,)` (or `(B, N)`). The transpose
is JAX's linear one: no complex conjugation.

Their pieces (`DIAGONAL` and `DENSE`, see `_structure.Structure`):

- the kernel: on the CPU, for float32, float64, complex64 and complex128, a
  compiled C++ loop called through the XLA FFI (`retrax._native`,
  `linear.cc`) that reads the operands in their own layout and advances
  independent chains (channels, or signals) together in SIMD lanes;
  everywhere else (other devices, or without the compiled library) the
  `lax.scan` of the same recursion;
- the JVP's drive: $\dot M_t h_{t-1}$ (or its adjoint counterpart
  $\dot M_{s+1}^\top w_{s+1}$);
- the transpose's state cotangent: $M_0^\top \bar w_0$ (forward) or
  $M_T \bar h_{T-1}$ (adjoint, constant coefficients; zero for per-sample
  ones).
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from .. import _native
from ._kernel_lowering import KERNEL_DTYPES, Kernel, sharded_like, varying_like
from ._structure import Structure


def _matrix_rank(structure) -> int:
    """The rank of one step's coefficients: 1 (a diagonal) or 2 (a matrix)."""
    return 2 if structure == "dense" else 1


def _per_sample(structure, a, u) -> bool:
    return a.ndim == u.ndim - 1 + _matrix_rank(structure)


# ---------------------------------------------------------------- the scan


def _step_product(structure, m, h, transpose):
    """$M h$ (or $M^\\top h$) for one step's coefficients `m`."""
    if structure == "diagonal":
        return m * h
    return h @ m if transpose else m @ h


def scan_linear(structure, a, u, zi, unroll, adjoint=False):
    """The recursion of one signal as a `lax.scan` (`adjoint`: the transposed
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


def _scan(structure, a, u, zi, *, adjoint, unroll):
    """The recursion as a scan (per signal, `vmap`ped over a batch)."""
    run = functools.partial(scan_linear, structure, unroll=unroll, adjoint=adjoint)
    if u.ndim == 3:
        # `vmap` under an explicit mesh needs its operands' batch axes
        # sharded alike; the batching rule broadcasts unbatched ones unsharded.
        a, zi = sharded_like(a, u), sharded_like(zi, u)
        run = jax.vmap(run)
    return run(a, u, zi)


# ---------------------------------------------------------------- the kernel


def _kernel_call(a, u, zi, *, structure, adjoint, unroll, time_major):
    """The compiled kernel on operands with a batch axis in front, in their
    own (row-major) layout: `u` of shape `(B, T, N)`."""
    del unroll, time_major
    call = jax.ffi.ffi_call(_native.LINEAR, jax.ShapeDtypeStruct(u.shape, u.dtype))
    return call(a, u, zi, dense=structure == "dense", adjoint=adjoint)


def _sharding_rule(structure, ranks):
    per_sample = ranks[0] == 2 + _matrix_rank(structure)
    dense = structure == "dense"
    a = "b" + (" t" if per_sample else "") + " n" + (" m" if dense else "")
    return f"{a}, b t n, b n -> b t n"


# ---------------------------------------------------------------- JVP and transpose


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


def _state_cotangent(structure, a, ct_u, zeros, *, adjoint, per_sample):
    if ct_u.shape[-2] == 0 or (adjoint and per_sample):  # the state is never read
        return zeros
    if not adjoint:  # h_0 = M_0 z + u_0: z's cotangent is M_0^T w_0
        m = a
        if per_sample:  # the coefficients of step 0
            m = lax.index_in_dim(a, 0, a.ndim - 1 - _matrix_rank(structure), False)
        return _products(structure, m, ct_u[..., :1, :], False, True)[..., 0, :]
    # w_{T-1} = u_{T-1} + M^T z: z's cotangent is M v_{T-1}
    return _products(structure, a, ct_u[..., -1:, :], False, False)[..., 0, :]


def _structure(structure: str) -> Structure:
    return Structure(
        name="state_recurrence",
        signal_rank=2,
        step_rank=_matrix_rank(structure),
        scan=functools.partial(_scan, structure),
        kernel=Kernel(
            name="linear",
            dtypes=KERNEL_DTYPES,
            call=_kernel_call,
            rule=functools.partial(_sharding_rule, structure),
            signal_rank=2,
        ),
        coefficient_drive=functools.partial(_coefficient_drive, structure),
        state_cotangent=functools.partial(_state_cotangent, structure),
    )


DIAGONAL = _structure("diagonal")
DENSE = _structure("dense")
