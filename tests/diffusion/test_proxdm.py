"""Proximal diffusion: exact mixture prox, ProxNetwork, sampler, prox_infer."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from helpers import assert_close, raises_eagerly_and_under_jit


SCHED = rd.VPSDE()


def mixture(dtype=jnp.float64):
    means = jnp.array([[1.0, 0.5, -0.2], [-1.0, 0.0, 0.3], [0.2, -1.2, 0.8]], dtype)
    return rd.GaussianMixtureEps(
        SCHED, means, jnp.array([0.3, 0.5, 0.2], dtype), jnp.array([0.5, 0.3, 0.2])
    )


MU1, S1 = jnp.array([0.5, -1.0]), 0.4


def gaussian_prox_closed_form(v, t, lam):
    """prox of -lam log N(a mu, c I): (c v + lam a mu) / (c + lam)."""
    a, c = SCHED.alpha(t), SCHED.alpha(t) ** 2 * S1**2 + SCHED.sigma(t) ** 2
    return (c * v + lam * a * MU1) / (c + lam)


class ExactGaussianEps(eqx.Module):
    """The normalised prox residual of N(MU1, S1^2 I): a perfectly trained net."""

    def __call__(self, v, t, lam):
        return (v - gaussian_prox_closed_form(v, t, lam)) / jnp.sqrt(lam)


def stationarity(mix, u, v, t, lam):
    return u - v - lam * jax.grad(rd.mixture_logdensity, argnums=1)(mix, u, t)


@pytest.mark.full
def test_mixture_prox_is_the_minimiser(getkey):
    mix = mixture()

    @jax.jit
    def check(v, t, lam):
        u = rd.MixtureProx(mix).prox(v, t, lam)
        # a local minimum: the objective's Hessian is positive definite there
        hess = jnp.eye(3) - lam * jax.hessian(rd.mixture_logdensity, argnums=1)(
            mix, u, t
        )
        return stationarity(mix, u, v, t, lam), jnp.min(jnp.linalg.eigvalsh(hess))

    for t, lam in [(0.0, 0.05), (0.05, 0.2), (0.3, 1.0), (0.8, 3.0)]:
        v = 1.5 * jax.random.normal(getkey(), (3,))
        residual, curvature = check(v, jnp.asarray(t), jnp.asarray(lam))
        assert_close(residual, jnp.zeros(3), atol=1e-13)
        assert curvature > 0


@pytest.mark.full
def test_mixture_prox_nonconvex_start(getkey):
    # Two well separated modes and a large lam: -log p_t is not convex between
    # them, Newton falls back to gradient steps, and still reaches a minimiser.
    mix = rd.GaussianMixtureEps(SCHED, jnp.array([[-1.0, 0.0], [1.0, 0.0]]), 0.1)
    v, t, lam = jnp.array([0.02, 0.1]), 0.01, 5.0
    u = rd.MixtureProx(mix).prox(v, t, lam)
    assert_close(stationarity(mix, u, v, t, lam), jnp.zeros(2), atol=1e-12)
    assert abs(float(u[0])) > 0.8  # it left the saddle for a mode


@pytest.mark.full
def test_gaussian_prox_closed_form_and_derivatives(getkey):
    one = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    v, t, lam = jnp.array([0.3, 0.7]), jnp.asarray(0.2), jnp.asarray(0.4)

    @jax.jit
    def derivatives(v, t, lam):
        f = lambda v, lam: one.prox(v, t, lam)
        return f(v, lam), jax.jacfwd(f)(v, lam), *jax.jacrev(f, (0, 1))(v, lam)

    u, jac_fwd, jac_rev, dlam = derivatives(v, t, lam)
    assert_close(u, gaussian_prox_closed_form(v, t, lam), rtol=1e-13)
    c = SCHED.alpha(t) ** 2 * S1**2 + SCHED.sigma(t) ** 2
    ref = c / (c + lam) * jnp.eye(2)
    assert_close(jac_fwd, ref, rtol=1e-12)
    assert_close(jac_rev, ref, rtol=1e-12)
    ref_lam = jax.jacfwd(gaussian_prox_closed_form, argnums=2)(v, t, lam)
    assert_close(dlam, ref_lam, rtol=1e-12)


def test_mixture_prox_implicit_derivatives_match_fd(getkey):
    mix = mixture()
    v, t, lam, h = jnp.array([0.3, 0.2, -0.5]), 0.05, 0.2, 1e-5

    def of_means(m):
        return rd.MixtureProx(eqx.tree_at(lambda x: x.means, mix, m)).prox(v, t, lam)

    jac = jax.jit(jax.jacrev(of_means))(mix.means)
    f = jax.jit(of_means)
    for i, j in [(0, 0), (1, 2), (2, 1)]:
        e = jnp.zeros_like(mix.means).at[i, j].set(h)
        fd = (f(mix.means + e) - f(mix.means - e)) / (2 * h)
        assert_close(jac[:, i, j], fd, rtol=1e-7, atol=1e-9)


def test_prox_network_and_matching_loss(getkey):
    net = rd.ProxNetwork(ExactGaussianEps(), SCHED)
    exact = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    v, t, lam = jnp.array([0.3, 0.7]), 0.2, 0.4
    assert_close(net.prox(v, t, lam), exact.prox(v, t, lam), rtol=1e-13)
    x, eps, zeta = jnp.array([0.4, -0.8]), jnp.array([0.5, -1.5]), 0.3
    eps_hat = ExactGaussianEps()(x + jnp.sqrt(lam) * eps, t, lam)
    ref = 1 - jnp.exp(-jnp.sum((eps_hat - eps) ** 2) / (2 * zeta**2))
    assert_close(rd.proximal_matching_loss(net, eps, x, t, lam, zeta), ref)
    loss = rd.proximal_matching_loss(net, getkey(), x, t, lam, zeta)
    assert 0 <= float(loss) < 1
    with pytest.raises(ValueError, match="zeta"):
        rd.proximal_matching_loss(net, eps, x, t, lam, 0.0)
    with pytest.raises(ValueError, match="lam"):
        net.prox(v, t, -0.1)
    bad = rd.ProxNetwork(lambda v, t, lam: v[:1], SCHED)
    with pytest.raises(ValueError, match="shape"):
        bad.prox(v, t, lam)


def pda_moments(steps, hybrid, t_start=1.0, x_init=None):
    """The exact mean and variance of the PDA chain for N(MU1, S1^2 I) data,
    from N(0, I) or from the point `x_init` (and the gain dX_0/dX_N)."""
    ts = np.linspace(0.0, t_start, steps + 1)
    big_b = SCHED.beta_min * ts + 0.5 * (SCHED.beta_max - SCHED.beta_min) * ts**2
    if x_init is None:
        mean, var = np.zeros(2), 1.0
    else:
        mean, var = np.asarray(x_init, float), 0.0
    gain = 1.0
    for k in range(steps, 0, -1):
        g = big_b[k] - big_b[k - 1]
        a = np.exp(-0.5 * big_b[k - 1])
        c = a**2 * S1**2 - np.expm1(-big_b[k - 1])
        if hybrid:
            lam, scale, noise = g, 1 + g / 2, g
        else:
            lam, scale, noise = 2 * g / (2 - g), 2 / (2 - g), (2 / (2 - g)) ** 2 * g
        shrink = c / (c + lam)
        mean = shrink * scale * mean + lam * a * np.asarray(MU1) / (c + lam)
        var = shrink**2 * (scale**2 * var + noise)
        gain = gain * shrink * scale
    if x_init is None:
        return mean, var
    return mean, var, gain


@pytest.mark.parametrize("hybrid", [False, True])
def test_proxdm_sample_gaussian(getkey, hybrid):
    prox = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    keys = jax.random.split(getkey(), 400)
    xs = jax.vmap(
        lambda k: rd.proxdm_sample(prox, k, 2, steps=40, hybrid=hybrid).value
    )(keys)
    mean, var = pda_moments(40, hybrid)
    stderr = np.sqrt(var / len(keys))
    assert np.all(np.abs(np.mean(xs, 0) - mean) < 5 * stderr)
    # the sample variance of 800 normal coordinates: relative sd about 0.05
    assert abs(float(jnp.mean(jnp.var(xs, axis=0))) / var - 1) < 0.25
    # the chain approximates the data distribution N(MU1, S1^2)
    assert np.all(np.abs(mean - np.asarray(MU1)) < 0.05) and abs(var / S1**2 - 1) < 0.2


@pytest.mark.full
def test_proxdm_sample_from_a_given_point(getkey):
    """From X_N = x_init at t_start = 0.3 (an SDEdit-style start): the
    closed-form moments, and the chain's exact linear response to x_init."""
    prox = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    a, b = jnp.array([2.0, 1.5]), jnp.array([-1.0, 0.5])

    def sample(key, x):
        return rd.proxdm_sample(prox, key, 2, steps=20, t_start=0.3, x_init=x).value

    keys = jax.random.split(getkey(), 400)
    xs = jax.jit(jax.vmap(sample, (0, None)))(keys, a)
    mean, var, gain = pda_moments(20, False, 0.3, a)
    stderr = np.sqrt(var / len(keys))
    assert np.all(np.abs(np.mean(xs, 0) - mean) < 5 * stderr)
    assert abs(float(jnp.mean(jnp.var(xs, axis=0))) / var - 1) < 0.25
    # from t_start = 0.3 the start is remembered, not washed out
    assert gain > 0.1
    # the same noise from two starts: the difference is gain * (a - b)
    xb = jax.jit(jax.vmap(sample, (0, None)))(keys[:3], b)
    assert_close(xs[:3] - xb, gain * jnp.broadcast_to(a - b, (3, 2)), rtol=1e-10)
    # and the derivative with respect to the start is gain * I, in forward
    # mode too (through the last prox, at t = 0)
    jac = jax.jacfwd(lambda x: sample(keys[0], x))(a)
    assert_close(jac, gain * jnp.eye(2), rtol=1e-8, atol=1e-12)
    # bad starts
    with pytest.raises(ValueError, match=r"`x_init` must have the sample's shape"):
        rd.proxdm_sample(prox, keys[0], 2, x_init=jnp.zeros(3))
    with pytest.raises(TypeError, match="x_init"):
        rd.proxdm_sample(prox, keys[0], 2, x_init=jnp.zeros(2, int))
    raises_eagerly_and_under_jit(
        lambda x: sample(keys[0], x),
        jnp.array([0.0, jnp.nan]),
        match="`x_init` must be finite",
    )


def test_proxdm_sample_pda_step_limit(getkey):
    prox = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    with pytest.raises(eqx.EquinoxRuntimeError, match="gamma_k < 2"):
        rd.proxdm_sample(prox, getkey(), 2, steps=2)
    sample = rd.proxdm_sample(prox, getkey(), 2, steps=2, hybrid=True)
    assert sample.value.shape == (2,)
    assert isinstance(sample, rd.AbstractSolution)
    assert sample.result == rd.RESULTS.successful
    assert int(sample.stats["num_steps"]) == 2


def hqs_conditions(mix, sol, z0, rho, t, lam):
    """Stationarity of -log p_t(u) + |u - w|^2/(2 lam) + sum rho^2 (w - z0)^2 / 2."""
    u, w = sol.u, sol.value
    grad_u = (u - w) / lam - jax.grad(rd.mixture_logdensity, argnums=1)(mix, u, t)
    hard = jnp.isinf(rho)
    rho_s = jnp.where(hard, 0.0, rho)
    grad_w = jnp.where(hard, 0.0, (w - u) / lam + rho_s**2 * (w - z0))
    return grad_u, grad_w, jnp.where(hard, w - z0, 0.0)


Z0 = jnp.array([0.8, 0.0, 0.3])
RHO = jnp.array([jnp.inf, 0.0, 2.0])


@pytest.mark.full
def test_prox_infer_converges(getkey):
    mix = mixture()
    t, lam = 0.01, 0.01
    sol = rd.prox_infer(rd.MixtureProx(mix), Z0, RHO, t, lam)
    assert bool(sol.converged) and int(sol.stats["num_steps"]) > 1
    assert isinstance(sol, rd.AbstractSolution)
    # the old spellings read the new places, and say so
    with pytest.warns(DeprecationWarning, match=r"`ProxSolution.steps` .*num_steps"):
        assert sol.steps is sol.stats["num_steps"]
    with pytest.warns(DeprecationWarning, match=r"`ProxSolution.z` .*`\.value`"):
        assert sol.z is sol.value
    assert sol.value[0] == Z0[0]  # hard clamp exactly
    assert sol.residual[0] == 0
    for cond in hqs_conditions(mix, sol, Z0, RHO, t, lam):
        assert_close(cond, jnp.zeros(3), atol=1e-6)


@pytest.mark.full
def test_prox_infer_gradient_matches_fd():
    mix = mixture()
    t, lam, h = 0.01, 0.05, 1e-5
    weights = jnp.array([0.3, 1.0, -0.5])

    @jax.jit
    def loss(z0, rho, means):
        prox = rd.MixtureProx(eqx.tree_at(lambda m: m.means, mix, means))
        return jnp.sum(weights * rd.prox_infer(prox, z0, rho, t, lam, tol=1e-13).value)

    gz, grho, gmeans = jax.grad(loss, argnums=(0, 1, 2))(Z0, RHO, mix.means)
    assert grho[0] == 0  # infinite stiffness
    fd_z = [
        (loss(Z0.at[i].add(h), RHO, mix.means) - loss(Z0.at[i].add(-h), RHO, mix.means))
        / (2 * h)
        for i in (0, 2)
    ]
    assert_close(gz[jnp.array([0, 2])], jnp.array(fd_z), rtol=1e-6)
    assert gz[1] == 0  # a free coordinate's z0 is only the start
    fd_rho = (
        loss(Z0, RHO.at[2].add(h), mix.means) - loss(Z0, RHO.at[2].add(-h), mix.means)
    ) / (2 * h)
    assert_close(grho[2], fd_rho, rtol=1e-6)
    e = jnp.zeros_like(mix.means).at[0, 1].set(h)
    fd_m = (loss(Z0, RHO, mix.means + e) - loss(Z0, RHO, mix.means - e)) / (2 * h)
    assert_close(gmeans[0, 1], fd_m, rtol=1e-6)


@pytest.mark.full
def test_prox_infer_vmap_patterns_and_float32(getkey):
    mix = mixture()
    prox = rd.MixtureProx(mix)
    z0s = jnp.stack([Z0, jnp.array([0.0, -1.0, 0.0]), jnp.array([0.5, 0.5, 0.5])])
    rhos = jnp.stack([RHO, jnp.array([0.0, jnp.inf, 0.0]), jnp.full(3, 1.0)])
    sols = jax.vmap(lambda z, r: rd.prox_infer(prox, z, r, 0.01, 0.05))(z0s, rhos)
    assert jnp.all(sols.converged)
    assert sols.value[1, 1] == -1.0
    for i in range(3):
        single = rd.prox_infer(prox, z0s[i], rhos[i], 0.01, 0.05)
        assert_close(sols.value[i], single.value, rtol=1e-12)
    prox32 = rd.MixtureProx(mixture(jnp.float32))
    sol32 = rd.prox_infer(
        prox32, Z0.astype(jnp.float32), RHO.astype(jnp.float32), 0.01, 0.05
    )
    assert sol32.value.dtype == jnp.float32 and bool(sol32.converged)
    assert_close(sol32.value, sols.value[0], rtol=1e-4)


@pytest.mark.full
def test_prox_value_checks_hold_under_jit():
    # each check raises with the same message eagerly and with traced arguments
    net = rd.ProxNetwork(ExactGaussianEps(), SCHED)
    prox = rd.MixtureProx(rd.GaussianMixtureEps(SCHED, MU1[None], S1))
    v, t = jnp.array([0.3, 0.7]), 0.2
    x, eps = jnp.array([0.4, -0.8]), jnp.array([0.5, -1.5])
    nonneg = "`lam` must be nonnegative and finite"
    raises_eagerly_and_under_jit(lambda lam: net.prox(v, t, lam), -0.1, match=nonneg)
    raises_eagerly_and_under_jit(
        lambda lam: prox.prox(v, t, lam), jnp.nan, match=nonneg
    )
    raises_eagerly_and_under_jit(
        lambda zeta: rd.proximal_matching_loss(net, eps, x, t, 0.4, zeta),
        0.0,
        match="`zeta` must be positive and finite",
    )
    mix = rd.MixtureProx(mixture())
    raises_eagerly_and_under_jit(
        lambda lam: rd.prox_infer(mix, Z0, RHO, 0.01, lam).value,
        0.0,
        match="`lam` must be positive and finite",
    )
    # `tol` and `t_start` are Python numbers (see their signatures)
    with pytest.raises(ValueError, match="`tol` must be positive"):
        rd.prox_infer(mix, Z0, RHO, 0.01, tol=-1e-6)
    with pytest.raises(ValueError, match=r"`t_start` must lie in \(0, 1\]"):
        rd.proxdm_sample(prox, jax.random.key(0), 2, steps=4, t_start=0.0)


@pytest.mark.full
def test_prox_infer_bad_input():
    prox = rd.MixtureProx(mixture())
    t = jnp.asarray(0.01)
    with pytest.raises(ValueError, match="lam"):
        rd.prox_infer(prox, Z0, RHO, t, -0.01)
    with pytest.raises(ValueError, match="lam"):
        rd.prox_infer(prox, Z0, RHO, t, 0.0)
    with pytest.raises((ValueError, TypeError), match="shape|parameter 'rho'"):
        rd.prox_infer(prox, Z0, RHO[:2], t)
    with pytest.raises((ValueError, TypeError), match="vector|parameter 'z0'"):
        rd.prox_infer(prox, Z0[None], RHO[None], t)
    with pytest.raises(eqx.EquinoxRuntimeError, match="rho"):
        rd.prox_infer(prox, Z0, RHO.at[1].set(-1.0), t)
    with pytest.raises(eqx.EquinoxRuntimeError, match="rho"):
        rd.prox_infer(prox, Z0, RHO.at[1].set(jnp.nan), t)
    with pytest.raises(eqx.EquinoxRuntimeError, match="z0"):
        rd.prox_infer(prox, Z0.at[0].set(jnp.nan), RHO, t)
    with pytest.raises((ValueError, eqx.EquinoxRuntimeError), match="time"):
        rd.prox_infer(prox, Z0, RHO, 1.5)
    with pytest.raises(eqx.EquinoxRuntimeError):
        rd.prox_infer(prox, Z0, RHO, t, max_steps=3)
    # without throw: a flagged result whose derivatives are NaN in both modes,
    # never a silent number
    solve = lambda z0: rd.prox_infer(prox, z0, RHO, t, max_steps=3, throw=False).value
    sol = rd.prox_infer(prox, Z0, RHO, t, max_steps=3, throw=False)
    assert not bool(sol.converged) and jnp.all(jnp.isfinite(sol.value))
    assert sol.result == rd.RESULTS.nonlinear_max_steps_reached
    assert bool(jnp.all(jnp.isnan(jax.grad(lambda z0: jnp.sum(solve(z0)))(Z0))))
    assert bool(jnp.all(jnp.isnan(jax.jvp(solve, (Z0,), (jnp.ones(3),))[1])))
    with pytest.raises(ValueError, match="steps"):
        rd.MixtureProx(mixture(), steps=0)
    with pytest.raises((ValueError, TypeError), match="shape|parameter 'v'"):
        rd.MixtureProx(mixture()).prox(jnp.zeros(2), 0.1, 0.1)


# -- failures of the inner prox solve are reported, never silent ----------------


V = jnp.array([2.0, 1.0, 0.0])


@pytest.mark.full
def test_mixture_prox_failure_has_a_result_and_nan_derivatives():
    # One Newton step does not reach the proximal point: the result says so and
    # the implicit derivative (taken at a point that is not a prox) is NaN.
    # (Each solve under `jit`: the Newton loop compiled once, not op by op.)
    short = rd.MixtureProx(mixture(), steps=1)
    exact = rd.MixtureProx(mixture())
    result_of = eqx.filter_jit(lambda p, v: p.prox_result(v, 0.1, 0.5))
    u, result = result_of(short, V)
    assert result == rd.RESULTS.nonlinear_max_steps_reached
    u_exact, ok = result_of(exact, V)
    assert ok == rd.RESULTS.successful
    assert float(jnp.max(jnp.abs(u - u_exact))) > 1e-6
    prox = lambda v: short.prox(v, 0.1, 0.5)
    assert bool(jnp.all(jnp.isnan(jax.jit(jax.jacfwd(prox))(V))))
    assert bool(jnp.all(jnp.isnan(jax.jit(jax.jacrev(prox))(V))))
    exact_jac = jax.jit(jax.jacrev(lambda v: exact.prox(v, 0.1, 0.5)))(V)
    assert bool(jnp.all(jnp.isfinite(exact_jac)))
    # An objective that overflows: the line search finds no acceptable step
    # (the old loop stopped there as if converged).
    _, failed = result_of(exact, jnp.array([1e155, 0.0, 0.0]))
    assert failed == rd.RESULTS.prox_search_failed
    # A network's prox is computed in closed form: always successful.
    net = rd.ProxNetwork(ExactGaussianEps(), SCHED)
    assert net.prox_result(V[:2], 0.1, 0.5)[1] == rd.RESULTS.successful


@pytest.mark.slow
def test_prox_failure_reaches_prox_infer_and_proxdm_sample(getkey):
    short = rd.MixtureProx(mixture(), steps=1)
    rho = jnp.array([jnp.inf, 0.0, 0.0])
    z0 = jnp.array([0.5, 0.2, 0.0])
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of steps"):
        rd.prox_infer(short, z0, rho, 0.1)
    sol = rd.prox_infer(short, z0, rho, 0.1, throw=False)
    assert sol.result == rd.RESULTS.nonlinear_max_steps_reached
    assert not bool(sol.converged)

    def solve(a):
        return rd.prox_infer(short, a, rho, 0.1, throw=False).value

    assert bool(jnp.all(jnp.isnan(jax.jacfwd(solve)(z0))))
    assert bool(jnp.all(jnp.isnan(jax.jacrev(solve)(z0))))
    good = rd.prox_infer(rd.MixtureProx(mixture()), z0, rho, 0.1)
    assert good.result == rd.RESULTS.successful and bool(good.converged)

    key = getkey()
    with pytest.raises(eqx.EquinoxRuntimeError, match="maximum number of steps"):
        rd.proxdm_sample(short, key, 3, steps=10)
    sample = rd.proxdm_sample(short, key, 3, steps=10, throw=False)
    assert sample.result == rd.RESULTS.nonlinear_max_steps_reached
    grad = jax.grad(
        lambda p: jnp.sum(rd.proxdm_sample(p, key, 3, steps=10, throw=False).value)
    )(short)
    assert bool(jnp.all(jnp.isnan(grad.mixture.means)))
    fine = rd.proxdm_sample(rd.MixtureProx(mixture()), key, 3, steps=10)
    assert fine.result == rd.RESULTS.successful
