import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers import (
    assert_close,
    check_float32,
    check_grads,
    check_signal_first,
    np_state_space,
    stable_poly,
    unchecked,
)
from retrax.ops import allpole, diag_state_space, lfilter_tv, state_space


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


def random_system(rng, n_state, n_in, n_out, length=None, complex_=False):
    def draw(*shape):
        v = rng.normal(size=shape)
        return v + 1j * rng.normal(size=shape) if complex_ else v

    lead = () if length is None else (length,)
    A = draw(*lead, n_state, n_state)
    A = 0.9 * A / np.max(np.abs(np.linalg.eigvals(A)), axis=-1)[..., None, None]
    return (
        A,
        draw(*lead, n_state, n_in),
        draw(*lead, n_out, n_state),
        draw(*lead, n_out, n_in),
    )


def _op(op):
    """`state_space` (`"dense"`) or `diag_state_space`, the transition passed
    as `A=` to either."""
    if op == "dense":
        return state_space
    return lambda x, *, A, **maps: diag_state_space(x, a=A, **maps)


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("time_varying", [False, True])
def test_state_space_matches_loop(complex_, time_varying):
    rng = np.random.default_rng(0)
    length = 24
    A, B, C, D = random_system(rng, 4, 2, 3, length if time_varying else None, complex_)
    x = rng.normal(size=(length, 2))
    zi = rng.normal(size=4)
    ref, ref_zf = np_state_space(A, B, C, D, x, zi)
    y, zf = state_space(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    ref, _ = np_state_space(A, B, C, None, x, np.zeros(4))
    assert_close(state_space(x, A=A, B=B, C=C, D=None), ref)
    # mixed: constant A with per-sample B, C, D and the reverse
    if time_varying:
        ref, _ = np_state_space(A[0], B, C, D[0], x, zi)
        assert_close(state_space(x, A=A[0], B=B, C=C, D=D[0], zi=zi), ref)


def test_state_space_companion_equals_lfilter_tv():
    rng = np.random.default_rng(1)
    a = stable_poly(rng, 3)
    b = rng.normal(size=4)
    x = rng.normal(size=50)
    zi = rng.normal(size=3)
    A = np.zeros((3, 3))
    A[0] = -a
    A[1:, :-1] = np.eye(2)
    B = np.eye(3)[:, :1]
    C = (b[1:] - b[0] * a)[None]
    D = b[:1][None]
    y, zf = state_space(x[:, None], A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
    ref, ref_zf = lfilter_tv(x, b=b, a=a, zi=zi, return_zf=True)
    assert_close(y[:, 0], ref)
    assert_close(zf, ref_zf)
    # the pure all-pole filter: the output is the newest state
    y = state_space(x[:, None], A=A, B=B, C=-a[None], D=np.ones((1, 1)), zi=zi)
    assert_close(y[:, 0], allpole(x, a, zi))
    assert_close(
        y[:, 0],
        np_state_space(A, B, -a[None], np.ones((1, 1)), x[:, None], zi)[0][:, 0],
    )


@pytest.mark.parametrize("complex_", [False, True])
@pytest.mark.parametrize("time_varying", [False, True])
def test_diag_state_space_equals_dense(complex_, time_varying):
    rng = np.random.default_rng(2)
    length, n_state = 20, 5
    shape = (length, n_state) if time_varying else (n_state,)
    a = rng.uniform(-0.95, 0.95, size=shape)
    if complex_:
        a = a * np.exp(1j * rng.uniform(0, np.pi, size=shape))
    _, B, C, D = random_system(rng, n_state, 2, 3, None, complex_)
    x = rng.normal(size=(length, 2))
    zi = rng.normal(size=n_state)
    A = np.apply_along_axis(np.diag, -1, a) if time_varying else np.diag(a)
    ref, ref_zf = np_state_space(A, B, C, D, x, zi)
    y, zf = diag_state_space(x, a=a, B=B, C=C, D=D, zi=zi, return_zf=True)
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    assert_close(y, state_space(x, A=A, B=B, C=C, D=D, zi=zi))


def test_diag_state_space_resonant_real_system():
    # a real resonator realised by a complex-conjugate pair of modes
    rng = np.random.default_rng(3)
    pole = 0.97 * np.exp(0.3j)
    A = np.array([[2 * pole.real, -(abs(pole) ** 2)], [1.0, 0.0]])
    B, C = np.array([[1.0], [0.0]]), np.array([[0.3, -0.2]])
    x = rng.normal(size=(40, 1))
    ref = state_space(x, A=A, B=B, C=C, D=None)
    eig, vec = np.linalg.eig(A)
    inv = np.linalg.inv(vec)
    y = diag_state_space(x.astype(complex), a=eig, B=inv @ B, C=C @ vec, D=None)
    assert y.dtype == jnp.complex128
    assert_close(jnp.real(y), ref)
    assert_close(jnp.imag(y), np.zeros_like(ref), atol=1e-12 * np.max(np.abs(ref)))


@pytest.mark.parametrize("op", ["dense", "diag"])
def test_streaming(op):
    rng = np.random.default_rng(4)
    length = 30
    A, B, C, D = random_system(rng, 3, 2, 2, length)
    if op == "diag":
        A = rng.uniform(-0.9, 0.9, size=(length, 3))
    f = _op(op)
    x = rng.normal(size=(length, 2))
    zi = rng.normal(size=3)
    ref, ref_zf = f(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
    z, ys = zi, []
    for lo, hi in [(0, 1), (1, 9), (9, 30)]:
        yk, z = f(
            x[lo:hi],
            A=A[lo:hi],
            B=B[lo:hi],
            C=C[lo:hi],
            D=D[lo:hi],
            zi=z,
            return_zf=True,
        )
        ys.append(yk)
    assert_close(jnp.concatenate(ys), ref)
    assert_close(z, ref_zf)


@pytest.mark.parametrize("op", ["dense", "diag"])
@pytest.mark.parametrize("time_varying", [False, True])
def test_grads(op, time_varying):
    rng = np.random.default_rng(5)
    length = 8
    A, B, C, D = random_system(rng, 3, 2, 2, length if time_varying else None)
    if op == "diag":
        A = rng.uniform(-0.9, 0.9, size=(length, 3) if time_varying else (3,))
    f = _op(op)
    x = rng.normal(size=(length, 2))
    zi = rng.normal(size=3)

    def g(A, B, C, D, x, zi):
        y, zf = f(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
        return jnp.concatenate([y.ravel(), zf])

    check_grads(
        jax.jit(g), tuple(jnp.asarray(v) for v in (A, B, C, D, x, zi)), eps=1e-5
    )


def test_complex_grads_match_dense():
    # JAX convention (plain transpose, no conjugation): compare the modal and
    # dense gradients of a real loss of complex parameters
    rng = np.random.default_rng(6)
    a = 0.9 * np.exp(1j * rng.uniform(0, np.pi, 3))
    _, B, C, _ = random_system(rng, 3, 1, 1, None, True)
    x = jnp.asarray(rng.normal(size=(12, 1)) + 0j)

    def loss_diag(a, B, C):
        return jnp.sum(jnp.real(diag_state_space(x, a=a, B=B, C=C, D=None)) ** 2)

    def loss_dense(a, B, C):
        return jnp.sum(jnp.real(state_space(x, A=jnp.diag(a), B=B, C=C, D=None)) ** 2)

    args = tuple(jnp.asarray(v) for v in (a, B, C))
    g1 = jax.grad(loss_diag, argnums=(0, 1, 2))(*args)
    g2 = jax.grad(loss_dense, argnums=(0, 1, 2))(*args)
    for u, v in zip(g1, g2, strict=True):
        assert_close(u, v)
    check_grads(
        jax.jit(lambda a, B, C: diag_state_space(x, a=a, B=B, C=C, D=None)),
        args,
        eps=1e-5,
    )


def test_float32_complex64_jit_vmap():
    rng = np.random.default_rng(7)
    A, B, C, D = random_system(rng, 4, 1, 1)
    x = rng.normal(size=(3, 64, 1))
    ref = np.stack([np_state_space(A, B, C, D, xb, np.zeros(4))[0] for xb in x])
    f32 = lambda v: jnp.asarray(v, jnp.float32)
    f = jax.jit(
        jax.vmap(
            lambda x, A, B, C, D: state_space(x, A=A, B=B, C=C, D=D),
            in_axes=(0, None, None, None, None),
        )
    )
    y = f(f32(x), f32(A), f32(B), f32(C), f32(D))
    assert y.dtype == jnp.float32
    assert_close(y, ref, rtol=1e-5)
    a = (0.9 * np.exp(1j * rng.uniform(0, np.pi, 4))).astype(np.complex64)
    c64 = lambda v: jnp.asarray(v, jnp.complex64)
    g = jax.jit(
        jax.vmap(
            lambda x, a, B, C: diag_state_space(x, a=a, B=B, C=C, D=None),
            in_axes=(0, None, None, None),
        )
    )
    y = g(c64(x), a, c64(B), c64(C))
    assert y.dtype == jnp.complex64
    ref = np.stack(
        [np_state_space(np.diag(a), B, C, None, xb, np.zeros(4))[0] for xb in x]
    )
    assert_close(y, ref, rtol=1e-5)


@pytest.mark.parametrize("op", ["dense", "diag"])
@pytest.mark.parametrize("time_varying", [False, True])
def test_one_input_signal_as_time(op, time_varying):
    # `x` of shape (time,) is one input: the numbers of `x[:, None]`, and a
    # one-output system gives `y` of shape (time,)
    rng = np.random.default_rng(11)
    length = 12
    A, B, C, D = random_system(rng, 3, 1, 1, length if time_varying else None)
    if op == "diag":
        A = rng.uniform(-0.9, 0.9, size=(length, 3) if time_varying else (3,))
    f = _op(op)
    x = rng.normal(size=length)
    zi = rng.normal(size=3)
    ref, ref_zf = np_state_space(
        A if op == "dense" else _diag(A), B, C, D, x[:, None], zi
    )
    y, zf = f(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
    assert y.shape == (length,)
    assert_close(y, ref[:, 0])
    assert_close(zf, ref_zf)
    assert_close(
        f(x, A=A, B=B, C=C, D=D, zi=zi),
        f(x[:, None], A=A, B=B, C=C, D=D, zi=zi)[:, 0],
        rtol=0,
    )
    assert_close(
        f(x, A=A, B=B, C=C, D=None), f(x[:, None], A=A, B=B, C=C, D=None)[:, 0], rtol=0
    )
    # jit and vmap over a batch of signals
    xs = rng.normal(size=(3, length))
    ys = jax.jit(jax.vmap(lambda x: f(x, A=A, B=B, C=C, D=D)))(xs)
    assert ys.shape == (3, length)
    for k in range(3):
        assert_close(ys[k], f(xs[k][:, None], A=A, B=B, C=C, D=D)[:, 0])
    # derivatives agree with the (time, 1) path's
    args = tuple(jnp.asarray(v) for v in (A, B, C, D, x, zi))

    def loss(one, A, B, C, D, x, zi):
        y = f(x if one else x[:, None], A=A, B=B, C=C, D=D, zi=zi)
        return jnp.sum(jnp.sin(y if one else y[:, 0]))

    grads = jax.grad(lambda *a: loss(True, *a), argnums=range(6))(*args)
    want = jax.grad(lambda *a: loss(False, *a), argnums=range(6))(*args)
    for g, w in zip(grads, want, strict=True):
        assert_close(g, w, rtol=1e-12)
    check_grads(lambda x: f(x, A=A, B=B, C=C, D=D, zi=zi), (jnp.asarray(x),), eps=1e-5)


def test_one_input_signal_with_several_outputs_keeps_outputs_axis():
    rng = np.random.default_rng(12)
    A, B, C, D = random_system(rng, 3, 1, 2)
    x = rng.normal(size=10)
    y = state_space(x, A=A, B=B, C=C, D=D)
    assert y.shape == (10, 2)
    assert_close(y, state_space(x[:, None], A=A, B=B, C=C, D=D), rtol=0)


def test_one_input_signal_needs_one_column_of_b():
    A, B, C = np.eye(3) * 0.5, np.ones((3, 2)), np.ones((1, 3))
    ss_, dss_ = unchecked(state_space), unchecked(diag_state_space)
    for call in (
        lambda: ss_(jnp.zeros(8), A=A, B=B, C=C, D=None),
        lambda: dss_(jnp.zeros(8), a=np.full(3, 0.5), B=B, C=C, D=None),
        lambda: ss_(jnp.zeros(8), A=A, B=np.ones((8, 3, 2)), C=C, D=None),
    ):
        with pytest.raises(
            ValueError, match=r"`x` of shape \(8,\) is one input.*`B` has 2"
        ):
            call()


def _diag(a):
    """The dense transition of modal decays `(N,)` or `(T, N)`."""
    a = np.asarray(a)
    return np.diag(a) if a.ndim == 1 else np.stack([np.diag(r) for r in a])


@pytest.mark.parametrize("op", ["dense", "diag"])
def test_state_space_ops_take_the_signal_first(op):
    rng = np.random.default_rng(13)
    A, B, C, D = random_system(rng, 2, 1, 1)
    if op == "diag":
        f, maps = diag_state_space, {"a": jnp.asarray([0.5, -0.3])}
    else:
        f, maps = state_space, {"A": jnp.asarray(A)}
    maps.update(B=jnp.asarray(B), C=jnp.asarray(C), D=jnp.asarray(D))
    x = jnp.asarray(rng.normal(size=(8, 1)))
    check_signal_first(f, x, maps, jnp.asarray(rng.normal(size=2)))


def test_bad_input():
    A, B, C, D = np.eye(3) * 0.5, np.ones((3, 2)), np.ones((1, 3)), np.ones((1, 2))
    x = jnp.zeros((8, 2))
    ss_, dss_ = unchecked(state_space), unchecked(diag_state_space)
    with pytest.raises(ValueError, match="`A`"):
        ss_(x, A=np.ones((3, 2)), B=B, C=C, D=D)
    with pytest.raises(ValueError, match="`A`"):
        ss_(x, A=np.ones((7, 3, 3)), B=B, C=C, D=D)
    with pytest.raises(ValueError, match="`B`"):
        ss_(x, A=A, B=np.ones((3, 1)), C=C, D=D)
    with pytest.raises(ValueError, match="`C`"):
        ss_(x, A=A, B=B, C=np.ones((1, 2)), D=D)
    with pytest.raises(ValueError, match="`D`"):
        ss_(x, A=A, B=B, C=C, D=np.ones((2, 2)))
    with pytest.raises(ValueError, match="`x`"):
        ss_(jnp.zeros(8), A=A, B=B, C=C, D=D)
    with pytest.raises(ValueError, match="`zi`"):
        ss_(x, A=A, B=B, C=C, D=D, zi=jnp.zeros(2))
    with pytest.raises(ValueError, match="`a`"):
        dss_(x, a=np.ones((7, 3)), B=B, C=C, D=D)
    with pytest.raises(ValueError, match="`B`"):
        dss_(x, a=np.ones(3), B=np.ones((8, 4, 2)), C=C, D=D)
    with pytest.raises(Exception, match="`A` has non-finite"):
        jax.jit(state_space)(x, A=np.full((3, 3), np.nan), B=B, C=C, D=D)
    with pytest.raises(Exception, match="`a` has non-finite"):
        diag_state_space(x, a=np.array([0.5, np.inf, 0.1]), B=B, C=C, D=D)
    with pytest.raises(Exception, match="`D` has non-finite"):
        state_space(x, A=A, B=B, C=C, D=np.full((1, 2), np.nan))


# One cell in the default run, the other three (each an order-2 derivative
# check through blocks) in the slow set.
@pytest.mark.parametrize(
    "op, time_varying",
    [
        ("dense", True),
        pytest.param("dense", False, marks=pytest.mark.slow),
        pytest.param("diag", False, marks=pytest.mark.slow),
        pytest.param("diag", True, marks=pytest.mark.slow),
    ],
)
@pytest.mark.full
def test_blocked_evaluation(monkeypatch, op, time_varying):
    # long signals run in blocks; force short blocks, with a remainder
    import retrax.ops._state_space as module

    monkeypatch.setattr(module, "chunk_length", lambda n_state: 8)
    rng = np.random.default_rng(8)
    length = 30
    A, B, C, D = random_system(rng, 3, 2, 2, length if time_varying else None)
    if op == "diag":
        A = rng.uniform(-0.9, 0.9, size=(length, 3) if time_varying else (3,))
        A_dense = np.apply_along_axis(np.diag, -1, A) if time_varying else np.diag(A)
    else:
        A_dense = A
    f = _op(op)
    x = rng.normal(size=(length, 2))
    zi = rng.normal(size=3)
    ref, ref_zf = np_state_space(A_dense, B, C, D, x, zi)
    y, zf = f(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
    assert_close(y, ref)
    assert_close(zf, ref_zf)
    # an exact number of blocks
    sl = (lambda v: v[:24]) if time_varying else (lambda v: v)
    ref, _ = np_state_space(sl(A_dense), sl(B), sl(C), sl(D), x[:24], zi)
    assert_close(f(x[:24], A=sl(A), B=sl(B), C=sl(C), D=sl(D), zi=zi), ref)

    def g(A, B, C, D, x, zi):
        y, zf = f(x, A=A, B=B, C=C, D=D, zi=zi, return_zf=True)
        return jnp.concatenate([y.ravel(), zf])

    args = tuple(jnp.asarray(v) for v in (A, B, C, D, x, zi))
    check_grads(jax.jit(g), args, eps=1e-5)
    # vmap over signals through the blocks
    xs = jnp.stack([args[4], 2 * args[4]])
    maps = dict(zip("ABCD", args[:4], strict=True))
    batched = jax.vmap(lambda x: f(x, **maps, zi=args[5]))(xs)
    assert_close(batched[1], f(xs[1], **maps, zi=args[5]))


T = 64


@pytest.mark.float32
def test_state_space():
    rng = np.random.default_rng(3)
    A = rng.standard_normal((3, 3))
    A = 0.9 * A / np.max(np.abs(np.linalg.eigvals(A)))
    B, C, D = (rng.standard_normal(s) for s in ((3, 2), (2, 3), (2, 2)))
    x, zi = rng.standard_normal((T, 2)), rng.standard_normal(3)
    ref = np_state_space(A, B, C, D, x, zi)[0]
    check_float32(
        lambda A, B, C, D, x, zi: state_space(x, A=A, B=B, C=C, D=D, zi=zi),
        (A, B, C, D, x, zi),
        ref,
    )


@pytest.mark.float32
def test_diag_state_space():
    rng = np.random.default_rng(4)
    a = rng.uniform(-0.95, 0.95, 3)
    B, C, D = (rng.standard_normal(s) for s in ((3, 2), (2, 3), (2, 2)))
    x, zi = rng.standard_normal((T, 2)), rng.standard_normal(3)
    ref = np_state_space(np.diag(a), B, C, D, x, zi)[0]
    check_float32(
        lambda a, B, C, D, x, zi: diag_state_space(x, a=a, B=B, C=C, D=D, zi=zi),
        (a, B, C, D, x, zi),
        ref,
    )
