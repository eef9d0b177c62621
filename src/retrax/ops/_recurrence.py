"""The one recurrence core behind every linear recursive filter in retrax.

A linear time-varying recursion of the form

$$s_t = M(c_t)\\, s_{t-1} + u_t, \\qquad s_{-1} = z_i,$$

with four static structures for the transition $M$:

- ``"allpole"``: a companion matrix, $y_t = u_t - \\sum_k a_{t,k} y_{t-k-1}$,
  state = the last $K$ outputs (newest first), output = $y$ of shape `(T,)`;
- ``"diagonal"``: $h_t = a_t \\odot h_{t-1} + u_t$, output `(T, N)`;
- ``"dense"``: $h_t = A_t h_{t-1} + u_t$, output `(T, N)`;
- `DelayLines(m)`: a feedback delay network,
  $s_{t,i} = u_{t,i} + \\sum_j A_{ij}\\, s_{t-m_j,j}$ with constant $A$ and
  static integer delays $m_i \\ge 1$, state = the last $\\max_i m_i$ values of
  every line, output = $s$ of shape `(T, N)`. It steps over blocks of
  $L = \\min_i m_i$ samples, all of whose feedback reads lie in the state.

The sequential all-pole, diagonal and dense recursions are one JAX primitive
with the structure as a static parameter, its own rules and compiled CPU
kernels (`_linear_primitive`): their derivatives run the same primitive,
forward for the tangent and the transposed recursion backwards in time for
the adjoint. For
`DelayLines` and the associative method, the derivative rule is a
`jax.custom_jvp` whose tangent is the same recursion driven by the tangent
input, $\\dot u_t + \\dot M(c_t) s_{t-1}$. JAX transposes
that linear scan into the time-reversed adjoint filter, so reverse mode costs
one backwards scan and stores only the coefficients and the lagged outputs,
and forward and higher-order modes come for free.

Two static methods evaluate the recursion. ``"sequential"`` (the default)
takes one step per sample (a compiled loop on the CPU for the all-pole,
diagonal and dense structures, a `lax.scan` otherwise): the least work, and
the fastest on a CPU.
``"associative"`` is `lax.associative_scan` on the pairs
$(M(c_t), u_t)$ combined as
$(M_2, b_2) \\circ (M_1, b_1) = (M_2 M_1, M_2 b_1 + b_2)$: $O(\\log T)$ steps
deep instead of $T$, at the price of more arithmetic (a $K \times K$ matrix
product per combination for the all-pole companion matrices). The tangent
recursion uses the same method as the primal, so reverse mode is still the
transpose of the tangent recursion.
"""

import dataclasses
import functools
from typing import Literal

import jax
import jax.numpy as jnp
from jax import lax

from ._allpole_structure import scan_allpole as _scan_allpole
from ._kernel_lowering import (
    DEFAULT_UNROLL as DEFAULT_UNROLL,
    TANGENT_UNROLL as TANGENT_UNROLL,
    varying_like,
)
from ._linear_primitive import allpole_recurrence, state_recurrence
from ._state_structures import scan_linear


@dataclasses.dataclass(frozen=True)
class DelayLines:
    """The static structure of a feedback delay network: the line lengths."""

    delays: tuple[int, ...]


Structure = Literal["allpole", "diagonal", "dense"] | DelayLines
Method = Literal["sequential", "associative"]
METHODS = ("sequential", "associative")


_scan_diagonal = functools.partial(scan_linear, "diagonal")
_scan_dense = functools.partial(scan_linear, "dense")


def _scan_delay_lines(delays, A, u, zi, unroll):
    # The whole history of the lines, time first, oldest first: `hist[M + t]`
    # starts as the drive $u_t$ and ends as $s_t$, and `hist[M - k - 1]` is
    # `zi[:, k]`, with M the longest line. Step r reads line i (of length m)
    # as the block of L values (L the shortest line) at `M + r L - m` and adds
    # the feedback to its own block in place, so a step costs O(N L) whatever
    # M is (shifting a buffer of the last M values instead cost O(N M) a step,
    # hundreds of times the network's arithmetic with the one-sample lines of
    # `FDNReverb`'s filters). Adding (a scatter-add) rather than writing keeps
    # the transposed loop in place too: its cotangent passes through the add
    # unchanged and is read once a step, where a write's transpose reads and
    # then zeroes the block, which made XLA copy the whole history a step.
    longest, block = max(delays), min(delays)
    length = u.shape[0]
    rows = -(-length // block)
    u = jnp.pad(u, ((0, rows * block - length), (0, 0)))
    hist = varying_like(jnp.concatenate([zi[:, ::-1].T, u]), A, u)
    offsets = jnp.arange(block)

    def step(r, hist):
        start = r * block + longest
        reads = jnp.concatenate(
            [
                lax.dynamic_slice(hist, (start - m, i), (block, 1))
                for i, m in enumerate(delays)
            ],
            axis=1,
        )
        return hist.at[start + offsets].add(
            reads @ A.T, indices_are_sorted=True, unique_indices=True
        )

    # Not unrolled: unrolled twice, the forward loop took 2.4x as long
    # (16 lines of 1 to 2,800 samples, T = 44,100, float32, 2-core x86 CPU).
    # The indices are recomputed in the transposed loop rather than saved, a
    # stack of them per line and step, from the block numbers scanned over.
    del unroll
    step = jax.checkpoint(step, policy=jax.checkpoint_policies.nothing_saveable)
    hist, _ = lax.scan(lambda h, r: (step(r, h), None), hist, jnp.arange(rows))
    return hist[longest : longest + length]


_SCANS = {"allpole": _scan_allpole, "diagonal": _scan_diagonal, "dense": _scan_dense}


def _combine_elementwise(earlier, later):
    m1, b1 = earlier
    m2, b2 = later
    return m2 * m1, m2 * b1 + b2


def _combine_matrix(earlier, later):
    m1, b1 = earlier
    m2, b2 = later
    return m2 @ m1, jnp.einsum("...ij,...j->...i", m2, b1) + b2


# Jitted so that an eager call compiles the scan's many slices once, instead of
# dispatching (and compiling) them one by one.
@functools.partial(jax.jit, static_argnums=3)
def _associative(transitions, offsets, zi, elementwise):
    """All states $s_t$ of $s_t = M_t s_{t-1} + b_t$, $s_{-1} = z_i$, in parallel."""
    # Fold the initial state into the first offset; the scan then starts at 0.
    if elementwise:
        first = transitions[0] * zi
        combine = _combine_elementwise
    else:
        first = transitions[0] @ zi
        combine = _combine_matrix
    offsets = jnp.asarray(offsets).at[0].add(first)
    _, states = lax.associative_scan(combine, (transitions, offsets))
    return states


def _companion(a):
    """The companion matrices of `a`, shape `(..., K, K)`: state newest first."""
    order = a.shape[-1]
    shift = jnp.eye(order - 1, order, dtype=a.dtype)
    shift = jnp.broadcast_to(shift, a.shape[:-1] + shift.shape)
    return jnp.concatenate([-a[..., None, :], shift], axis=-2)


def _associative_allpole(a, u, zi):
    length, order = u.shape[0], zi.shape[0]
    if order == 1:
        transitions = jnp.broadcast_to(-a, (length, 1))
        return _associative(transitions, u[:, None], zi, True)[:, 0]
    transitions = jnp.broadcast_to(_companion(a), (length, order, order))
    offsets = jnp.zeros((length, order), u.dtype).at[:, 0].set(u)
    return _associative(transitions, offsets, zi, False)[:, 0]


def _associative_diagonal(a, u, zi):
    return _associative(jnp.broadcast_to(a, u.shape), u, zi, True)


def _associative_dense(A, u, zi):
    transitions = jnp.broadcast_to(A, u.shape[:1] + A.shape[-2:])
    return _associative(transitions, u, zi, False)


_ASSOCIATIVE = {
    "allpole": _associative_allpole,
    "diagonal": _associative_diagonal,
    "dense": _associative_dense,
}


def check_method(method: str) -> None:
    """Raise a clear error for an unknown `method`."""
    if method not in METHODS:
        raise ValueError(
            f"`method` must be one of {METHODS}, got {method!r}. Use "
            '"sequential" (a scan, fastest on CPU) or "associative" (a parallel '
            "scan, O(log T) deep, for accelerators)."
        )


def delay_line_reads(delays, s, zi):
    """$s_{t-m_i,i}$ for every step and line, `(T, N)`, with `zi[i, k] = s_i[-k-1]`."""
    longest, length = zi.shape[1], s.shape[0]
    full = jnp.concatenate([zi[:, ::-1].T, s])  # full[longest + t] = s[t]
    return jnp.stack(
        [full[longest - m : longest - m + length, i] for i, m in enumerate(delays)],
        axis=-1,
    )


def previous_states(structure: Structure, out, zi):
    """The state $s_{t-1}$ seen at every step: `(T, K)` lags or `(T, N)` states
    (for `DelayLines`, the `(T, N)` values $s_{t-m_i,i}$ the feedback reads)."""
    if isinstance(structure, DelayLines):
        return delay_line_reads(structure.delays, out, zi)
    if structure == "allpole":
        order = zi.shape[0]
        length = out.shape[0]
        full = jnp.concatenate([zi[::-1], out])
        return jnp.stack(
            [full[order - k - 1 : order - k - 1 + length] for k in range(order)],
            axis=-1,
        )
    return jnp.concatenate([zi[None], out[:-1]], axis=0)


def _transition_tangent(structure: Structure, dcoeffs, prev):
    """$\\dot M(c_t) s_{t-1}$ for every step."""
    if isinstance(structure, DelayLines):
        return prev @ dcoeffs.T
    if structure == "allpole":
        if dcoeffs.ndim == 1:
            return -(prev @ dcoeffs)
        return -jnp.sum(dcoeffs * prev, axis=-1)
    if structure == "diagonal":
        return dcoeffs * prev
    if dcoeffs.ndim == 2:
        return prev @ dcoeffs.T
    return jnp.einsum("tij,tj->ti", dcoeffs, prev)


def recurrence(
    structure: Structure, unroll: int, coeffs, u, zi, method: Method = "sequential"
):
    """Run the recursion; see the module docstring. Inputs share one dtype.

    `coeffs` is constant (no time axis) or per-sample (leading axis `T`), `u`
    has a leading time axis, and `zi` is the state before the first sample.
    `unroll` applies to the sequential method only. The sequential all-pole
    all-pole, diagonal and dense recursions are the primitive of
    `_linear_primitive` (compiled kernels on the CPU); the others run
    `_recurrence`.
    """
    check_method(method)
    if structure == "allpole" and method == "sequential":
        return allpole_recurrence(coeffs, u, zi, unroll=unroll)
    if structure in ("diagonal", "dense") and method == "sequential":
        return state_recurrence(structure, coeffs, u, zi, unroll=unroll)
    return _recurrence(structure, unroll, coeffs, u, zi, method)


@functools.partial(jax.custom_jvp, nondiff_argnums=(0, 1, 5))
def _recurrence(
    structure: Structure, unroll: int, coeffs, u, zi, method: Method = "sequential"
):
    if isinstance(structure, DelayLines):
        if method != "sequential":
            raise ValueError("A delay network runs with `method='sequential'` only.")
        return _scan_delay_lines(structure.delays, coeffs, u, zi, unroll)
    if method == "associative":
        return _ASSOCIATIVE[structure](coeffs, u, zi)
    return _SCANS[structure](coeffs, u, zi, unroll)


@_recurrence.defjvp
def _recurrence_jvp(structure, unroll, method, primals, tangents):
    coeffs, u, zi = primals
    dcoeffs, du, dzi = tangents
    out = _recurrence(structure, unroll, coeffs, u, zi, method)
    prev = previous_states(structure, out, zi)
    drive = du + _transition_tangent(structure, dcoeffs, prev)
    dout = _recurrence(structure, TANGENT_UNROLL, coeffs, drive, dzi, method)
    return out, dout
