"""The cascade's reverse mode in one pass (`ops._sections_gradient`) and the
constant coefficients' lag sums (`ops._allpole_lags.lag_dot`): the same
derivatives as the expansion they replace, on every path the kernels take
(one signal, a batch in vector lanes and its remainder, blocks of samples,
every number of sections), for every order of derivative."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from retrax import _native, ops
from retrax.ops import _allpole_lags, _sections_gradient
from retrax.ops._linear_primitive import sections_recurrence


pytestmark = pytest.mark.kernels
FULL = pytest.mark.full


def _coefficients(n_sections, dtype, seed=0):
    """Rows [b0, b1, b2, a1, a2] of stable sections, poles of radius 0.3-0.9
    (well conditioned, so that two summation orders agree to rounding)."""
    rng = np.random.default_rng(seed)
    radius = rng.uniform(0.3, 0.9, n_sections)
    angle = rng.uniform(0.1, 3.0, n_sections)
    a1, a2 = -2 * radius * np.cos(angle), radius**2
    b = rng.standard_normal((n_sections, 3))
    return jnp.asarray(np.column_stack([b, a1, a2]), dtype)


def _cascade_loss(run, w):
    def loss(c, x, zi):
        y = run(c, x, zi)
        return jnp.sum(w * y) + jnp.sum(jnp.sin(y) ** 2)

    return loss


def _expansion(c, x, zi):
    if x.ndim == 2:
        return jax.vmap(_expansion, in_axes=(None, 0, None))(c, x, zi)
    return _sections_gradient._expand(c, x, zi)


def _close(got, want, rtol):
    for g, r in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        scale = max(float(jnp.max(jnp.abs(r), initial=0.0)), 1e-30)
        assert float(jnp.max(jnp.abs(g - r), initial=0.0)) <= rtol * scale


# (the default set: one section and eight, the most the kernels unroll)
@pytest.mark.parametrize(
    "n_sections", [1, pytest.param(3, marks=FULL), 8, pytest.param(9, marks=FULL)]
)
@pytest.mark.parametrize("shape", [(0,), (1,), (2,), (300,), (3, 5), (11, 260)])
def test_cascade_gradient_is_the_expansions(n_sections, shape):
    rng = np.random.default_rng(n_sections)
    c = _coefficients(n_sections, jnp.float64)
    x = jnp.asarray(rng.standard_normal(shape))
    zi = jnp.asarray(rng.standard_normal(2 * n_sections))
    w = jnp.asarray(rng.standard_normal(shape))

    def run(c, x, zi):
        if x.ndim == 2:
            return jax.vmap(sections_recurrence, in_axes=(None, 0, None))(c, x, zi)
        return sections_recurrence(c, x, zi)

    got = jax.jit(jax.grad(_cascade_loss(run, w), argnums=(0, 1, 2)))(c, x, zi)
    want = jax.grad(_cascade_loss(_expansion, w), argnums=(0, 1, 2))(c, x, zi)
    _close(got, want, 1e-12)
    # the kernel's path is the one taken
    text = jax.jit(jax.grad(_cascade_loss(run, w))).lower(c, x, zi).as_text()
    assert (f"@{_native.SECTIONS_ADJOINT}(" in text) == _native.available("allpole")


def test_cascade_gradient_float32_lanes():
    # eight float32 signals fill one vector of lanes, the ninth runs alone
    rng = np.random.default_rng(0)
    c = _coefficients(4, jnp.float32)
    x = jnp.asarray(rng.standard_normal((9, 700)), jnp.float32)
    zi = jnp.zeros(8, jnp.float32)
    w = jnp.asarray(rng.standard_normal((9, 700)), jnp.float32)
    run = jax.vmap(sections_recurrence, in_axes=(None, 0, None))
    got = jax.grad(_cascade_loss(run, w), argnums=(0, 1))(c, x, zi)
    want = jax.grad(_cascade_loss(_expansion, w), argnums=(0, 1))(c, x, zi)
    _close(got, want, 2e-4)


BLOCK = _sections_gradient.BLOCK
# lengths around the checkpoints' blocks: none, one sample, a block but one,
# a block, a block and one, several blocks with a short last one
_LENGTHS = (0, 1, BLOCK - 1, BLOCK, BLOCK + 1, 3 * BLOCK + 17)


def _block_cases():
    default = {(8, "float64", BLOCK + 1), (1, "float32", 3 * BLOCK + 17)}
    return [
        pytest.param(
            n, dtype, length, marks=() if (n, dtype, length) in default else FULL
        )
        for n in range(1, 9)
        for dtype in ("float64", "float32")
        for length in _LENGTHS
    ]


def _block_gradients(n_sections, dtype, shape, seed):
    """The kernel's gradient and the expansion's in float64 (the derivative
    the float32 one rounds), with an initial state."""
    rng = np.random.default_rng(seed)
    c = _coefficients(n_sections, dtype)
    zi = jnp.asarray(rng.standard_normal(2 * n_sections), dtype)
    x = jnp.asarray(rng.standard_normal(shape), dtype)
    w = jnp.asarray(rng.standard_normal(shape), dtype)
    run = jax.vmap(sections_recurrence, in_axes=(None, 0, None))
    got = jax.jit(jax.grad(_cascade_loss(run, w), argnums=(0, 1, 2)))(c, x, zi)
    wide = [jnp.asarray(v, jnp.float64) for v in (c, x, zi, w)]
    reference = jax.grad(_cascade_loss(_expansion, wide[3]), argnums=(0, 1, 2))
    want = jax.jit(reference)(*wide[:3])
    return got, jax.tree.map(lambda v: v.astype(dtype), want)


@pytest.mark.parametrize("n_sections, dtype, length", _block_cases())
def test_cascade_gradient_over_checkpointed_blocks(n_sections, dtype, length):
    # a group of signals in vector lanes and one signal on its own, each
    # recomputed a block at a time from its checkpoints
    lanes = 32 // np.dtype(dtype).itemsize
    got, want = _block_gradients(
        n_sections, dtype, (lanes + 1, length), seed=n_sections + length
    )
    _close(got, want, 1e-12 if dtype == "float64" else 2e-4)


@pytest.mark.parametrize(
    "n_sections, dtype, batch, blocks, tail",
    [
        # two lane groups of blocks, the last of two with a short block
        (2, "float32", 1, 10, 17),
        pytest.param(8, "float64", 2, 6, 1, marks=FULL),
        # whole groups, the last block whole
        pytest.param(4, "float64", 1, 8, 0, marks=FULL),
        # a group of signals in lanes and one left over, three groups of
        # blocks, the last of one short block
        pytest.param(5, "float32", 9, 17, 1000, marks=FULL),
    ],
)
def test_cascade_gradient_of_a_signal_over_lane_groups_of_blocks(
    n_sections, dtype, batch, blocks, tail
):
    # a signal on its own recomputes W blocks at once in vector lanes
    # (W = 8 in float32, 4 in float64)
    length = (blocks - (tail > 0)) * BLOCK + tail
    got, want = _block_gradients(n_sections, dtype, (batch, length), seed=blocks + tail)
    _close(got, want, 1e-12 if dtype == "float64" else 2e-4)


@pytest.mark.parametrize(
    "n_sections", [pytest.param(3, marks=FULL), 8, pytest.param(9, marks=FULL)]
)
@pytest.mark.parametrize("dtype", ["float64", pytest.param("float32", marks=FULL)])
def test_cascade_gradient_batch_of_whole_lane_groups(n_sections, dtype):
    lanes = 32 // np.dtype(dtype).itemsize
    got, want = _block_gradients(
        n_sections, dtype, (2 * lanes, 2 * BLOCK + 5), seed=n_sections
    )
    _close(got, want, 1e-12 if dtype == "float64" else 2e-4)


def test_saved_checkpoints_do_not_grow_with_sections_times_length():
    # reverse mode keeps the output and 2 S values a block, never a signal
    # per section
    n_sections, length = 8, 10 * BLOCK + 3
    c = _coefficients(n_sections, jnp.float32)
    x = jnp.ones((3, length), jnp.float32)
    zi = jnp.zeros(2 * n_sections, jnp.float32)
    run = jax.vmap(sections_recurrence, in_axes=(None, 0, None))
    grad = jax.grad(lambda c, x: jnp.sum(run(c, x, zi) ** 2), argnums=(0, 1))
    jaxpr = jax.make_jaxpr(grad)(c, x).jaxpr
    saved = [e for e in jaxpr.eqns if e.primitive is _sections_gradient.saved_p]
    if not _native.available("allpole"):
        # without the kernels the expansion differentiates the cascade
        assert not saved
        return
    assert saved[0].outvars[1].aval.shape == (3, 11, 2 * n_sections)
    # nothing in the gradient's program is as large as a signal per section
    for eqn in jaxpr.eqns:
        for var in eqn.outvars:
            assert var.aval.size < n_sections * x.size
    text = jax.jit(grad).lower(c, x).as_text()
    assert "tensor<3x11x16xf32>" in text
    assert f"tensor<3x{n_sections}x{length}xf32>" not in text


def test_kernel_checkpoints_are_the_references():
    # a signal on its own: the kernel lays its checkpoints out as the
    # reference does (every section's outputs before each block's start)
    rng = np.random.default_rng(3)
    c = _coefficients(3, jnp.float64)
    x = jnp.asarray(rng.standard_normal(2 * BLOCK + 7))
    zi = jnp.asarray(rng.standard_normal(6))
    got = jax.jit(_sections_gradient.saved_p.bind)(c, x, zi)
    want = _sections_gradient._saved_reference(c, x, zi)
    assert got[1].shape == want[1].shape == (3, 6)
    _close(got, want, 1e-12)


@pytest.mark.parametrize("n_sections", [2, 9])
def test_cascade_forward_mode_and_second_derivatives(n_sections):
    rng = np.random.default_rng(1)
    c = _coefficients(n_sections, jnp.float64)
    x = jnp.asarray(rng.standard_normal(40))
    zi = jnp.asarray(rng.standard_normal(2 * n_sections))
    w = jnp.asarray(rng.standard_normal(40))
    loss = _cascade_loss(sections_recurrence, w)
    reference = _cascade_loss(_expansion, w)
    primals = (c, x, zi)
    tangents = tuple(jnp.asarray(rng.standard_normal(p.shape)) for p in primals)
    _close(
        jax.jvp(loss, primals, tangents), jax.jvp(reference, primals, tangents), 1e-12
    )
    # Hessian-vector products: forward over reverse and reverse over reverse
    hvp = jax.jvp(jax.grad(loss, argnums=(0, 1, 2)), primals, tangents)[1]
    want = jax.jvp(jax.grad(reference, argnums=(0, 1, 2)), primals, tangents)[1]
    _close(hvp, want, 1e-10)
    vjp = jax.grad(lambda p: jnp.vdot(jax.grad(loss)(p, x, zi), tangents[0]))(c)
    want = jax.grad(lambda p: jnp.vdot(jax.grad(reference)(p, x, zi), tangents[0]))(c)
    _close(vjp, want, 1e-10)


def test_sosfilt_coefficient_gradient_matches_finite_differences():
    # scipy's numbers: the derivative of scipy.signal.sosfilt by central
    # differences, against the kernel's one-pass gradient
    rng = np.random.default_rng(2)
    sos = scipy.signal.butter(6, 0.2, output="sos")
    x = rng.standard_normal(500)
    w = rng.standard_normal(500)
    grad = jax.grad(lambda s: jnp.sum(w * ops.sosfilt(s, jnp.asarray(x))))(
        jnp.asarray(sos)
    )
    step = 1e-6
    for i, j in [(0, 0), (1, 1), (2, 2), (0, 4), (1, 5), (2, 4)]:
        up, down = sos.copy(), sos.copy()
        up[i, j] += step
        down[i, j] -= step
        fd = (
            np.sum(w * scipy.signal.sosfilt(up, x))
            - np.sum(w * scipy.signal.sosfilt(down, x))
        ) / (2 * step)
        assert abs(float(grad[i, j]) - fd) <= 1e-6 * max(1.0, abs(fd))


@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, marks=FULL), jnp.float64])
@pytest.mark.parametrize("order", [pytest.param(1, marks=FULL), 5, 32])
@pytest.mark.parametrize("length", [0, pytest.param(1, marks=FULL), 40, 1001])
@pytest.mark.parametrize("adjoint", [False, True])
def test_lag_sums_are_the_reductions(dtype, order, length, adjoint):
    rng = np.random.default_rng(order + length)
    ct, out = (jnp.asarray(rng.standard_normal((3, length)), dtype) for _ in "ab")
    zi = jnp.asarray(rng.standard_normal((3, order)), dtype)
    got = jax.jit(
        jax.vmap(lambda c, o, z: _allpole_lags.lag_dot(c, o, z, adjoint=adjoint))
    )(ct, out, zi)
    want = _allpole_lags._dot(ct, out, zi, adjoint=adjoint)
    _close(got, want, 1e-5 if dtype == jnp.float32 else 1e-13)


@pytest.mark.parametrize("order", [2, 16])
def test_constant_allpole_and_fir_gradients_are_the_scans(order):
    rng = np.random.default_rng(order)
    a = jnp.asarray(0.5 * rng.standard_normal(order) / order)
    b = jnp.asarray(rng.standard_normal(order + 1))
    x = jnp.asarray(rng.standard_normal(600))
    zi = jnp.asarray(rng.standard_normal(order))

    def loss(a, b, x, zi):
        return jnp.sum(jnp.sin(ops.allpole(ops.fir(x, b=b), a, zi)))

    def scan(a, b, x, zi):
        padded = jnp.concatenate([jnp.zeros(order), x])
        drive = sum(
            b[k] * padded[order - k : order - k + 600] for k in range(order + 1)
        )

        def step(past, u):
            y = u - jnp.dot(a, past)
            return jnp.concatenate([y[None], past[:-1]]), y

        return jnp.sum(jnp.sin(jax.lax.scan(step, zi, drive)[1]))

    got = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(a, b, x, zi)
    want = jax.grad(scan, argnums=(0, 1, 2, 3))(a, b, x, zi)
    _close(got, want, 1e-11)
    hessian = jax.hessian(loss)(a, b, x, zi)
    _close(hessian, jax.hessian(scan)(a, b, x, zi), 1e-10)
