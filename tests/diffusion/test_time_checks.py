"""Every public method of a schedule checks its time, eagerly and under `jit`,
although the library's own callers use the unchecked formulas."""

import jax.numpy as jnp
import pytest

import retrax.diffusion as rd
from helpers import raises_eagerly_and_under_jit


S = rd.VPSDE()
X = jnp.array([0.3, -0.2])
METHODS = {
    "beta": lambda t: S.beta(t),
    "integrated_beta": lambda t: S.integrated_beta(t),
    "alpha": lambda t: S.alpha(t),
    "sigma": lambda t: S.sigma(t),
    "snr": lambda t: S.snr(t),
    "diffusion": lambda t: S.diffusion(t),
    "drift": lambda t: S.drift(X, t),
    "perturb": lambda t: S.perturb(X, t, X),
    "marginal_variance": lambda t: S.marginal_variance(t, 1.0),
}
PREDICTOR = rd.GaussianMixtureEps(S, jnp.array([[0.0, 1.0], [1.0, 0.0]]), 0.1)
PREDICTOR_METHODS = {
    "epsilon": lambda t: PREDICTOR.epsilon(X, t),
    "score": lambda t: PREDICTOR.score(X, t),
    "denoise": lambda t: PREDICTOR.denoise(X, t),
    "logdensity": lambda t: PREDICTOR.logdensity(X, t),
    "jacobian": lambda t: PREDICTOR.jacobian(X, t),
}


@pytest.mark.parametrize("name", sorted(METHODS) + sorted(PREDICTOR_METHODS))
@pytest.mark.parametrize("t", [1.5, -0.25, jnp.nan])
def test_public_methods_check_their_time(name, t):
    method = METHODS.get(name) or PREDICTOR_METHODS[name]
    raises_eagerly_and_under_jit(
        method, jnp.asarray(t, jnp.float64), match=r"must lie in \[0, 1\]"
    )


def test_unchecked_formulas_agree_with_the_public_methods():
    t = jnp.linspace(0.0, 1.0, 7)
    assert jnp.array_equal(S._alpha(t), S.alpha(t))
    assert jnp.array_equal(S._sigma(t), S.sigma(t))
    assert jnp.array_equal(S._beta(t), S.beta(t))
    assert jnp.array_equal(S._integrated_beta(t), S.integrated_beta(t))
    assert jnp.array_equal(S._sigma2(t), -jnp.expm1(-S.integrated_beta(t)))
