"""Training by denoising score matching, and the samplers, against closed forms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import retrax
import retrax.diffusion as rd
from helpers import (
    assert_close,
    fit_kwargs,
    raises_eagerly_and_under_jit,
    tiny_training_problem,
    tree_is_finite,
    users_compiler,
)


SCHED = rd.VPSDE()
MEANS = jnp.array([[-1.5, 0.0], [1.5, 0.5], [0.0, -1.5]])
WEIGHTS = jnp.array([0.5, 0.3, 0.2])
MIX = rd.GaussianMixtureEps(SCHED, MEANS, jnp.array([0.3, 0.25, 0.2]), WEIGHTS)
NUM = 5000

GAUSS_MEAN = jnp.array([0.5, -0.25])
GAUSS_VAR = 0.5


@pytest.fixture(scope="session")
def gaussian_fit():
    """A tiny MLP trained on a 2-D Gaussian, once for the session."""
    key = jax.random.key(1)
    data = GAUSS_MEAN + jnp.sqrt(GAUSS_VAR) * jax.random.normal(key, (2048, 2))
    model = rd.TimeMLP(2, hidden=32, key=jax.random.key(2))
    pred = rd.NoisePredictor(model, SCHED)
    run = rd.fit(
        pred,
        data,
        jax.random.key(3),
        optimizer=optax.adam(3e-3),
        steps=1500,
        batch_size=128,
        t_range=(0.05, 0.5),
        progress=False,
    )
    trained, losses = run.value, run.losses
    return pred, trained, losses


def optimal_loss(t):
    """The least denoising loss for Gaussian data, alpha^2 v0 / (alpha^2 v0 + s^2)."""
    a2 = SCHED.alpha(t) ** 2
    return a2 * GAUSS_VAR / (a2 * GAUSS_VAR + SCHED.sigma(t) ** 2)


def expected_loss(pred, key, t, num=20_000):
    k1, k2 = jax.random.split(key)
    x0 = GAUSS_MEAN + jnp.sqrt(GAUSS_VAR) * jax.random.normal(k1, (num, 2))
    eps = jax.random.normal(k2, (num, 2))
    return jnp.mean(jax.vmap(pred.denoising_loss, (0, 0, None))(eps, x0, t))


@pytest.mark.full
def test_fit_learns_gaussian_epsilon(gaussian_fit, getkey):
    pred, trained, losses = gaussian_fit
    assert losses.shape == (1500,) and losses.dtype == jnp.float64
    assert jnp.all(jnp.isfinite(losses))
    assert float(jnp.mean(losses[-100:])) < float(jnp.mean(losses[:100]))
    assert isinstance(trained, rd.NoisePredictor)
    assert trained.schedule == pred.schedule
    for t in [0.1, 0.3]:
        opt = optimal_loss(t)
        # the trained net is within 10% of the optimum; the untrained one is not
        assert float(expected_loss(trained, getkey(), t)) < 1.1 * float(opt)
        assert float(expected_loss(pred, getkey(), t)) > 1.1 * float(opt)
        # and close to the closed-form Gaussian epsilon where the noised data
        # lie (in units of the noise variance 1); the untrained net is not
        exact = rd.GaussianMixtureEps(SCHED, GAUSS_MEAN[None], jnp.sqrt(GAUSS_VAR))
        xt = GAUSS_MEAN + jnp.sqrt(SCHED.marginal_variance(t, GAUSS_VAR)) * (
            jax.random.normal(getkey(), (4000, 2))
        )

        def mse(p, xt=xt, t=t, exact=exact):
            diff = jax.vmap(p.epsilon, (0, None))(xt, t)
            return jnp.mean((diff - jax.vmap(exact.epsilon, (0, None))(xt, t)) ** 2)

        assert float(mse(trained)) < 0.01
        assert float(mse(pred)) > 0.1


def test_fit_is_deterministic_and_chunked(getkey):
    data = jax.random.normal(getkey(), (64, 2))
    pred = rd.NoisePredictor(rd.TimeMLP(2, hidden=8, depth=1, key=getkey()), SCHED)
    key = getkey()
    run = rd.fit(pred, data, key, steps=8, batch_size=8, progress=False)
    a, la = run.value, run.losses
    run = rd.fit(pred, data, key, steps=8, batch_size=8, progress=False, chunk_size=3)
    b, lb = run.value, run.losses
    # chunking (3 chunks, the last one padded) does not change the result
    assert_close(la, lb, rtol=1e-12)
    leaves_a = jax.tree.leaves(eqx.filter(a, eqx.is_inexact_array))
    leaves_b = jax.tree.leaves(eqx.filter(b, eqx.is_inexact_array))
    for x, y in zip(leaves_a, leaves_b, strict=True):
        assert_close(x, y, rtol=1e-12)
    # and matches a plain Python loop of the same steps
    params, static = eqx.partition(pred, eqx.is_inexact_array)
    opt = optax.adam(1e-3)
    state = opt.init(params)

    @jax.jit
    def step(params, state, i):
        k_idx, k_t, k_eps = jax.random.split(jax.random.fold_in(key, i), 3)
        x0 = data[jax.random.randint(k_idx, (8,), 0, 64)]
        t = jax.random.uniform(k_t, (8,), jnp.float64, 1e-3, 0.2)
        eps = jax.random.normal(k_eps, x0.shape, jnp.float64)

        def loss_fn(p):
            model = eqx.combine(p, static)
            return jnp.mean(jax.vmap(model.denoising_loss)(eps, x0, t))

        loss, grads = jax.value_and_grad(loss_fn)(params)
        with jax.numpy_dtype_promotion("standard"):
            updates, state = opt.update(grads, state, params)
        return eqx.apply_updates(params, updates), state, loss

    ref = []
    for i in range(8):
        params, state, loss = step(params, state, jnp.int32(i))
        ref.append(loss)
    assert_close(la, jnp.stack(ref), rtol=1e-10)


def test_fit_ema_averages_the_iterates(getkey):
    data = jax.random.normal(getkey(), (64, 2))
    pred = rd.NoisePredictor(rd.TimeMLP(2, hidden=8, depth=1, key=getkey()), SCHED)
    key = getkey()

    def params(p):
        return jax.tree.leaves(eqx.filter(p, eqx.is_inexact_array))

    # the iterates theta_1, theta_2, theta_3 of one run (steps draw their
    # minibatches by absolute index, so shorter runs are its prefixes)
    iterates = [
        params(rd.fit(pred, data, key, steps=s, batch_size=8, progress=False).value)
        for s in (1, 2, 3)
    ]
    run = rd.fit(pred, data, key, steps=3, batch_size=8, progress=False)
    last, losses = run.value, run.losses
    d = 0.8
    # chunked (the last chunk padded): padded steps do not enter the average
    run = rd.fit(
        pred, data, key, steps=3, batch_size=8, progress=False, ema=d, chunk_size=2
    )
    avg, avg_losses = run.value, run.losses
    # the optimiser and the loss history are unchanged
    assert_close(avg_losses, losses, rtol=1e-12)
    weights = [(1 - d) * d**2, (1 - d) * d, 1 - d]
    for j, got in enumerate(params(avg)):
        want = sum(w * it[j] for w, it in zip(weights, iterates, strict=True))
        assert_close(got, want / (1 - d**3), rtol=1e-12)
        assert not np.allclose(got, iterates[-1][j])
    # decay 0 keeps only the last iterate
    zero = rd.fit(pred, data, key, steps=3, batch_size=8, progress=False, ema=0.0).value
    for got, want in zip(params(zero), params(last), strict=True):
        assert_close(got, want, rtol=1e-12)


def test_fit_ema_float32(getkey):
    data = jax.random.normal(getkey(), (32, 2), jnp.float32)
    model = rd.TimeMLP(2, hidden=8, depth=1, dtype=jnp.float32, key=getkey())
    trained = rd.fit(
        rd.NoisePredictor(model, SCHED),
        data,
        getkey(),
        steps=5,
        progress=False,
        ema=0.99,
    ).value
    assert trained.model.layers[0].weight.dtype == jnp.float32
    assert jnp.all(jnp.isfinite(trained.model.layers[0].weight))


def test_fit_progress_bar(getkey, capsys):
    data = jax.random.normal(getkey(), (32, 2))
    pred = rd.NoisePredictor(rd.TimeMLP(2, hidden=8, depth=1, key=getkey()), SCHED)
    rd.fit(pred, data, getkey(), steps=4, batch_size=4, progress=True)
    assert "fit" in capsys.readouterr().err
    rd.fit(pred, data, getkey(), steps=4, batch_size=4, progress=False)
    assert capsys.readouterr().err == ""


def test_fit_float32(getkey):
    data = jax.random.normal(getkey(), (32, 2), jnp.float32)
    model = rd.TimeMLP(2, hidden=8, depth=1, dtype=jnp.float32, key=getkey())
    run = rd.fit(
        rd.NoisePredictor(model, SCHED), data, getkey(), steps=5, progress=False
    )
    trained, losses = run.value, run.losses
    assert losses.dtype == jnp.float32
    assert trained.model.layers[0].weight.dtype == jnp.float32


def test_fit_bad_input(getkey):
    pred = rd.NoisePredictor(rd.TimeMLP(2, hidden=8, depth=1, key=getkey()), SCHED)
    data = jax.random.normal(getkey(), (16, 2))
    with pytest.raises(ValueError, match="shape \\(num_examples, dim\\)"):
        rd.fit(pred, data[:, 0], getkey(), steps=2, progress=False)
    with pytest.raises(ValueError, match="cannot take one row"):
        rd.fit(pred, jnp.zeros((16, 3)), getkey(), steps=2, progress=False)
    with pytest.raises(ValueError, match="must be finite: 1 of 16 rows"):
        rd.fit(pred, data.at[3, 1].set(jnp.nan), getkey(), steps=2, progress=False)
    with pytest.raises(ValueError, match="must be finite"):
        rd.fit(pred, data.at[0, 0].set(jnp.inf), getkey(), steps=2, progress=False)
    with pytest.raises(TypeError, match="floating"):
        rd.fit(pred, jnp.zeros((16, 2), int), getkey(), steps=2, progress=False)
    with pytest.raises(ValueError, match="t_range"):
        rd.fit(pred, data, getkey(), steps=2, t_range=(0.1, 1.5), progress=False)
    with pytest.raises(ValueError, match="t_range"):
        rd.fit(pred, data, getkey(), steps=2, t_range=(0.5, 0.1), progress=False)
    with pytest.raises(ValueError, match="steps"):
        rd.fit(pred, data, getkey(), steps=0, progress=False)
    with pytest.raises(ValueError, match="batch_size"):
        rd.fit(pred, data, getkey(), steps=2, batch_size=0, progress=False)
    with pytest.raises(ValueError, match="ema"):
        rd.fit(pred, data, getkey(), steps=2, ema=1.0, progress=False)
    with pytest.raises(ValueError, match="ema"):
        rd.fit(pred, data, getkey(), steps=2, ema=-0.1, progress=False)
    with pytest.raises(TypeError, match="ema"):
        rd.fit(pred, data, getkey(), steps=2, ema=True, progress=False)


class _WrongSize(eqx.Module):
    lin: eqx.nn.Linear

    def __call__(self, x, t):
        return self.lin(x)


def test_fit_model_output_shape(getkey):
    bad = rd.NoisePredictor(_WrongSize(eqx.nn.Linear(2, 3, key=getkey())), SCHED)
    with pytest.raises(ValueError, match="output must have the shape"):
        rd.fit(bad, jnp.zeros((8, 2)), getkey(), steps=2, progress=False)


def mixture_stats(xs):
    """Assign each sample to the nearest mean: weights and per-component means."""
    xs = np.asarray(xs)
    means = np.asarray(MEANS)
    labels = np.argmin(((xs[:, None] - means[None]) ** 2).sum(-1), axis=1)
    weights = np.array([np.mean(labels == j) for j in range(3)])
    comp_means = np.stack([xs[labels == j].mean(0) for j in range(3)])
    return weights, comp_means


@pytest.mark.parametrize(
    "sampler",
    [
        lambda k: rd.sample_ancestral(MIX, k, 2).value,
        lambda k: rd.sample_euler_maruyama(MIX, k, 2).value,
        lambda k: rd.sample_ddim(MIX, k, (2,)).value,
        lambda k: rd.sample_ddim(MIX, k, 2, eta=1.0).value,
        lambda k: rd.sample_ode(MIX, k, 2).value,
    ],
    ids=["ancestral", "euler_maruyama", "ddim", "ddim_eta1", "ode"],
)
@pytest.mark.full
def test_samplers_reproduce_mixture(sampler):
    keys = jax.random.split(jax.random.key(0), NUM)
    xs = jax.vmap(sampler)(keys)
    assert xs.shape == (NUM, 2) and jnp.all(jnp.isfinite(xs))
    weights, comp_means = mixture_stats(xs)
    assert np.max(np.abs(weights - np.asarray(WEIGHTS))) <= 0.03, weights
    assert np.max(np.abs(comp_means - np.asarray(MEANS))) <= 0.05, comp_means


def test_ode_sampler_against_rk4():
    # the probability-flow ODE integrated here by fixed-step RK4 from the
    # same x_1 (sample_ode draws x_1 = normal(key) directly)
    key = jax.random.key(5)
    got = rd.sample_ode(MIX, key, 2, rtol=1e-9, atol=1e-9).value

    def f(t, x):
        beta, sigma = SCHED.beta(t), SCHED.sigma(t)
        return 0.5 * beta * (MIX.epsilon(x, t) / sigma - x)

    def rk4(x, t):
        h = -(1.0 - SCHED.t_min) / 4000
        k1 = f(t, x)
        k2 = f(t + h / 2, x + h / 2 * k1)
        k3 = f(t + h / 2, x + h / 2 * k2)
        k4 = f(t + h, x + h * k3)
        return x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4), None

    ts = jnp.linspace(1.0, SCHED.t_min, 4001)[:-1]
    ref, _ = jax.lax.scan(rk4, jax.random.normal(key, (2,)), ts)
    assert_close(got, ref, rtol=1e-6)


@pytest.mark.full
def test_log_likelihood_matches_mixture():
    keys = jax.random.split(jax.random.key(1), 12)
    xs = jax.vmap(lambda k: rd.sample_ancestral(MIX, k, 2).value)(keys)

    def exact_prior(z):
        return rd.mixture_logdensity(MIX, z, 1.0)

    ll = jax.vmap(lambda x: rd.log_likelihood(MIX, x, prior=exact_prior).value)(xs)
    ref = jax.vmap(lambda x: rd.mixture_logdensity(MIX, x, SCHED.t_min))(xs)
    assert_close(ll, ref, atol=1e-3, rtol=0)


def test_log_likelihood_gaussian_closed_form():
    # one Gaussian component: the standard normal prior is then off only by
    # the exact terminal marginal, which we pass; check another start time too
    one = rd.GaussianMixtureEps(SCHED, jnp.zeros((1, 2)), 0.5)
    x = jnp.array([0.3, -0.4])
    got = rd.log_likelihood(
        one, x, t0=0.1, prior=lambda z: rd.mixture_logdensity(one, z, 1.0)
    ).value
    v = SCHED.marginal_variance(0.1, 0.25)
    ref = -0.5 * jnp.sum(x**2) / v - jnp.log(2 * jnp.pi * v)
    assert_close(got, ref, atol=1e-5, rtol=0)


@pytest.mark.full
def test_sample_conditional_mixture():
    # two components share x = 1; given x = 1, y is +-1 with odds 0.45 : 0.3
    means = jnp.array([[1.0, 1.0], [1.0, -1.0], [-1.5, 0.0]])
    weights = jnp.array([0.45, 0.3, 0.25])
    mix = rd.GaussianMixtureEps(SCHED, means, 0.3, weights)
    mask, values = jnp.array([True, False]), jnp.array([1.0, 123.0])
    keys = jax.random.split(jax.random.key(2), 4000)
    xs = jax.vmap(lambda k: rd.sample_conditional(mix, k, mask, values).value)(keys)
    assert jnp.all(xs[:, 0] == 1.0)
    y = np.asarray(xs[:, 1])
    # exact conditional: component posteriors given x = 1 (isotropic components)
    logw = np.log(np.asarray(weights)) - 0.5 * (1 - np.asarray(means[:, 0])) ** 2 / 0.09
    pi = np.exp(logw - logw.max())
    pi /= pi.sum()
    # 4 standard errors of 4,000 draws
    assert abs(np.mean(y > 0) - pi[0]) < 0.03
    assert abs(y.mean() - pi @ np.asarray(means[:, 1])) < 0.065
    assert abs(np.abs(y).mean() - 1.0) < 0.03


@pytest.mark.full
def test_samplers_float32_jit_and_errors(getkey):
    mix32 = rd.GaussianMixtureEps(SCHED, MEANS.astype(jnp.float32), 0.3)
    key = getkey()
    for f in [rd.sample_ancestral, rd.sample_euler_maruyama, rd.sample_ddim]:
        x = f(mix32, key, 2, steps=20, dtype=jnp.float32).value
        assert x.dtype == jnp.float32 and jnp.all(jnp.isfinite(x))
    x = rd.sample_ode(mix32, key, 2, dtype=jnp.float32, rtol=1e-3, atol=1e-3).value
    assert x.dtype == jnp.float32 and jnp.all(jnp.isfinite(x))
    with pytest.raises(ValueError, match="t_end"):
        rd.sample_ancestral(MIX, key, 2, t_end=0.0)
    with pytest.raises(ValueError, match="steps"):
        rd.sample_ddim(MIX, key, 2, steps=0)
    with pytest.raises(ValueError, match="eta"):
        rd.sample_ddim(MIX, key, 2, eta=2.0)
    with pytest.raises(ValueError, match="shape"):
        rd.sample_ancestral(MIX, key, (0,))
    with pytest.raises(ValueError, match="one point of shape"):
        rd.sample_ancestral(MIX, key, 3)
    with pytest.raises(Exception, match="max_steps"):
        rd.sample_ode(MIX, key, 2, max_steps=2)
    failed = rd.sample_ode(MIX, key, 2, max_steps=2, throw=False)
    assert jnp.all(jnp.isnan(failed.value)) and failed.result == rd.RESULTS.ode_failed
    with pytest.raises((ValueError, TypeError), match="mask"):
        rd.sample_conditional(MIX, key, jnp.array([1.0, 0.0]), jnp.zeros(2))
    with pytest.raises((ValueError, TypeError), match="values|shape"):
        rd.sample_conditional(MIX, key, jnp.array([True, False]), jnp.zeros(3))
    with pytest.raises(Exception, match="finite"):
        rd.sample_conditional(
            MIX, key, jnp.array([True, False]), jnp.array([jnp.nan, 0.0])
        )
    with pytest.raises(Exception, match="finite"):
        rd.log_likelihood(MIX, jnp.array([jnp.nan, 0.0]))
    with pytest.raises(ValueError, match="t1"):
        rd.log_likelihood(MIX, jnp.zeros(2), t1=1e-4)
    with pytest.raises(ValueError, match="t0"):
        rd.log_likelihood(MIX, jnp.zeros(2), t0=0.0)


class _PoisonedRight(rd.AbstractPredictor):
    """MIX's noise, but NaN wherever the first coordinate passes 1.2: the
    chains that wander into the right component fail, the others do not."""

    schedule: rd.VPSDE = SCHED
    conservative = False

    def potential(self, x, t):
        raise TypeError("not conservative")

    def epsilon(self, x, t):
        eps = MIX.epsilon(x, t)
        return jnp.where(x[0] > 1.2, jnp.array(jnp.nan, x.dtype), eps)


@pytest.mark.parametrize(
    "name", ["ancestral", "euler_maruyama", "ddim", "ode", "conditional"]
)
@pytest.mark.full
def test_samplers_return_a_sample_with_a_result_per_draw(name):
    # Before: the samplers returned bare arrays, and a chain whose state went
    # non-finite returned NaN without a word. Now each returns a `Sample`
    # (x, result, stats) under the `throw=` convention: a batch drawn with
    # throw=False flags exactly the failed draws, whose x is NaN, and leaves
    # every other draw bit-equal to the clean predictor's.
    mask, values = jnp.array([False, True]), jnp.array([0.0, 0.25])
    samplers = {
        "ancestral": lambda p, k, **kw: rd.sample_ancestral(p, k, 2, steps=40, **kw),
        "euler_maruyama": lambda p, k, **kw: rd.sample_euler_maruyama(
            p, k, 2, steps=40, **kw
        ),
        "ddim": lambda p, k, **kw: rd.sample_ddim(p, k, 2, steps=40, **kw),
        "ode": lambda p, k, **kw: rd.sample_ode(p, k, 2, rtol=1e-4, atol=1e-4, **kw),
        "conditional": lambda p, k, **kw: rd.sample_conditional(
            p, k, mask, values, steps=40, **kw
        ),
    }
    sampler = samplers[name]
    keys = jax.random.split(jax.random.key(3), 32)
    clean = jax.vmap(lambda k: sampler(MIX, k))(keys)
    assert isinstance(clean, rd.Sample) and clean.value.shape == (32, 2)
    assert bool(jnp.all(clean.result == rd.RESULTS.successful))
    assert clean.stats["num_steps"].shape == (32,)
    assert bool(jnp.all(clean.stats["num_steps"] > 0))

    poisoned = _PoisonedRight()
    got = jax.jit(jax.vmap(lambda k: sampler(poisoned, k, throw=False)))(keys)
    failed = np.asarray(got.result != rd.RESULTS.successful)
    assert 0 < failed.sum() < 32, failed
    # (the ODE solver rejects its steps on a NaN field, and runs out of them)
    code = rd.RESULTS.ode_failed if name == "ode" else rd.RESULTS.nonfinite_sample
    assert np.asarray(got.result == code)[failed].all()
    assert bool(jnp.all(jnp.isnan(got.value[failed])))
    good = ~failed
    if name == "ode":
        # a vmapped adaptive solve steps every draw until the slowest is done
        # (here: the failed ones, at max_steps), so the others' last steps
        # differ, within the solver's tolerance
        np.testing.assert_allclose(
            got.value[good], clean.value[good], rtol=0, atol=1e-2
        )
    else:
        np.testing.assert_array_equal(got.value[good], clean.value[good])

    # throw=True (the default) raises with the code's message, eagerly and
    # under jit
    bad_key = keys[int(np.argmax(failed))]
    match = "did not reach its final" if name == "ode" else "became non-finite"
    raises_eagerly_and_under_jit(
        lambda k: sampler(poisoned, k).value, bad_key, match=match
    )


@pytest.mark.full
def test_log_likelihood_returns_its_result():
    x = jnp.array([0.3, -0.4])
    sol = rd.log_likelihood(MIX, x, rtol=1e-4, atol=1e-4)
    assert isinstance(sol, rd.LogLikelihood) and sol.value.shape == ()
    assert sol.result == rd.RESULTS.successful and sol.stats["num_steps"] > 0
    failed = jax.jit(lambda x: rd.log_likelihood(MIX, x, max_steps=2, throw=False))(x)
    assert failed.result == rd.RESULTS.ode_failed and jnp.isnan(failed.value)
    with pytest.raises(eqx.EquinoxRuntimeError, match="max_steps"):
        rd.log_likelihood(MIX, x, max_steps=2)


def test_trace_time_hyperparameters_name_themselves_under_jit():
    # Step counts, times and tolerances shape the traced program, so they are
    # Python numbers; a traced one raises naming the argument, not a tracer
    # error (the public annotations say `float`, which the test suite's
    # type checker enforces first, so the helper they share is tested here).
    from retrax._validate import static_float

    assert static_float("eta", np.float32(0.5)) == 0.5
    with pytest.raises(TypeError, match="`eta` is fixed when the program"):
        jax.jit(lambda v: static_float("eta", v))(0.5)


@pytest.mark.full
def test_samplers_with_trained_network(gaussian_fit):
    # the trained net runs through every sampler under jit and vmap
    _, trained, _ = gaussian_fit
    keys = jax.random.split(jax.random.key(3), 8)
    for f in [rd.sample_ancestral, rd.sample_ddim]:
        xs = jax.vmap(lambda k, f=f: f(trained, k, 2, steps=50).value)(keys)
        assert xs.shape == (8, 2) and jnp.all(jnp.isfinite(xs))
    ll = rd.log_likelihood(trained, GAUSS_MEAN, rtol=1e-4, atol=1e-4).value
    assert jnp.isfinite(ll)


@pytest.mark.slow
def test_circle_mlp_end_to_end():
    # the spec's circle model: 5,122 parameters, Adam 1e-3, batch 256, 6,000
    # steps on t ~ U(1e-3, 0.2); its epsilon against the (near-exact) KDE of
    # the 4,096 training points, whose spacing is far below the 0.02 noise
    key = jax.random.key(0)
    theta = jax.random.uniform(jax.random.fold_in(key, 1), (4096,), maxval=2 * jnp.pi)
    noise = 0.02 * jax.random.normal(jax.random.fold_in(key, 2), (4096, 2))
    data = jnp.stack([jnp.cos(theta), jnp.sin(theta)], axis=1) + noise
    pred = rd.NoisePredictor(rd.TimeMLP(2, key=jax.random.fold_in(key, 3)), SCHED)
    with users_compiler():  # 6,000 steps: optimised code runs them faster
        run = rd.fit(pred, data, jax.random.fold_in(key, 4), steps=6000)
        trained, losses = run.value, run.losses
    assert losses.shape == (6000,)
    kde = rd.kde_predictor(SCHED, data, 0.02)
    eps = jax.random.normal(jax.random.fold_in(key, 5), (1000, 2))
    for t in [0.05, 0.1, 0.2]:
        xt = jax.vmap(SCHED.perturb, (0, None, 0))(data[:1000], t, eps)
        got = jax.vmap(trained.epsilon, (0, None))(xt, t)
        ref = jax.vmap(kde.epsilon, (0, None))(xt, t)
        # within 5% of the reference's mean square
        assert float(jnp.mean((got - ref) ** 2)) < 0.05 * float(jnp.mean(ref**2))


# one object each, so that the calls share their compiled chunks
DIVERGING = optax.sgd(optax.piecewise_constant_schedule(1e-3, {10: 1e12}))


NAN_RATE = optax.sgd(float("nan"))


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_fit_nan_learning_rate_raises_naming_the_step(getkey, dtype):
    pred, data = tiny_training_problem(getkey, dtype)
    with pytest.raises(FloatingPointError, match="stopped at step 0 .*parameters"):
        rd.fit(pred, data, getkey(), optimizer=NAN_RATE, steps=3, **fit_kwargs())


def _poisoned(step, part):
    """SGD that writes inf into the updates (`part="parameters"`) or into a
    state entry the updates never read (`part="state"`) at `step`."""

    def init(params):
        del params
        return {"count": jnp.zeros((), jnp.int32), "extra": jnp.zeros(())}

    def update(grads, state, params=None):
        del params
        hit = state["count"] == step
        poison = hit if part == "parameters" else False
        updates = jax.tree.map(lambda g: jnp.where(poison, jnp.inf, -1e-3 * g), grads)
        extra = jnp.where(hit & (part == "state"), jnp.inf, state["extra"])
        return updates, {"count": state["count"] + 1, "extra": extra}

    return optax.GradientTransformation(init, update)


@pytest.mark.loud
@pytest.mark.parametrize(
    "part, why", [("parameters", "parameters"), ("state", "optimiser state")]
)
@pytest.mark.full
def test_fit_names_the_step_whose_update_failed(getkey, part, why):
    """A chunk checks its losses at every step and its parameters and
    optimiser state after it; the step named is still the one whose update
    failed: here a loss that stays finite (a non-finite state nothing
    reads), or one that fails a step after the parameters did."""
    pred, data = tiny_training_problem(getkey)
    kw = fit_kwargs(optimizer=_poisoned(5, part), steps=12, chunk_size=4)
    with pytest.raises(FloatingPointError, match=f"stopped at step 5 .*{why}"):
        rd.fit(pred, data, getkey(), **kw)
    # with "skip" every step from 5 on is skipped: the count that reaches
    # the poison is part of the state each skip throws away
    with pytest.warns(RuntimeWarning, match="skipped 7 of 12 steps"):
        run = rd.fit(pred, data, getkey(), nonfinite="skip", **kw)
    assert tree_is_finite(run.value) and tree_is_finite(run.state.opt_state)
    assert run.result == rd.RESULTS.successful
    assert int(run.stats["num_skipped"]) == 7


@pytest.mark.loud
@pytest.mark.parametrize("part", ["parameters", "state"])
def test_fit_without_throw_returns_the_run_up_to_the_failed_step(getkey, part):
    """With `throw=False` a run that meets a non-finite step returns where it
    stopped, its result code and the step in `stats`: the same predictor,
    state and losses as a run of the steps before it."""
    pred, data = tiny_training_problem(getkey)
    key = getkey()
    kw = fit_kwargs(optimizer=_poisoned(5, part), chunk_size=4)
    run = rd.fit(pred, data, key, steps=12, throw=False, **kw)
    assert run.result == rd.RESULTS.nonfinite_update
    assert int(run.stats["nonfinite_step"]) == 5
    assert int(run.stats["num_steps"]) == 5
    assert run.state.step == 5
    before = rd.fit(pred, data, key, steps=5, **kw)
    assert before.result == rd.RESULTS.successful
    assert int(before.stats["nonfinite_step"]) == -1
    for got, want in [
        (run.value, before.value),
        (run.state.opt_state, before.state.opt_state),
        (run.losses[:5], before.losses),
    ]:
        got, want = (jax.tree.leaves(eqx.filter(v, eqx.is_array)) for v in (got, want))
        assert len(got) == len(want) > 0
        assert all(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    # the losses up to and including the step that stopped the run
    assert run.losses.shape == (6,)


@pytest.mark.loud
def test_fit_without_throw_names_what_failed_as_the_raised_message_does(getkey):
    pred, data = tiny_training_problem(getkey)
    key = getkey()
    kw = fit_kwargs(optimizer=DIVERGING, steps=20)
    with pytest.raises(FloatingPointError) as info:
        rd.fit(pred, data, key, **kw)
    run = rd.fit(pred, data, key, throw=False, **kw)
    step = int(run.stats["nonfinite_step"])
    assert f"stopped at step {step} " in str(info.value)
    if "the minibatch loss is not finite" in str(info.value):
        assert run.result == rd.RESULTS.nonfinite_loss
        assert not bool(jnp.isfinite(run.losses[-1]))
    else:
        assert run.result == rd.RESULTS.nonfinite_update
    assert run.losses.shape == (step + 1,)
    assert tree_is_finite(run.value) and tree_is_finite(run.state.opt_state)


@pytest.mark.loud
def test_fit_nonfinite_skip_keeps_the_last_finite_state(getkey):
    pred, data = tiny_training_problem(getkey)
    key = getkey()
    with pytest.warns(RuntimeWarning, match=r"skipped \d+ of 20 steps") as record:
        run = rd.fit(
            pred,
            data,
            key,
            **fit_kwargs(optimizer=DIVERGING, steps=20, nonfinite="skip"),
        )
    trained, losses, state = run.value, run.losses, run.state
    # the skipped steps are counted in the run's statistics too, as the
    # warning counts them
    skipped = int(run.stats["num_skipped"])
    assert skipped >= int(jnp.sum(~jnp.isfinite(losses))) > 0
    assert any(f"skipped {skipped} of 20" in str(w.message) for w in record)
    assert int(run.stats["num_steps"]) == 20
    assert losses.shape == (20,)
    assert not bool(jnp.all(jnp.isfinite(losses)))
    assert tree_is_finite(trained) and tree_is_finite(state.opt_state)
    assert state.step == 20
    with pytest.raises(ValueError, match="`nonfinite` must be 'raise' or 'skip'"):
        rd.fit(pred, data, key, **fit_kwargs(steps=1, nonfinite="ignore"))


@pytest.mark.loud
@pytest.mark.float32
def test_fit_diverges_loudly_in_float32(getkey, tmp_path):
    """x64 off, the users' default: float32 overflows sooner, and still stops."""
    pred, data = tiny_training_problem(getkey, jnp.float32)
    kw = fit_kwargs(optimizer=DIVERGING, steps=20, checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d "):
        rd.fit(pred, data, getkey(), checkpoint_dir=tmp_path, **kw)
    params, _ = eqx.partition(pred, eqx.is_inexact_array)
    found = retrax.load_checkpoint(
        tmp_path,
        {
            "state": rd.TrainState(
                params, DIVERGING.init(params), None, 0, getkey(), None
            ),
            "losses": jnp.zeros(20, jnp.float32),
        },
    )
    assert tree_is_finite(found.tree["state"].params)
    with pytest.raises(FloatingPointError, match="stopped at step 0 "):
        rd.fit(pred, data, getkey(), optimizer=NAN_RATE, steps=2, **fit_kwargs())
