"""Failed run-time checks lead with the check's message, which names the
argument; where the check sits comes after it."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax
from retrax import diffusion as rd, ops
from retrax._errors import error_if, filter_jit


def _relation():
    angles = jnp.linspace(0, 2 * jnp.pi, 12, endpoint=False)
    ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
    pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(12, 0.05))
    return rd.ImplicitDiffusion(pred, rd.field_nodes(jax.random.key(0), 2, samples=4))


def _raised(call) -> str:
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        jax.block_until_ready(call())
    return str(info.value)


def test_a_later_call_leads_with_the_failed_check():
    model, rho = _relation(), jnp.array([jnp.inf, 0.0])
    ok = rd.implicit_infer(model, jnp.array([0.6, 0.5]), rho)
    assert ok.result == rd.RESULTS.successful
    # The same compiled program fails on the second call.
    text = _raised(lambda: rd.implicit_infer(model, jnp.array([jnp.nan, 0.5]), rho))
    assert text.startswith("`z0` must be finite"), text[:200]
    # Where the check sits comes after, inside the compiled function only:
    # not the stack of the first call, which traced the program.
    where = text.index("The check, inside the compiled call:")
    assert "_infer.py" in text[where:]
    assert "test_a_later_call_leads_with_the_failed_check" not in text
    assert "Above is the stack outside of JIT" not in text


def test_a_compiled_solver_called_eagerly_raises_a_bad_value_as_value_error():
    # Before: `implicit_infer` (compiled as a whole) raised a bare
    # EquinoxRuntimeError for a NaN clamp on concrete input, where code that
    # catches ValueError (as for scipy's and Python's bad values) broke. Its
    # arguments are concrete, so a failed argument check is a ValueError;
    # it is still an EquinoxRuntimeError, as before.
    model, rho = _relation(), jnp.array([jnp.inf, 0.0])
    with pytest.raises(ValueError, match="^`z0` must be finite") as info:
        rd.implicit_infer(model, jnp.array([jnp.nan, 0.5]), rho)
    assert isinstance(info.value, retrax.InvalidArgumentError)
    assert isinstance(info.value, eqx.EquinoxRuntimeError)
    # a failed solve is not a bad value: its result's message, not a ValueError
    with pytest.raises(eqx.EquinoxRuntimeError) as info:
        jax.block_until_ready(
            rd.implicit_infer(model, jnp.array([0.6, 0.5]), rho, max_steps=1)
        )
    assert not isinstance(info.value, ValueError), str(info.value)[:200]
    # under the user's own filter_jit the same bad value raises at run time,
    # as an EquinoxRuntimeError rendered by Equinox
    run = eqx.filter_jit(lambda z0: rd.implicit_infer(model, z0, rho).z)
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
    run = eqx.filter_jit(lambda z0: rd.implicit_infer(model, z0, rho).z)
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
    first = _raised(lambda: rd.sample_ancestral(pred, key, 2, steps=4).x)
    assert first.startswith("A sampler's state became non-finite"), first[:200]
    where = first.index("The check, inside the compiled call:")
    assert "in sample_ancestral" in first[where:]
    second = _raised(lambda: rd.sample_ddim(pred, key, 2, steps=4).x)
    assert second.startswith("A sampler's state became non-finite"), second[:200]
    assert "sample_ancestral" not in second
