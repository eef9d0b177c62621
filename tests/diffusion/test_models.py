"""Network architectures and the energy-parametrised predictor."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close


SCHED = rd.VPSDE()


def build(kind, n, key, dtype=None):
    if kind == "mlp":
        return rd.TimeMLP(n, hidden=16, key=key, dtype=dtype)
    if kind == "film":
        return rd.FiLMResidualMLP(n, hidden=16, key=key, dtype=dtype)
    return rd.ChannelTransformer(n, width=8, heads=2, layers=1, key=key, dtype=dtype)


@pytest.mark.parametrize("kind", ["mlp", "film", "transformer"])
@pytest.mark.full
def test_architectures_through_predictor(kind, getkey):
    n = 4
    pred = rd.NoisePredictor(build(kind, n, getkey()), SCHED)
    xs = jax.random.normal(getkey(), (3, n))
    ts = jnp.array([0.01, 0.1, 0.5])
    noise = jax.random.normal(getkey(), (n,))

    def loss(p):
        return p.denoising_loss(noise, xs[0], 0.1)

    @eqx.filter_jit
    def everything(pred):
        eps = jax.vmap(pred.epsilon)(xs, ts)
        jacs = [
            rd.epsilon_jacobian(pred, xs[0], 0.1, mode=m) for m in ("fwd", "rev", "fd")
        ]
        value, grads = eqx.filter_value_and_grad(loss)(pred)
        stepped = eqx.apply_updates(pred, jax.tree.map(lambda v: -1e-3 * v, grads))
        return eps, jacs, value, grads, loss(stepped), stepped.epsilon(xs[0], 0.9)

    eps, (jf, jr, jfd), value, grads, stepped_loss, late = everything(pred)
    assert eps.shape == (3, n) and jnp.all(jnp.isfinite(eps))
    assert_close(eps[1], pred.epsilon(xs[1], 0.1), rtol=1e-12)
    assert_close(jr, jf, rtol=1e-12)
    assert_close(jfd, jf, rtol=1e-7)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert leaves and all(jnp.all(jnp.isfinite(leaf)) for leaf in leaves)
    # a gradient step lowers the loss for that fixed noise
    assert float(stepped_loss) < float(value)
    # the time input matters (FiLM only after training: it starts t-independent)
    assert not jnp.allclose(eps[0], late)


@pytest.mark.parametrize("kind", ["mlp", "film", "transformer"])
def test_architectures_float32(kind, getkey):
    model = build(kind, 3, getkey(), dtype=jnp.float32)
    out = model(jnp.ones(3, jnp.float32), 0.2)
    assert out.dtype == jnp.float32 and out.shape == (3,)


def test_film_starts_near_linear_in_x(getkey):
    # the zero-initialised block outputs make the untrained net independent of t
    model = rd.FiLMResidualMLP(3, hidden=16, key=getkey())
    x = jnp.array([0.1, -0.2, 0.3])
    assert_close(model(x, 0.1), model(x, 0.7), rtol=1e-14)


def test_architecture_errors(getkey):
    with pytest.raises(ValueError, match="heads"):
        rd.ChannelTransformer(3, width=10, heads=3, key=getkey())
    with pytest.raises(ValueError, match="blocks"):
        rd.FiLMResidualMLP(3, blocks=0, key=getkey())
    with pytest.raises(ValueError, match="out_size"):
        rd.TimeMLP(3, out_size=0, key=getkey())
    model = rd.ChannelTransformer(3, width=8, key=getkey())
    with pytest.raises((ValueError, TypeError), match="channel|shape"):
        model(jnp.ones(4), 0.1)


class _MixtureEnergy(eqx.Module):
    """-log p_t of a closed-form mixture, as an energy network."""

    mixture: rd.GaussianMixtureEps

    def __call__(self, x, t):
        return -rd.mixture_logdensity(self.mixture, x, t)


@pytest.mark.full
def test_energy_network_of_mixture_is_exact(getkey):
    mix = rd.GaussianMixtureEps(
        SCHED, jnp.array([[1.0, 0.0], [-1.0, 0.5]]), jnp.array([0.3, 0.4])
    )
    energy = rd.EnergyNetwork(_MixtureEnergy(mix), SCHED)
    values = eqx.filter_jit(
        lambda p, x, t: (p.epsilon(x, t), p.jacobian(x, t), p.energy(x, t))
    )
    for t in [0.01, 0.3]:
        x = jax.random.normal(getkey(), (2,))
        eps, jac, e = values(energy, x, jnp.float64(t))
        assert_close(eps, mix.epsilon(x, t), rtol=1e-12)
        assert_close(jac, mix.jacobian(x, t), rtol=1e-11)
        assert_close(e, -rd.mixture_logdensity(mix, x, t))


@pytest.mark.full
def test_energy_network_jacobian_symmetric(getkey):
    net = rd.TimeMLP(4, out_size=1, hidden=16, key=getkey())
    energy = rd.EnergyNetwork(net, SCHED)
    x, t = jax.random.normal(getkey(), (4,)), 0.2
    jac = rd.epsilon_jacobian(energy, x, t)
    scale = float(jnp.max(jnp.abs(jac)))
    assert float(jnp.max(jnp.abs(jac - jac.T))) <= 4 * np.finfo(np.float64).eps * scale
    assert_close(jac, rd.epsilon_jacobian(energy, x, t, mode="fwd"), rtol=1e-12)
    assert_close(energy.epsilon(x, t), SCHED.sigma(t) * jax.grad(energy.energy)(x, t))


@pytest.mark.full
def test_energy_denoising_gradient(getkey):
    net = rd.TimeMLP(2, out_size=1, hidden=8, depth=1, key=getkey())
    energy = rd.EnergyNetwork(net, SCHED)
    x0 = jax.random.normal(getkey(), (6, 2))
    t = jnp.linspace(0.05, 0.5, 6)
    eps = jax.random.normal(getkey(), (6, 2))
    loss, grads = energy.denoising_gradient(eps, x0, t)
    ref = jnp.mean(jax.vmap(energy.denoising_loss)(eps, x0, t))
    assert_close(loss, ref, rtol=1e-14)
    # directional derivative against central differences in parameter space
    params, static = eqx.partition(energy, eqx.is_inexact_array)
    direction = jax.tree.map(lambda p: jax.random.normal(getkey(), p.shape), params)

    def loss_at(s):
        p = jax.tree.map(lambda a, d: a + s * d, params, direction)
        model = eqx.combine(p, static)
        return jnp.mean(jax.vmap(model.denoising_loss)(eps, x0, t))

    h = 1e-5
    fd = (loss_at(h) - loss_at(-h)) / (2 * h)
    g = eqx.filter(grads, eqx.is_inexact_array)
    dot = sum(
        jnp.sum(a * b)
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(direction), strict=True)
    )
    assert_close(dot, fd, rtol=1e-7)
    key_loss, _ = energy.denoising_gradient(getkey(), x0, t)
    assert jnp.isfinite(key_loss)
    with pytest.raises((ValueError, TypeError), match="batch|x0|parameter 't'"):
        energy.denoising_gradient(eps, x0, t[:3])


@pytest.mark.full
def test_energy_network_errors_and_float32(getkey):
    bad = rd.EnergyNetwork(rd.TimeMLP(2, hidden=8, key=getkey()), SCHED)
    with pytest.raises(ValueError, match="scalar"):
        bad.epsilon(jnp.zeros(2), 0.1)
    net = rd.TimeMLP(2, out_size=1, hidden=8, dtype=jnp.float32, key=getkey())
    e32 = rd.EnergyNetwork(net, SCHED)
    x = jnp.ones(2, jnp.float32)

    @eqx.filter_jit
    def values(e, x):
        ones = jnp.ones((3, 2), jnp.float32)
        g = jax.vmap(jax.grad(lambda x: jnp.sum(e.score(x, 0.1))))(ones)
        return e.epsilon(x, 0.1), rd.epsilon_jacobian(e, x, 0.1), g

    eps, jac, g = values(e32, x)
    assert eps.dtype == jac.dtype == g.dtype == jnp.float32
    assert g.shape == (3, 2)
