r"""The linear recursions of the recurrence core as one JAX primitive.

`linear_p` runs a linear recursion forward in time (`adjoint=False`) or its
transpose backwards in time (`adjoint=True`), for one signal or a batch of
them (a leading batch axis on every operand, under `vmap`), with the static
`structure`:

- `"allpole"`: $y_t = u_t - \sum_k a_{t,k}\, y_{t-k-1}$, the state the last
  $K$ outputs (`_allpole_structure`);
- `"diagonal"` and `"dense"`: $h_t = M_t h_{t-1} + u_t$ with
  $M_t = \operatorname{diag}(a_t)$ or $A_t$ (`_state_structures`);
- `"sections"` and `"sections_state"`: a cascade of second-order sections
  in scipy's transposed direct form II (`_sections_structure`), forward
  only, written with the all-pole structure (its `expand`) and run by its
  own kernel in one pass;

with coefficients constant or per sample. `allpole_recurrence`,
`state_recurrence` and `sections_recurrence` bind it. What differs between
structures (the scan, the compiled kernel, the JVP's coefficient drive, the
transpose's state cotangent, the operands' ranks) is a table of `_structure.Structure`s
(`STRUCTURES`); its rules, as JAX's documentation on defining primitives
describes, are written once:

- abstract evaluation: the output is typed as `u` (its sharding and the mesh
  axes it varies over inside `shard_map`, which the binders make the same
  for every operand), the final state's length longer where the structure
  appends it;
- impl and lowering (`_kernel_lowering.register_lowerings`): on the CPU,
  for the structure's kernel dtypes, its compiled C++ loop called through
  the XLA FFI (`retrax._native`), partitioned over a sharded batch;
  everywhere else (other devices, or without the compiled library) the
  structure's `lax.scan` of the same recursion;
- batching: the batch goes to the kernel as its leading axis, whichever
  axis `vmap` maps (nested maps merge into one batch axis);
- JVP: the tangent is the same primitive driven by $\dot u$ plus the
  structure's coefficient drive ($-\sum_k \dot a_{t,k} y_{t-k-1}$,
  $\dot M_t h_{t-1}$, or their adjoint counterparts), and a symbolic zero
  tangent of the coefficients skips that term, so a derivative with respect
  to `u` alone never forms the lagged outputs or states; a structure that
  composes others (`expand`) has its expansion's JVP;
- transpose: the forward recursion's transpose is the adjoint one and the
  other way round, on the same kernel; the state's cotangent is the
  structure's read-out of the first (or last) cotangents.

So reverse mode runs one adjoint recursion backwards in time and stores the
coefficients and the output, and forward mode, reverse mode and every higher
order compose without unrolling the loop.
"""

import jax
import jax.numpy as jnp
from jax.extend.core import Primitive
from jax.interpreters import ad, batching

from ._allpole_structure import ALLPOLE
from ._kernel_lowering import (
    DEFAULT_UNROLL,
    TANGENT_UNROLL,
    batch_in_front,
    register_lowerings,
    varying_like,
)
from ._sections_structure import SECTIONS, SECTIONS_STATE
from ._state_structures import DENSE, DIAGONAL


STRUCTURES = {
    "allpole": ALLPOLE,
    "diagonal": DIAGONAL,
    "dense": DENSE,
    "sections": SECTIONS,
    "sections_state": SECTIONS_STATE,
}

linear_p = Primitive("recurrence")


def _bind(
    structure: str, a, u, zi, *, adjoint: bool, unroll: int, time_major: bool = False
):
    a, u, zi = (varying_like(v, a, u, zi) for v in (a, u, zi))
    return linear_p.bind(
        a,
        u,
        zi,
        structure=structure,
        adjoint=bool(adjoint),
        unroll=int(unroll),
        time_major=bool(time_major),
    )


def allpole_recurrence(
    a, u, zi, *, adjoint: bool = False, unroll: int = DEFAULT_UNROLL
):
    """Bind `linear_p` with the all-pole structure (see the module
    docstring); order 0 is the identity."""
    if zi.shape[-1] == 0:
        return u
    return _bind("allpole", a, u, zi, adjoint=adjoint, unroll=unroll)


def state_recurrence(
    structure: str, a, u, zi, *, adjoint: bool = False, unroll: int = DEFAULT_UNROLL
):
    """Bind `linear_p` with the `"diagonal"` or `"dense"` structure (see the
    module docstring)."""
    if structure not in ("diagonal", "dense"):
        raise ValueError(f"state_recurrence: unknown structure {structure!r}")
    return _bind(structure, a, u, zi, adjoint=adjoint, unroll=unroll)


def sections_recurrence(
    a, u, zi, *, final_state: bool = False, unroll: int = DEFAULT_UNROLL
):
    """Bind `linear_p` with the `"sections"` structure, or with
    `final_state` the `"sections_state"` one (see the module docstring):
    `a` of shape `(S, 5)`, `zi` of `(2 S,)`."""
    structure = "sections_state" if final_state else "sections"
    return _bind(structure, a, u, zi, adjoint=False, unroll=unroll)


# ---------------------------------------------------------------- abstract eval


def _abstract_eval(a, u, zi, *, structure, adjoint, unroll, time_major):
    del adjoint, unroll, time_major
    pieces = STRUCTURES[structure]
    batch = u.ndim - pieces.signal_rank
    if (
        batch not in (0, 1)
        or zi.ndim != batch + 1
        or a.ndim not in (batch + pieces.step_rank, batch + pieces.step_rank + 1)
    ):
        raise ValueError(
            f"{pieces.name}: bad operand ranks a{a.shape}, u{u.shape}, zi{zi.shape}"
        )
    if not (a.dtype == u.dtype == zi.dtype):
        raise TypeError(f"{pieces.name}: mixed dtypes {a.dtype}, {u.dtype}, {zi.dtype}")
    if pieces.state_appended:
        shape = u.shape[:-1] + (u.shape[-1] + zi.shape[-1],)
        return u.update(shape=shape, weak_type=False)
    return u.update(weak_type=False)


linear_p.def_abstract_eval(_abstract_eval)


# ---------------------------------------------------------------- impl and lowering


def _expanded(pieces, a, u, zi, *, adjoint, unroll):
    """A composed structure's recursion as its expansion."""
    if adjoint:
        raise NotImplementedError(f"{pieces.name} runs forward only")
    return pieces.expand(_bind, a, u, zi, unroll=unroll)


def _scan(a, u, zi, *, structure, adjoint, unroll, time_major):
    del time_major
    pieces = STRUCTURES[structure]
    if pieces.expand is not None:
        return _expanded(pieces, a, u, zi, adjoint=adjoint, unroll=unroll)
    return pieces.scan(a, u, zi, adjoint=adjoint, unroll=unroll)


def _cpu_scan(a, u, zi, *, structure, adjoint, unroll, time_major):
    pieces = STRUCTURES[structure]
    if pieces.cpu_scan is None:
        return _scan(
            a,
            u,
            zi,
            structure=structure,
            adjoint=adjoint,
            unroll=unroll,
            time_major=time_major,
        )
    return pieces.cpu_scan(a, u, zi, adjoint=adjoint, unroll=unroll)


register_lowerings(
    linear_p,
    scan=_scan,
    cpu_scan=_cpu_scan,
    kernel=lambda *, structure, **params: STRUCTURES[structure].kernel,
    signal=1,
)


# ---------------------------------------------------------------- batching


def _batch(args, dims, *, structure, adjoint, unroll, time_major):
    del time_major  # a hint about one signal's batch: recomputed here
    # A batch of signals mapped along their last axis (a time-first array,
    # `vmap(..., in_axes=1)` over `(T, C)`) is time-major in memory: the
    # kernel that can read that layout is told so, and XLA then drops the
    # transposes around it (`_sections_structure._kernel_call`).
    u, u_dim = args[1], dims[1]
    hint = u_dim is not None and u.ndim == 2 and u_dim == 1

    def bind(a, u, zi):
        return _bind(
            structure, a, u, zi, adjoint=adjoint, unroll=unroll, time_major=hint
        )

    signal_rank = STRUCTURES[structure].signal_rank
    return batch_in_front(bind, args, dims, signal=1, signal_rank=signal_rank)


batching.primitive_batchers[linear_p] = _batch


# ---------------------------------------------------------------- JVP


def _expanded_jvp(pieces, primals, tangents, *, adjoint, unroll):
    """The JVP of a composed structure's expansion, differentiating only the
    operands with a tangent (a symbolic zero tangent of the coefficients
    skips their drive). Its primal is the expansion's too, so reverse mode
    stores the other structures' residuals and runs nothing else forward."""
    live = [i for i, t in enumerate(tangents) if type(t) is not ad.Zero]

    def expansion(*operands):
        full = list(primals)
        for i, v in zip(live, operands, strict=True):
            full[i] = v
        return _expanded(pieces, *full, adjoint=adjoint, unroll=unroll)

    return jax.jvp(
        expansion, tuple(primals[i] for i in live), tuple(tangents[i] for i in live)
    )


def _jvp(primals, tangents, *, structure, adjoint, unroll, time_major):
    pieces = STRUCTURES[structure]
    if structure == "sections":
        # the cascade's reverse mode in one pass, where its kernel runs
        from . import _sections_gradient

        if _sections_gradient.fused(primals[0], primals[1]):
            return _sections_gradient.jvp(primals, tangents)
    if pieces.expand is not None:
        return _expanded_jvp(pieces, primals, tangents, adjoint=adjoint, unroll=unroll)
    a, u, zi = primals
    da, du, dzi = tangents
    out = _bind(
        structure, a, u, zi, adjoint=adjoint, unroll=unroll, time_major=time_major
    )
    drive = None
    if type(da) is not ad.Zero:
        drive = STRUCTURES[structure].coefficient_drive(da, out, zi, adjoint)
    if type(du) is not ad.Zero:
        drive = du if drive is None else drive + du
    if drive is None and type(dzi) is ad.Zero:
        return out, ad.Zero.from_primal_value(out)
    drive = jnp.zeros_like(u) if drive is None else drive
    dzi = jnp.zeros_like(zi) if type(dzi) is ad.Zero else dzi
    dout = _bind(structure, a, drive, dzi, adjoint=adjoint, unroll=TANGENT_UNROLL)
    return out, dout


ad.primitive_jvps[linear_p] = _jvp


# ---------------------------------------------------------------- transpose


def _transpose(ct, a, u, zi, *, structure, adjoint, unroll, time_major):
    del time_major
    pieces = STRUCTURES[structure]
    if ad.is_undefined_primal(a):
        raise NotImplementedError(f"{pieces.name} is not linear in its coefficients")
    if pieces.expand is not None:  # its JVP binds the structures it composes
        raise NotImplementedError(f"{pieces.name} is transposed through its expansion")
    u_aval = u.aval if ad.is_undefined_primal(u) else jax.typeof(u)
    zi_aval = zi.aval if ad.is_undefined_primal(zi) else jax.typeof(zi)
    if type(ct) is ad.Zero:
        ct_u = ad.Zero(u_aval) if ad.is_undefined_primal(u) else None
        ct_zi = ad.Zero(zi_aval) if ad.is_undefined_primal(zi) else None
        return None, ct_u, ct_zi
    zeros = jnp.zeros(zi_aval.shape, zi_aval.dtype)
    # The forward recursion's transpose is the adjoint one, and back.
    ct_u = _bind(structure, a, ct, zeros, adjoint=not adjoint, unroll=unroll)
    ct_zi = None
    if ad.is_undefined_primal(zi):
        ct_zi = pieces.state_cotangent(
            a, ct_u, zeros, adjoint=adjoint, per_sample=pieces.per_sample(a, u_aval)
        )
    return None, (ct_u if ad.is_undefined_primal(u) else None), ct_zi


ad.primitive_transposes[linear_p] = _transpose
