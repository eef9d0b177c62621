"""Sampling conditioned on a linear measurement, against the exact Gaussian posterior.

A Gaussian prior $N(\\mu, s^2 I)$ is a one-component `GaussianMixtureEps`, whose
noise predictor is exact, and with $y = Hx + \\sigma_y\\xi$ the posterior is
Gaussian with precision $I/s^2 + H^\\top H/\\sigma_y^2$: the reference here.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd
from retrax.diffusion._measurement import _psd_sqrt


SCHED = rd.VPSDE()
MU = np.array([0.5, -0.3, 0.2])
SCALE = 0.8
H = np.array([[1.0, 0.5, 0.0], [0.0, -0.4, 1.0]])
Y = np.array([0.9, -0.2])
SIGMA_Y = 0.3
NUM = 10_000


def exact_posterior():
    precision = np.eye(3) / SCALE**2 + H.T @ H / SIGMA_Y**2
    cov = np.linalg.inv(precision)
    mean = cov @ (MU / SCALE**2 + H.T @ Y / SIGMA_Y**2)
    return mean, np.sqrt(np.diag(cov))


def prior(dtype):
    return rd.GaussianMixtureEps(SCHED, jnp.asarray(MU[None], dtype), SCALE)


def standardised_errors(samples):
    """(sample mean - exact mean) / exact std, and sample std / exact std."""
    mean, std = exact_posterior()
    samples = np.asarray(samples, np.float64)
    return (samples.mean(0) - mean) / std, samples.std(0) / std


def _tweedie_batch(dtype):
    pred = prior(dtype)

    def one(key, h, y, sigma_y):
        return rd.sample_tweedie_projection(
            pred, key, h, y, sigma_y, steps=5, dtype=dtype
        ).value

    # one compiled program for the check and for the run-time errors below
    return jax.jit(jax.vmap(one, in_axes=(0, None, None, None)))


def test_tweedie_projection_is_exact_for_gaussian_data():
    sampler = _tweedie_batch(jnp.float64)
    keys = jax.random.split(jax.random.key(0), NUM)
    h, y, sigma_y = jnp.asarray(H), jnp.asarray(Y), jnp.asarray(SIGMA_Y)
    samples = sampler(keys, h, y, sigma_y)
    assert samples.shape == (NUM, 3) and samples.dtype == jnp.float64
    bias, ratio = standardised_errors(samples)
    print("Tweedie projection: mean error / posterior std", bias, "std ratio", ratio)
    # the Monte Carlo error of 10,000 samples is 0.01 (mean) and 0.007 (std)
    assert np.max(np.abs(bias)) < 0.05, bias
    assert np.max(np.abs(ratio - 1)) < 0.05, ratio
    # values checked at run time name their argument, in the same compiled program
    with pytest.raises(Exception, match="`sigma_y` must be a finite, positive"):
        sampler(keys, h, y, jnp.asarray(-1.0))
    with pytest.raises(Exception, match="`sigma_y` must be a finite, positive"):
        sampler(keys, h, y, jnp.asarray(0.0))
    with pytest.raises(Exception, match="`y` must be finite"):
        sampler(keys, h, y.at[1].set(jnp.nan), sigma_y)
    with pytest.raises(Exception, match="`H` must be finite"):
        sampler(keys, h.at[0, 0].set(jnp.inf), y, sigma_y)


@pytest.mark.float32
def test_tweedie_projection_float32():
    sampler = _tweedie_batch(jnp.float32)
    keys = jax.random.split(jax.random.key(1), NUM)
    samples = sampler(keys, jnp.asarray(H), jnp.asarray(Y), jnp.asarray(SIGMA_Y))
    assert samples.dtype == jnp.float32
    bias, ratio = standardised_errors(samples)
    assert np.max(np.abs(bias)) < 0.05, bias
    assert np.max(np.abs(ratio - 1)) < 0.05, ratio


def test_samplers_sample_float32_by_default():
    pred = prior(jnp.float64)
    key = jax.random.key(2)
    for sampler in (rd.sample_tweedie_projection, rd.sample_dps):
        # traced, not compiled: the dtype and shape of the program's output
        out = jax.eval_shape(lambda k, f=sampler: f(pred, k, H, Y, SIGMA_Y).value, key)
        assert out.dtype == jnp.float32 and out.shape == (3,)


@pytest.mark.parametrize(
    "sampler", [rd.sample_tweedie_projection, rd.sample_dps], ids=["tweedie", "dps"]
)
def test_bad_measurements_name_their_argument(sampler):
    pred = prior(jnp.float64)
    key = jax.random.key(3)
    bad = [
        ((H[:, :2], Y, SIGMA_Y), ValueError, "`H` has 2 columns"),
        ((H[0], Y, SIGMA_Y), ValueError, "`H` must be a matrix"),
        ((H, Y[:1], SIGMA_Y), ValueError, "`y` must have shape \\(2,\\)"),
        ((H, Y, -0.1), ValueError, "`sigma_y` must be a finite, positive"),
        ((H, Y, 0.0), ValueError, "`sigma_y` must be a finite, positive"),
        ((H, Y, float("inf")), ValueError, "`sigma_y` must be a finite, positive"),
        ((H, Y, np.ones(2)), ValueError, "`sigma_y` must be a scalar"),
        ((H.astype(int), Y, SIGMA_Y), TypeError, "`H` must have a real floating"),
    ]
    for (h, y, sigma_y), kind, match in bad:
        with pytest.raises(kind, match=match):
            sampler(pred, key, h, y, sigma_y, steps=2)
    with pytest.raises(ValueError, match="`steps` must be a positive integer"):
        sampler(pred, key, H, Y, SIGMA_Y, steps=0)
    with pytest.raises(TypeError, match="`dtype` must be a real floating"):
        sampler(pred, key, H, Y, SIGMA_Y, steps=2, dtype=jnp.int32)
    # shape errors hold under jit (at trace time)
    with pytest.raises(ValueError, match="`H` has 2 columns"):
        eqx.filter_jit(sampler)(pred, key, jnp.asarray(H[:, :2]), Y, SIGMA_Y, steps=2)


def test_dps_step_size_is_checked():
    pred = prior(jnp.float64)
    with pytest.raises(ValueError, match="`step_size` must be a finite positive"):
        rd.sample_dps(pred, jax.random.key(0), H, Y, SIGMA_Y, step_size=-1.0)


@pytest.mark.slow
def test_dps_bias_is_measured():
    # The numbers `sample_dps`'s docstring and the docs quote: DPS drops the
    # denoiser's covariance from the likelihood, and is biased even here.
    pred = prior(jnp.float64)
    keys = jax.random.split(jax.random.key(0), NUM)

    def one(key):
        return rd.sample_dps(
            pred, key, H, Y, SIGMA_Y, steps=500, dtype=jnp.float64
        ).value

    bias, ratio = standardised_errors(jax.jit(jax.vmap(one))(keys))
    print("DPS: mean error / posterior std", bias, "std ratio", ratio)
    # beyond the Monte Carlo error (0.01 and 0.007): a real bias, as documented
    assert 0.06 < np.max(np.abs(bias)) < 0.12, bias
    assert 0.85 < np.min(ratio) < 0.92, ratio
    assert np.max(ratio) < 1.0, ratio


def test_projection_square_root_of_an_indefinite_covariance():
    # A learned field's Tweedie covariance may be indefinite: its negative
    # eigenvalues are clipped (eigenvalues 3 and -1 here), and a positive
    # definite one takes the Cholesky path unchanged.
    root, cov = _psd_sqrt(jnp.array([[1.0, 2.0], [2.0, 1.0]]))
    np.testing.assert_allclose(cov, np.full((2, 2), 1.5), atol=1e-12)
    np.testing.assert_allclose(root @ root.T, cov, atol=1e-12)
    spd = jnp.array([[2.0, 0.5], [0.5, 1.0]])
    root, cov = _psd_sqrt(spd)
    np.testing.assert_allclose(cov, spd)
    np.testing.assert_allclose(root, np.linalg.cholesky(np.asarray(spd)))


@pytest.mark.slow
def test_tweedie_projection_derivative_in_y():
    # Reparametrised samples: the derivative of their mean with respect to the
    # measurement is the posterior's gain C_post H^T / sigma_y^2. The isotropic
    # covariance of Gaussian data has repeated eigenvalues, where an
    # eigendecomposition's derivative is infinite: it must not leak as NaN.
    pred = prior(jnp.float64)
    keys = jax.random.split(jax.random.key(0), 2000)

    def mean_sample(y):
        def one(k):
            return rd.sample_tweedie_projection(
                pred, k, H, y, SIGMA_Y, steps=5, dtype=jnp.float64
            ).value

        return jax.vmap(one)(keys).mean(0)

    direction = jnp.array([1.0, 0.0])
    _, column = jax.jit(lambda y: jax.jvp(mean_sample, (y,), (direction,)))(
        jnp.asarray(Y)
    )
    precision = np.eye(3) / SCALE**2 + H.T @ H / SIGMA_Y**2
    gain = np.linalg.inv(precision) @ H.T / SIGMA_Y**2
    # per sample the derivative is nearly deterministic: 1e-4 is far above
    # the Monte Carlo error measured (3e-6)
    np.testing.assert_allclose(column, gain[:, 0], rtol=1e-4)


MIX_MEANS = np.array(
    [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.5, 1.0], [-1.0, -0.5, 0.5]]
)


MIX_SCALE = 0.3


MIX_H = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])


MIX_Y = np.array([0.8, 0.1])


MIX_NUM = 512


def _mixture_posterior_upper_mass(sigma_y):
    """P(x_3 > 0.5 | y) for the mixture prior, in closed form.

    Component j's posterior weight is proportional to
    N(y; H mu_j, (s^2 + sigma_y^2) I) (equal prior weights); H leaves x_3
    alone, so given j it keeps its prior N(mu_j3, s^2).
    """
    var = MIX_SCALE**2 + sigma_y**2
    logw = -np.sum((MIX_Y - MIX_MEANS @ MIX_H.T) ** 2, axis=1) / (2 * var)
    w = np.exp(logw - logw.max())
    w /= w.sum()
    upper = [
        0.5 * math.erfc((0.5 - mu) / (MIX_SCALE * math.sqrt(2)))
        for mu in MIX_MEANS[:, 2]
    ]
    return float(w @ np.array(upper))


@pytest.mark.loud
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.full
def test_dps_stays_on_the_measurement_at_small_noise(dtype):
    # Before the step bound, sigma_y = 0.02 ended at 1e5..1e11 and 0.01 at NaN
    # (float32) or 1e78 (float64): the likelihood's weight var/sigma_y^2
    # overshot y by up to ten times every step.
    pred = rd.GaussianMixtureEps(SCHED, jnp.asarray(MIX_MEANS, dtype), MIX_SCALE)
    keys = jax.random.split(jax.random.key(0), MIX_NUM)
    h, y = jnp.asarray(MIX_H, dtype), jnp.asarray(MIX_Y, dtype)

    @jax.jit
    def dps(sigma_y):
        return jax.vmap(
            lambda k: rd.sample_dps(pred, k, h, y, sigma_y, dtype=dtype).value
        )(keys)

    @jax.jit
    def tweedie(sigma_y):
        return jax.vmap(
            lambda k: (
                rd.sample_tweedie_projection(pred, k, h, y, sigma_y, dtype=dtype).value
            )
        )(keys)

    for sigma_y in (0.01, 0.02):
        s = jnp.asarray(sigma_y, dtype)
        x = np.asarray(dps(s), np.float64)
        ref = np.asarray(tweedie(s), np.float64)
        assert x.shape == (MIX_NUM, 3) and np.all(np.isfinite(x))
        misfit = (x[:, :2] - MIX_Y) / sigma_y
        ref_misfit = (ref[:, :2] - MIX_Y) / sigma_y
        # The exact posterior of Hx given each component is Gaussian with
        # std sigma_y s / sqrt(s^2 + sigma_y^2) < sigma_y and mean within
        # sigma_y^2/s^2 |y - H mu_j| < 0.05 sigma_y of y (the components that
        # carry weight). 512 samples: Monte Carlo error of the mean 0.045
        # sigma_y. DPS's bias is of the order of 0.1 posterior std (see its
        # docstring), so 0.3 sigma_y, for DPS and for the exact-for-Gaussians
        # Tweedie projection alike.
        assert np.max(np.abs(misfit.mean(0))) < 0.3, misfit.mean(0)
        assert np.max(np.abs(ref_misfit.mean(0))) < 0.3, ref_misfit.mean(0)
        assert np.max(np.abs(misfit.mean(0) - ref_misfit.mean(0))) < 0.3
        # no sample strays: a Gaussian exceeds 6 std with probability 2e-9
        assert np.max(np.abs(misfit)) < 6, np.max(np.abs(misfit))
        # over-confident (as documented) but not collapsed onto y
        std = misfit.std(0)
        assert np.all(std > 0.3) and np.all(std < 1.2), std
        # and the unmeasured coordinate follows the posterior's two modes
        # (x_3 ~ 0 or 1): the mass above 0.5 against the closed form, within
        # 0.1 (five Monte Carlo errors of 512 samples)
        upper = _mixture_posterior_upper_mass(sigma_y)
        assert abs(np.mean(x[:, 2] > 0.5) - upper) < 0.1, (
            np.mean(x[:, 2] > 0.5),
            upper,
        )
