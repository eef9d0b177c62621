"""Linear state-space systems, dense and modal (diagonal), on the recurrence core."""

import jax
import jax.numpy as jnp
from jax import lax
from jaxtyping import Array, ArrayLike, Inexact, Shaped

from .._deprecated import signal_first
from .._misc import as_inexact, result_dtype
from .._validate import check_finite, check_zi
from ._recurrence import DEFAULT_UNROLL, recurrence


def _check_map(name: str, m: Array, shape: tuple[int, ...], length: int, what: str):
    """`m` must be `shape` (constant) or `(length, *shape)` (per sample)."""
    if m.shape == shape or m.shape == (length, *shape):
        return
    raise ValueError(
        f"`{name}` must have shape {what} = {shape} or (time, {what[1:-1]}) = "
        f"{(length, *shape)}, got shape {m.shape}."
    )


def _apply(m: Array, v: Array) -> Array:
    """`m @ v[t]` for every `t`, `m` constant `(P, N)` or per sample `(T, P, N)`."""
    if m.ndim == 2:
        return v @ m.T
    return jnp.einsum("tpn,tn->tp", m, v)


def chunk_length(n_state: int) -> int:
    """Samples per block: about 128 KiB of float32 states, 64 to 1024 samples.

    Measured on a 2-core x86 CPU (T=44,100, float32, diagonal): running the
    recurrence over the whole signal and reading out afterwards streams
    `(T, N)` states through memory and is over 10x slower at N=256 than
    blocks that stay in cache (160 ms against 11 ms with 128-sample blocks;
    256-sample blocks took 20 ms), and no faster at N=16.
    """
    return int(min(1024, max(64, 2**15 // max(n_state, 1))))


def _block(structure, A, B, C, x, h0):
    """One block through the core: the outputs `C h` and the last state."""
    nxt = recurrence(structure, DEFAULT_UNROLL, A, _apply(B, x), h0)
    # h[0..T]: read out at h[0..T-1], pass h[T] on (`h0` for an empty block)
    h = jnp.concatenate([h0[None], nxt])
    return _apply(C, h[:-1]), h[-1]


def _blocked(structure, A, B, C, x, zi, per_sample):
    """`_block` over consecutive blocks of `chunk_length` samples.

    Each block runs the one recurrence core (with its derivative rule) and
    reads its states out at once, so the `(T, N)` states never leave cache;
    the blocks pass the state on in an outer `lax.scan`, which autodiff
    transposes into passing the adjoint state back, block by block. Reverse
    mode keeps only the state at each block's start and recomputes the
    block's states (`jax.checkpoint`) before running its adjoint: one more
    forward pass for `O(T N / block)` instead of `O(T N)` stored states
    (measured at T=441,000, N=16: 10 MiB against 88 MiB, and still faster
    than back-propagating through a plain scan).
    """
    length = x.shape[0]
    block = chunk_length(zi.shape[0])
    n_blocks = length // block
    maps = {"A": A, "B": B, "C": C}
    if n_blocks <= 1:
        return _block(structure, A, B, C, x, zi)
    head = n_blocks * block
    varying = {k: v for k, v in maps.items() if per_sample[k]}

    def split(v):
        return v[:head].reshape(n_blocks, block, *v.shape[1:])

    def body(h, xs):
        xb, vb = xs
        m = {**maps, **vb}
        y, h = _block(structure, m["A"], m["B"], m["C"], xb, h)
        return h, y

    xs = (split(x), {k: split(v) for k, v in varying.items()})
    h, ys = lax.scan(jax.checkpoint(body), zi, xs)
    y = ys.reshape(head, *ys.shape[2:])
    if head == length:
        return y, h
    m = {**maps, **{k: v[head:] for k, v in varying.items()}}
    y_tail, h = _block(structure, m["A"], m["B"], m["C"], x[head:], h)
    return jnp.concatenate([y, y_tail]), h


def _run(structure, A, B, C, D, x, zi, n_state, return_zf, names):
    """Shared body: validate, promote, run the core on `u = B x`, read out."""
    a_name = names[0]
    x = as_inexact("x", x)
    if x.ndim not in (1, 2):
        raise ValueError(
            f"`x` must have shape (time, inputs), or (time,) for one input, got "
            f"shape {x.shape}. Batch with `jax.vmap`."
        )
    B = as_inexact("B", B)
    C = as_inexact("C", C)
    one_input = x.ndim == 1
    if one_input:
        if B.ndim in (2, 3) and B.shape[-1] != 1:
            raise ValueError(
                f"`x` of shape {x.shape} is one input signal, but `B` has "
                f"{B.shape[-1]} input columns (shape {B.shape}): pass `x` of "
                f"shape (time, {B.shape[-1]}), one column per input."
            )
        x = x[:, None]
    length, n_in = x.shape
    _check_map("B", B, (n_state, n_in), length, "(state, inputs)")
    if C.ndim not in (2, 3) or C.shape[-1] != n_state:
        raise ValueError(
            f"`C` must have shape (outputs, state) or (time, outputs, state) with "
            f"state = {n_state}, got shape {C.shape}."
        )
    n_out = C.shape[-2]
    _check_map("C", C, (n_out, n_state), length, "(outputs, state)")
    if D is not None:
        D = as_inexact("D", D)
        _check_map("D", D, (n_out, n_in), length, "(outputs, inputs)")
    zi = check_zi(zi, (n_state,), "the initial state h[0]")
    dtype = result_dtype(A, B, C, D, x, zi)
    A = check_finite(a_name, A.astype(dtype))
    B = check_finite("B", B.astype(dtype))
    C = check_finite("C", C.astype(dtype))
    x = x.astype(dtype)
    zi = jnp.zeros(n_state, dtype) if zi is None else zi.astype(dtype)
    # the core's s_t is h[t+1]: s_t = A_t s_{t-1} + B_t x_t with s_{-1} = h[0]
    a_rank = 2 if structure == "dense" else 1
    per_sample = {"A": A.ndim > a_rank, "B": B.ndim == 3, "C": C.ndim == 3}
    y, zf = _blocked(structure, A, B, C, x, zi, per_sample)
    if D is not None:
        y = y + _apply(check_finite("D", D.astype(dtype)), x)
    if one_input and n_out == 1:
        y = y[:, 0]
    if not return_zf:
        return y
    return y, zf


@signal_first("A", "B", "C", "D")
def state_space(
    x: Shaped[ArrayLike, "time inputs"] | Shaped[ArrayLike, " time"],
    *,
    A: Shaped[ArrayLike, "state state"] | Shaped[ArrayLike, "time state state"],
    B: Shaped[ArrayLike, "state inputs"] | Shaped[ArrayLike, "time state inputs"],
    C: Shaped[ArrayLike, "outputs state"] | Shaped[ArrayLike, "time outputs state"],
    D: Shaped[ArrayLike, "outputs inputs"]
    | Shaped[ArrayLike, "time outputs inputs"]
    | None,
    zi: Shaped[ArrayLike, " state"] | None = None,
    return_zf: bool = False,
) -> (
    Inexact[Array, "time outputs"]
    | Inexact[Array, " time"]
    | tuple[
        Inexact[Array, "time outputs"] | Inexact[Array, " time"],
        Inexact[Array, " state"],
    ]
):
    r"""Discrete-time linear state-space system, MIMO, LTI or LPV.

    $$h_{n+1} = A_n h_n + B_n x_n, \qquad y_n = C_n h_n + D_n x_n,
      \qquad h_0 = z_i,$$

    the standard discrete state-space model (e.g. `scipy.signal.dlsim` for
    constant maps). Each map is constant (LTI) or given per sample (linear
    parameter-varying), read from its rank. The state recursion runs on
    retrax's recurrence core with the dense structure, so reverse mode is the
    adjoint system run backwards in time,
    $\lambda_n = C_n^\top g_n + A_n^\top \lambda_{n+1}$. Memory: a signal
    shorter than two blocks ($L$ = 64 to 1024 samples, fewer for larger $N$)
    keeps its $T \times N$ states for the adjoint; a longer one runs in blocks
    and keeps only the state at each block's start, recomputing a block's
    states just before its adjoint: $O(T N / L + L N)$ saved numbers besides
    the inputs, for one extra forward pass. Cost $O(T N^2)$ per signal; for a
    diagonalisable $A$ use `diag_state_space`, $O(T N)$, which stores and
    recomputes the same way.

    **Arguments:**

    - `x`: the input, shape `(T, M)`, or `(T,)` for one input (then `B` and
      `D` have one column, `M = 1`); batch with `jax.vmap`.
    - `A`: state transition, `(N, N)` or `(T, N, N)`.
    - `B`: input map, `(N, M)` or `(T, N, M)`.
    - `C`: output map, `(P, N)` or `(T, P, N)`.
    - `D`: feedthrough, `(P, M)` or `(T, P, M)`, or `None` for none.
    - `zi`: the initial state $h_0$, shape `(N,)`. Defaults to zeros.
    - `return_zf`: also return $h_T$, the state after the last sample, the
      `zi` of the next block (streaming).

    The maps by keyword, `state_space(x, A=A, B=B, C=C, D=D)`: for this
    release a second positional argument raises a `TypeError`, since
    `state_space` took the maps first until now.

    **Returns:**

    `y` of shape `(T, P)`, or `(y, zf)` if `return_zf`. A single-input,
    single-output system driven by `x` of shape `(T,)` gives `y` of shape
    `(T,)`: the same numbers as `state_space(x[:, None], A=A, B=B, C=C, D=D)[:, 0]`
    (with `P > 1` outputs, `y` keeps its shape `(T, P)`). The dtype is the
    promoted dtype of the inputs (real or complex). An empty `x` (`T = 0`)
    gives an empty `y` and `zf = zi`.

    Non-finite maps raise an error (also under `jax.jit`); non-finite samples
    of `x` pass through; an unstable `A` is not an error (the state grows as
    the recursion defines it).
    """
    A = as_inexact("A", A)
    if A.ndim not in (2, 3) or A.shape[-1] != A.shape[-2]:
        raise ValueError(
            f"`A` must be square, shape (state, state) or (time, state, state), "
            f"got shape {A.shape}."
        )
    n_state = A.shape[-1]
    x_shape = jnp.shape(x)
    if A.ndim == 3 and len(x_shape) >= 1 and A.shape[0] != x_shape[0]:
        raise ValueError(
            f"time-varying `A` must have one matrix per sample of `x`: `A` has "
            f"{A.shape[0]} and `x` has {x_shape[0]} samples."
        )
    return _run("dense", A, B, C, D, x, zi, n_state, return_zf, ("A",))


@signal_first("a", "B", "C", "D")
def diag_state_space(
    x: Shaped[ArrayLike, "time inputs"] | Shaped[ArrayLike, " time"],
    *,
    a: Shaped[ArrayLike, " state"] | Shaped[ArrayLike, "time state"],
    B: Shaped[ArrayLike, "state inputs"] | Shaped[ArrayLike, "time state inputs"],
    C: Shaped[ArrayLike, "outputs state"] | Shaped[ArrayLike, "time outputs state"],
    D: Shaped[ArrayLike, "outputs inputs"]
    | Shaped[ArrayLike, "time outputs inputs"]
    | None,
    zi: Shaped[ArrayLike, " state"] | None = None,
    return_zf: bool = False,
) -> (
    Inexact[Array, "time outputs"]
    | Inexact[Array, " time"]
    | tuple[
        Inexact[Array, "time outputs"] | Inexact[Array, " time"],
        Inexact[Array, " state"],
    ]
):
    r"""State-space system in modal form, $A = \mathrm{diag}(a)$: $O(T N)$.

    $$h_{n+1} = a_n \odot h_n + B_n x_n, \qquad y_n = C_n h_n + D_n x_n,
      \qquad h_0 = z_i,$$

    i.e. `state_space(x, A=jnp.diag(a), B=B, C=C, D=D)`: `N` decoupled one-pole
    modes, the diagonalised (modal) realisation of a linear system, as used
    by modal synthesis and diagonal state-space sequence models (S4D, LRU).
    A real system with resonances has complex-conjugate eigenvalues: pass
    complex `a`, `B`, `C` (e.g. from `jnp.linalg.eig`); the result is then
    complex and the real system's output is its real part, `jnp.real(y)`.
    The recursion runs on retrax's recurrence core (diagonal structure), so
    reverse mode is the adjoint modes run backwards in time.

    **Arguments:**

    - `x`, `B`, `C`, `D`, `zi`, `return_zf`: as in `state_space`.
    - `a`: the eigenvalues (mode decays), `(N,)` or `(T, N)` per sample.

    The maps by keyword, `diag_state_space(x, a=a, B=B, C=C, D=D)`: for this
    release a second positional argument raises a `TypeError`, as in
    `state_space`.

    **Returns:**

    `y` of shape `(T, P)` (`(T,)` for `x` of shape `(T,)` and one output,
    as in `state_space`), or `(y, zf)` with $h_T$ if `return_zf`.
    """
    a = as_inexact("a", a)
    x_shape = jnp.shape(x)
    if a.ndim not in (1, 2) or (
        a.ndim == 2 and len(x_shape) >= 1 and a.shape[0] != x_shape[0]
    ):
        raise ValueError(
            f"`a` must have shape (state,) or (time, state) with one row per "
            f"sample of `x`, got shape {a.shape} for `x` of shape {x_shape}."
        )
    return _run("diagonal", a, B, C, D, x, zi, a.shape[-1], return_zf, ("a",))
