"""Hostile inputs to the diffusion beliefs, factors and samplers fail loudly.

Each case once gave a plausible wrong number, or an error that did not say
what was wrong: a diverging DPS chain at realistic measurement noise, finite
garbage from a singular Gaussian, a tolerance that no query could meet,
internal errors from an integer dtype or traced coordinates.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax.diffusion as rd


# -- sample_dps at small measurement noise ------------------------------------

SCHED = rd.VPSDE()
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


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_dps_stays_on_the_measurement_at_small_noise(dtype):
    # Before the step bound, sigma_y = 0.02 ended at 1e5..1e11 and 0.01 at NaN
    # (float32) or 1e78 (float64): the likelihood's weight var/sigma_y^2
    # overshot y by up to ten times every step.
    pred = rd.GaussianMixtureEps(SCHED, jnp.asarray(MIX_MEANS, dtype), MIX_SCALE)
    keys = jax.random.split(jax.random.key(0), MIX_NUM)
    h, y = jnp.asarray(MIX_H, dtype), jnp.asarray(MIX_Y, dtype)

    @jax.jit
    def dps(sigma_y):
        return jax.vmap(lambda k: rd.sample_dps(pred, k, h, y, sigma_y, dtype=dtype))(
            keys
        )

    @jax.jit
    def tweedie(sigma_y):
        return jax.vmap(
            lambda k: rd.sample_tweedie_projection(pred, k, h, y, sigma_y, dtype=dtype)
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
