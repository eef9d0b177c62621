"""Composed relations: restrictions to coordinates, weighted products, and
energy relations, against closed-form Gaussians."""

import equinox as eqx
import jax
import jax.numpy as jnp
import lineax as lx
import numpy as np
import pytest

import retrax.diffusion as rd
import retrax.relations as rr
from helpers import assert_close, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()
INF = jnp.inf
BLOCKS = {"x": 1, "y": 1, "z": 1}
MU1 = np.array([0.3, -0.4])  # relation 1 over (x, y)
MU2 = np.array([0.5, 1.2])  # relation 2 over (y, z)
S1, S2 = 0.6, 0.9
W = np.array([1.0, 2.0])


def gaussian(mu, scale, nodes, lam=1.0):
    mix = rd.GaussianMixtureEps(SCHED, jnp.asarray(mu)[None, :], jnp.asarray(scale))
    return rr.ImplicitDiffusion(mix, nodes, lam)


def gaussian_coef(scale, nodes, lam=1.0):
    """`c` and offset `b` of the exact field `c (z - mu) + b` of one Gaussian."""
    t = np.asarray(nodes.t)
    alpha = np.asarray(SCHED.alpha(jnp.asarray(t)))
    sigma = np.asarray(SCHED.sigma(jnp.asarray(t)))
    w = np.asarray(nodes.w)
    v = alpha**2 * scale**2 + sigma**2
    c = lam * np.sum(w * sigma**2 / v)
    coef = w * lam * sigma / alpha * (sigma**2 / v - 1)
    return c, coef @ np.asarray(nodes.eps)


def product(levels=None, lam=None, weights=W):
    nodes = rr.field_nodes(jax.random.key(0), 2, levels=levels, samples=2)
    if lam == "density":
        lam = float(rr.density_lambda(SCHED, nodes))
    lam = 1.0 if lam is None else lam
    r1 = rr.named_relation(gaussian(MU1, S1, nodes, lam), ["x", "y"], BLOCKS)
    r2 = rr.named_relation(gaussian(MU2, S2, nodes, lam), ["y", "z"], BLOCKS)
    return rr.ProductRelation([r1, r2], weights), nodes, lam


def linear_answer(nodes, lam, z0, rho, weights=W):
    """The product's answer from its closed-form linear field."""
    c1, b1 = gaussian_coef(S1, nodes, lam)
    c2, b2 = gaussian_coef(S2, nodes, lam)
    a = np.zeros((3, 3))
    rhs = np.zeros(3)
    for idx, c, b, mu, w in [
        ([0, 1], c1, b1, MU1, weights[0]),
        ([1, 2], c2, b2, MU2, weights[1]),
    ]:
        a[idx, idx] += w * c
        rhs[idx] += w * (c * mu - b)
    rho = np.asarray(rho)
    clamped = np.isinf(rho)
    soft = np.where(clamped, 0, rho) ** 2
    a += np.diag(soft)
    rhs += soft * np.asarray(z0)
    free = ~clamped
    z = np.array(z0, float)
    rhs_f = rhs[free] - a[np.ix_(free, clamped)] @ z[clamped]
    z[free] = np.linalg.solve(a[np.ix_(free, free)], rhs_f)
    return z


# -- layout helpers and restrictions ------------------------------------------


def test_blockranges_and_assemble():
    ranges = rr.blockranges({"x": 1, "y": 2, "z": 1})
    assert ranges == {"x": range(0, 1), "y": range(1, 3), "z": range(3, 4)}
    z = rr.assemble_state({"x": 1, "y": 2, "z": 1}, {"y": jnp.array([2.0, 3.0])})
    assert_close(z, np.array([0.0, 2.0, 3.0, 0.0]))
    rho = rr.assemble_state(BLOCKS, {"y": 0.0, "z": 0.0}, fill=jnp.inf)
    assert np.isinf(rho[0]) and rho[1] == 0 and rho.dtype == jnp.float64
    with pytest.raises(ValueError, match="unknown variables"):
        rr.assemble_state(BLOCKS, {"w": 1.0})
    with pytest.raises(ValueError, match="size 1"):
        rr.assemble_state(BLOCKS, {"x": jnp.zeros(2)})
    with pytest.raises(ValueError, match="positive integer size"):
        rr.blockranges({"x": 0})


@pytest.mark.full
def test_indexed_field_scatters():
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=2)
    member = gaussian(MU2, S2, nodes)
    rel = rr.IndexedRelation(member, [2, 0], 4)
    z = jnp.array([0.1, -0.7, 0.4, 2.0])
    # (under `jit`: one program each, not op by op)
    g = eqx.filter_jit(rel.prior_field)(z)
    inner = eqx.filter_jit(member.prior_field)(jnp.array([0.4, 0.1]))
    assert_close(g, np.array([inner[1], 0.0, inner[0], 0.0]), rtol=1e-15)
    jac = eqx.filter_jit(rel.prior_jacobian)(z)
    assert jac.shape == (4, 4) and np.all(np.asarray(jac)[[1, 3]] == 0)


# -- the product of Gaussian relations ------------------------------------------


@pytest.mark.parametrize(
    "rho",
    [
        [INF, 0.0, 0.0],  # clamp x, infer (y, z)
        [INF, 0.0, 3.0],  # and a soft target on z
        [2.0, 0.0, INF],  # soft x, clamped z
    ],
)
@pytest.mark.full
def test_product_gaussians_closed_form(rho):
    model, nodes, lam = product()
    z0 = jnp.array([0.8, 0.0, -0.3])
    rho = jnp.array(rho)
    sol = rr.implicit_infer(model, z0, rho, tol=1e-13)
    assert bool(sol.converged) and bool(sol.stable)
    ref = linear_answer(nodes, lam, np.asarray(z0), np.asarray(rho))
    assert_close(sol.value, ref, atol=1e-8, rtol=0)
    # The conservative product is detected: the symmetric adjoint path agrees
    # with the general (transposed) one.
    sol2 = rr.implicit_infer(model, z0, rho, tol=1e-13, symmetric=False)
    assert_close(sol2.value, ref, atol=1e-8, rtol=0)


@pytest.mark.slow
def test_product_density_lambda_trend():
    """With `lam = density_lambda` the answer approaches the conditional mean
    of the product of Gaussians p1^w1 p2^w2 as the node levels shrink."""
    x = 0.8
    # y: precision-weighted mean of the two factors' y means (x and y decouple
    # for isotropic factors); z: the second factor's z mean.
    prec = W[0] / S1**2 + W[1] / S2**2
    y_ref = (W[0] * MU1[1] / S1**2 + W[1] * MU2[0] / S2**2) / prec
    ref = np.array([x, y_ref, MU2[1]])
    errors = []
    for scale in [1.0, 0.1, 0.01]:
        levels = scale * np.linspace(0.002, 0.05, 8)
        model, _, _ = product(levels=levels, lam="density")
        sol = rr.implicit_infer(
            model, jnp.array([x, 0.0, 0.0]), jnp.array([INF, 0.0, 0.0]), tol=1e-13
        )
        errors.append(float(np.max(np.abs(np.asarray(sol.value) - ref))))
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 1e-4 and errors[1] < 0.1 * errors[0]


@pytest.mark.slow
def test_product_gradients_every_member():
    model, _, _ = product()
    z0 = jnp.array([0.8, 0.0, -0.3])
    rho = jnp.array([INF, 0.0, 3.0])
    target = jnp.array([0.0, 0.2, 0.4])

    def loss(m, x):
        sol = rr.implicit_infer(m, z0.at[0].set(x), rho, tol=1e-13)
        return 0.5 * jnp.sum((sol.value - target) ** 2)

    gm = eqx.filter_jit(eqx.filter_grad(loss))(model, z0[0])
    grads = [gm.relations[i].relation.pred.means for i in range(2)]
    h = 1e-6
    for i in range(2):
        assert np.all(np.isfinite(np.asarray(grads[i])))
        assert float(jnp.max(jnp.abs(grads[i]))) > 1e-3
        means = model.relations[i].relation.pred.means
        for j in range(2):

            def at(v, i=i, j=j, means=means):
                m = eqx.tree_at(
                    lambda p: p.relations[i].relation.pred.means,
                    model,
                    means.at[0, j].set(v),
                )
                return loss(m, z0[0])

            fd = (at(means[0, j] + h) - at(means[0, j] - h)) / (2 * h)
            assert_close(grads[i][0, j], fd, rtol=1e-6, atol=1e-6 * abs(float(fd)))
    # the product weights and the clamped input too
    gw = gm.weights
    fd_w = (
        loss(eqx.tree_at(lambda p: p.weights, model, model.weights.at[1].add(h)), 0.8)
        - loss(
            eqx.tree_at(lambda p: p.weights, model, model.weights.at[1].add(-h)), 0.8
        )
    ) / (2 * h)
    assert_close(gw[1], fd_w, rtol=1e-6)
    gx = jax.grad(lambda x: loss(model, x))(0.8)
    fd_x = (loss(model, 0.8 + h) - loss(model, 0.8 - h)) / (2 * h)
    assert_close(gx, fd_x, rtol=1e-6)


@pytest.mark.full
def test_product_pullback_and_roots():
    model, nodes, lam = product()
    z0 = jnp.array([0.8, 0.0, -0.3])
    rho = jnp.array([INF, 0.0, 0.0])
    sol = rr.implicit_infer(model, z0, rho, tol=1e-13)
    zbar = jnp.array([0.0, 1.0, -0.5])
    mbar, z0bar, _ = rr.implicit_pullback(model, sol, z0, rho, zbar)
    g = eqx.filter_grad(
        lambda m: jnp.dot(rr.implicit_infer(m, z0, rho, tol=1e-13).value, zbar)
    )(model)
    for i in range(2):
        assert_close(
            mbar.relations[i].relation.pred.means,
            g.relations[i].relation.pred.means,
            rtol=1e-8,
        )
    roots = rr.implicit_roots(model, z0, rho, jax.random.key(1), n_starts=4)
    assert int(roots.count) == 1
    assert_close(roots.value[0], linear_answer(nodes, lam, z0, rho), atol=1e-8, rtol=0)


# -- energy relations -----------------------------------------------------------


@pytest.mark.full
def test_product_energy_and_symmetric_cholesky():
    model, _, _ = product()
    z = jnp.array([0.2, -0.1, 0.7])
    assert model.conservative
    # (each side under `jit`: one program, not op by op)
    grad_energy = eqx.filter_jit(lambda m, z: jax.grad(m.energy)(z))(model, z)
    assert_close(grad_energy, eqx.filter_jit(model.prior_field)(z), rtol=1e-10)
    z0 = jnp.array([0.8, 0.0, -0.3])
    rho = jnp.array([INF, 0.0, 0.0])

    def loss(m, solver):
        sol = rr.implicit_infer(m, z0, rho, tol=1e-13, adjoint_solver=solver)
        return jnp.sum(sol.value**2)

    g_lu = eqx.filter_grad(lambda m: loss(m, None))(model)
    g_ch = eqx.filter_grad(lambda m: loss(m, lx.Cholesky()))(model)
    for i in range(2):
        assert_close(
            g_ch.relations[i].relation.pred.means,
            g_lu.relations[i].relation.pred.means,
            rtol=1e-10,
        )


def test_roots_by_energy():
    """Two modes of unequal weight: the deeper (lower energy) answer first."""
    means = jnp.array([[-1.0, 0.0], [1.0, 0.0]])
    mix = rd.GaussianMixtureEps(SCHED, means, 0.3, jnp.array([0.2, 0.8]))
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=2)
    model = rr.ImplicitDiffusion(mix, nodes, float(rr.density_lambda(SCHED, nodes)))
    z0 = jnp.array([0.0, 0.0])
    rho = jnp.array([0.0, INF])
    roots = rr.implicit_roots(model, z0, rho, jax.random.key(3), n_starts=8, spread=1.5)
    assert int(roots.count) == 2
    by_energy = rr.roots_by_energy(model, roots, z0, rho)
    assert isinstance(by_energy, rr.RootsByEnergy)
    ordered, energy = by_energy  # unpacks as the pair it was
    assert by_energy.value is ordered.value and by_energy.energy is energy
    assert int(ordered.count) == 2
    assert float(ordered.value[0, 0]) > 0.5 and float(ordered.value[1, 0]) < -0.5
    assert float(energy[0]) < float(energy[1])
    assert np.all(np.isinf(np.asarray(energy)[~np.asarray(ordered.valid)]))


# -- bad input -------------------------------------------------------------------


def test_bad_relations():
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=2)
    g = gaussian(MU1, S1, nodes)
    with pytest.raises(ValueError, match="exceeds the joint state"):
        rr.IndexedRelation(g, [1, 3], 3)
    with pytest.raises(ValueError, match="exceeds the joint state"):
        rr.IndexedRelation(g, [-1, 0], 3)
    with pytest.raises(ValueError, match="repeats"):
        rr.IndexedRelation(g, [1, 1], 3)
    with pytest.raises(ValueError, match="dimension 2"):
        rr.IndexedRelation(g, [0, 1, 2], 3)
    with pytest.raises(ValueError, match="not in the joint state"):
        rr.named_relation(g, ["x", "w"], BLOCKS)
    r1 = rr.IndexedRelation(g, [0, 1], 3)
    r2 = rr.IndexedRelation(g, [1, 2], 3)
    with pytest.raises(ValueError, match="one weight per relation"):
        rr.ProductRelation([r1, r2], [1.0])
    with pytest.raises(ValueError, match="one weight per relation"):
        rr.ProductRelation([r1, r2], [1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="`weights` must be finite and nonnegative"):
        rr.ProductRelation([r1, r2], [1.0, -1.0])

    def product_field(weights):
        return rr.ProductRelation([r1, r2], weights).prior_field(jnp.ones(3))

    for bad in [jnp.array([1.0, -1.0]), jnp.array([jnp.nan, 1.0])]:
        raises_eagerly_and_under_jit(
            product_field, bad, match="`weights` must be finite and nonnegative"
        )
    with pytest.raises(ValueError, match="different joint dimensions"):
        rr.ProductRelation([r1, rr.IndexedRelation(g, [0, 1], 4)])
    with pytest.raises(TypeError, match="AbstractImplicitRelation"):
        rr.ProductRelation([r1, g.pred])
    with pytest.raises(ValueError, match="`lam` must be a finite, nonnegative"):
        rr.ImplicitDiffusion(g.pred, nodes, -1.0)

    def field(lam):
        return rr.ImplicitDiffusion(g.pred, nodes, lam).prior_field(jnp.ones(2))

    for bad in [-1.0, jnp.inf]:
        raises_eagerly_and_under_jit(
            field, bad, match="`lam` must be a finite, nonnegative"
        )
    # beartype (active in this suite) or the library's own check
    with pytest.raises((ValueError, TypeError), match="`lam` must be a scalar|'lam'"):
        rr.ImplicitDiffusion(g.pred, nodes, jnp.ones(2))
    twisted = rr.ImplicitDiffusion(
        rd.NoisePredictor(
            rd.TimeMLP(2, hidden=4, key=jax.random.key(0), dtype=jnp.float64), SCHED
        ),
        nodes,
    )
    assert not twisted.conservative
    with pytest.raises(ValueError, match="conservative"):
        rr.implicit_infer(twisted, jnp.zeros(2), jnp.array([INF, 0.0]), symmetric=True)
    with pytest.raises(TypeError, match="conservative"):
        rr.implicit_energy(twisted, jnp.zeros(2))
    with pytest.raises(ValueError, match="length 3"):
        rr.implicit_infer(rr.ProductRelation([r1, r2]), jnp.zeros(2), jnp.zeros(2))


class _QuadraticEnergy(eqx.Module):
    """A bowl plus a small network: a conservative field with one stable root."""

    centre: jax.Array
    mlp: rd.TimeMLP

    def __call__(self, x, t):
        bowl = 0.5 * jnp.sum((x - self.centre) ** 2)
        return bowl + 0.1 * jnp.tanh(self.mlp(x, t)[0])


@pytest.mark.slow
def test_energy_network_symmetric_adjoint():
    mlp = rd.TimeMLP(2, out_size=1, hidden=8, key=jax.random.key(2), dtype=jnp.float64)
    net = _QuadraticEnergy(jnp.array([0.3, -0.2]), mlp)
    energy_model = rr.ImplicitDiffusion(
        rd.EnergyNetwork(net, SCHED), rr.field_nodes(jax.random.key(0), 2, samples=2)
    )
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=2)
    model = rr.ProductRelation(
        [
            rr.named_relation(energy_model, ["x", "y"], BLOCKS),
            rr.named_relation(gaussian(MU2, S2, nodes), ["y", "z"], BLOCKS),
        ]
    )
    assert model.conservative
    z = jnp.array([0.2, -0.1, 0.7])
    # (each side under `jit`: one program, not op by op)
    grad_energy = eqx.filter_jit(lambda m, z: jax.grad(m.energy)(z))(model, z)
    assert_close(grad_energy, eqx.filter_jit(model.prior_field)(z), rtol=1e-10)
    jac = model.prior_jacobian(z)
    assert_close(jac, jac.T, rtol=1e-12)
    z0 = jnp.array([0.8, 0.0, -0.3])
    rho = jnp.array([INF, 0.0, 0.0])

    def loss(m, symmetric):
        sol = rr.implicit_infer(m, z0, rho, tol=1e-13, symmetric=symmetric)
        return jnp.sum(jnp.sin(sol.value))

    g_sym = eqx.filter_grad(lambda m: loss(m, None))(model)
    g_gen = eqx.filter_grad(lambda m: loss(m, False))(model)
    a = jax.tree.leaves(eqx.filter(g_sym, eqx.is_inexact_array))
    b = jax.tree.leaves(eqx.filter(g_gen, eqx.is_inexact_array))
    assert len(a) == len(b) and len(a) > 3
    for x, y in zip(a, b, strict=True):
        assert_close(x, y, rtol=1e-9, atol=1e-12)
    gw = g_sym.relations[0].relation.pred.net.mlp
    assert float(sum(jnp.sum(jnp.abs(x)) for x in jax.tree.leaves(gw))) > 0


@pytest.mark.full
def test_product_laplace():
    """With `lam = density_lambda` and small levels, the Laplace covariance of
    the product approaches that of the product of Gaussians."""
    model, _, _ = product(levels=0.01 * np.linspace(0.002, 0.05, 8), lam="density")
    z0 = jnp.array([0.8, 0.0, 0.0])
    rho = jnp.array([INF, 0.0, 0.0])
    sol = rr.implicit_infer(model, z0, rho, tol=1e-13)
    cov = rr.implicit_laplace(model, sol, rho)
    prec_y = W[0] / S1**2 + W[1] / S2**2
    ref = np.diag([0.0, 1 / prec_y, S2**2 / W[1]])
    assert_close(cov, ref, atol=1e-4, rtol=0)
