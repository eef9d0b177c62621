"""Failed run-time checks lead with the check's message, which names the
argument; where the check sits comes after it."""

import itertools
import os
import subprocess
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax
from helpers import copies_in
from retrax import diffusion as rd, ops, relations as rr
from retrax._errors import error_if, filter_jit
from retrax.ops import (
    allpole,
)


def _relation():
    angles = jnp.linspace(0, 2 * jnp.pi, 12, endpoint=False)
    ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
    pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(12, 0.05))
    return rr.ImplicitDiffusion(pred, rr.field_nodes(jax.random.key(0), 2, samples=4))


def _raised(call) -> str:
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        jax.block_until_ready(call())
    return str(info.value)


@pytest.mark.full
def test_a_later_call_leads_with_the_failed_check():
    model, rho = _relation(), jnp.array([jnp.inf, 0.0])
    ok = rr.implicit_infer(model, jnp.array([0.6, 0.5]), rho)
    assert ok.result == rr.RESULTS.successful
    # The same compiled program fails on the second call.
    text = _raised(lambda: rr.implicit_infer(model, jnp.array([jnp.nan, 0.5]), rho))
    assert text.startswith("`z0` must be finite"), text[:200]
    # Where the check sits comes after, inside the compiled function only:
    # not the stack of the first call, which traced the program.
    where = text.index("The check, inside the compiled call:")
    assert "_infer.py" in text[where:]
    assert "test_a_later_call_leads_with_the_failed_check" not in text
    assert "Above is the stack outside of JIT" not in text


@pytest.mark.full
def test_a_compiled_solver_called_eagerly_raises_a_bad_value_as_value_error():
    # Before: `implicit_infer` (compiled as a whole) raised a bare
    # EquinoxRuntimeError for a NaN clamp on concrete input, where code that
    # catches ValueError (as for scipy's and Python's bad values) broke. Its
    # arguments are concrete, so a failed argument check is a ValueError;
    # it is still an EquinoxRuntimeError, as before.
    model, rho = _relation(), jnp.array([jnp.inf, 0.0])
    with pytest.raises(ValueError, match="^`z0` must be finite") as info:
        rr.implicit_infer(model, jnp.array([jnp.nan, 0.5]), rho)
    assert isinstance(info.value, retrax.InvalidArgumentError)
    assert isinstance(info.value, eqx.EquinoxRuntimeError)
    # a failed solve is not a bad value: its result's message, not a ValueError
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        jax.block_until_ready(
            rr.implicit_infer(model, jnp.array([0.6, 0.5]), rho, max_steps=1)
        )
    assert not isinstance(info.value, ValueError), str(info.value)[:200]
    # under the user's own filter_jit the same bad value raises at run time,
    # as an EquinoxRuntimeError rendered by Equinox
    run = eqx.filter_jit(lambda z0: rr.implicit_infer(model, z0, rho).value)
    with pytest.raises(eqx.EquinoxRuntimeError, match="`z0` must be finite"):
        jax.block_until_ready(run(jnp.array([jnp.nan, 0.5])))


def test_wrapper_keeps_the_function_and_its_values():
    def double(x):
        """Twice `x`, which must be non-negative."""
        return error_if(x, jnp.any(x < 0), "`x` must be non-negative.") * 2

    jitted = filter_jit(double)
    assert jitted.__doc__ == double.__doc__ and jitted.__wrapped__ is double
    assert jnp.array_equal(jitted(jnp.arange(3.0)), 2 * jnp.arange(3.0))
    text = _raised(lambda: jitted(-jnp.ones(3)))
    assert text.startswith("`x` must be non-negative."), text[:200]


def test_inside_a_users_own_filter_jit_the_check_still_raises():
    # There the user's `eqx.filter_jit` renders the error; the check's message
    # is in it.
    model, rho = _relation(), jnp.array([jnp.inf, 0.0])
    run = eqx.filter_jit(lambda z0: rr.implicit_infer(model, z0, rho).value)
    run(jnp.array([0.6, 0.5]))
    text = _raised(lambda: run(jnp.array([jnp.nan, 0.5])))
    assert "`z0` must be finite" in text
    # equinox renders it (the stack, then the message), not the text of the
    # check's own callback, which says that `equinox.filter_jit` is not used
    assert text.startswith("Above is the stack outside of JIT")
    assert "do not appear to be using" not in text


def test_a_concrete_check_raises_at_once_as_a_value_error():
    # Decided without compiling anything: both a ValueError (what Python and
    # scipy raise for a bad value) and an EquinoxRuntimeError (what the same
    # check raises at run time under jit).
    with pytest.raises(ValueError, match="^`x` must be non-negative.$") as info:
        error_if(-jnp.ones(3), jnp.array(True), "`x` must be non-negative.")
    assert isinstance(info.value, eqx.EquinoxRuntimeError)
    x = jnp.ones(3)
    assert error_if(x, jnp.array(False), "unused") is x
    assert error_if(x, np.False_, "unused") is x
    # traced, it is a run-time check
    checked = eqx.filter_jit(lambda x: error_if(x, jnp.any(x < 0), "`x` must be >= 0."))
    assert jnp.array_equal(checked(x), x)
    with pytest.raises(eqx.EquinoxRuntimeError, match="`x` must be >= 0."):
        jax.block_until_ready(checked(-x))


def test_a_check_carries_every_kind_of_leaf():
    # a solution checked as a whole holds booleans and integers beside floats
    tree = (jnp.ones(2), jnp.array([True, False]), jnp.arange(3))
    checked = jax.jit(lambda t: error_if(t, t[0][0] < 0, "`t` must be >= 0."))
    out = checked(tree)
    for got, want in zip(out, tree, strict=True):
        assert got.dtype == want.dtype and bool(jnp.all(got == want))


@pytest.mark.parametrize("decorate", ["bare", "with_arguments"])
def test_a_users_program_under_retrax_filter_jit_leads_with_the_check(decorate):
    # The user's own compiled program calls retrax; a NaN coefficient that
    # only its second call carries fails the check inside `lfilter`.
    def program(b, a, x):
        return ops.lfilter(b, a, x)

    run = (
        retrax.filter_jit(program)
        if decorate == "bare"
        else retrax.filter_jit(donate="none")(program)
    )
    b, a, x = jnp.array([1.0, 0.5]), jnp.array([1.0, 0.2]), jnp.ones(16)
    assert jnp.allclose(run(b, a, x), ops.lfilter(b, a, x))
    text = _raised(lambda: run(b, a.at[0].set(jnp.nan), x))
    assert text.startswith("`a` has non-finite"), text[:200]
    where = text.index("The check, inside the compiled call:")
    assert "in program" in text[where:]
    assert "Above is the stack outside of JIT" not in text
    # the same program under a plain `eqx.filter_jit` puts the stack first
    plain = eqx.filter_jit(program)
    plain(b, a, x)
    text = _raised(lambda: plain(b, a.at[0].set(jnp.nan), x))
    assert not text.startswith("`a` has non-finite")
    assert "`a` has non-finite" in text


class _NaNNoise(rd.AbstractPredictor):
    """A predictor whose noise estimate is NaN everywhere."""

    schedule: rd.VPSDE = rd.VPSDE()
    conservative = False

    def potential(self, x, t):
        raise TypeError("not conservative")

    def epsilon(self, x, t):
        return jnp.full_like(x, jnp.nan)


def test_a_check_two_functions_share_never_shows_the_others_place():
    # Equinox records where a check sits once per distinct check (the same
    # messages and shapes), when it is first traced. Every sampler makes the
    # same result-code check, so DDIM's failure was shown as sitting in
    # `sample_ancestral`, which traced it first. A place recorded in another
    # function is now left out; the message still leads.
    pred, key = _NaNNoise(), jax.random.key(0)
    first = _raised(lambda: rd.sample_ancestral(pred, key, 2, steps=4).value)
    assert first.startswith("A sampler's state became non-finite"), first[:200]
    where = first.index("The check, inside the compiled call:")
    assert "in sample_ancestral" in first[where:]
    second = _raised(lambda: rd.sample_ddim(pred, key, 2, steps=4).value)
    assert second.startswith("A sampler's state became non-finite"), second[:200]
    assert "sample_ancestral" not in second


RUNTIME = eqx.EquinoxRuntimeError


def _batch_copies(f, *args) -> list[str]:
    """The copies of a whole `(8, 1000)` batch in `f`'s compiled program."""
    return copies_in(jax.jit(f).lower(*args).compile().as_text(), "[8,1000]")


def test_checks_do_not_copy_the_checked_signal():
    # A run-time check passes a flag, not the signal, through its `lax.cond`
    # (`retrax._errors.error_if`): XLA would write a conditional's result to
    # a new buffer, a copy of the whole batch on every call. The checked op
    # compiles to as many batch copies as its unchecked recursion (none
    # with the kernel; the pure-JAX loop copies its initial buffer).
    from retrax.ops._linear_primitive import allpole_recurrence

    x = jnp.ones((8, 1_000), jnp.float32)
    a = jnp.broadcast_to(jnp.asarray([-0.5, 0.2], jnp.float32), (8, 1_000, 2))
    zi = jnp.zeros((8, 2), jnp.float32)
    checked = jax.vmap(lambda x, a, zi: allpole(x, a, zi))
    bare = jax.vmap(lambda x, a, zi: allpole_recurrence(a, x, zi))
    for f in (checked, bare):
        assert jnp.allclose(jax.jit(checked)(x, a, zi), jax.jit(f)(x, a, zi))
    for mode in ("forward", "gradient"):
        counts = []
        for f in (checked, bare):
            if mode == "gradient":
                f = jax.grad(  # noqa: PLW2901
                    lambda x, a, zi, f=f: jnp.sum(f(x, a, zi) ** 2), argnums=(0, 1)
                )
            counts.append(_batch_copies(f, x, a, zi))
        assert len(counts[0]) == len(counts[1]), (mode, counts)
    # and a check on a computed value copies nothing
    from retrax._errors import error_if

    def f(x):
        y = jnp.sin(x)
        return 3 * error_if(y, ~jnp.all(jnp.isfinite(y[:, -1])), "m")

    assert _batch_copies(f, x) == []


def test_check_keeps_every_value_bit_for_bit():
    from retrax._errors import error_if

    v = jnp.asarray([-0.0, 0.0, np.nan, np.inf, -np.inf, -1.5e-45, 3.0])
    for dtype, in_gradient in itertools.product(
        (jnp.float32, jnp.complex64), (False, True)
    ):
        w = v.astype(dtype)

        def check(w, in_gradient=in_gradient):
            return error_if(w, jnp.real(w[-1]) > 5, "m", in_gradient=in_gradient)

        out = eqx.filter_jit(check)(w)
        assert out.dtype == w.dtype
        np.testing.assert_array_equal(
            np.asarray(out).view(np.uint8), np.asarray(w).view(np.uint8)
        )
    with pytest.raises(RUNTIME, match="`w` is bad"):
        eqx.filter_jit(lambda w: error_if(w, w[-1] > 2, "`w` is bad"))(v)


def test_check_needs_an_array_to_carry_it():
    # with nothing to thread the flag on, the check would vanish unseen
    from retrax._errors import error_if

    with pytest.raises(ValueError, match="no arrays"):
        error_if((1.0, "name"), jnp.asarray(True), "m")


@pytest.mark.full
def test_check_gives_nan_with_eqx_on_error_nan():
    # `EQX_ON_ERROR=nan` (read by equinox at import) turns a failed check
    # into NaN for the whole checked value, as `eqx.error_if` does, whether
    # the check runs in the program or on the host before it.
    code = (
        "import jax, jax.numpy as jnp\n"
        "from retrax.ops import allpole\n"
        "x = jnp.ones(16)\n"
        "a = jnp.zeros((16, 2)).at[5, 0].set(jnp.nan)\n"
        "for f in (allpole, jax.jit(allpole)):\n"
        "    y = f(x, a)\n"
        "    assert bool(jnp.all(jnp.isnan(y))), y\n"
        "    assert bool(jnp.all(jnp.isfinite(f(x, a.at[5, 0].set(0.1)))))\n"
        "# a check made on the host, at once (a Python sample rate), too\n"
        "from retrax.ops import freqz\n"
        "w, _ = freqz([1.0, 0.5], worN=4, fs=-1.0)\n"
        "assert bool(jnp.all(jnp.isnan(w))), w\n"
        "print('ok')\n"
    )
    env = {**os.environ, "EQX_ON_ERROR": "nan"}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().endswith("ok")


@pytest.mark.parametrize("wrap", ["eqx.filter_jit", "jax.jit"])
def test_equinox_renderings_of_a_failed_check_are_read(wrap):
    # The one parser of equinox's error text, against the installed equinox:
    # the message (several paragraphs too) comes back exactly, under both
    # ways of compiling the program.
    from retrax._errors import check_message, is_argument_check

    msg = "`x` must be non-positive.\n\nA second paragraph."
    program = (eqx.filter_jit if wrap == "eqx.filter_jit" else jax.jit)(
        lambda x: eqx.error_if(x, x > 0, msg)
    )
    with pytest.raises(Exception) as info:
        jax.block_until_ready(program(jnp.ones(())))
    assert check_message(str(info.value)) == msg
    assert is_argument_check(msg)
    assert check_message("no check here") is None
    # a failed solve's message is a result code's, not an argument's
    assert not is_argument_check(rr.RESULTS[rr.RESULTS.max_steps_reached])
    assert not is_argument_check(rr.RESULTS[rr.RESULTS.unstable_root])
