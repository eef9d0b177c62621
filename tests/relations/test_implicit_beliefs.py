"""Multi-start roots, Laplace beliefs, mixtures and energies of implicit queries."""

import sys
from pathlib import Path

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import assert_close, raises_eagerly_and_under_jit, ring_radius


# the arm of examples/arm_beliefs.py
sys.path.insert(0, str(Path(__file__).parents[2] / "examples"))

SCHED = rd.VPSDE()
INF = jnp.inf


def ring_model():
    ang = 2 * np.pi * np.arange(48) / 48
    means = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1))
    mix = rd.GaussianMixtureEps(SCHED, means, 0.05)
    return rr.ImplicitDiffusion(mix, rr.field_nodes(jax.random.key(0), 2, samples=8))


def two_bumps(weights=(0.7, 0.3), s=0.2):
    means = jnp.array([[-1.0, 0.0], [1.0, 0.0]])
    mix = rd.GaussianMixtureEps(SCHED, means, s, jnp.array(weights))
    nodes = rr.field_nodes(jax.random.key(3), 2, samples=4)
    return rr.ImplicitDiffusion(mix, nodes, lam=rr.density_lambda(SCHED, nodes))


@pytest.mark.slow
def test_roots_of_the_ring_are_two_branches():
    model = ring_model()
    roots = rr.implicit_roots(
        model, jnp.array([0.6, 0.0]), jnp.array([INF, 0.0]), jax.random.key(1)
    )
    assert int(roots.count) == 2
    assert bool(jnp.all(roots.valid[:2])) and not bool(jnp.any(roots.valid[2:]))
    ys = np.sort(np.asarray(roots.value[:2, 1]))
    # the branches at the ring's radius from the spec's smoothing bias (see
    # `helpers.ring_radius`; within 0.01 as in test_implicit_infer.py)
    y = np.sqrt(ring_radius(SCHED, model.nodes, 0.05) ** 2 - 0.6**2)
    assert abs(ys[0] + y) < 0.01 and abs(ys[1] - y) < 0.01
    # jittable and differentiable with the mask (invalid slots give zero, not NaN)

    def total(x):
        r = rr.implicit_roots(
            model,
            jnp.stack([x, jnp.asarray(0.0)]),
            jnp.array([INF, 0.0]),
            jax.random.key(1),
        )
        return jnp.sum(jnp.where(r.valid, r.value[:, 1] ** 2, 0.0))

    g = jax.jit(jax.grad(total))(jnp.asarray(0.6))
    assert bool(jnp.isfinite(g))
    h = 1e-5
    assert_close(g, (total(0.6 + h) - total(0.6 - h)) / (2 * h), rtol=1e-5)


@pytest.mark.full
def test_roots_from_explicit_starts():
    """The query's own start first, then the given ones; each slot is the
    answer `implicit_infer` gives from its start, under `jit`."""
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    # the clamped coordinate of a start is ignored (held at z0)
    starts = jnp.array([[0.6, -0.5], [9.0, -0.4], [0.6, 0.7]])
    roots = jax.jit(lambda s: rr.implicit_roots(model, z0, rho, starts=s))(starts)
    assert roots.value.shape == (4, 2) and int(roots.count) == 2
    # discovery order: the own start (the upper branch), then the lower one;
    # the two other starts repeat them
    y = np.sqrt(ring_radius(SCHED, model.nodes, 0.05) ** 2 - 0.6**2)
    assert abs(float(roots.value[0, 1]) - y) < 0.01
    assert abs(float(roots.value[1, 1]) + y) < 0.01
    assert bool(jnp.all(roots.valid[:2])) and not bool(jnp.any(roots.valid[2:]))
    assert bool(jnp.all(roots.value[:, 0] == 0.6))
    # (`z_init=z0` is the default start, passed to share one compilation)
    own = rr.implicit_infer(model, z0, rho, z_init=z0)
    lower = rr.implicit_infer(model, z0, rho, z_init=starts[0])
    assert_close(roots.value[0], own.value, rtol=1e-10)
    assert_close(roots.value[1], lower.value, rtol=1e-10)
    loads = jnp.stack([own.clamp_load, lower.clamp_load])
    assert_close(roots.clamp_load[:2], loads, rtol=1e-8)
    # `z_init` is the query's own start: here the lower branch comes first
    flipped = rr.implicit_roots(model, z0, rho, starts=starts[2:], z_init=starts[0])
    assert_close(flipped.value[0], lower.value, rtol=1e-10)
    assert int(flipped.count) == 2 and float(flipped.value[1, 1]) > 0
    # random starts: the own start is slot 0 of the `n_starts`
    rand = rr.implicit_roots(model, z0, rho, jax.random.key(1))
    assert rand.value.shape == (16, 2) and bool(rand.valid[0])
    assert_close(rand.value[0], own.value, rtol=1e-10)


@pytest.mark.full
def test_roots_pass_the_solver_options_on():
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    starts, lower = jnp.array([[0.6, 0.7]]), jnp.array([0.6, -0.5])
    plain = rr.implicit_roots(model, z0, rho, starts=starts, z_init=lower)
    # Newton-Krylov steps, a tighter tolerance, and every clamp flagged
    krylov = rr.implicit_roots(
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
    assert_close(krylov.value, plain.value, rtol=1e-8)
    assert bool(jnp.all(krylov.off_data)) and not bool(jnp.any(plain.off_data))
    short = rr.implicit_roots(
        model, z0, rho, starts=starts, z_init=lower, max_steps=1, throw=False
    )
    assert not bool(jnp.any(short.converged))
    assert bool(jnp.all(short.stats["num_steps"] == 1))
    assert bool(jnp.all(short.result == rr.RESULTS.nonlinear_max_steps_reached))


@pytest.mark.full
def test_roots_bad_starts():
    model = ring_model()
    z0, rho = jnp.array([0.6, 0.5]), jnp.array([INF, 0.0])
    key = jax.random.key(0)
    for bad in [jnp.zeros(2), jnp.zeros((2, 3)), jnp.zeros((0, 2))]:
        with pytest.raises(ValueError, match=r"`starts` must have shape \(m, 2\)"):
            rr.implicit_roots(model, z0, rho, starts=bad)
    # (a TypeError naming `starts`: the library's, or the annotation's)
    with pytest.raises(TypeError, match="starts"):
        rr.implicit_roots(model, z0, rho, starts=jnp.zeros((1, 2), int))
    with pytest.raises(ValueError, match="either `key`.*or `starts`"):
        rr.implicit_roots(model, z0, rho, key, starts=jnp.zeros((1, 2)))
    with pytest.raises(ValueError, match="needs a PRNG `key`"):
        rr.implicit_roots(model, z0, rho)
    # a NaN on a free coordinate raises eagerly and under `jit`; on the
    # clamped one it is ignored, as in `z_init`
    nan = jnp.array([[0.6, jnp.nan]])
    raises_eagerly_and_under_jit(
        lambda s: rr.implicit_roots(model, z0, rho, starts=s),
        nan,
        match="`starts` must be finite on the coordinates that are not clamped",
    )
    roots = rr.implicit_roots(model, z0, rho, starts=jnp.array([[jnp.nan, -0.5]]))
    assert int(roots.count) == 2


@pytest.mark.full
def test_energy_is_the_potential_of_the_field():
    # (each side under `jit`: one program, not op by op; the eager energy
    # runs in test_energy_network_potential)
    model = two_bumps()
    z = jnp.array([0.3, -0.4])
    z0, rho = jnp.array([0.0, 0.5]), jnp.array([0.0, 2.0])
    assert_close(
        eqx.filter_jit(jax.grad(rr.implicit_energy, argnums=1))(model, z),
        eqx.filter_jit(lambda m, z: m.prior_field(z))(model, z),
        rtol=1e-11,
    )
    grad_q = jax.jit(jax.grad(lambda q: rr.implicit_energy(model, q, z0, rho)))(z)
    residual = jax.jit(lambda q: model.implicit_residual(q, z0, rho))(z)
    assert_close(grad_q, residual, rtol=1e-11)
    mlp = rd.NoisePredictor(rd.TimeMLP(2, hidden=4, key=jax.random.key(0)), SCHED)
    with pytest.raises(TypeError, match="potential"):
        rr.implicit_energy(rr.ImplicitDiffusion(mlp, model.nodes), z)


@pytest.mark.full
def test_energy_network_potential():
    net = rd.TimeMLP(2, hidden=8, key=jax.random.key(0), out_size=1)
    model = rr.ImplicitDiffusion(
        rd.EnergyNetwork(net, SCHED), rr.field_nodes(jax.random.key(1), 2, samples=2)
    )
    z = jnp.array([0.3, -0.4])
    assert_close(
        jax.grad(rr.implicit_energy, argnums=1)(model, z),
        model.prior_field(z),
        rtol=1e-10,
    )


@pytest.mark.full
def test_laplace_covariance_of_a_gaussian():
    # One component N(0, s^2 I): the field is linear, the answer the mean, and
    # the Laplace covariance s^2 plus the smoothing of the node levels.
    s = 0.5
    mix = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, 2)), s)
    nodes = rr.field_nodes(jax.random.key(0), 2)
    model = rr.ImplicitDiffusion(mix, nodes, lam=rr.density_lambda(SCHED, nodes))
    z0, rho = jnp.array([0.3, 0.2]), jnp.array([0.0, 0.0])
    sol = rr.implicit_infer(model, z0, rho)
    assert_close(sol.value, jnp.zeros(2), atol=1e-9)
    cov = rr.implicit_laplace(model, sol, rho)
    ratio = SCHED.sigma(nodes.t) ** 2 / SCHED.alpha(nodes.t) ** 2
    c = SCHED.alpha(nodes.t) ** 2 * s**2 + SCHED.sigma(nodes.t) ** 2
    # exact for this field: precision = mean(sigma^2/c) / mean(sigma^2/alpha^2)
    var = float(jnp.mean(ratio) / jnp.mean(SCHED.sigma(nodes.t) ** 2 / c))
    assert_close(cov, var * jnp.eye(2), rtol=1e-10)
    assert abs(var - s**2) < 0.03
    # a clamped coordinate is known; a soft input adds its precision rho^2
    rho2 = jnp.array([INF, 3.0])
    sol2 = rr.implicit_infer(model, z0, rho2)
    belief = rr.laplace_belief(model, sol2, rho2)
    assert float(belief.cov[0, 0]) == 0.0 and float(belief.cov[0, 1]) == 0.0
    assert_close(belief.cov[1, 1], 1 / (1 / var + 9.0), rtol=1e-10)
    assert bool(belief.free[1]) and not bool(belief.free[0])
    # an unconverged answer has no covariance
    # (a Gaussian's Newton solve converges in one step, so mark one unconverged)
    sol = rr.implicit_infer(model, z0, rho)
    bad = eqx.tree_at(lambda s: s.converged, sol, jnp.asarray(False))
    assert bool(jnp.all(jnp.isnan(rr.implicit_laplace(model, bad, rho))))


def _gaussian_relation(s, n, levels=None, deblur=True):
    mix = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, n)), s)
    nodes = rr.field_nodes(jax.random.key(0), n, levels=levels)
    return rr.ImplicitDiffusion(
        mix, nodes, lam=rr.density_lambda(SCHED, nodes), deblur=deblur
    )


@pytest.mark.full
def test_deblurred_laplace_covariance_is_the_data_covariance():
    # One component N(0, s^2 I): the field's Laplace covariance is s^2 plus
    # the node levels' smoothing (previous test); with `deblur=True` it is
    # s^2 itself, for the default levels (eight of them, noisier than s
    # here) and for one level about as noisy as s.
    z0, free = jnp.array([0.3, 0.2]), jnp.zeros(2)
    for s, levels in ((0.5, None), (0.05, [0.01])):
        model = _gaussian_relation(s, 2, levels)
        blurred = _gaussian_relation(s, 2, levels, deblur=False)
        sol = jax.jit(rr.implicit_infer)(model, z0, free)
        cov = jax.jit(rr.implicit_laplace)(model, sol, free)
        assert_close(cov, s**2 * jnp.eye(2), rtol=1e-9)
        wide = rr.implicit_laplace(blurred, sol, free)
        assert float(wide[0, 0]) > 1.01 * s**2
        # the answer itself does not change
        assert_close(
            rr.implicit_infer(blurred, z0, free).value, sol.value, rtol=0, atol=0
        )
        # a soft input adds its precision rho^2 to the data's; a clamp is known
        rho = jnp.array([INF, 3.0])
        belief = rr.laplace_belief(model, rr.implicit_infer(model, z0, rho), rho)
        assert_close(belief.cov[1, 1], 1 / (1 / s**2 + 9.0), rtol=1e-9)
        assert float(belief.cov[0, 0]) == 0.0
        # a factor, and a relation indexed into a larger joint state, keep it
        factor = rr.Factor(model, {"a": 1, "b": 1})
        assert_close(rr.implicit_laplace(factor, sol, free), cov, rtol=1e-12)
        wider = rr.ProductRelation(
            [rr.IndexedRelation(model, [0, 2], 3), rr.IndexedRelation(model, [1, 2], 3)]
        )
        big = wider.belief_precision(jnp.array([0.0, 0.0, 0.0]))
        assert_close(jnp.diag(big), jnp.array([1.0, 1.0, 2.0]) / s**2, rtol=1e-9)


def test_deblurring_sharpens_at_most_tenfold():
    # Data far thinner than every level: the deblurred variance would be
    # s^2, below a tenth of the blurred one, so it is held at that tenth.
    z0, free = jnp.array([0.3, 0.2]), jnp.zeros(2)
    model = _gaussian_relation(0.005, 2)
    sol = rr.implicit_infer(model, z0, free)
    blurred = rr.implicit_laplace(_gaussian_relation(0.005, 2, deblur=False), sol, free)
    assert_close(rr.implicit_laplace(model, sol, free), blurred / 10, rtol=1e-9)
    # a direction of negative curvature (between two bumps) is kept as measured
    bumps = two_bumps()
    saddle = jnp.array([0.0, 0.0])
    sharp = rr.ImplicitDiffusion(bumps.pred, bumps.nodes, lam=bumps.lam, deblur=True)
    kept = sharp.belief_precision(saddle)
    assert_close(kept[0, 0], bumps.belief_precision(saddle)[0, 0], rtol=1e-12)
    assert float(kept[0, 0]) < 0


@pytest.mark.full
def test_deblurred_variance_has_the_data_variances_derivative():
    # The deblurred variance is s^2 as a function of the data's sd: derivative
    # 2 s, through the bisection by the implicit function theorem, under jit;
    # in two dimensions too, where the precision's two eigenvalues coincide.
    for n in (1, 2):

        def variance(s, n=n):
            model = _gaussian_relation(s, n)
            return jnp.linalg.inv(model.belief_precision(jnp.zeros(n)))[0, 0]

        s = jnp.asarray(0.3)
        assert_close(variance(s), s**2, rtol=1e-9)
        assert_close(jax.jit(jax.grad(variance))(s), 2 * s, rtol=1e-7)


@pytest.mark.parametrize("repeated", [False, True])
@pytest.mark.full
def test_deblurred_precision_derivative_is_central_differences(repeated):
    from retrax.relations._deblur import deblurred_precision

    rng = np.random.default_rng(0)
    if repeated:  # an eigenvalue of multiplicity two
        q, _ = np.linalg.qr(rng.standard_normal((3, 3)))
        p = q @ np.diag([40.0, 40.0, 300.0]) @ q.T
    else:
        a = rng.standard_normal((3, 3))
        p = 30 * (a @ a.T + np.eye(3))
    r2 = jnp.asarray([1e-3, 4e-3, 9e-3])
    c = jnp.asarray([0.2, 0.3, 0.5])
    d = rng.standard_normal((3, 3))
    d = jnp.asarray(d + d.T)
    dr2 = jnp.asarray(rng.standard_normal(3) * 1e-3)
    dc = jnp.asarray(rng.standard_normal(3) * 0.1)

    def f(t):
        return deblurred_precision(
            jnp.asarray(p) + t * d, r2 + t * dr2, c + t * dc, 10.0
        )

    _, jvp = jax.jvp(f, (0.0,), (1.0,))
    h = 1e-6
    assert_close(jvp, (f(h) - f(-h)) / (2 * h), rtol=1e-6)
    # reverse mode is the transpose of the same rule
    w = jnp.asarray(rng.standard_normal((3, 3)))
    g = jax.grad(lambda t: jnp.sum(w * f(t)))(0.0)
    assert_close(g, jnp.sum(w * jvp), rtol=1e-10)


def test_deblur_must_be_a_bool():
    mix = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, 2)), 0.5)
    nodes = rr.field_nodes(jax.random.key(0), 2)
    with pytest.raises(TypeError, match="deblur"):
        rr.ImplicitDiffusion(mix, nodes, deblur=1)
    # a point of another dimension is refused by name, eagerly and under jit
    model = _gaussian_relation(0.5, 2)
    raises_eagerly_and_under_jit(
        lambda z: model.belief_precision(z),
        jnp.zeros(3),
        match="`z` must be a vector of length 2",
    )


def test_mixture_weights_follow_the_mass():
    model = two_bumps()
    z0, rho = jnp.array([0.0, 0.0]), jnp.array([0.0, 0.0])
    roots = rr.implicit_roots(model, z0, rho, jax.random.key(0), spread=1.5)
    assert int(roots.count) == 2
    # (under `jit`: the Laplace covariances and energies compiled as one
    # program instead of op by op)
    mixture = eqx.filter_jit(rr.implicit_mixture)
    mix = mixture(model, roots, z0, rho)
    assert_close(jnp.sum(mix.weights), 1.0, rtol=1e-12)
    left = int(jnp.argmin(jnp.where(roots.valid, roots.value[:, 0], jnp.inf)))
    right = int(jnp.argmax(jnp.where(roots.valid, roots.value[:, 0], -jnp.inf)))
    assert abs(float(mix.weights[left]) - 0.7) < 0.02
    assert abs(float(mix.weights[right]) - 0.3) < 0.02
    assert float(jnp.sum(mix.weights[~roots.valid])) == 0.0
    # without a potential: equal weights on the valid roots
    mlp_model = rr.ImplicitDiffusion(
        rd.NoisePredictor(rd.TimeMLP(2, hidden=4, key=jax.random.key(0)), SCHED),
        model.nodes,
    )
    eq = mixture(mlp_model, roots, z0, rho)
    assert_close(eq.weights[roots.valid], jnp.full(2, 0.5), rtol=1e-12)


# -- levels for calibrated beliefs ------------------------------------------------


def thin_line(s, n=4000, schedule=SCHED):
    """A relation y = x of thickness `s` (a dense row of Gaussians along the
    diagonal) and `n` samples of it."""
    u = jnp.linspace(-1.0, 1.0, 401)
    means = jnp.stack([u, u], 1)
    k1, k2 = jax.random.split(jax.random.key(5))
    data = means[jax.random.randint(k1, (n,), 0, 401)]
    data = data + s * jax.random.normal(k2, (n, 2))
    return rd.GaussianMixtureEps(schedule, means, s), data


@pytest.mark.slow
def test_belief_levels_read_the_thickness_and_calibrate_the_laplace_belief():
    # The sensor-only query of a thin relation: y measured with sd 0.02, x
    # latent. The exact belief about x is N(y, sd^2 + 2 s^2) (x = y - sqrt(2) d
    # with d the N(0, s^2) offset across the line). Node levels at noise sd r
    # see the line smoothed to s^2 + r^2, and the Laplace variance across it is
    # V = sum r^2 / sum r^2 / (s^2 + r^2) (belief_levels' docstring).
    s, sd = 0.01, 0.02
    schedule = rd.VPSDE(t_min=1e-5)
    mix, data = thin_line(s, schedule=schedule)
    levels = rr.belief_levels(schedule, data)
    assert levels.shape == (4,) and levels.dtype == data.dtype
    assert bool(jnp.all(jnp.diff(levels) >= 0)) and bool(jnp.all(levels > 1e-5))
    noise = schedule.sigma(levels) / schedule.alpha(levels)
    factors = jnp.geomspace(0.25, 1.0, 4)
    # geometric in units of one measured thickness, which is s to 10%
    assert_close(noise / factors, jnp.full(4, noise[0] / factors[0]), rtol=1e-6)
    assert abs(float(noise[0] / factors[0]) / s - 1) < 0.1

    def belief_sd(levels):
        nodes = rr.field_nodes(jax.random.key(1), 2, levels=levels, samples=8)
        factor = rr.Factor(rr.ImplicitDiffusion(mix, nodes), {"x": 1, "y": 1})
        marks = {"x": rr.Latent(0.0), "y": rr.Unobserved(0.1, sd**-2)}
        sol = rr.factor_infer(factor, marks)
        assert bool(sol.converged & sol.stable)
        return float(
            jnp.sqrt(1 / rr.factor_messages(factor, sol, marks)["x"].precision[0, 0])
        )

    truth = np.sqrt(sd**2 + 2 * s**2)
    r2 = np.asarray(noise) ** 2
    var = np.sum(r2) / np.sum(r2 / (s**2 + r2))
    assert_close(belief_sd(levels), np.sqrt(sd**2 + 2 * var), rtol=1e-3)
    assert belief_sd(levels) < 1.2 * truth
    # the default levels (noise sd 0.016-0.17) are several times too wide
    assert belief_sd(None) > 4 * truth
    # jittable, and float32 data give float32 levels
    assert_close(eqx.filter_jit(rr.belief_levels)(schedule, data), levels, rtol=1e-12)
    levels32 = rr.belief_levels(schedule, data.astype(jnp.float32))
    assert levels32.dtype == jnp.float32
    assert_close(levels32.astype(jnp.float64), levels, rtol=1e-3)


def test_belief_levels_hold_at_t_min_and_refuse_bad_input():
    # data thinner than the noise at the schedule's t_min: every level is t_min
    _, data = thin_line(0.002, n=1000)
    levels = rr.belief_levels(SCHED, data, n_levels=3)
    np.testing.assert_array_equal(levels, jnp.full(3, SCHED.t_min))
    with pytest.raises(ValueError, match="neighbours"):
        rr.belief_levels(SCHED, data, neighbours=2)
    with pytest.raises(ValueError, match="more than `neighbours`"):
        rr.belief_levels(SCHED, data[:100])
    with pytest.raises(ValueError, match="low"):
        rr.belief_levels(SCHED, data, low=2.0, high=1.0)
    # (beartype's jaxtyping check raises a TypeError first in the test suite)
    with pytest.raises((ValueError, TypeError)):
        rr.belief_levels(SCHED, data[:, 0])
    with pytest.raises(TypeError):
        rr.belief_levels(SCHED, jnp.ones((200, 2), jnp.int32))
    with pytest.raises((ValueError, TypeError), match="n_levels"):
        rr.belief_levels(SCHED, data, n_levels=0)
    raises_eagerly_and_under_jit(
        lambda d: rr.belief_levels(SCHED, d), data.at[3, 0].set(jnp.nan), match="finite"
    )
    # data on an exact line have no thickness
    exact = jnp.stack([data[:, 0], data[:, 0]], 1)
    raises_eagerly_and_under_jit(
        lambda d: rr.belief_levels(SCHED, d), exact, match="thickness is 0"
    )
