"""Hostile inputs to the diffusion beliefs, factors and samplers fail loudly.

Each case once gave a plausible wrong number, or an error that did not say
what was wrong: a diverging DPS chain at realistic measurement noise, finite
garbage from a singular Gaussian, a tolerance that no query could meet,
internal errors from an integer dtype or traced coordinates.
"""

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax
import retrax.diffusion as rd
import retrax.relations as rr


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
        return jax.vmap(lambda k: rd.sample_dps(pred, k, h, y, sigma_y, dtype=dtype).x)(
            keys
        )

    @jax.jit
    def tweedie(sigma_y):
        return jax.vmap(
            lambda k: (
                rd.sample_tweedie_projection(pred, k, h, y, sigma_y, dtype=dtype).x
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


# -- Gaussian beliefs: singular forms are NaN, invalid matrices are refused ---


def _rank2_cov(dtype):
    a = np.random.default_rng(0).normal(size=(3, 2))
    return jnp.asarray(a @ a.T, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_singular_gaussians_convert_to_nan(dtype):
    # Before: entries of 1e7 (float32) to 1e16 (float64), rounding error
    # inverted, where the docstrings promise NaN.
    mean = jnp.asarray([1.0, 2.0, 3.0], dtype)
    cov = _rank2_cov(dtype)
    clamped = jnp.diag(jnp.asarray([1.0, 0.0, 2.0], dtype))
    flat = jnp.zeros((3, 3), dtype)
    cases = [
        lambda m, c: rd.MomentGaussian(m, c).canonical(),
        lambda m, c: rd.CanonicalGaussian(m, c).moment(),
    ]
    for convert in cases:
        for singular in (cov, clamped, flat):
            for out in (convert(mean, singular), jax.jit(convert)(mean, singular)):
                leaves = jax.tree.leaves(out)
                assert all(leaf.dtype == dtype for leaf in leaves)
                assert all(np.all(np.isnan(leaf)) for leaf in leaves), out
    # an indefinite precision (a quotient's) has no moment form either
    quotient = rd.divide(
        rd.MomentGaussian(mean, jnp.eye(3, dtype=dtype)),
        rd.MomentGaussian(mean, jnp.diag(jnp.asarray([0.5, 2.0, 2.0], dtype))),
    )
    assert np.all(np.isnan(quotient.moment().cov))
    # the Schur complement over a singular block is NaN too
    p = jnp.asarray([[2.0, 1.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0]], dtype)
    p = p.at[1:, 1:].set(jnp.ones((2, 2), dtype))  # singular block over (1, 2)
    marg = rd.CanonicalGaussian(mean, p).marginal([0])
    assert np.all(np.isnan(marg.precision)) and np.all(np.isnan(marg.info))
    # well-conditioned forms still convert, and an isotropic covariance's
    # derivative is finite (the rank test is not differentiated)
    spd = cov + 0.5 * jnp.eye(3, dtype=dtype)
    back = rd.MomentGaussian(mean, spd).canonical().moment()
    tol = 1e-4 if dtype == jnp.float32 else 1e-12
    np.testing.assert_allclose(back.cov, spd, rtol=tol, atol=tol)
    np.testing.assert_allclose(back.mean, mean, rtol=tol, atol=tol)
    grad = jax.grad(lambda c: rd.MomentGaussian(mean, c).canonical().info.sum())(
        jnp.eye(3, dtype=dtype)
    )
    # d/dC of 1^T C^{-1} mu at C = I is -(1 mu^T)'s symmetric part
    expected = -0.5 * (np.outer(np.ones(3), mean) + np.outer(mean, np.ones(3)))
    np.testing.assert_allclose(grad, expected, rtol=tol)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_gaussian_constructors_refuse_invalid_matrices(dtype):
    mean = jnp.asarray([1.0, 2.0, 3.0], dtype)
    negative = jnp.diag(jnp.asarray([1.0, -2.0, 1.0], dtype))
    skew = jnp.asarray([[1.0, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype)
    psd = "`cov` must be symmetric positive semidefinite"
    with pytest.raises(ValueError, match=psd + ": its smallest eigenvalue is -2"):
        rd.MomentGaussian(mean, negative)
    with pytest.raises(ValueError, match=psd + ": it differs from its transpose"):
        rd.MomentGaussian(mean, skew)
    with pytest.raises(ValueError, match="`precision` must be symmetric: it differs"):
        rd.CanonicalGaussian(mean, skew)
    with pytest.raises(TypeError, match="`cov` must have a real floating dtype"):
        rd.MomentGaussian(mean, jnp.eye(3, dtype=jnp.int32))

    # under jit, at run time, with the same message
    def moment(m, c):
        return rd.MomentGaussian(m, c).cov

    def canonical(m, c):
        return rd.CanonicalGaussian(m, c).precision

    jit_moment, jit_canonical = jax.jit(moment), jax.jit(canonical)
    with pytest.raises(Exception, match=psd + " \\(it has a negative eigenvalue\\)"):
        jit_moment(mean, negative)
    with pytest.raises(Exception, match=psd + " \\(it is not symmetric\\)"):
        jit_moment(mean, skew)
    with pytest.raises(Exception, match="`precision` must be symmetric \\(it is not"):
        jit_canonical(mean, skew)
    # the product of a refused covariance is never formed: before, combine
    # gave the variance -2 of a "belief" with covariance diag(1, -0.5, 1)
    with pytest.raises(ValueError, match=psd):
        rd.combine(
            rd.MomentGaussian(mean, jnp.diag(jnp.asarray([1.0, -0.5, 1], dtype)))
        )
    # valid matrices pass, eagerly and under jit: PSD with rounding (the
    # rank-2 covariance's smallest eigenvalue is -4e-9 in float32), an
    # indefinite (quotient) precision, and NaN (a failed solve's mark)
    for ok in (_rank2_cov(dtype), jnp.eye(3, dtype=dtype)):
        np.testing.assert_array_equal(moment(mean, ok), ok)
        np.testing.assert_array_equal(jit_moment(mean, ok), ok)
    np.testing.assert_array_equal(jit_canonical(mean, negative), negative)
    nan = jnp.full((3, 3), jnp.nan, dtype)
    assert np.all(np.isnan(moment(mean, nan))) and np.all(
        np.isnan(jit_moment(mean, nan))
    )


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_graph_factor_precisions_are_checked_row_by_row_under_jit(dtype):
    # Before: a graph built inside the user's `jit` took any traced precision
    # (negative, non-symmetric, NaN); only concrete ones were refused.
    good = jnp.asarray(
        [[[1.0, 0.0], [0.0, 1.0]], [[2.0, 0.5], [0.5, 1.0]], [[1.0, 1.0], [1.0, 1.0]]],
        dtype,
    )  # the last is singular PSD: its smallest eigenvalue is rounding

    def build(p):
        eye, zeros = jnp.eye(2, dtype=dtype), jnp.zeros(2, dtype)
        return rr.GaussianFactor([("x", [0, 1, 2])], eye, zeros, p).precision

    bad = [
        (good.at[1].set(jnp.diag(jnp.asarray([1.0, -2.0], dtype))), "negative"),
        (good.at[2, 0, 1].set(0.0), "not symmetric"),
        (good.at[0, 1, 1].set(jnp.nan), "finite"),
    ]
    eager = {
        "negative": "`precision` must be symmetric positive semidefinite: its "
        "smallest eigenvalue is -2",
        "not symmetric": "`precision` must be symmetric positive semidefinite: "
        "it differs from its transpose by 1",
        "finite": "`precision` must be finite",
    }
    traced = {
        "negative": "`precision` must be symmetric positive semidefinite "
        "\\(it has a negative eigenvalue\\)",
        "not symmetric": "`precision` must be symmetric positive semidefinite "
        "\\(it is not symmetric\\)",
        "finite": "`precision` must be finite",
    }
    jitted, users = jax.jit(build), retrax.filter_jit(build)
    np.testing.assert_array_equal(build(good), good)
    np.testing.assert_array_equal(jitted(good), good)
    np.testing.assert_array_equal(users(good), good)
    for p, what in bad:
        with pytest.raises(ValueError, match=eager[what]):
            build(p)
        with pytest.raises(Exception, match=traced[what]):
            jax.block_until_ready(jitted(p))
        with pytest.raises(eqx.EquinoxRuntimeError, match="^" + traced[what]):
            users(p)
    # one bad row among many identical good ones is found
    many = jnp.broadcast_to(good[1], (64, 2, 2)).at[37, 0, 0].set(-1.0)
    many = many.at[37, 1, 1].set(-1.0)

    def prior(p):
        return rr.GaussianFactor.prior(("x", range(64)), jnp.zeros((64, 2), dtype), p)

    with pytest.raises(Exception, match=traced["negative"]):
        jax.block_until_ready(jax.jit(lambda p: prior(p).precision)(many))


# -- factors: options and dtypes that no query can honour ---------------------


class _Quadratic(eqx.Module):
    """The energy 0.5 (x - b)^T A (x - b): a Gaussian relation."""

    a: jax.Array
    b: jax.Array

    def __call__(self, x, t):
        d = x - self.b
        return 0.5 * d @ self.a @ d


def _gaussian_factor(dtype=jnp.float64):
    a = jnp.asarray([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 1.5]], dtype)
    b = jnp.asarray([0.3, -0.2, 0.1], dtype)
    nodes = rd.noisefree_nodes(3, 0.01)
    pred = rd.EnergyNetwork(_Quadratic(a, b), SCHED)
    rel = rd.ImplicitDiffusion(pred, nodes, lam=rd.density_lambda(SCHED, nodes))
    return rd.Factor(rel, {"x": 1, "y": 2})


def test_factor_infer_refuses_tolerances_and_step_counts_it_cannot_use():
    # Before: tol=-1 failed every query and blamed max_steps.
    factor = _gaussian_factor()
    marks = {"x": rd.Observed(jnp.asarray(0.5))}
    for tol in (-1.0, 0.0, -1e-9, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
            rd.factor_infer(factor, marks, tol=tol)
    for steps in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="`max_steps` must be a positive integer"):
            rd.factor_infer(factor, marks, max_steps=steps)

    # under jit (the options are fixed when the program is traced)
    @eqx.filter_jit
    def solve(factor, marks, tol):
        return rd.factor_infer(factor, marks, tol=tol).z

    with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
        solve(factor, marks, -1.0)
    with pytest.raises(TypeError, match="`tol` is fixed when the program is traced"):
        jax.jit(lambda tol: rd.factor_infer(factor, marks, tol=tol).z)(1e-9)
    # valid options still answer
    sol = rd.factor_infer(factor, marks, tol=1e-10, max_steps=50)
    assert bool(sol.converged) and bool(sol.stable)
    np.testing.assert_allclose(solve(factor, marks, 1e-10), sol.z, rtol=1e-12)


def test_factor_query_refuses_integer_dtypes():
    # Before: an internal error deep in the channel marks (or from inf cast
    # to an integer stiffness).
    factor = _gaussian_factor()
    marks = {"x": rd.Observed(jnp.asarray(0.5)), "y": rd.Unobserved(0.1, 2.0)}
    for dtype in (jnp.int32, np.int64, bool, "int8"):
        with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
            factor.query(marks, dtype=dtype)
        with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
            rd.factor_infer(factor, marks, dtype=dtype)
    with pytest.raises(TypeError, match="`dtype` must be a real floating dtype"):
        eqx.filter_jit(lambda f: f.query(marks, dtype=jnp.int32))(factor)
    for dtype in (jnp.float32, jnp.float64):
        z0, rho = factor.query(marks, dtype=dtype)
        assert z0.dtype == dtype and rho.dtype == dtype
        np.testing.assert_array_equal(rho[0], np.inf)


def test_marginal_coords_must_be_concrete():
    # Before: jax's TracerArrayConversionError, which does not say that the
    # coordinates fix the marginal's shape.
    mean = jnp.asarray([1.0, 2.0, 3.0])
    cov = jnp.diag(jnp.asarray([1.0, 2.0, 3.0]))
    beliefs = [
        rd.MomentGaussian(mean, cov),
        rd.MomentGaussian(mean, cov).canonical(),
        rd.LaplaceBelief(mean=mean, cov=cov, free=jnp.ones(3, bool)),
    ]
    match = "`coords` must be concrete: they fix the marginal's shape"
    for belief in beliefs:
        with pytest.raises(TypeError, match=match):
            jax.jit(lambda c, b=belief: b.marginal(c).mean)(jnp.asarray([0, 2]))
        # static coordinates work under jit, and agree with eager ones
        eager = belief.marginal([2, 0]).moment()
        jitted = jax.jit(lambda b: b.marginal((2, 0)).moment())(belief)
        np.testing.assert_allclose(jitted.mean, eager.mean, rtol=1e-12)
        np.testing.assert_allclose(jitted.cov, eager.cov, rtol=1e-12)
        np.testing.assert_allclose(eager.mean, [3.0, 1.0], rtol=1e-12)
        np.testing.assert_allclose(eager.cov, np.diag([3.0, 1.0]), rtol=1e-12)
    # and where a belief is made with coords (laplace_belief)
    factor = _gaussian_factor()
    marks = {"x": rd.Observed(jnp.asarray(0.5))}
    z0, rho = factor.query(marks)
    sol = rd.factor_infer(factor, marks)
    with pytest.raises(TypeError, match=match):
        jax.jit(lambda c: rd.laplace_belief(factor, sol, rho, c).mean)(
            jnp.asarray([1, 2])
        )
    belief = rd.laplace_belief(factor, sol, rho, factor.coords("y"))
    assert belief.mean.shape == (2,) and np.all(np.isfinite(belief.cov))


def test_implicit_infer_refuses_tolerances_and_step_counts_it_cannot_use():
    # Before: tol=-1 or 0 ran to max_steps and reported "maximum steps reached".
    model = _gaussian_factor()
    z0, rho = jnp.array([0.5, 0.0, 0.0]), jnp.array([jnp.inf, 0.0, 0.0])
    for tol in (-1.0, 0.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
            rd.implicit_infer(model, z0, rho, tol=tol)
    for steps in (0, -3, True):
        with pytest.raises(ValueError, match="`max_steps` must be a positive integer"):
            rd.implicit_infer(model, z0, rho, max_steps=steps)
    run = eqx.filter_jit(lambda tol: rd.implicit_infer(model, z0, rho, tol=tol).z)
    with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
        run(-1.0)
    assert bool(rd.implicit_infer(model, z0, rho, tol=1e-10).converged)
