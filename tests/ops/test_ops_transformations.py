"""retrax.ops under JAX's transformations: checks that hold under
`jit(grad(...))` whatever the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from retrax import ops


T = 48
_RNG = np.random.default_rng(0)
X = jnp.asarray(_RNG.standard_normal(T))
W = jnp.asarray(_RNG.standard_normal(T))
B = jnp.array([1.0, 0.5, 0.2])
A = jnp.array([1.0, -0.5, 0.2])
SOS = jnp.array([[1.0, 0.5, 0.2, 1.0, -0.5, 0.2], [1.0, 0.1, 0.0, 1.0, -0.3, 0.0]])
N = 3
SS = {"A": 0.5 * jnp.eye(N), "B": jnp.ones((N, 1)), "C": jnp.ones((1, N))}


def _nan(v, index):
    return v.at[index].set(jnp.nan)


# (op of the one argument under test, the argument's name, a value of it
# with a NaN): every op that checks its coefficients, constant and per sample
NON_FINITE = {
    "allpole": (lambda a: ops.allpole(X, a), "a", _nan(A[1:], 1)),
    "allpole per sample": (
        lambda a: ops.allpole(X, a),
        "a",
        _nan(jnp.tile(A[1:], (T, 1)), (20, 1)),
    ),
    "allpole associative": (
        lambda a: ops.allpole(X, a, method="associative"),
        "a",
        _nan(jnp.tile(A[1:], (T, 1)), (20, 1)),
    ),
    "linear_recurrence": (
        lambda d: ops.linear_recurrence(X, decay=d),
        "decay",
        _nan(jnp.full(T, 0.5), 3),
    ),
    "lfilter b": (lambda b: ops.lfilter(b, A, X), "b", _nan(B, 1)),
    "lfilter a": (lambda a: ops.lfilter(B, a, X), "a", _nan(A, 1)),
    "filtfilt b": (lambda b: ops.filtfilt(b, A, X), "b", _nan(B, 1)),
    "filtfilt a": (lambda a: ops.filtfilt(B, a, X), "a", _nan(A, 1)),
    "filtfilt gust": (lambda b: ops.filtfilt(b, A, X, method="gust"), "b", _nan(B, 1)),
    "sosfilt b": (lambda s: ops.sosfilt(s, X), "sos", _nan(SOS, (0, 1))),
    "sosfilt a": (lambda s: ops.sosfilt(s, X), "sos", _nan(SOS, (1, 4))),
    "sosfiltfilt": (lambda s: ops.sosfiltfilt(s, X), "sos", _nan(SOS, (0, 1))),
    "lfilter_tv b": (lambda b: ops.lfilter_tv(X, b=b, a=A[1:]), "b", _nan(B, 1)),
    "lfilter_tv b per sample": (
        lambda b: ops.lfilter_tv(X, b=b, a=A[1:]),
        "b",
        _nan(jnp.tile(B, (T, 1)), (5, 0)),
    ),
    "lfilter_tv a per sample": (
        lambda a: ops.lfilter_tv(X, b=B, a=a),
        "a",
        _nan(jnp.tile(A[1:], (T, 1)), (5, 0)),
    ),
    "fir": (lambda b: ops.fir(X, b=b), "b", _nan(B, 1)),
    "state_space A": (
        lambda m: ops.state_space(X, **{**SS, "A": m}, D=None),
        "A",
        _nan(SS["A"], (0, 1)),
    ),
    "state_space B": (
        lambda m: ops.state_space(X, **{**SS, "B": m}, D=None),
        "B",
        _nan(SS["B"], (0, 0)),
    ),
    "state_space C": (
        lambda m: ops.state_space(X, **{**SS, "C": m}, D=None),
        "C",
        _nan(SS["C"], (0, 0)),
    ),
    "state_space D": (
        lambda m: ops.state_space(X, **SS, D=m),
        "D",
        _nan(jnp.ones((1, 1)), (0, 0)),
    ),
    "diag_state_space": (
        lambda a: ops.diag_state_space(X, a=a, B=SS["B"], C=SS["C"], D=None),
        "a",
        _nan(jnp.full((T, N), 0.5), (3, 1)),
    ),
}


# the costliest programs to compile, left to the full set
_FULL = {"allpole associative", "filtfilt a", "filtfilt gust", "sosfiltfilt"}


def _jit_grad_raises(case, loss):
    op, name, bad = NON_FINITE[case]
    grad = jax.jit(jax.grad(lambda c: loss(op(c))))
    with pytest.raises(Exception, match=f"`{name}` has non-finite"):
        jax.block_until_ready(grad(bad))


@pytest.mark.loud
@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.full) if c in _FULL else c for c in NON_FINITE],
)
def test_nonfinite_coefficient_raises_under_jit_grad_of_a_linear_loss(case):
    # A check whose flag only the forward output carried vanished from
    # `jit(grad(...))` when the loss was linear in the output: the gradient
    # needs the output's cotangent, not its value, and XLA dropped the
    # check with the unused value (195 of 200 NaN entries, no error).
    _jit_grad_raises(case, lambda y: jnp.sum(W * y))


@pytest.mark.full
@pytest.mark.loud
@pytest.mark.parametrize("case", list(NON_FINITE))
def test_nonfinite_coefficient_raises_under_grad_as_eagerly(case):
    op, name, bad = NON_FINITE[case]
    match = f"`{name}` has non-finite"
    _jit_grad_raises(case, lambda y: jnp.sum(y**2))
    for loss in (lambda y: jnp.sum(W * y), lambda y: jnp.sum(y**2)):
        with pytest.raises(ValueError, match=match):
            jax.grad(lambda c, loss=loss: loss(op(c)))(bad)
