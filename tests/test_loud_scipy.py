"""The scipy-named ops fail loudly, as scipy does: bad values of concrete
arguments are a `ValueError` at once (run-time errors under `jit`), dtypes JAX
does not compute in a `TypeError` naming the argument and the dtype."""

import decimal

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal as ss

from helpers import assert_close
from retrax import ops


RUNTIME = eqx.EquinoxRuntimeError
SOS4 = ss.butter(4, 0.2, output="sos")  # two sections: scipy's padlen is 15


def _under_jit(f, args, match):
    """`f(*args)` with traced arguments raises at run time with `match`."""
    with pytest.raises(RUNTIME, match=match):
        eqx.filter_jit(f)(*args)
    with pytest.raises(Exception, match=match):
        jax.jit(f)(*args)


# ------------------------------------------- scipy's ValueError on values


A0_ZERO = [
    ("lfilter", lambda b, a: ops.lfilter(b, a, jnp.ones(20))),
    ("lfilter_zi", ops.lfilter_zi),
    ("lfiltic", lambda b, a: ops.lfiltic(b, a, jnp.ones(2))),
    ("filtfilt", lambda b, a: ops.filtfilt(b, a, jnp.ones(20))),
    ("filtfilt gust", lambda b, a: ops.filtfilt(b, a, jnp.ones(20), method="gust")),
]


@pytest.mark.parametrize("f", [f for _, f in A0_ZERO], ids=[n for n, _ in A0_ZERO])
def test_a0_zero_is_a_value_error(f):
    b, a = jnp.array([1.0, 2.0]), jnp.array([0.0, 1.0, 2.0])
    with pytest.raises(ValueError, match=r"`a\[0\]` must be non-zero"):
        f(b, a)
    _under_jit(f, (b, a), r"`a\[0\]` must be non-zero")


def test_scipy_lfiltic_a0_zero():
    # scipy's test_lfiltic_bad_coeffs, with retrax's lfiltic
    with pytest.raises(ValueError):
        ops.lfiltic([1, 2], [0, 1], [1, 2])
    with pytest.raises(ValueError):
        ss.lfiltic([1, 2], [0, 1], [1, 2])


@pytest.mark.parametrize("name", ["b", "a"])
def test_nonfinite_coefficients_are_a_value_error(name):
    coeffs = {"b": jnp.array([1.0, 0.5]), "a": jnp.array([1.0, -0.5])}
    coeffs[name] = coeffs[name].at[1].set(jnp.nan)
    for f in (
        lambda b, a: ops.lfilter(b, a, jnp.ones(20)),
        lambda b, a: ops.filtfilt(b, a, jnp.ones(20)),
        lambda b, a: ops.freqz(b, a, 8)[1],
    ):
        with pytest.raises(ValueError, match=f"`{name}` has non-finite"):
            f(coeffs["b"], coeffs["a"])
        _under_jit(f, (coeffs["b"], coeffs["a"]), f"`{name}` has non-finite")


SOS_FUNCTIONS = [
    ("sosfilt", lambda sos: ops.sosfilt(sos, jnp.ones(40))),
    ("sosfiltfilt", lambda sos: ops.sosfiltfilt(sos, jnp.ones(40))),
    ("freqz_sos", lambda sos: ops.freqz_sos(sos, 8)[1]),
    ("sosfreqz", lambda sos: ops.sosfreqz(sos, 8)[1]),
]


@pytest.mark.parametrize(
    "f", [f for _, f in SOS_FUNCTIONS], ids=[n for n, _ in SOS_FUNCTIONS]
)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sos_a0_not_one_is_a_value_error(f, dtype):
    # scipy's test_bad_sos: a0 = sos[:, 3] must be 1
    sos = SOS4.astype(dtype).copy()
    sos[0, 3] = 0.0
    with pytest.raises(ValueError, match="a0"):
        f(sos)
    with pytest.raises(ValueError):
        ss.sosfilt(sos, np.ones(40))
    _under_jit(f, (jnp.asarray(sos),), "a0")
    nan = SOS4.astype(dtype).copy()
    nan[1, 4] = np.nan
    with pytest.raises(ValueError, match="`sos` has non-finite"):
        f(nan)
    _under_jit(f, (jnp.asarray(nan),), "`sos` has non-finite")


@pytest.mark.parametrize("length", range(10, 16))
def test_sosfiltfilt_too_short_quotes_scipys_padlen(length):
    x = np.ones(length)
    with pytest.raises(ValueError, match="padlen, which is 15"):
        ss.sosfiltfilt(SOS4, x)
    with pytest.raises(ValueError, match="`padlen` = 15 samples"):
        ops.sosfiltfilt(SOS4, x)
    with pytest.raises(ValueError, match="`padlen` = 15 samples"):
        ops.sosfiltfilt(jnp.asarray(SOS4, jnp.float32), jnp.asarray(x, jnp.float32))
    # traced sections: the default padlen depends on their values
    _under_jit(ops.sosfiltfilt, (jnp.asarray(SOS4), jnp.asarray(x)), "`padlen`")


def test_sosfiltfilt_default_padlen_counts_first_order_sections():
    odd = ss.butter(3, 0.2, output="sos")  # one first-order section: padlen 12
    with pytest.raises(ValueError, match="`padlen` = 12 samples"):
        ops.sosfiltfilt(odd, np.ones(12))
    x = np.random.default_rng(0).normal(size=13)
    assert_close(ops.sosfiltfilt(odd, x), ss.sosfiltfilt(odd, x), rtol=1e-10)
    assert_close(jax.jit(ops.sosfiltfilt)(odd, x), ss.sosfiltfilt(odd, x), rtol=1e-10)


def test_sosfiltfilt_too_short_for_any_sections_names_the_bound_under_jit():
    with pytest.raises(ValueError, match="at least 9; got 9 samples"):
        jax.jit(ops.sosfiltfilt)(SOS4, jnp.ones(9))


# ------------------------------------------------- worN: scipy's count rule


def test_worN_zero_d_integer_array_is_a_count():  # noqa: N802
    # scipy's test_freqz (worN=np.array(7)) and test_sos_freqz (np.array(8))
    w, h = ops.freqz([1.0], worN=np.array(7))
    assert w.shape == h.shape == (7,)
    assert_close(w, ss.freqz([1.0], worN=np.array(7))[0], rtol=1e-12)
    w, h = ops.freqz_sos(SOS4, worN=np.array(8))
    assert w.shape == h.shape == (8,)
    assert_close(h, ss.freqz_sos(SOS4, worN=np.array(8))[1], rtol=1e-10)
    assert ops.freqz([1.0], worN=jnp.array(7))[0].shape == (7,)
    # a float (0-d) is one frequency, as in scipy
    w, h = ops.freqz([1.0, 0.5], worN=np.array(0.25))
    w_ref, h_ref = ss.freqz([1.0, 0.5], worN=np.array(0.25))
    assert_close(w, w_ref, rtol=1e-12)
    assert_close(h, h_ref, rtol=1e-12)
    # under jit a concrete count (closed over) works; a traced one cannot fix
    # the result's shape
    n = np.array(7)
    assert jax.jit(lambda b: ops.freqz(b, worN=n)[1])(jnp.ones(2)).shape == (7,)
    with pytest.raises(TypeError, match="`worN`"):
        jax.jit(lambda n: ops.freqz([1.0], worN=n))(jnp.array(7))


# ------------------------------------------------------------------ dtypes


WIDE = [np.longdouble, np.clongdouble]


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here"
)
@pytest.mark.parametrize("dtype", WIDE, ids=["float128", "complex256"])
def test_long_double_is_a_type_error_naming_the_dtype(dtype):
    name = np.dtype(dtype).name
    x = np.ones(8, dtype)
    for f, arg in (
        (lambda x: ops.lfilter([1.0], [1.0, -0.5], x), "x"),
        (lambda x: ops.filtfilt([1.0], [1.0, -0.5], x, padlen=2), "x"),
        (lambda x: ops.sosfilt(SOS4, x), "x"),
        (lambda b: ops.lfilter(b, [1.0, -0.5], np.ones(8)), "b"),
        (lambda b: ops.freqz(b), "b"),
        (lambda sos: ops.sosfilt(sos, np.ones(8)), "sos"),
    ):
        value = SOS4.astype(dtype) if arg == "sos" else x
        with pytest.raises(TypeError, match=f"`{arg}` has dtype {name}"):
            f(value)


@pytest.mark.skipif(
    np.dtype(np.longdouble).itemsize <= 8, reason="long double is float64 here"
)
def test_long_double_in_retraxs_own_linear_ops():
    x = np.ones(8, np.longdouble)
    for f, arg in (
        (lambda v: ops.fir(jnp.ones(2), v), "x"),
        (lambda v: ops.fir(v[:2], jnp.ones(8)), "b"),
        (lambda v: ops.lfilter_tv(jnp.ones(2), v[:1], jnp.ones(8)), "a"),
        (lambda v: ops.lfilter_tv(jnp.ones(2), jnp.ones(1) * 0.5, v), "x"),
        (lambda v: ops.fir(jnp.ones(2), jnp.ones(8), zi=v[:1]), "zi"),
    ):
        with pytest.raises(TypeError, match=f"`{arg}` has dtype float128"):
            f(x)
    with pytest.raises(TypeError, match="`x` must be numeric, got dtype object"):
        ops.fir(jnp.ones(2), np.array([decimal.Decimal(1)] * 4))


def test_object_arrays_are_a_type_error_naming_the_dtype():
    decimals = np.array([decimal.Decimal(1)] * 4)
    with pytest.raises(TypeError, match="`x` must be numeric, got dtype object"):
        ops.lfilter([1.0], [1.0, -0.5], decimals)
    with pytest.raises(TypeError, match="`a` must be numeric, got dtype object"):
        ops.lfilter([1.0], decimals, np.ones(4))
    with pytest.raises(TypeError, match="`b` must be numeric, got dtype object"):
        ops.freqz([decimal.Decimal(1), decimal.Decimal(2)])


def _big_unsigned():
    return np.array([2**63 + 1, 2**40 + 3, 7], np.uint64)


@pytest.mark.parametrize("x64", [True, False])
def test_uint64_converts_as_scipy_converts(x64):
    """scipy converts integer input to float; without x64 JAX would first
    narrow 64-bit integers to 32 bits (2**63 + 1 became 1)."""
    x = _big_unsigned()
    ref = ss.lfilter([1.0], [1.0, -0.5], x)
    with jax.enable_x64(x64):
        y = ops.lfilter([1.0], [1.0, -0.5], x)
        assert y.dtype == (np.float64 if x64 else np.float32)
        assert_close(y, ref, rtol=1e-15 if x64 else 1e-7)
        # under jit, closed over (a jit argument is converted by JAX itself,
        # which without x64 narrows it to uint32 before retrax sees it)
        y = jax.jit(lambda a: ops.lfilter([1.0], a, x))(jnp.array([1.0, -0.5]))
        assert_close(y, ref, rtol=1e-15 if x64 else 1e-7)
        y = ops.lfilter([1.0], [1.0], np.array([2**62 + 1], np.int64))
        assert_close(y, [2.0**62], rtol=1e-15 if x64 else 1e-7)


@pytest.mark.float32
def test_uint64_converts_as_scipy_converts_float32_session():
    x = _big_unsigned()
    y = ops.lfilter([1.0], [1.0, -0.5], x)
    assert y.dtype == np.float32
    assert_close(y, ss.lfilter([1.0], [1.0, -0.5], x), rtol=1e-7)
    y = ops.sosfilt(SOS4.astype(np.float32), x)
    assert_close(y, ss.sosfilt(SOS4, x.astype(np.float64)), rtol=1e-5)


# -------------------------------------------------------- freqz: fs, float16


BAD_FS = [np.inf, -np.inf, np.nan, 0.0, -1.0, -1, jnp.asarray(-1.0), np.float32(0)]


@pytest.mark.parametrize("fs", BAD_FS, ids=[repr(v) for v in BAD_FS])
@pytest.mark.parametrize(
    "f",
    [
        lambda fs: ops.freqz([1.0, 0.5], [1.0, -0.3], 8, fs=fs),
        lambda fs: ops.freqz_sos(SOS4, 8, fs=fs),
        lambda fs: ops.freqz([1.0, 0.5], worN=[0.1, 0.2], fs=fs),
    ],
    ids=["freqz", "freqz_sos", "freqz at frequencies"],
)
def test_bad_fs_is_a_value_error(f, fs):
    with pytest.raises(ValueError, match="`fs` must be a positive, finite number"):
        f(fs)
    if not isinstance(fs, jax.Array):  # a Python or NumPy number: also under jit
        with pytest.raises(ValueError, match="`fs` must be a positive, finite"):
            jax.jit(lambda: f(fs))()


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_traced_bad_fs_is_a_run_time_error(dtype):
    def freqz(fs):
        return ops.freqz(jnp.ones(2, dtype), worN=8, fs=fs)

    def freqz_sos(fs):
        return ops.freqz_sos(jnp.asarray(SOS4, dtype), worN=[1.0, 2.0], fs=fs)

    for f in (freqz, freqz_sos):
        for fs in (-1.0, 0.0, jnp.inf, jnp.nan):
            _under_jit(f, (jnp.asarray(fs, dtype),), "`fs` must be a positive")
        w, h = jax.jit(f)(jnp.asarray(100.0, dtype))  # a good one still works
        assert jnp.all(w >= 0) and jnp.all(jnp.isfinite(h))


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16])
def test_float16_freqz_computes_in_float32(dtype):
    b = np.array([0.25, 0.5, 0.25], dtype)
    a = np.array([1.0, -0.5], dtype)
    for f in (ops.freqz, jax.jit(ops.freqz, static_argnums=2)):
        w, h = f(b, a, 16)
        assert h.dtype == jnp.complex64 and w.dtype == jnp.float32
        w_ref, h_ref = ss.freqz(b.astype(np.float32), a.astype(np.float32), 16)
        assert_close(h, h_ref, rtol=1e-6)
        assert_close(w, w_ref, rtol=1e-6)
    if dtype == np.float16:
        assert ss.freqz(b, a, 16)[1].dtype == np.complex64  # as scipy
    sos = SOS4.astype(dtype)
    w, h = ops.freqz_sos(sos, 16)
    assert h.dtype == jnp.complex64
    assert_close(h, ss.freqz_sos(sos.astype(np.float32), 16)[1], rtol=1e-5)


# ------------------------------------- float16 filters compute in float32

NARROW_FILTERS = [
    ("lfilter", lambda b, a, sos, x: ops.lfilter(b, a, x), ss.lfilter, "ba"),
    ("filtfilt", lambda b, a, sos, x: ops.filtfilt(b, a, x), ss.filtfilt, "ba"),
    ("lfilter_zi", lambda b, a, sos, x: ops.lfilter_zi(b, a), ss.lfilter_zi, "ba0"),
    ("sosfilt", lambda b, a, sos, x: ops.sosfilt(sos, x), ss.sosfilt, "sos"),
    (
        "sosfiltfilt",
        lambda b, a, sos, x: ops.sosfiltfilt(sos, x),
        ss.sosfiltfilt,
        "sos",
    ),
]


@pytest.mark.parametrize("dtype", [np.float16, jnp.bfloat16], ids=["f16", "bf16"])
@pytest.mark.parametrize(
    "name, f, ref, args",
    NARROW_FILTERS,
    ids=[n for n, *_ in NARROW_FILTERS],
)
def test_narrow_floats_filter_to_their_own_precision(name, f, ref, args, dtype):
    """float16 input is filtered in float32 and rounded once: the error is
    the output's rounding, not a recursion's accumulated rounding (about 20
    times more for this filter in float16)."""
    del name
    b, a = (c.astype(dtype) for c in ss.butter(2, 0.05))
    sos = ss.butter(4, 0.05, output="sos").astype(dtype)
    x = np.random.default_rng(0).normal(size=200).astype(dtype)
    wide = {
        "ba": (b.astype(np.float64), a.astype(np.float64), x.astype(np.float64)),
        "ba0": (b.astype(np.float64), a.astype(np.float64)),
        "sos": (sos.astype(np.float64), x.astype(np.float64)),
    }[args]
    expected = ref(*wide)
    eps = float(jnp.finfo(dtype).eps)
    for g in (f, jax.jit(f)):
        y = g(b, a, sos, x)
        assert y.dtype == dtype
        assert_close(np.asarray(y, np.float64), expected, rtol=eps)
