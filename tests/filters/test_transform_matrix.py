"""Every filter op under jit, vmap, grad and jvp in every supported dtype,
against an independent float64 (complex128) reference: scipy or a plain loop.

The exhaustive matrix is slow (one compilation per cell): run with `-m slow`.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal as ss

from helpers import assert_close, np_ballistics, np_df2, np_state_space
from retrax.ops import (
    ballistics,
    diag_state_space,
    filtfilt,
    fir,
    lfilter,
    lfilter_tv,
    sosfilt,
    state_space,
)


T = 16
REAL = [jnp.float32, jnp.float64]
COMPLEX = [jnp.complex64, jnp.complex128]


# retrax's own ops take the signal first and their coefficients by keyword;
# the matrix passes every op its arguments with the signal last
def _fir(b, x):
    return fir(x, b=b)


def _lfilter_tv(b, a, x):
    return lfilter_tv(x, b=b, a=a)


def _state_space(A, B, C, D, x):
    return state_space(x, A=A, B=B, C=C, D=D)


def _diag_state_space(a, B, C, D, x):
    return diag_state_space(x, a=a, B=B, C=C, D=D)


def _cases(rng):
    """(name, op, args, supported dtypes): args are float64 numpy arrays, the
    signal last."""
    b, a = ss.butter(2, 0.3)
    sos = ss.butter(4, 0.3, output="sos")
    x = rng.normal(size=T)
    A = 0.5 * np.eye(3) + 0.1 * rng.normal(size=(3, 3))
    B, C, D = rng.normal(size=(3, 2)), rng.normal(size=(2, 3)), rng.normal(size=(2, 2))
    xm = rng.normal(size=(T, 2))
    return [
        ("fir", _fir, (rng.normal(size=3), x), REAL + COMPLEX),
        ("fir_tv", _fir, (rng.normal(size=(T, 3)), x), REAL + COMPLEX),
        ("lfilter", lfilter, (b, a, x), REAL + COMPLEX),
        ("lfilter_tv_lti", _lfilter_tv, (b, a[1:], x), REAL + COMPLEX),
        (
            "lfilter_tv",
            _lfilter_tv,
            (np.tile(b, (T, 1)), np.tile(a[1:], (T, 1)), x),
            REAL + COMPLEX,
        ),
        ("filtfilt", lambda *v: filtfilt(*v, padlen=3), (b, a, x), REAL),
        ("sosfilt", sosfilt, (sos, x), REAL),
        ("state_space", _state_space, (A, B, C, D, xm), REAL + COMPLEX),
        (
            "diag_state_space",
            _diag_state_space,
            (rng.uniform(-0.9, 0.9, 3), B, C, D, xm),
            REAL + COMPLEX,
        ),
        ("ballistics", ballistics, (np.abs(x), np.array(0.4), np.array(0.1)), REAL),
    ]


CASES = _cases(np.random.default_rng(0))


def _fir_reference(b, x):
    b = np.broadcast_to(b, (len(x), b.shape[-1]))
    past = np.concatenate([np.zeros(b.shape[-1] - 1, x.dtype), x])
    return np.asarray(
        [b[t] @ past[t + b.shape[-1] - 1 :: -1][: b.shape[-1]] for t in range(len(x))]
    )


def _ss_reference(A, B, C, D, x):
    return np_state_space(A, B, C, D, x, np.zeros(A.shape[-1], x.dtype))[0]


# The reference of each case, from its float64 (complex128) arguments.
REFERENCES = {
    "fir": _fir_reference,
    "fir_tv": _fir_reference,
    "lfilter": ss.lfilter,
    "lfilter_tv_lti": lambda b, a, x: np_df2(b, a, x, np.zeros(2, x.dtype))[0],
    "lfilter_tv": lambda b, a, x: np_df2(b, a, x, np.zeros(2, x.dtype))[0],
    "filtfilt": lambda b, a, x: ss.filtfilt(b, a, x, padlen=3),
    "sosfilt": ss.sosfilt,
    "state_space": _ss_reference,
    "diag_state_space": lambda a, B, C, D, x: _ss_reference(np.diag(a), B, C, D, x),
    "ballistics": lambda x, at, rt: np_ballistics(x, at, rt, 0.0),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", REAL + COMPLEX, ids=lambda d: jnp.dtype(d).name)
def test_transforms(case, dtype):
    name, op, args, dtypes = case
    if dtype not in dtypes:
        pytest.skip("not a supported dtype for this op")
    args = tuple(jnp.asarray(v).astype(dtype) for v in args)
    tol = 1e-4 if jnp.finfo(dtype).bits <= 32 else 1e-12
    wide = np.complex128 if jnp.issubdtype(dtype, jnp.complexfloating) else np.float64
    ref = REFERENCES[name](*(np.asarray(v).astype(wide) for v in args))
    y = jax.jit(op)(*args)
    assert y.dtype == dtype
    assert_close(y, ref, rtol=tol)
    batched = jax.vmap(op, in_axes=(None,) * (len(args) - 1) + (0,))(
        *args[:-1], jnp.stack([args[-1], 2 * args[-1]])
    )
    assert_close(batched[0], ref, rtol=tol)
    # every argument: reverse mode and forward mode agree
    loss = lambda *v: jnp.sum(jnp.real(op(*v)) ** 2)
    grads = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))(*args)
    tangents = tuple(jnp.ones_like(v) for v in args)
    _, dloss = jax.jvp(loss, args, tangents)
    total = sum(jnp.sum(jnp.real(g)) for g in grads)
    # JAX convention: d loss[v + s t] / ds = Re <grad, t> for real tangents t
    assert_close(dloss, total, rtol=10 * tol)
