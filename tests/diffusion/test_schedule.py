"""The VP noise schedule against its closed forms."""

import equinox as eqx
import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest

from helpers import assert_close, raises_eagerly_and_under_jit
from retrax.diffusion import VPSDE


def reference(t, beta_min=0.1, beta_max=20.0):
    """Closed forms in numpy, written independently of the library."""
    t = np.asarray(t, dtype=np.float64)
    b = beta_min * t + (beta_max - beta_min) * t**2 / 2
    alpha = np.exp(-b / 2)
    sigma = np.sqrt(1 - np.exp(-b))
    return b, alpha, sigma


def test_values_at_t005():
    s = VPSDE()
    assert_close(s.alpha(0.05), 0.98517, rtol=1e-5)
    assert_close(s.sigma(0.05), 0.1716, rtol=1e-3)
    ts = np.linspace(0.01, 1.0, 23)
    b, alpha, sigma = reference(ts)
    assert_close(s.integrated_beta(ts), b, rtol=1e-14)
    assert_close(s.alpha(ts), alpha, rtol=1e-14)
    assert_close(s.sigma(ts), sigma, rtol=1e-12)
    assert_close(s.snr(ts), alpha / sigma, rtol=1e-12)
    assert_close(s.beta(ts), 0.1 + ts * 19.9, rtol=1e-14)
    assert_close(s.diffusion(ts), np.sqrt(0.1 + ts * 19.9), rtol=1e-14)
    assert_close(s.alpha(ts) ** 2 + s.sigma(ts) ** 2, np.ones_like(ts), rtol=1e-14)


def test_other_parameters():
    s = VPSDE(beta_min=0.5, beta_max=3.0, t_min=0.01)
    ts = np.linspace(0.0, 1.0, 7)
    b, alpha, _ = reference(ts, 0.5, 3.0)
    assert_close(s.integrated_beta(ts), b, rtol=1e-14)
    assert_close(s.alpha(ts), alpha, rtol=1e-14)


@pytest.mark.parametrize("t", [1e-8, 1e-10, 3e-7, 1e-5])
def test_sigma_small_t_relative_accuracy(t):
    mpmath.mp.dps = 50
    tt = mpmath.mpf(t)
    b = mpmath.mpf("0.1") * tt + (mpmath.mpf(20) - mpmath.mpf("0.1")) * tt**2 / 2
    ref = float(mpmath.sqrt(1 - mpmath.exp(-b)))
    got = float(VPSDE().sigma(jnp.float64(t)))
    assert abs(got - ref) <= 1e-15 * ref, (got, ref)
    # naive 1 - exp(-B) would have lost most digits here
    naive = float(np.sqrt(1 - np.exp(-float(b))))
    assert t > 1e-6 or abs(naive - ref) > 1e-12 * ref


def test_beta_is_derivative_of_integrated_beta():
    s = VPSDE()
    ts = jnp.linspace(0.0, 1.0, 9)
    assert_close(jax.vmap(jax.grad(s.integrated_beta))(ts), s.beta(ts), rtol=1e-14)


def test_drift_perturb_marginal(getkey):
    s = VPSDE()
    x = jax.random.normal(getkey(), (3,))
    eps = jax.random.normal(getkey(), (3,))
    t = 0.3
    _, alpha, sigma = reference(t)
    assert_close(s.drift(x, t), -0.5 * (0.1 + 0.3 * 19.9) * np.asarray(x))
    assert_close(s.perturb(x, t, eps), alpha * np.asarray(x) + sigma * np.asarray(eps))
    assert_close(s.marginal_variance(t, 2.5), alpha**2 * 2.5 + sigma**2)
    # marginal variance against a Monte Carlo estimate of Var(x_t)
    x0 = jnp.sqrt(2.5) * jax.random.normal(getkey(), (200_000,))
    xt = s.perturb(x0, t, jax.random.normal(getkey(), (200_000,)))
    assert_close(jnp.var(xt), s.marginal_variance(t, 2.5), rtol=0.02)
    with pytest.raises(ValueError, match="shape of `x0`"):
        s.perturb(x, t, eps[:2])


def test_sample_time(getkey):
    s = VPSDE(t_min=0.1)
    ts = s.sample_time(getkey(), (10_000,))
    assert ts.shape == (10_000,) and ts.dtype == jnp.float64
    assert float(ts.min()) >= 0.1 and float(ts.max()) <= 1.0
    assert_close(jnp.mean(ts), 0.55, rtol=0.01)
    assert s.sample_time(getkey(), (), jnp.float32).dtype == jnp.float32


@pytest.mark.full
def test_float32_and_transforms():
    s = VPSDE()
    t32 = jnp.float32(0.05)
    assert s.alpha(t32).dtype == jnp.float32
    assert s.sigma(t32).dtype == jnp.float32
    x32 = jnp.ones(2, jnp.float32)
    assert s.perturb(x32, 0.1, x32).dtype == jnp.float32
    assert s.drift(x32, 0.1).dtype == jnp.float32
    ts = jnp.linspace(0.1, 0.9, 5)
    assert_close(jax.jit(s.sigma)(ts), s.sigma(ts), rtol=1e-15)
    assert_close(jax.vmap(s.alpha)(ts), s.alpha(ts), rtol=1e-15)
    # d sigma / dt = beta alpha^2 / (2 sigma)
    dsig = jax.vmap(jax.grad(s.sigma))(ts)
    assert_close(dsig, s.beta(ts) * s.alpha(ts) ** 2 / (2 * s.sigma(ts)), rtol=1e-12)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(beta_min=0.0), "`beta_min` must be positive"),
        (dict(beta_min=-1.0), "`beta_min` must be positive"),
        (dict(beta_min=np.nan), "`beta_min` must be positive and finite"),
        (dict(beta_min=5.0, beta_max=1.0), "`beta_max` must be .* at least `beta_min`"),
        (dict(beta_max=np.inf), "`beta_max` must be finite"),
        (dict(t_min=1.0), r"`t_min` must lie in \[0, 1\)"),
        (dict(t_min=-0.1), r"`t_min` must lie in \[0, 1\)"),
    ],
)
def test_invalid_parameters(kwargs, match):
    with pytest.raises(ValueError, match=match):
        VPSDE(**kwargs)
    # the same check, with the same message, when the parameters are traced
    # (a schedule built under `jit`, e.g. to differentiate with respect to it)
    names = sorted(kwargs)

    def use(*values):
        s = VPSDE(**dict(zip(names, values, strict=True)))
        return s.alpha(0.5) + s.sample_time(jax.random.key(0))

    raises_eagerly_and_under_jit(use, *[kwargs[k] for k in names], match=match)


def test_parameters_can_be_traced():
    def alpha(beta_max):
        return VPSDE(beta_max=beta_max).alpha(0.5)

    # alpha = exp(-B/2), B = beta_min t + (beta_max - beta_min) t^2 / 2, so
    # d alpha / d beta_max = -alpha t^2 / 4
    ref = -float(VPSDE().alpha(0.5)) * 0.25 / 4
    assert_close(jax.jit(jax.grad(alpha))(20.0), ref, rtol=1e-12)
    assert isinstance(VPSDE().t_min, float)
    # a batch of schedules: the check holds for each member
    build = eqx.filter_vmap(lambda b: VPSDE(beta_min=b))
    assert build(jnp.array([0.1, 0.2])).beta_min.shape == (2,)
    with pytest.raises(Exception, match="`beta_min` must be positive and finite"):
        build(jnp.array([0.1, -0.2]))


def test_time_outside_unit_interval():
    s = VPSDE()
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        s.alpha(1.5)
    with pytest.raises(ValueError, match=r"must lie in \[0, 1\]"):
        s.sigma(jnp.array([0.5, -0.1]))
    with pytest.raises(Exception, match=r"must lie in \[0, 1\]"):
        eqx.filter_jit(s.sigma)(jnp.float64(2.0))
    with pytest.raises(TypeError):
        s.alpha(jnp.complex128(0.5))
