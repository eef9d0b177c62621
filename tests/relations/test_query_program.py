"""The README query's compiled program and its build: checks staged once, at
the public boundary (deterministic counts, no timing; speed lives in
`benchmarks/bench_first_call.py`)."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr


INF = jnp.inf
CALLBACK = "xla_ffi_python_cpu_callback"


def readme_model(components=48):
    angles = jnp.linspace(0, 2 * jnp.pi, components, endpoint=False)
    ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
    pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(components, 0.05))
    return rr.ImplicitDiffusion(pred, rr.field_nodes(jax.random.key(0), 2, samples=8))


@pytest.mark.full
def test_readme_query_stages_each_check_once():
    # The query's own checks are one staged check; the schedule's time checks
    # are made where a time enters (a predictor's public method), not again in
    # every evaluation of alpha and sigma inside the solve. Before: 22 host
    # callbacks (26 for the gradient).
    model = readme_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    text = rr.implicit_infer.lower(model, z0, rho).as_text()
    assert 1 <= text.count(CALLBACK) <= 10

    def answer(x):
        return rr.implicit_infer(model, jnp.array([x, 0.5]), rho).value[1]

    text = jax.jit(jax.grad(answer)).lower(0.6).as_text()
    assert 1 <= text.count(CALLBACK) <= 12


@pytest.mark.parametrize(
    "z0, rho, z_init, match",
    [
        ([0.6, 0.5], [INF, np.nan], None, "`rho` must be nonnegative"),
        ([0.6, 0.5], [INF, -1.0], None, "`rho` must be nonnegative"),
        ([0.6, 0.5], [INF, INF], None, "every coordinate is clamped"),
        ([np.nan, 0.5], [INF, 0.0], None, r"`z0` must be finite \(it holds"),
        ([0.6, 0.5], [INF, 0.0], [0.0, np.inf], "`z_init` must be finite on"),
        # the first failing check gives the message
        ([np.nan, 0.5], [INF, -1.0], None, "`rho` must be nonnegative"),
    ],
)
def test_query_checks_raise_their_own_message(z0, rho, z_init, match):
    model = readme_model()
    z0, rho = jnp.asarray(z0), jnp.asarray(rho)
    z_init = None if z_init is None else jnp.asarray(z_init)

    def query(z0, rho):
        return rr.implicit_infer(model, z0, rho, z_init=z_init).value

    with pytest.raises(Exception, match=match):
        query(z0, rho)
    with pytest.raises(Exception, match=match):
        jax.jit(query)(z0, rho)


def test_query_checks_in_a_batch_report_the_earliest_check():
    # one query with a non-finite z0, one with a negative rho: the rho check
    # comes first, as it did when each check was staged on its own
    model = readme_model()
    z0 = jnp.array([[np.nan, 0.5], [0.6, 0.5]])
    rho = jnp.array([[INF, 0.0], [INF, -1.0]])
    with pytest.raises(Exception, match="`rho` must be nonnegative"):
        jax.vmap(lambda a, b: rr.implicit_infer(model, a, b).value)(z0, rho)


class _Compiles(logging.Handler):
    def __init__(self):
        super().__init__()
        self.names = []

    def emit(self, record):
        message = record.getMessage()
        if message.startswith("Finished XLA compilation of "):
            self.names.append(message.split(" of ", 1)[1].split(" in ")[0])


def _eager_compiles(build):
    logger = logging.getLogger("jax")
    handler = _Compiles()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    try:
        with jax.log_compiles(True):
            build()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return handler.names


def test_building_the_readme_inputs_compiles_few_programs():
    # Concrete arguments are checked with NumPy, and the nodes are drawn in
    # one program: before, the mixture compiled 21 small programs (one per
    # eager jnp op of its checks) and the nodes 22. Shapes no other test uses,
    # so that no program is already compiled.
    means = jnp.asarray(np.random.default_rng(0).normal(size=(37, 3)))
    scales = jnp.full(37, 0.05, means.dtype)
    mixture = _eager_compiles(lambda: rd.GaussianMixtureEps(rd.VPSDE(), means, scales))
    assert len(mixture) <= 3, mixture
    nodes = _eager_compiles(lambda: rr.field_nodes(jax.random.key(3), 3, samples=5))
    assert len(nodes) <= 3, nodes


def test_concrete_arguments_still_raise_naming_them():
    means = jnp.array([[0.0, 1.0], [jnp.nan, 0.0]])
    with pytest.raises(ValueError, match="`means` must be finite"):
        rd.GaussianMixtureEps(rd.VPSDE(), means, 0.1)
    with pytest.raises(ValueError, match="`weights` must be finite and nonnegative"):
        rd.GaussianMixtureEps(
            rd.VPSDE(), jnp.zeros((2, 2)), 0.1, weights=jnp.array([0.0, 0.0])
        )
    with pytest.raises(ValueError, match=r"the node times `t` must lie in \(0, 1\]"):
        rr.FieldNodes(jnp.array([0.5, 1.5]), jnp.zeros((2, 2)), jnp.ones(2))
    # and traced ones when the program runs
    with pytest.raises(Exception, match="`scales` must be finite, nonnegative"):
        jax.jit(
            lambda s: rd.GaussianMixtureEps(rd.VPSDE(), jnp.zeros((2, 2)), s).scales
        )(jnp.array([0.1, -1.0]))
