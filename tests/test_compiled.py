"""Public functions compiled as a whole: eager calls at their jitted speed,
with the same values, the same errors and no compilation per value."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

import retrax
from retrax.ops import allpole, linear_recurrence


def _signal(dtype=jnp.float32, length=64):
    return jax.random.normal(jax.random.key(0), (length,), dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_eager_call_equals_its_jitted_call_and_scipy(dtype):
    x, a = _signal(dtype), jnp.array([-1.6, 0.8], dtype)
    y = allpole(x, a)
    assert y.dtype == dtype
    np.testing.assert_array_equal(y, jax.jit(allpole)(x, a))
    want = scipy.signal.lfilter([1.0], [1.0, -1.6, 0.8], np.asarray(x, np.float64))
    tol = 1e-4 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(y, want, rtol=tol, atol=tol)
    y2, zf = allpole(x, a, return_zf=True)
    np.testing.assert_array_equal(y2, y)
    np.testing.assert_array_equal(zf, y[::-1][:2])


def test_new_values_do_not_compile_again():
    x = _signal(jnp.float64)
    before = allpole._cache_size()
    for a in ([-1.6, 0.8], [-1.2, 0.5], [0.3, 0.1]):
        allpole(x, jnp.array(a))
        allpole(x, np.array(a))  # a NumPy array of the same dtype
    assert allpole._cache_size() - before == 1
    # Python lists are one array argument, not one traced scalar per number.
    np.testing.assert_array_equal(
        allpole(list(np.asarray(x)), [-1.6, 0.8]), allpole(x, jnp.array([-1.6, 0.8]))
    )


def test_eager_run_time_check_is_a_value_error_naming_the_argument():
    x = _signal()
    with pytest.raises(retrax.InvalidArgumentError) as info:
        allpole(x, jnp.array([jnp.nan, 0.5], jnp.float32))
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, eqx.EquinoxRuntimeError)
    assert str(info.value).startswith("`a` has non-finite")
    with pytest.raises(ValueError, match="`decay`"):
        linear_recurrence(jnp.asarray(jnp.inf), x)
    # under the user's jit it stays a run-time error
    with pytest.raises(eqx.EquinoxRuntimeError, match="`a` has non-finite"):
        eqx.filter_jit(allpole)(x, jnp.array([jnp.nan, 0.5], jnp.float32))


def test_shape_errors_still_raise_while_tracing():
    with pytest.raises(ValueError, match="order >= 1"):
        allpole(_signal(), jnp.zeros((0,)))


def test_arrays_jax_would_narrow_take_the_functions_own_path():
    # float16 and 64-bit integers go through the function itself, which
    # converts them as it always did
    x16 = np.linspace(-1, 1, 16).astype(np.float16)
    np.testing.assert_allclose(
        allpole(x16, np.array([0.5], np.float16)),
        allpole(jnp.asarray(x16, jnp.float32), jnp.array([0.5], jnp.float32)),
        rtol=1e-2,
    )
    xi = np.arange(8, dtype=np.int64)
    np.testing.assert_allclose(allpole(xi, [0.5]), allpole(xi.astype(float), [0.5]))


def test_transformations_through_the_compiled_call():
    x, a = _signal(jnp.float64), jnp.array([-1.6, 0.8])

    def loss(a, x):
        return jnp.sum(allpole(x, a) ** 2)

    g = jax.grad(loss)(a, x)
    np.testing.assert_allclose(g, jax.jit(jax.grad(loss))(a, x), rtol=1e-12)
    xs = jnp.stack([x, 2 * x])
    np.testing.assert_allclose(
        jax.vmap(allpole, (0, None))(xs, a),
        jnp.stack([allpole(x, a), 2 * allpole(x, a)]),
        rtol=1e-12,
    )
    tangent = jax.jvp(lambda a: allpole(x, a), (a,), (jnp.ones(2),))[1]
    eps = 1e-6
    fd = (allpole(x, a + eps) - allpole(x, a - eps)) / (2 * eps)
    np.testing.assert_allclose(tangent, fd, rtol=1e-5, atol=1e-6)
