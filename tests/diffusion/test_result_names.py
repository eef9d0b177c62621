"""Result codes print their name on success and their message otherwise."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import optimistix as optx
import pytest

import retrax.diffusion as rd
import retrax.relations as rr


@pytest.mark.parametrize("results", [rd.RESULTS, rr.RESULTS])
def test_success_prints_its_name(results):
    prefix = f"{results.__module__}.{results.__qualname__}"
    assert str(results.successful) == f"{prefix}<successful>"
    assert repr(results.successful) == f"{prefix}<successful>"
    assert results[results.successful] == "successful"
    # a success from a parent's code, promoted, and one that crossed a jit
    assert str(results.promote(optx.RESULTS.successful)) == f"{prefix}<successful>"
    assert str(results.promote(lx.RESULTS.successful)) == f"{prefix}<successful>"
    assert str(jax.jit(lambda: results.successful)()) == f"{prefix}<successful>"


@pytest.mark.parametrize("results", [rd.RESULTS, rr.RESULTS])
def test_failures_print_their_message(results):
    prefix = f"{results.__module__}.{results.__qualname__}"
    message = optx.RESULTS[optx.RESULTS.max_steps_reached]
    assert message.startswith("The maximum number of solver steps")
    assert str(results.max_steps_reached) == f"{prefix}<{message}>"
    assert results[results.max_steps_reached] == message
    assert str(results.nonfinite_iterate).startswith(f"{prefix}<An iterate")


def test_a_batch_prints_each_code():
    codes = jax.vmap(
        lambda p: rr.RESULTS.where(p, rr.RESULTS.successful, rr.RESULTS.unstable_root)
    )(jnp.array([True, False]))
    text = rr.RESULTS[codes]
    assert "'successful'" in text
    assert "unstable root" in text


def test_a_solution_prints_its_success():
    # a real solve's code, as a user prints it
    sol = rr.propagate_beliefs(
        rr.FactorGraph({"a": 1}, [rr.GaussianFactor(["a"], [[1.0]], [2.0], 1.0)])
    )
    assert str(sol.result).endswith("RESULTS<successful>")


def test_a_failure_still_raises_its_message():
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver"):
        rr.RESULTS.max_steps_reached.error_if(jnp.ones(2), jnp.array(True))
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of solver"):
        eqx.filter_jit(lambda p: rr.RESULTS.max_steps_reached.error_if(jnp.ones(2), p))(
            jnp.array(True)
        )
