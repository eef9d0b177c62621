"""Public functions compiled as a whole: eager calls at their jitted speed,
with the same values, the same errors and no compilation per value."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

import retrax
from helpers import assert_close
from retrax import ops
from retrax.ops import allpole, linear_recurrence


# Rerun by CI with the compiled kernels disabled (RETRAX_DISABLE_KERNELS=1).
pytestmark = pytest.mark.kernels


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
        linear_recurrence(x, decay=jnp.asarray(jnp.inf))
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


def _scipy_calls(x):
    """Each scipy name and its compiled core, called as a scipy user would,
    with the coefficients `c` (a Butterworth-like low-pass scaled by `c`)."""
    from retrax.ops import _filtfilt, _freqz, _lfilter, _sosfilt

    ops = retrax.ops

    def ba(c):
        return [0.2 * c, 0.4 * c, 0.2 * c], [1.0, -0.5 * c, 0.2]

    def sos(c):
        return np.array([[0.2 * c, 0.4 * c, 0.2 * c, 1.0, -0.5 * c, 0.2]] * 2)

    return {
        "lfilter": (_lfilter._lfilter, lambda c: ops.lfilter(*ba(c), x)),
        "lfilter zi": (
            _lfilter._lfilter,
            lambda c: ops.lfilter(*ba(c), x, zi=[c, 0.0])[1],
        ),
        "lfilter_zi": (_lfilter._lfilter_zi, lambda c: ops.lfilter_zi(*ba(c))),
        "lfiltic": (_lfilter._lfiltic, lambda c: ops.lfiltic(*ba(c), [c, 1.0])),
        "filtfilt": (_filtfilt._filtfilt, lambda c: ops.filtfilt(*ba(c), x)),
        "filtfilt gust": (
            _filtfilt._filtfilt,
            lambda c: ops.filtfilt(*ba(c), x, method="gust"),
        ),
        "sosfilt": (_sosfilt._sosfilt, lambda c: ops.sosfilt(sos(c), x)),
        "sosfilt_zi": (_sosfilt._sosfilt_zi, lambda c: ops.sosfilt_zi(sos(c))),
        "sosfiltfilt": (_filtfilt._sosfiltfilt, lambda c: ops.sosfiltfilt(sos(c), x)),
        "freqz": (_freqz._freqz, lambda c: ops.freqz(*ba(c), worN=16)[1]),
        "freqz at frequencies": (
            _freqz._freqz,
            lambda c: ops.freqz(*ba(c), worN=[0.1, 0.2 * c], fs=48000.0)[1],
        ),
        "freqz_sos": (_freqz._freqz_sos, lambda c: ops.freqz_sos(sos(c), 16)[1]),
    }


@pytest.mark.parametrize("name", list(_scipy_calls(None)))
def test_scipy_names_compile_once_for_new_values(name):
    # Python lists and NumPy arrays of new values reuse the program the first
    # call compiled, and give what the same call under `jax.jit` gives.
    x = np.random.default_rng(0).standard_normal(64).astype(np.float32)
    core, call = _scipy_calls(x)[name]
    first = call(1.0)
    before = core._cache_size()
    outs = [call(c) for c in (0.5, 0.75, 1.25)]
    assert core._cache_size() == before
    assert all(out.dtype == first.dtype for out in outs)
    assert not np.allclose(outs[0], outs[2])
    tol = 1e-12 if first.real.dtype == np.float64 else 2e-5
    np.testing.assert_allclose(
        outs[0], jax.jit(lambda: call(0.5))(), rtol=tol, atol=tol
    )


def test_lists_of_python_integers_keep_the_signal_dtype_and_compile():
    from retrax.ops._lfilter import _lfilter

    x = np.ones(32, np.float32)
    retrax.ops.lfilter([1], [1, 0], x)
    before = _lfilter._cache_size()
    for b in ([1], [2], [3]):
        y = retrax.ops.lfilter(b, [1, 0], x)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(y, b[0] * x)
    assert _lfilter._cache_size() == before


def test_jitted_and_vmapped_forms_lower_ahead_of_time():
    # `jax.vmap` and `jax.jit` copy a wrapped function's attributes: a `lower`
    # stored on the compiled call made `jax.jit(jax.vmap(allpole)).lower`
    # lower the unbatched function ("`x` must be one signal").
    x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 32)))
    a = jnp.full((4, 2), 0.1)
    for f, args in [
        (ops.allpole, (x, a)),
        (lambda d, x: ops.linear_recurrence(x, decay=d), (jnp.full((4,), 0.5), x)),
        (lambda b, x: ops.lfilter(b, jnp.array([1.0, -0.5]), x), (a, x)),
    ]:
        batched = jax.jit(jax.vmap(f))
        compiled = batched.lower(*args).compile()
        assert_close(compiled(*args), batched(*args))
    lowered = jax.jit(ops.allpole).lower(x[0], a[0])
    assert_close(lowered.compile()(x[0], a[0]), ops.allpole(x[0], a[0]))
    assert ops.allpole.lower(x[0], a[0]).compile() is not None
