"""Noise predictors: closed-form mixtures, learned models and their derivatives."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import retrax.diffusion as rd
from helpers import assert_close, raises_eagerly_and_under_jit, tree_allclose


SCHED = rd.VPSDE()


def mixture(dtype=jnp.float64):
    means = jnp.array([[1.0, 0.5, -0.2], [-1.0, 0.0, 0.3], [0.2, -1.2, 0.8]], dtype)
    return rd.GaussianMixtureEps(
        SCHED, means, jnp.array([0.3, 0.5, 0.2], dtype), jnp.array([0.5, 0.3, 0.2])
    )


def mlp_predictor(key, n=2, dtype=None):
    return rd.NoisePredictor(rd.TimeMLP(n, key=key, dtype=dtype), SCHED)


def test_time_embedding():
    emb = rd.TimeEmbedding()
    t = 0.3
    f = np.array([0.5, 1, 2, 4, 8])
    ref = np.concatenate([np.sin(2 * np.pi * t * f), np.cos(2 * np.pi * t * f)])
    assert_close(emb(t), ref, rtol=1e-14)
    assert emb.size == 10
    assert emb(jnp.float32(t)).dtype == jnp.float32
    with pytest.raises(ValueError, match="at least one"):
        rd.TimeEmbedding(())


def test_circle_mlp_architecture(getkey):
    model = rd.TimeMLP(2, key=getkey())
    params = eqx.filter(model, eqx.is_inexact_array)
    assert sum(p.size for p in jax.tree.leaves(params)) == 5122
    shapes = [layer.weight.shape for layer in model.layers]
    assert shapes == [(64, 12), (64, 64), (2, 64)]
    # independent evaluation of the documented formula
    x, t = jnp.array([0.3, -0.7]), 0.2
    f = jnp.array([0.5, 1, 2, 4, 8])
    h = jnp.concatenate([x, jnp.sin(2 * jnp.pi * t * f), jnp.cos(2 * jnp.pi * t * f)])
    for layer in model.layers[:-1]:
        h = jax.nn.swish(layer.weight @ h + layer.bias)
    h = model.layers[-1].weight @ h + model.layers[-1].bias
    assert_close(model(x, t), h, rtol=1e-13)
    with pytest.raises(ValueError, match="in_size"):
        rd.TimeMLP(0, key=getkey())


def test_mixture_epsilon_is_scaled_score(getkey):
    mix = mixture()
    for t in [0.01, 0.2, 0.9]:
        x = jax.random.normal(getkey(), (3,))
        ref = -SCHED.sigma(t) * jax.grad(rd.mixture_logdensity, argnums=1)(mix, x, t)
        assert_close(mix.epsilon(x, t), ref, rtol=1e-12)
        assert_close(mix.score(x, t), -mix.epsilon(x, t) / SCHED.sigma(t))


def test_mixture_logdensity_against_scipy(getkey):
    from scipy.stats import multivariate_normal

    mix = mixture()
    x, t = jax.random.normal(getkey(), (3,)), 0.3
    a, s = float(SCHED.alpha(t)), float(SCHED.sigma(t))
    w = np.array([0.5, 0.3, 0.2])
    ref = np.log(
        sum(
            w[j]
            * multivariate_normal.pdf(
                np.asarray(x),
                a * np.asarray(mix.means[j]),
                (a**2 * float(mix.scales[j]) ** 2 + s**2) * np.eye(3),
            )
            for j in range(3)
        )
    )
    assert_close(rd.mixture_logdensity(mix, x, t), ref, rtol=1e-12)


def test_mixture_jacobian_and_vjp(getkey):
    mix = mixture()
    for t in [0.005, 0.1, 0.7]:
        x = 0.8 * jax.random.normal(getkey(), (3,))
        jac = mix.jacobian(x, t)
        assert_close(jac, jax.jacfwd(mix.epsilon)(x, t), rtol=1e-12)
        assert_close(jac, jac.T, rtol=1e-14)
        assert_close(rd.epsilon_jacobian(mix, x, t), jac, rtol=0)
        w = jax.random.normal(getkey(), (3,))

        def eps_of_means(m, x=x, t=t):
            return eqx.tree_at(lambda p: p.means, mix, m).epsilon(x, t)

        _, pullback = jax.vjp(eps_of_means, mix.means)
        assert_close(mix.vjp_means(x, t, w), pullback(w)[0], rtol=1e-12)
        grads = rd.epsilon_vjp_params(mix, x, t, w)
        assert_close(grads.means, mix.vjp_means(x, t, w), rtol=1e-12)
        assert grads.scales.shape == (3,) and grads.weights.shape == (3,)


def test_one_component_closed_form(getkey):
    v0 = 0.7
    mu = jnp.array([0.4, -0.3])
    one = rd.GaussianMixtureEps(SCHED, mu[None], jnp.sqrt(v0))
    for t in [0.001, 0.05, 0.5, 1.0]:
        x = jax.random.normal(getkey(), (2,))
        a, s = SCHED.alpha(t), SCHED.sigma(t)
        c = a**2 * v0 + s**2
        assert_close(one.epsilon(x, t), s * (x - a * mu) / c, rtol=1e-13)
        # Tweedie's mean is the Gaussian posterior mean of x0
        post = mu + a * v0 * (x - a * mu) / c
        assert_close(one.denoise(x, t), post, rtol=1e-12)
        assert_close(one.jacobian(x, t), s / c * jnp.eye(2), rtol=1e-13)
    zero = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, 2)), jnp.sqrt(v0))
    x, t = jnp.array([1.0, 2.0]), 0.05
    a, s = SCHED.alpha(t), SCHED.sigma(t)
    assert_close(zero.epsilon(x, t), s * x / (a**2 * v0 + s**2), rtol=1e-13)


def test_mixture_zero_weight_and_point_masses(getkey):
    means = jnp.array([[1.0, 0.0], [-1.0, 0.0]])
    mix = rd.GaussianMixtureEps(SCHED, means, 0.0, jnp.array([1.0, 0.0]))
    x, t = jnp.array([0.2, 0.1]), 0.3
    single = rd.GaussianMixtureEps(SCHED, means[:1], 0.0)
    assert_close(mix.epsilon(x, t), single.epsilon(x, t), rtol=1e-14)
    assert jnp.all(jnp.isfinite(mix.jacobian(x, t)))
    grads = rd.epsilon_vjp_params(mix, x, t, x)
    assert jnp.all(jnp.isfinite(grads.means))
    # an empty component still has the derivative of adding weight to it:
    # against a one-sided difference from weight 0
    h = 1e-7

    def eps_at(w2):
        m = rd.GaussianMixtureEps(SCHED, means, 0.0, jnp.array([1.0, w2]))
        return jnp.dot(m.epsilon(x, t), x)

    fd = (eps_at(h) - eps_at(0.0)) / h
    assert_close(grads.weights[1], fd, rtol=1e-5)
    assert float(jnp.abs(grads.weights[1])) > 0


def test_mixture_bad_input():
    with pytest.raises(ValueError, match="means"):
        rd.GaussianMixtureEps(SCHED, jnp.zeros(3), 1.0)
    with pytest.raises(ValueError, match="scales"):
        rd.GaussianMixtureEps(SCHED, jnp.zeros((2, 3)), jnp.ones(3))
    mix = mixture()
    x = jnp.zeros(3)

    def eps(means, scales, weights):
        return rd.GaussianMixtureEps(SCHED, means, scales, weights).epsilon(x, 0.1)

    # the value checks hold eagerly and under `jit` (traced arguments)
    good = (mix.means, mix.scales, mix.weights)
    for i, bad, match in [
        (1, -mix.scales, "`scales` must be finite, nonnegative"),
        (1, mix.scales.at[0].set(jnp.inf), "`scales` must be finite, nonnegative"),
        (2, mix.weights.at[0].set(-1.0), "`weights` must be finite and nonnegative"),
        (2, jnp.zeros(3), "`weights` must be .* with a positive sum"),
        (0, mix.means.at[1, 2].set(jnp.nan), "`means` must be finite"),
    ]:
        args = good[:i] + (bad,) + good[i + 1 :]
        raises_eagerly_and_under_jit(eps, *args, match=match)
    # and under `vmap` over constructors: one bad mixture in the batch raises
    batch = jnp.stack([mix.weights, mix.weights.at[1].set(-0.5)])
    build = eqx.filter_vmap(lambda w: rd.GaussianMixtureEps(SCHED, mix.means, 0.3, w))
    with pytest.raises(Exception, match="`weights` must be finite and nonnegative"):
        build(batch)
    assert build(jnp.stack([mix.weights, mix.weights])).weights.shape == (2, 3)
    with pytest.raises(ValueError, match="one point of shape"):
        mix.epsilon(jnp.zeros(2), 0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mix.epsilon(jnp.zeros(3), 1.2)
    # beartype (active in this suite) or the library's own check
    with pytest.raises((ValueError, TypeError), match="scalar time|parameter 't'"):
        mix.epsilon(jnp.zeros(3), jnp.array([0.1, 0.2]))


def test_noise_predictor_derivatives(getkey):
    pred = mlp_predictor(getkey(), n=3)
    x, t = jax.random.normal(getkey(), (3,)), 0.1
    jf = rd.epsilon_jacobian(pred, x, t, mode="fwd")
    assert_close(rd.epsilon_jacobian(pred, x, t), jf, rtol=0)
    assert_close(rd.epsilon_jacobian(pred, x, t, mode="rev"), jf, rtol=1e-13)
    assert_close(rd.epsilon_jacobian(pred, x, t, mode="fd"), jf, rtol=1e-8)
    assert_close(
        rd.epsilon_jacobian(pred, x, t, mode="fd", fd_step=1e-4), jf, rtol=1e-6
    )
    # against central differences written here
    h = 1e-6
    cols = [
        (pred.epsilon(x + h * e, t) - pred.epsilon(x - h * e, t)) / (2 * h)
        for e in jnp.eye(3)
    ]
    assert_close(jf, jnp.stack(cols, axis=1), rtol=1e-7)
    with pytest.raises(ValueError, match="no exact Jacobian"):
        rd.epsilon_jacobian(pred, x, t, mode="exact")
    with pytest.raises((ValueError, TypeError), match="mode"):
        rd.epsilon_jacobian(pred, x, t, mode="bogus")
    with pytest.raises((ValueError, TypeError), match="vector|parameter 'x'"):
        rd.epsilon_jacobian(pred, jnp.zeros((1, 3)), t)

    w = jax.random.normal(getkey(), (3,))
    grads = rd.epsilon_vjp_params(pred, x, t, w)
    ref = eqx.filter_grad(lambda m: jnp.dot(m(x, jnp.float64(t)), w))(pred.model)
    assert tree_allclose(grads.model, ref, rtol=1e-13)
    with pytest.raises(ValueError, match="shape of `x`"):
        rd.epsilon_vjp_params(pred, x, t, w[:2])


def test_predictor_score_denoise_loss(getkey):
    pred = mlp_predictor(getkey())
    x0, t = jax.random.normal(getkey(), (2,)), 0.15
    eps = jax.random.normal(getkey(), (2,))
    a, s = SCHED.alpha(t), SCHED.sigma(t)
    xt = a * x0 + s * eps
    eh = pred.epsilon(xt, t)
    assert_close(pred.score(xt, t), -eh / s, rtol=1e-14)
    assert_close(pred.denoise(xt, t), (xt - s * eh) / a, rtol=1e-14)
    assert_close(pred.denoising_loss(eps, x0, t), jnp.mean((eh - eps) ** 2), rtol=1e-13)
    key = getkey()
    drawn = jax.random.normal(key, (2,), jnp.float64)
    assert_close(pred.denoising_loss(key, x0, t), pred.denoising_loss(drawn, x0, t))
    legacy = jax.random.PRNGKey(3)
    assert jnp.isfinite(pred.denoising_loss(legacy, x0, t))
    # the mixture's exact epsilon has a smaller expected loss than a random net
    mix = rd.GaussianMixtureEps(SCHED, jnp.array([[1.0, 1.0], [-1.0, -1.0]]), 0.2)
    keys = jax.random.split(getkey(), 4000)
    x0s = mix.means[jax.random.bernoulli(getkey(), 0.5, (4000,)).astype(int)]
    x0s = x0s + 0.2 * jax.random.normal(getkey(), x0s.shape)
    mean_loss = eqx.filter_jit(
        lambda p: jax.vmap(p.denoising_loss, (0, 0, None))(keys, x0s, t).mean()
    )
    assert float(mean_loss(mix)) < float(mean_loss(pred))


class _WrongSize(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, x, t):
        return self.lin(x)


def test_model_output_shape_error(getkey):
    bad = rd.NoisePredictor(_WrongSize(eqx.nn.Linear(2, 3, key=getkey())), SCHED)
    with pytest.raises(ValueError, match="output must have the shape"):
        bad.epsilon(jnp.zeros(2), 0.1)
    with pytest.raises(TypeError):
        mlp_predictor(getkey()).epsilon(jnp.zeros(2, int), 0.1)


def test_custom_input_adapter(getkey):
    model = rd.TimeMLP(2, key=getkey())

    def scaled(x, t):
        return 2.0 * x, t

    pred = rd.NoisePredictor(model, SCHED, input=scaled)
    x = jnp.array([0.1, 0.2])
    assert_close(pred.epsilon(x, 0.3), model(2.0 * x, 0.3), rtol=1e-15)


def energy_predictor(key):
    return rd.EnergyNetwork(rd.TimeMLP(3, out_size=1, hidden=16, key=key), SCHED)


def online_kde_predictor():
    kde = rd.OnlineKDE(3, 4, 0.3)
    for x in mixture().means:
        kde = kde.observe(x)
    return kde.predictor(SCHED)


@pytest.mark.parametrize("kind", ["mlp", "mixture", "kde", "online_kde", "energy"])
def test_jit_vmap_grad_through_predictors(kind, getkey):
    pred = {
        "mlp": lambda: mlp_predictor(getkey(), n=3),
        "mixture": mixture,
        "kde": lambda: rd.kde_predictor(
            SCHED, jax.random.normal(getkey(), (9, 3)), 0.3
        ),
        "online_kde": online_kde_predictor,
        "energy": lambda: energy_predictor(getkey()),
    }[kind]()
    xs = jax.random.normal(getkey(), (5, 3))
    ts = jnp.linspace(0.01, 0.9, 5)
    ref = jnp.stack([pred.epsilon(x, t) for x, t in zip(xs, ts, strict=True)])

    def loss(p):
        return jnp.sum(jax.vmap(p.denoise)(xs, ts) ** 2)

    @eqx.filter_jit
    def transformed(pred):
        eps = jax.vmap(pred.epsilon)(xs, ts)
        jacs = jax.vmap(lambda x, t: rd.epsilon_jacobian(pred, x, t))(xs, ts)
        grads = eqx.filter_grad(loss)(pred)
        gx = jax.grad(lambda x: jnp.sum(pred.score(x, 0.2)))(xs[0])
        gt = jax.grad(lambda t: jnp.sum(pred.epsilon(xs[0], t)))(jnp.float64(0.3))
        return eps, jacs, grads, gx, gt

    eps, jacs, grads, gx, gt = transformed(pred)
    assert_close(eps, ref, rtol=1e-12)
    assert jacs.shape == (5, 3, 3)
    assert_close(jacs[2], rd.epsilon_jacobian(pred, xs[2], ts[2]), rtol=1e-12)
    leaves = jax.tree.leaves(eqx.filter(grads, eqx.is_inexact_array))
    assert leaves and all(jnp.all(jnp.isfinite(leaf)) for leaf in leaves)
    assert_close(
        gx,
        -jnp.sum(rd.epsilon_jacobian(pred, xs[0], 0.2), 0) / SCHED.sigma(0.2),
        rtol=1e-12,
    )
    # d eps / dt against a central difference
    h = 1e-6
    fd = (pred.epsilon(xs[0], 0.3 + h) - pred.epsilon(xs[0], 0.3 - h)) / (2 * h)
    assert_close(gt, jnp.sum(fd), rtol=1e-6)


@pytest.mark.parametrize("kind", ["mlp", "mixture"])
def test_float32(kind, getkey):
    if kind == "mlp":
        pred = mlp_predictor(getkey(), n=3, dtype=jnp.float32)
    else:
        pred = mixture(jnp.float32)
    x = jax.random.normal(getkey(), (3,), jnp.float32)
    assert pred.epsilon(x, 0.1).dtype == jnp.float32
    assert pred.denoise(x, 0.1).dtype == jnp.float32
    assert rd.epsilon_jacobian(pred, x, 0.1).dtype == jnp.float32
    assert rd.epsilon_jacobian(pred, x, 0.1, mode="fd").dtype == jnp.float32
    key = getkey()
    assert pred.denoising_loss(key, x, 0.1).dtype == jnp.float32


def test_default_input_is_identity():
    x, t = jnp.array([1.0, 2.0]), jnp.float64(0.3)
    out = rd.default_input(x, t)
    assert out[0] is x and out[1] is t


def test_every_public_name_is_documented():
    import inspect

    for name in dir(rd):
        if name.startswith("_"):
            continue
        obj = getattr(rd, name)
        if inspect.ismodule(obj):
            continue
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not callable(member):
                    continue
                assert inspect.getdoc(getattr(obj, attr)), f"{name}.{attr}"


@eqx.filter_jit
def _mixture_identities(mix, x, t, w):
    jac = mix.jacobian(x, t)
    jac_ad = jax.jacfwd(mix.epsilon)(x, t)
    _, pullback = jax.vjp(
        lambda m: eqx.tree_at(lambda p: p.means, mix, m).epsilon(x, t), mix.means
    )
    score = jax.grad(rd.mixture_logdensity, argnums=1)(mix, x, t)
    return (
        jac,
        jac_ad,
        mix.vjp_means(x, t, w),
        pullback(w)[0],
        mix.epsilon(x, t),
        -SCHED.sigma(t) * score,
    )


@settings(deadline=None, max_examples=25)
@given(
    seed=st.integers(0, 2**31 - 1),
    t=st.floats(1e-3, 1.0),
    spread=st.floats(0.1, 3.0),
)
def test_mixture_identities_property(seed, t, spread):
    keys = jax.random.split(jax.random.key(seed), 5)
    means = spread * jax.random.normal(keys[0], (4, 3))
    scales = jax.random.uniform(keys[1], (4,), minval=0.05, maxval=1.0)
    weights = jax.random.uniform(keys[2], (4,), minval=0.05, maxval=1.0)
    mix = rd.GaussianMixtureEps(SCHED, means, scales, weights)
    x = spread * jax.random.normal(keys[3], (3,))
    w = jax.random.normal(keys[4], (3,))
    jac, jac_ad, vjp, vjp_ad, eps, eps_ref = _mixture_identities(
        mix, x, jnp.float64(t), w
    )
    assert_close(jac, jac_ad, rtol=1e-10)
    assert_close(jac, jac.T, rtol=1e-13)
    assert_close(vjp, vjp_ad, rtol=1e-10)
    assert_close(eps, eps_ref, rtol=1e-10)
