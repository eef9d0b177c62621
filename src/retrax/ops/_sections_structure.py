r"""Cascades of second-order sections as structures of the recurrence
primitive (`_linear_primitive`): `scipy.signal.sosfilt`'s recursion.

With `structure="sections"`, `linear_p` computes, for one signal (`u` of
shape `(T,)`) or a batch of them (`(B, T)`, under `vmap`), the cascade of
$S$ sections with constant coefficients `a` of shape `(S, 5)` (or
`(B, S, 5)`), rows $[b_0, b_1, b_2, a_1, a_2]$ ($a_0 = 1$), each in
scipy's transposed direct form II: section $s$ maps its input $x$ to

$$y_t = b_0 x_t + z_{0,t-1},\quad z_{0,t} = b_1 x_t - a_1 y_t + z_{1,t-1},
\quad z_{1,t} = b_2 x_t - a_2 y_t,$$

its state before the first sample `zi[2 s : 2 s + 2]` (`zi` of shape
`(2 S,)`, or `(B, 2 S)`), and $y$ is the next section's $x$. With
`structure="sections_state"` the output is the last section's $y$ followed
by the final state in `zi`'s layout ($2S$ more entries), still linear in
`u` and `zi`. Forward only (`adjoint=False`).

Its pieces (`SECTIONS`, `SECTIONS_STATE`, see `_structure.Structure`):

- the kernel: on the CPU, for float32 and float64, a compiled C++ loop
  (`retrax._native`, `sections.cc`) that takes every sample through every
  section while it is in registers, one pass over memory where the sections
  run one after the other read and write the signal once each. It computes
  each section as the expansion does (direct form I, the state entering the
  first two samples' drive), whose only dependency from one sample to the
  next is one multiply-add where the transposed form has two, and advances
  a batch's signals together in SIMD lanes;
- the expansion: each section as a three-tap FIR plus the all-pole
  structure ($y = \operatorname{allpole}(a, b * x + z)$, the state entering
  as the first two samples of the drive, the final state
  `scipy.signal.lfiltic`'s map of the last inputs and outputs). Off the
  kernel (other devices and dtypes, or without the compiled library) the
  primitive lowers to it, and its derivatives are the expansion's: reverse
  mode runs each section's adjoint all-pole filter backwards in time, as
  before the kernel existed.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from .. import _native
from ._fir import fir_apply
from ._kernel_lowering import REAL_KERNEL_DTYPES, Kernel
from ._structure import Structure


def _section(bind, c, x, z, *, unroll, final_state):
    """One section on one signal: `(y, final state or None)`."""
    length = x.shape[0]
    drive = fir_apply(c[:3], x, jnp.zeros(2, x.dtype))
    # the state enters the first two samples (a pad, not a scatter: reverse
    # mode keeps no indices)
    head = min(2, length)
    drive = drive + jnp.pad(z[:head], (0, length - head))
    y = bind(
        "allpole", c[3:], drive, jnp.zeros(2, x.dtype), adjoint=False, unroll=unroll
    )
    if not final_state:
        return y, None
    # the last inputs and outputs, newest first, zero before the start
    past_x = jnp.concatenate([x[::-1], jnp.zeros(2, x.dtype)])[:2]
    past_y = jnp.concatenate([y[::-1], jnp.zeros(2, x.dtype)])[:2]
    b1, b2, a1, a2 = c[1], c[2], c[3], c[4]
    zf = jnp.stack(
        [
            b1 * past_x[0] + b2 * past_x[1] - a1 * past_y[0] - a2 * past_y[1],
            b2 * past_x[0] - a2 * past_y[0],
        ]
    )
    if length < 2:  # the part of `z` not yet shifted out
        zf = zf + jnp.concatenate([z[length:], jnp.zeros(length, x.dtype)])
    return y, zf


def _expand(final_state, bind, a, u, zi, *, unroll):
    """The cascade as one FIR and one all-pole pass per section."""
    if u.ndim == 2:
        run = functools.partial(_expand, final_state, bind, unroll=unroll)
        return jax.vmap(run)(a, u, zi)
    n_sections = a.shape[0]
    section = functools.partial(_section, bind, unroll=unroll, final_state=final_state)
    states = zi.reshape(n_sections, 2)
    if n_sections == 1:
        y, zf = section(a[0], u, states[0])
        finals = None if zf is None else zf[None]
    else:
        # a scan over the sections: the program (and its derivatives') holds
        # one section's filter whatever their number, where an unrolled
        # cascade's trace and compile times grow with every section
        def step(y, row_and_state):
            return section(row_and_state[0], y, row_and_state[1])

        y, finals = jax.lax.scan(step, u, (a, states))
    if not final_state:
        return y
    return jnp.concatenate([y, finals.reshape(-1)])


def section_outputs(bind, a, u, zi, *, unroll):
    """Every section's output, shape `(S, T)` (or `(B, S, T)`): the expansion,
    keeping what reverse mode reads (`_sections_gradient`)."""
    if u.ndim == 2:
        run = functools.partial(section_outputs, bind, unroll=unroll)
        return jax.vmap(run)(a, u, zi)

    def step(y, row_and_state):
        y, _ = _section(
            bind,
            row_and_state[0],
            y,
            row_and_state[1],
            unroll=unroll,
            final_state=False,
        )
        return y, y

    _, ys = jax.lax.scan(step, u, (a, zi.reshape(a.shape[0], 2)))
    return ys


def _kernel_call(a, u, zi, *, structure, adjoint, unroll, time_major):
    """The compiled kernel on operands with a batch axis in front, `u` of
    shape `(B, T)`. With `time_major` (the batch of a time-first array, see
    `_linear_primitive._batch`) the plain cascade takes `u.T` and returns
    `y.T`, shape `(T, B)`, time-major as the caller's array lies: XLA folds
    those transposes into the ones that made the batch, and the kernel reads
    and writes the caller's memory in place (stereo `(T, 2)` along `axis=0`,
    jitted: no copy of the signal in or out). Otherwise the operands in their
    own (batch-major) layout."""
    del unroll
    if adjoint:
        raise NotImplementedError("the sections structure runs forward only")
    final_state = structure == "sections_state"
    if time_major and not final_state and u.shape[0] > 1:
        out = jax.ShapeDtypeStruct(u.shape[::-1], u.dtype)
        call = jax.ffi.ffi_call(_native.SECTIONS, out)
        return call(a, u.T, zi, final_state=False, time_major=True).T
    length = u.shape[1] + (zi.shape[1] if final_state else 0)
    out = jax.ShapeDtypeStruct((u.shape[0], length), u.dtype)
    call = jax.ffi.ffi_call(_native.SECTIONS, out)
    return call(a, u, zi, final_state=final_state, time_major=False)


def kernel_applies(dtype) -> bool:
    """Whether the cascade of a signal of `dtype` runs the compiled kernel
    (on the CPU, float32 or float64, with `retrax._native` built)."""
    return (
        np.dtype(dtype) in REAL_KERNEL_DTYPES
        and jax.default_backend() == "cpu"
        and _native.available("allpole")
    )


def _rule(final_state, ranks):
    del ranks
    return "b s c, b t, b k -> b " + ("o" if final_state else "t")


def _structure(final_state: bool) -> Structure:
    return Structure(
        name="sections_recurrence",
        signal_rank=1,
        step_rank=2,
        kernel=Kernel(
            # registered with the all-pole kernels (`retrax.kernels()["allpole"]`)
            name="allpole",
            dtypes=REAL_KERNEL_DTYPES,
            call=_kernel_call,
            rule=functools.partial(_rule, final_state),
            signal_rank=1,
        ),
        state_appended=final_state,
        expand=functools.partial(_expand, final_state),
    )


SECTIONS = _structure(final_state=False)
SECTIONS_STATE = _structure(final_state=True)
