r"""The all-pole structure of the recurrence primitive (`_linear_primitive`).

With `structure="allpole"`, `linear_p` computes, for one signal (`u` of
shape `(T,)`) or a batch of them (`(B, T)`, under `vmap`),

- `adjoint=False`: $y_t = u_t - \sum_k a_{t,k}\, y_{t-k-1}$ with
  $y_{-k-1} = z_k$, $t = 0, \dots, T-1$;
- `adjoint=True`: the transposed recursion, run backwards in time,
  $w_s = u_s - \sum_k a_{s+k+1,k}\, w_{s+k+1}$ with $w_{T+k} = z_k$ and,
  for per-sample coefficients, $a_{t,k} = 0$ past the end ($t \ge T$);

with `a` per sample (`(T, K)`, or `(B, T, K)`) or constant (`(K,)`, or
`(B, K)`) and the state `z` of shape `(K,)` (or `(B, K)`).

Its pieces (`ALLPOLE`, see `_structure.Structure`):

- the kernel: on the CPU, for float32, float64, complex64 and complex128, a
  compiled C++ loop called through the XLA FFI (`retrax._native`,
  `allpole.cc`) that advances the batch's signals together in SIMD lanes;
  everywhere else (other devices, or without the compiled library) the
  `lax.scan` of the same recursion, which on the CPU steps a batch through
  its own layout;
- the JVP's drive: $-\sum_k \dot a_{t,k} y_{t-k-1}$ (or its adjoint
  counterpart; for per-sample coefficients that product is
  `_allpole_lags.lag_drive_p`, whose transpose, the coefficients'
  cotangent, is a compiled loop on the CPU);
- the transpose's state cotangent: a $K \times K$ read-out of the first
  (or last) $K$ cotangents.

So reverse mode runs one adjoint recursion backwards in time and stores the
coefficients and the output, and forward mode, reverse mode and every higher
order compose without unrolling the loop.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .. import _native
from ._allpole_lags import lag_drive, lag_drive_const
from ._kernel_lowering import KERNEL_DTYPES, Kernel, sharded_like, varying_like
from ._structure import Structure


def _per_sample(a, u) -> bool:
    return a.ndim == u.ndim + 1


# ---------------------------------------------------------------- the scan


def shifted(a):
    """The adjoint's per-sample coefficients: `out[..., s, k] = a[..., s+k+1, k]`,
    zero past the end."""
    length, order = a.shape[-2:]
    cols = []
    for k in range(order):
        col = a[..., k + 1 :, k]
        pad = [(0, 0)] * (col.ndim - 1) + [(0, length - col.shape[-1])]
        cols.append(jnp.pad(col, pad))
    return jnp.stack(cols, axis=-1)


def scan_allpole(a, u, zi, unroll, reverse=False):
    """The forward recursion of one signal as a `lax.scan` (`reverse`: run
    from the last sample to the first, the state being the next outputs)."""
    zi = varying_like(zi, a, u)
    order = zi.shape[0]
    carry0 = tuple(zi[k] for k in range(order))

    def combine(carry, ut, ak):
        y = ut
        for k in range(order):
            y = y - ak[k] * carry[k]
        return (y,) + carry[:-1], y

    if a.ndim == 1:
        coeffs = tuple(a[k] for k in range(order))

        def step(carry, ut):
            return combine(carry, ut, coeffs)

        xs = u
    else:

        def step(carry, inp):
            ut, ak = inp
            return combine(carry, ut, ak)

        xs = (u, tuple(a[:, k] for k in range(order)))
    _, y = lax.scan(step, carry0, xs, unroll=unroll, reverse=reverse)
    return y


def scan_allpole_batch(a, u, zi, unroll, adjoint=False):
    """The recursion of a batch `u` of shape `(B, T)`, stepping along time on
    the operands as they are laid out (batch-major): each step reads its
    column of `u` and `a` and writes the output's in place.

    `jax.vmap` of `scan_allpole` would move the batch into the carry and scan
    over time-major copies of `u`, of each lag of `a` and of the output, which
    XLA materialises: a reverse-mode gradient then holds about six
    signal-sized arrays where this holds the output and the cotangent.

    The adjoint with per-sample coefficients runs in its transposed
    (scatter) form: at step $s$ the carry holds what the later outputs have
    already contributed to the next $K$ steps, so $a$ is read at $s$ itself
    and no shifted copy of it is formed; its state is not read (the
    coefficients are zero past the end)."""
    length = u.shape[-1]
    if length == 0:  # no step: the loop's body cannot even index its operands
        return varying_like(jnp.zeros_like(u), a, u)
    order = zi.shape[-1]
    per_sample = _per_sample(a, u)
    scatter = adjoint and per_sample
    if scatter:
        carry0 = tuple(jnp.zeros_like(zi[:, k]) for k in range(order))
    else:
        carry0 = tuple(zi[:, k] for k in range(order))
    carry0 = tuple(varying_like(c, a, u) for c in carry0)

    def body(i, state):
        y, carry = state
        t = length - 1 - i if adjoint else i
        ut = lax.dynamic_index_in_dim(u, t, axis=1, keepdims=False)
        if per_sample:
            at = lax.dynamic_index_in_dim(a, t, axis=1, keepdims=False)
        else:
            at = a
        if scatter:
            v = ut + carry[0]
            rest = carry[1:] + (jnp.zeros_like(v),)
            carry = tuple(r - at[:, k] * v for k, r in enumerate(rest))
        else:
            v = ut
            for k in range(order):
                v = v - at[:, k] * carry[k]
            carry = (v,) + carry[:-1]
        y = lax.dynamic_update_index_in_dim(y, v, t, axis=1)
        return y, carry

    y0 = varying_like(jnp.zeros_like(u), a, u)
    y, _ = lax.fori_loop(0, length, body, (y0, carry0), unroll=unroll)
    return y


def _scan(a, u, zi, *, adjoint, unroll, batch_major=False):
    """The all-pole recursion as a scan: per signal, `vmap`ped over a batch
    (time-major copies of the operands), or with `batch_major` a batch
    stepped through in its own layout (`scan_allpole_batch`)."""
    if u.ndim == 2:
        # `vmap` under an explicit mesh, and the batch-major step's
        # arithmetic, need the operands' batch axes sharded alike; the
        # batching rule broadcasts unbatched ones unsharded.
        a, zi = sharded_like(a, u), sharded_like(zi, u)
        if batch_major:
            return scan_allpole_batch(a, u, zi, unroll, adjoint=adjoint)
    if adjoint and _per_sample(a, u):
        a = shifted(a)
    run = functools.partial(scan_allpole, unroll=unroll, reverse=adjoint)
    if u.ndim == 2:
        run = jax.vmap(run)
    return run(a, u, zi)


# ---------------------------------------------------------------- the kernel


def _kernel_call(a, u, zi, *, structure, adjoint, unroll, time_major):
    """The compiled kernel on operands with a batch axis in front: `u` of
    shape `(B, T)`, handed over as they are, in the user's batch-major
    layout, which the kernel reads in register tiles. Transposing a batch
    to time-major for the kernel costs more than the filter: measured on a
    2-core x86 CPU (order 2, T = 44,100, float32), reading in place was as
    fast or faster from B = 2 on (B = 64: 8.7 against 11.3 ms forward, 29
    against 73 ms gradient). One signal runs the kernel's single-signal loop
    (`batch_major` false); its bytes are the same in both layouts, so it
    keeps the default one (a layout of its own made XLA copy it on the way
    to and from the lags kernel). With `time_major` (the batch of a
    time-first array, see `_linear_primitive._batch`) and constant
    coefficients, the kernel takes the transposes `u.T`, `a.T`, `zi.T` in
    its time-major layout and returns `y.T`: XLA folds them into the ones
    that made the batch (as `_sections_structure._kernel_call`)."""
    del structure, unroll
    if time_major and u.shape[0] > 1 and a.ndim == 2:
        out = jax.ShapeDtypeStruct(u.shape[::-1], u.dtype)
        call = jax.ffi.ffi_call(_native.ALLPOLE, out)
        y = call(a.T, u.T, zi.T, adjoint=adjoint, batch_major=False, time_major=True)
        return y.T
    call = jax.ffi.ffi_call(_native.ALLPOLE, jax.ShapeDtypeStruct(u.shape, u.dtype))
    return call(a, u, zi, adjoint=adjoint, batch_major=u.shape[0] > 1, time_major=False)


def _allpole_rule(ranks):
    return ("b t k" if ranks[0] == 3 else "b k") + ", b t, b k -> b t"


# ---------------------------------------------------------------- JVP and transpose


def _coefficient_drive(da, out, zi, adjoint):
    """The tangent's drive from the coefficients' tangent `da`:
    $-\\sum_k \\dot a_{t,k} y_{t-k-1}$ (forward) or
    $-\\sum_k \\dot a_{s+k+1,k} w_{s+k+1}$ (adjoint)."""
    if da.ndim == out.ndim + 1:  # per sample: see `_allpole_lags`
        return lag_drive(da, out, zi, adjoint=adjoint)
    return lag_drive_const(da, out, zi, adjoint=adjoint)


def _readout(a, ct, order, per_sample):
    """$\\bar z_j = -\\sum_{t=0}^{K-1-j} a_{t,t+j}\\, \\bar u_t$: how the state
    enters the first K steps of the forward recursion, transposed."""
    n = min(order, ct.shape[-1])
    t = np.arange(n)[None, :]
    k = t + np.arange(order)[:, None]  # (j, t) -> k = t + j
    valid = k < order
    k = np.where(valid, k, 0)
    if per_sample:
        coeffs = a[..., np.broadcast_to(t, k.shape), k]
    else:
        coeffs = a[..., k]
    coeffs = jnp.where(valid, coeffs, 0)
    return -jnp.sum(coeffs * ct[..., None, :n], axis=-1)


def _state_cotangent(a, ct_u, zeros, *, adjoint, per_sample):
    order = zeros.shape[-1]
    if not adjoint:
        return _readout(a, ct_u, order, per_sample)
    if per_sample:  # the adjoint reads no state past the end
        return zeros
    # the state enters the last K steps: the same, time-reversed
    return _readout(a, ct_u[..., ::-1], order, False)


ALLPOLE = Structure(
    name="allpole_recurrence",
    signal_rank=1,
    step_rank=1,
    scan=_scan,
    kernel=Kernel(
        name="allpole",
        dtypes=KERNEL_DTYPES,
        call=_kernel_call,
        rule=_allpole_rule,
        signal_rank=1,
    ),
    coefficient_drive=_coefficient_drive,
    state_cotangent=_state_cotangent,
    # On the CPU a batch steps through its own layout: the time-major copies
    # that `vmap` of the scan makes cost more time and memory than strided
    # reads of a few signals (order 2, T = 44,100, float32, B = 8: 0.45
    # against 1.4 ms forward, 2.0 against 4.0 to 8.7 ms gradient on a loaded
    # 2-core x86 CPU; 29 against 81 MiB of XLA temporaries for the gradient
    # at T = 441,000). Other platforms keep the time-major scan (not
    # measured there: its reads coalesce on a GPU, strided ones may not).
    cpu_scan=functools.partial(_scan, batch_major=True),
)
