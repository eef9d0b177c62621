"""Every public op of retrax.ops under JAX's transformations: checks that hold under
`jit(grad(...))` whatever the loss, and ahead-of-time lowering of every op."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import assert_close
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


def _scalar(v):
    return jnp.asarray(v, X.dtype)  # not weakly typed, as a spec is not


LINES = jnp.array([[0.6, -0.3], [0.3, 0.6]])
HALF = jnp.array([0.5, 0.5])
# Every public op as a user calls it on one signal (the op itself, statics
# bound by `functools.partial`), with its array arguments, positional then
# keyword.
LOWER = {
    "allpole": (ops.allpole, (X, A[1:]), {}),
    "ballistics": (ops.ballistics, (X, _scalar(0.5), _scalar(0.9)), {}),
    "comb": (functools.partial(ops.comb, delay=4), (X,), {"g": _scalar(0.5)}),
    "delay": (
        functools.partial(ops.delay, max_delay=8),
        (X, _scalar(2.5)),
        {},
    ),
    "diag_state_space": (
        ops.diag_state_space,
        (X,),
        {"a": jnp.full(N, 0.5), "B": SS["B"], "C": SS["C"], "D": None},
    ),
    "fdn": (
        functools.partial(ops.fdn, delays=(3, 5)),
        (X,),
        {"A": LINES, "b": HALF, "c": HALF},
    ),
    "fdn_frequency_response": (
        functools.partial(ops.fdn_frequency_response, (3, 5), n_fft=16),
        (LINES, HALF, HALF),
        {},
    ),
    "fdn_impulse_response": (
        functools.partial(ops.fdn_impulse_response, (3, 5), length=16),
        (LINES, HALF, HALF),
        {},
    ),
    "filtfilt": (ops.filtfilt, (B, A, X), {}),
    "fir": (ops.fir, (X,), {"b": B}),
    "freqz": (ops.freqz, (B, A), {}),
    "freqz_sos": (ops.freqz_sos, (SOS,), {}),
    "lfilter": (ops.lfilter, (B, A, X), {}),
    "lfilter_tv": (ops.lfilter_tv, (X,), {"b": B, "a": A[1:]}),
    "lfilter_tv_zi": (ops.lfilter_tv_zi, (B, A[1:]), {}),
    "lfilter_zi": (ops.lfilter_zi, (B, A), {}),
    "lfiltic": (ops.lfiltic, (B, A, X[:2]), {}),
    "linear_recurrence": (ops.linear_recurrence, (X,), {"decay": _scalar(0.5)}),
    "schroeder_allpass": (
        functools.partial(ops.schroeder_allpass, delay=4),
        (X,),
        {"g": _scalar(0.5)},
    ),
    "sosfilt": (ops.sosfilt, (SOS, X), {}),
    "sosfilt_zi": (ops.sosfilt_zi, (SOS,), {}),
    "sosfiltfilt": (ops.sosfiltfilt, (SOS, X), {}),
    "sosfreqz": (ops.sosfreqz, (SOS,), {}),
    "state_space": (ops.state_space, (X,), {**SS, "D": None}),
}


def test_every_public_op_has_a_lowering_case():
    public = {
        name
        for name in dir(ops)
        if not name.startswith("_") and not isinstance(getattr(ops, name), type(ops))
    }
    assert public == set(LOWER)


def _batched(tree, size=3):
    return jax.tree.map(lambda v: jnp.stack([v] * size), tree)


def _specs(tree):
    return jax.tree.map(lambda v: jax.ShapeDtypeStruct(v.shape, v.dtype), tree)


@pytest.mark.parametrize("name", sorted(LOWER))
def test_jitted_and_vmapped_op_lowers_ahead_of_time(name):
    # `jax.jit(jax.vmap(ops.allpole)).lower(x, a)` lowered the unbatched
    # function ("`x` must be one signal") while calling it worked: a
    # `lower` attribute of the compiled op was copied onto `vmap`'s wrapper.
    # Ahead-of-time compilation takes arrays or `jax.ShapeDtypeStruct`s.
    op, args, kwargs = LOWER[name]
    one = jax.eval_shape(op, *args, **kwargs)
    batched = _batched((args, kwargs))
    for f, (a, k), size in (
        (jax.jit(op), (args, kwargs), ()),
        (jax.jit(jax.vmap(op)), batched, (3,)),
    ):
        want = jax.tree.map(lambda s, size=size: (size + s.shape, s.dtype), one)
        for lowered in (f.lower(*a, **k), f.lower(*_specs(a), **_specs(k))):
            got = jax.tree.map(lambda s: (s.shape, s.dtype), lowered.out_info)
            assert got == want


@pytest.mark.full
@pytest.mark.parametrize("name", sorted(LOWER))
def test_op_compiled_ahead_of_time_from_specs_runs(name):
    op, args, kwargs = LOWER[name]
    a, k = _batched((args, kwargs))
    compiled = jax.jit(jax.vmap(op)).lower(*_specs(a), **_specs(k)).compile()
    jax.tree.map(assert_close, compiled(*a, **k), jax.vmap(op)(*a, **k))
