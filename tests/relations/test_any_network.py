"""Any network as a relation: a Flax NNX module, a Haiku function and a plain
function with a parameter pytree answer and differentiate as the same
network written in Equinox does, with the relation built inside
`eqx.filter_jit(eqx.filter_grad(...))`. The solves with their derivatives
are in the slow set (a compile each)."""

import equinox as eqx
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx as flax_nnx

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import tree_allclose


SCHED = rd.VPSDE()
HIDDEN = 6
INF = jnp.inf


def weights():
    """One network's weights: `eps(x, t) = w2 tanh(w1 [x, t] + b1) + b2 + x`
    (the identity term keeps the field's root stable)."""
    k1, k2, k3, k4 = jax.random.split(jax.random.key(7), 4)
    return {
        "w1": 0.3 * jax.random.normal(k1, (HIDDEN, 3), jnp.float64),
        "b1": 0.1 * jax.random.normal(k2, (HIDDEN,), jnp.float64),
        "w2": 0.3 * jax.random.normal(k3, (2, HIDDEN), jnp.float64),
        "b2": 0.1 * jax.random.normal(k4, (2,), jnp.float64),
    }


def plain_mlp(params, x, t):
    h = jnp.tanh(params["w1"] @ jnp.concatenate([x, t[None]]) + params["b1"])
    return params["w2"] @ h + params["b2"] + x


class EqxMLP(eqx.Module):
    l1: eqx.nn.Linear
    l2: eqx.nn.Linear

    def __call__(self, x, t):
        return self.l2(jnp.tanh(self.l1(jnp.concatenate([x, t[None]])))) + x


def eqx_model(w):
    key = jax.random.key(0)
    m = EqxMLP(
        eqx.nn.Linear(3, HIDDEN, key=key, dtype=jnp.float64),
        eqx.nn.Linear(HIDDEN, 2, key=key, dtype=jnp.float64),
    )
    m = eqx.tree_at(lambda m: (m.l1.weight, m.l1.bias), m, (w["w1"], w["b1"]))
    return eqx.tree_at(lambda m: (m.l2.weight, m.l2.bias), m, (w["w2"], w["b2"]))


class NNXMLP(flax_nnx.Module):
    def __init__(self, w):
        rngs = flax_nnx.Rngs(0)
        self.l1 = flax_nnx.Linear(3, HIDDEN, rngs=rngs, param_dtype=jnp.float64)
        self.l2 = flax_nnx.Linear(HIDDEN, 2, rngs=rngs, param_dtype=jnp.float64)
        self.l1.kernel[...] = w["w1"].T
        self.l1.bias[...] = w["b1"]
        self.l2.kernel[...] = w["w2"].T
        self.l2.bias[...] = w["b2"]

    def __call__(self, x, t):
        return self.l2(jnp.tanh(self.l1(jnp.concatenate([x, t[None]])))) + x


def haiku_net(x, t):
    h = jnp.tanh(hk.Linear(HIDDEN, name="l1")(jnp.concatenate([x, t[None]])))
    return hk.Linear(2, name="l2")(h) + x


HAIKU = hk.without_apply_rng(hk.transform(haiku_net))


def haiku_params(w):
    return {
        "l1": {"w": w["w1"].T, "b": w["b1"]},
        "l2": {"w": w["w2"].T, "b": w["b2"]},
    }


NODES = rr.field_nodes(jax.random.key(1), 2, dtype=jnp.float64)
Z0 = jnp.array([0.4, 0.0])
RHO = jnp.array([INF, 0.0])


def answer(model):
    """Build the relation from `model` and answer a query: the free
    coordinate given the clamped one, and the field at a point."""
    relation = rr.ImplicitDiffusion(rd.NoisePredictor(model, SCHED), NODES)
    sol = rr.implicit_infer(relation, Z0, RHO)
    return sol.value[1] + jnp.sum(relation.prior_field(jnp.array([0.3, -0.2])) ** 2)


def equinox_reference(w):
    value, grads = eqx.filter_jit(eqx.filter_value_and_grad(answer))(eqx_model(w))
    as_weights = {
        "w1": grads.l1.weight,
        "b1": grads.l1.bias,
        "w2": grads.l2.weight,
        "b2": grads.l2.bias,
    }
    return value, as_weights


@pytest.fixture(scope="module")
def reference():
    w = weights()
    value, grads = equinox_reference(w)
    # the query is a real one: a converged answer with a nonzero gradient
    assert np.isfinite(value)
    assert all(float(jnp.max(jnp.abs(g))) > 1e-6 for g in grads.values())
    return w, value, grads


@pytest.mark.slow
def test_plain_function_with_a_parameter_pytree(reference):
    w, value, grads = reference

    def loss(params):
        return answer(jax.tree_util.Partial(plain_mlp, params))

    got_value, got = eqx.filter_jit(eqx.filter_value_and_grad(loss))(w)
    assert tree_allclose(got_value, value)
    assert tree_allclose(got, grads)


@pytest.mark.slow
def test_haiku_function(reference):
    w, value, grads = reference

    def loss(params):
        return answer(jax.tree_util.Partial(HAIKU.apply, params))

    got_value, got = eqx.filter_jit(eqx.filter_value_and_grad(loss))(haiku_params(w))
    assert tree_allclose(got_value, value)
    assert tree_allclose(got, haiku_params(grads))


@pytest.mark.slow
def test_flax_nnx_module(reference):
    w, value, grads = reference
    graphdef, state = flax_nnx.split(NNXMLP(w))

    def loss(state):
        return answer(flax_nnx.merge(graphdef, state))

    got_value, got = eqx.filter_jit(eqx.filter_value_and_grad(loss))(state)
    assert tree_allclose(got_value, value)
    assert tree_allclose(got["l1"]["kernel"][...], grads["w1"].T)
    assert tree_allclose(got["l1"]["bias"][...], grads["b1"])
    assert tree_allclose(got["l2"]["kernel"][...], grads["w2"].T)
    assert tree_allclose(got["l2"]["bias"][...], grads["b2"])


@pytest.mark.slow
def test_flax_nnx_module_as_a_pytree(reference):
    # an NNX module is itself a pytree: differentiating the module directly
    w, value, grads = reference
    got_value, got = eqx.filter_jit(eqx.filter_value_and_grad(answer))(NNXMLP(w))
    assert tree_allclose(got_value, value)
    assert tree_allclose(got.l1.kernel[...], grads["w1"].T)
    assert tree_allclose(got.l2.bias[...], grads["b2"])


def test_closure_over_parameters_has_nothing_to_differentiate():
    # the documented pitfall: a closure hides the parameters from `grad`,
    # where `Partial` binds them as leaves
    w = weights()
    closure = rd.NoisePredictor(lambda x, t: plain_mlp(w, x, t), SCHED)
    bound = rd.NoisePredictor(jax.tree_util.Partial(plain_mlp, w), SCHED)
    x, t = jnp.array([0.3, -0.2]), jnp.array(0.1)
    assert tree_allclose(closure.epsilon(x, t), bound.epsilon(x, t))
    assert jax.tree.leaves(eqx.filter(closure, eqx.is_inexact_array)) == []
    leaves = jax.tree.leaves(eqx.filter(bound, eqx.is_inexact_array))
    assert sum(leaf.size for leaf in leaves) == sum(v.size for v in w.values())


@pytest.mark.loud
def test_the_dimension_check_reports_the_model_error():
    model = jax.tree_util.Partial(plain_mlp, weights())
    pred = rd.NoisePredictor(model, SCHED)
    nodes = rr.field_nodes(jax.random.key(0), 3, dtype=jnp.float64)
    # the model's own exception type and text are in the message
    with pytest.raises(
        ValueError, match=r"`nodes` have dimension 3.*TypeError: .*dot_general"
    ) as info:
        rr.ImplicitDiffusion(pred, nodes)
    assert isinstance(info.value.__cause__, TypeError)

    def build(params):
        return rr.ImplicitDiffusion(
            rd.NoisePredictor(jax.tree_util.Partial(plain_mlp, params), SCHED), nodes
        ).lam

    with pytest.raises(ValueError, match=r"`nodes` have dimension 3.*TypeError"):
        eqx.filter_jit(build)(weights())


@pytest.mark.loud
def test_python_control_flow_on_values_is_named():
    def branching(params, x, t):
        if jnp.sum(x) > 0:
            return x
        return plain_mlp(params, x, t)

    def build(params):
        pred = rd.NoisePredictor(jax.tree_util.Partial(branching, params), SCHED)
        return rr.ImplicitDiffusion(pred, NODES).lam

    with pytest.raises(
        TypeError,
        match="reads the value of an array in Python.*TracerBoolConversionError",
    ):
        build(weights())
