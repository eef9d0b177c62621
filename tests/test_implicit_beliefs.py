"""Multi-start roots, Laplace beliefs, mixtures and energies of implicit queries."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close, raises_eagerly_and_under_jit, ring_radius


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


def test_roots_from_explicit_starts():
    """The query's own start first, then the given ones; each slot is the
    answer `implicit_infer` gives from its start, under `jit`."""
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    # the clamped coordinate of a start is ignored (held at z0)
    starts = jnp.array([[0.6, -0.5], [9.0, -0.4], [0.6, 0.7]])
    roots = jax.jit(lambda s: rd.implicit_roots(model, z0, rho, starts=s))(starts)
    assert roots.z.shape == (4, 2) and int(roots.count) == 2
    # discovery order: the own start (the upper branch), then the lower one;
    # the two other starts repeat them
    y = np.sqrt(ring_radius(SCHED, model.nodes, 0.05) ** 2 - 0.6**2)
    assert abs(float(roots.z[0, 1]) - y) < 0.01
    assert abs(float(roots.z[1, 1]) + y) < 0.01
    assert bool(jnp.all(roots.valid[:2])) and not bool(jnp.any(roots.valid[2:]))
    assert bool(jnp.all(roots.z[:, 0] == 0.6))
    # (`z_init=z0` is the default start, passed to share one compilation)
    own = rd.implicit_infer(model, z0, rho, z_init=z0)
    lower = rd.implicit_infer(model, z0, rho, z_init=starts[0])
    assert_close(roots.z[0], own.z, rtol=1e-10)
    assert_close(roots.z[1], lower.z, rtol=1e-10)
    loads = jnp.stack([own.clamp_load, lower.clamp_load])
    assert_close(roots.clamp_load[:2], loads, rtol=1e-8)
    # `z_init` is the query's own start: here the lower branch comes first
    flipped = rd.implicit_roots(model, z0, rho, starts=starts[2:], z_init=starts[0])
    assert_close(flipped.z[0], lower.z, rtol=1e-10)
    assert int(flipped.count) == 2 and float(flipped.z[1, 1]) > 0
    # random starts: the own start is slot 0 of the `n_starts`
    rand = rd.implicit_roots(model, z0, rho, jax.random.key(1))
    assert rand.z.shape == (16, 2) and bool(rand.valid[0])
    assert_close(rand.z[0], own.z, rtol=1e-10)


def test_roots_pass_the_solver_options_on():
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    starts, lower = jnp.array([[0.6, 0.7]]), jnp.array([0.6, -0.5])
    plain = rd.implicit_roots(model, z0, rho, starts=starts, z_init=lower)
    # Newton-Krylov steps, a tighter tolerance, and every clamp flagged
    krylov = rd.implicit_roots(
        model,
        z0,
        rho,
        starts=starts,
        z_init=lower,
        matrix_free=True,
        tol=1e-11,
        off_data_tol=0.0,
        symmetric=True,
    )
    assert_close(krylov.z, plain.z, rtol=1e-8)
    assert bool(jnp.all(krylov.off_data)) and not bool(jnp.any(plain.off_data))
    short = rd.implicit_roots(
        model, z0, rho, starts=starts, z_init=lower, max_steps=1, throw=False
    )
    assert not bool(jnp.any(short.converged))
    assert bool(jnp.all(short.steps == 1))
    assert bool(jnp.all(short.result == rd.RESULTS.nonlinear_max_steps_reached))


def test_roots_bad_starts():
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    key = jax.random.key(0)
    for bad in [jnp.zeros(2), jnp.zeros((2, 3)), jnp.zeros((0, 2))]:
        with pytest.raises(ValueError, match=r"`starts` must have shape \(m, 2\)"):
            rd.implicit_roots(model, z0, rho, starts=bad)
    # (a TypeError naming `starts`: the library's, or the annotation's)
    with pytest.raises(TypeError, match="starts"):
        rd.implicit_roots(model, z0, rho, starts=jnp.zeros((1, 2), int))
    with pytest.raises(ValueError, match="either `key`.*or `starts`"):
        rd.implicit_roots(model, z0, rho, key, starts=jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="needs a PRNG `key`"):
        rd.implicit_roots(model, z0, rho)
    # a NaN on a free coordinate raises eagerly and under `jit`; on the
    # clamped one it is ignored, as in `z_init`
    nan = jnp.array([[0.6, jnp.nan]])
    raises_eagerly_and_under_jit(
        lambda s: rd.implicit_roots(model, z0, rho, starts=s),
        nan,
        match="`starts` must be finite on the coordinates that are not clamped",
    )
    roots = rd.implicit_roots(model, z0, rho, starts=jnp.array([[jnp.nan, -0.5]]))
    assert int(roots.count) == 2


def test_energy_is_the_potential_of_the_field():
    # (each side under `jit`: one program, not op by op; the eager energy
    # runs in test_energy_network_potential)
    model = two_bumps()
    z = jnp.array([0.3, -0.4])
    z0, rho = jnp.array([0.0, 0.5]), jnp.array([0.0, 2.0])
    assert_close(
        eqx.filter_jit(jax.grad(rd.implicit_energy, argnums=1))(model, z),
        eqx.filter_jit(lambda m, z: m.prior_field(z))(model, z),
        rtol=1e-11,
    )
    grad_q = jax.jit(jax.grad(lambda q: rd.implicit_energy(model, q, z0, rho)))(z)
    residual = jax.jit(lambda q: model.implicit_residual(q, z0, rho))(z)
    assert_close(grad_q, residual, rtol=1e-11)
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
    # (a Gaussian's Newton solve converges in one step, so mark one unconverged)
    sol = rd.implicit_infer(model, z0, rho)
    bad = eqx.tree_at(lambda s: s.converged, sol, jnp.asarray(False))
    assert bool(jnp.all(jnp.isnan(rd.implicit_laplace(model, bad, rho))))


def test_mixture_weights_follow_the_mass():
    model = two_bumps()
    z0, rho = jnp.array([0.0, 0.0]), jnp.array([0.0, 0.0])
    roots = rd.implicit_roots(model, z0, rho, jax.random.key(0), spread=1.5)
    assert int(roots.count) == 2
    # (under `jit`: the Laplace covariances and energies compiled as one
    # program instead of op by op)
    mixture = eqx.filter_jit(rd.implicit_mixture)
    mix = mixture(model, roots, z0, rho)
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
    eq = mixture(mlp_model, roots, z0, rho)
    assert_close(eq.weights[roots.valid], jnp.full(2, 0.5), rtol=1e-12)
