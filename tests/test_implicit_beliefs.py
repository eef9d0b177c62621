"""Multi-start roots, Laplace beliefs, mixtures and energies of implicit queries."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close, ring_radius


SCHED = rd.VPSDE()
INF = jnp.inf


def ring_model():
    ang = 2 * np.pi * np.arange(48) / 48
    means = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1))
    mix = rd.GaussianMixtureEps(SCHED, means, 0.05)
    return rd.ImplicitDiffusion(mix, rd.field_nodes(jax.random.key(0), 2, samples=8))


def two_bumps(weights=(0.7, 0.3), s=0.2):
    means = jnp.array([[-1.0, 0.0], [1.0, 0.0]])
    mix = rd.GaussianMixtureEps(SCHED, means, s, jnp.array(weights))
    nodes = rd.field_nodes(jax.random.key(3), 2, samples=4)
    return rd.ImplicitDiffusion(mix, nodes, lam=rd.density_lambda(SCHED, nodes))


def test_roots_of_the_ring_are_two_branches():
    model = ring_model()
    roots = rd.implicit_roots(
        model, jnp.array([0.6, 0.0]), jnp.array([INF, 0.0]), jax.random.key(1)
    )
    assert int(roots.count) == 2
    assert bool(jnp.all(roots.valid[:2])) and not bool(jnp.any(roots.valid[2:]))
    ys = np.sort(np.asarray(roots.z[:2, 1]))
    # the branches at the ring's radius from the spec's smoothing bias (see
    # `helpers.ring_radius`; within 0.01 as in test_implicit_infer.py)
    y = np.sqrt(ring_radius(SCHED, model.nodes, 0.05) ** 2 - 0.6**2)
    assert abs(ys[0] + y) < 0.01 and abs(ys[1] - y) < 0.01
    # jittable and differentiable with the mask (invalid slots give zero, not NaN)

    def total(x):
        r = rd.implicit_roots(
            model,
            jnp.stack([x, jnp.asarray(0.0)]),
            jnp.array([INF, 0.0]),
            jax.random.key(1),
        )
        return jnp.sum(jnp.where(r.valid, r.z[:, 1] ** 2, 0.0))

    g = jax.jit(jax.grad(total))(jnp.asarray(0.6))
    assert bool(jnp.isfinite(g))
    h = 1e-5
    assert_close(g, (total(0.6 + h) - total(0.6 - h)) / (2 * h), rtol=1e-5)


def test_energy_is_the_potential_of_the_field():
    model = two_bumps()
    z = jnp.array([0.3, -0.4])
    z0, rho = jnp.array([0.0, 0.5]), jnp.array([0.0, 2.0])
    assert_close(
        jax.grad(rd.implicit_energy, argnums=1)(model, z),
        model.prior_field(z),
        rtol=1e-11,
    )
    grad_q = jax.grad(lambda q: rd.implicit_energy(model, q, z0, rho))(z)
    assert_close(grad_q, model.implicit_residual(z, z0, rho), rtol=1e-11)
    mlp = rd.NoisePredictor(rd.TimeMLP(2, hidden=4, key=jax.random.key(0)), SCHED)
    with pytest.raises(TypeError, match="potential"):
        rd.implicit_energy(rd.ImplicitDiffusion(mlp, model.nodes), z)


def test_energy_network_potential():
    net = rd.TimeMLP(2, hidden=8, key=jax.random.key(0), out_size=1)
    model = rd.ImplicitDiffusion(
        rd.EnergyNetwork(net, SCHED), rd.field_nodes(jax.random.key(1), 2, samples=2)
    )
    z = jnp.array([0.3, -0.4])
    assert_close(
        jax.grad(rd.implicit_energy, argnums=1)(model, z),
        model.prior_field(z),
        rtol=1e-10,
    )


def test_laplace_covariance_of_a_gaussian():
    # One component N(0, s^2 I): the field is linear, the answer the mean, and
    # the Laplace covariance s^2 plus the smoothing of the node levels.
    s = 0.5
    mix = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, 2)), s)
    nodes = rd.field_nodes(jax.random.key(0), 2)
    model = rd.ImplicitDiffusion(mix, nodes, lam=rd.density_lambda(SCHED, nodes))
    z0, rho = jnp.array([0.3, 0.2]), jnp.array([0.0, 0.0])
    sol = rd.implicit_infer(model, z0, rho)
    assert_close(sol.z, jnp.zeros(2), atol=1e-9)
    cov = rd.implicit_laplace(model, sol, rho)
    ratio = SCHED.sigma(nodes.t) ** 2 / SCHED.alpha(nodes.t) ** 2
    c = SCHED.alpha(nodes.t) ** 2 * s**2 + SCHED.sigma(nodes.t) ** 2
    # exact for this field: precision = mean(sigma^2/c) / mean(sigma^2/alpha^2)
    var = float(jnp.mean(ratio) / jnp.mean(SCHED.sigma(nodes.t) ** 2 / c))
    assert_close(cov, var * jnp.eye(2), rtol=1e-10)
    assert abs(var - s**2) < 0.03
    # a clamped coordinate is known; a soft input adds its precision rho^2
    rho2 = jnp.array([INF, 3.0])
    sol2 = rd.implicit_infer(model, z0, rho2)
    belief = rd.laplace_belief(model, sol2, rho2)
    assert float(belief.cov[0, 0]) == 0.0 and float(belief.cov[0, 1]) == 0.0
    assert_close(belief.cov[1, 1], 1 / (1 / var + 9.0), rtol=1e-10)
    assert bool(belief.free[1]) and not bool(belief.free[0])
    # an unconverged answer has no covariance
    bad = rd.implicit_infer(model, z0, rho, max_steps=0, throw=False)
    assert bool(jnp.all(jnp.isnan(rd.implicit_laplace(model, bad, rho))))


def test_mixture_weights_follow_the_mass():
    model = two_bumps()
    z0, rho = jnp.array([0.0, 0.0]), jnp.array([0.0, 0.0])
    roots = rd.implicit_roots(model, z0, rho, jax.random.key(0), spread=1.5)
    assert int(roots.count) == 2
    mix = rd.implicit_mixture(model, roots, z0, rho)
    assert_close(jnp.sum(mix.weights), 1.0, rtol=1e-12)
    left = int(jnp.argmin(jnp.where(roots.valid, roots.z[:, 0], jnp.inf)))
    right = int(jnp.argmax(jnp.where(roots.valid, roots.z[:, 0], -jnp.inf)))
    assert abs(float(mix.weights[left]) - 0.7) < 0.02
    assert abs(float(mix.weights[right]) - 0.3) < 0.02
    assert float(jnp.sum(mix.weights[~roots.valid])) == 0.0
    # without a potential: equal weights on the valid roots
    mlp_model = rd.ImplicitDiffusion(
        rd.NoisePredictor(rd.TimeMLP(2, hidden=4, key=jax.random.key(0)), SCHED),
        model.nodes,
    )
    eq = rd.implicit_mixture(mlp_model, roots, z0, rho)
    assert_close(eq.weights[roots.valid], jnp.full(2, 0.5), rtol=1e-12)
