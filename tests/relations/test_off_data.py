"""Calibrated off-data tests: `calibrate_off_data` and the `off_data` flag."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import retrax
import retrax.diffusion as rd
import retrax.relations as rr


SCHED = rd.VPSDE()
INF = jnp.inf
RING_SD = 0.05


def ring_model(dtype=jnp.float64):
    """The closed-form noise predictor of 48 Gaussians of sd 0.05 on the unit
    circle, with the default field nodes."""
    ang = 2 * np.pi * np.arange(48) / 48
    means = jnp.asarray(np.stack([np.cos(ang), np.sin(ang)], 1), dtype)
    mix = rd.GaussianMixtureEps(SCHED, means, jnp.asarray(RING_SD, dtype))
    return rr.ImplicitDiffusion(mix, rr.field_nodes(jax.random.key(0), 2, dtype=dtype))


def ring_data(key, m, dtype=jnp.float64):
    """Rows drawn from the ring's mixture."""
    k1, k2 = jax.random.split(key)
    ang = 2 * jnp.pi * jax.random.randint(k1, (m,), 0, 48).astype(dtype) / 48
    centre = jnp.stack([jnp.cos(ang), jnp.sin(ang)], 1)
    return centre + RING_SD * jax.random.normal(k2, (m, 2), dtype)


def x_queries(model, xs, start=0.5, tol=None):
    """Clamp x at each of `xs`, solve for y from `start`."""
    dtype = xs.dtype
    rho = jnp.array([INF, 0.0], dtype)

    def one(x):
        z0 = jnp.stack([x, jnp.asarray(start, dtype)])
        return rr.implicit_infer(model, z0, rho, throw=False, off_data_tol=tol)

    return eqx.filter_jit(jax.vmap(one))(xs)


def passes(sols):
    """The queries reported successful and on the data."""
    return (sols.result == rr.RESULTS.successful) & ~sols.off_data


@pytest.fixture(scope="module")
def ring():
    model = ring_model()
    data = ring_data(jax.random.key(1), 2048)
    return model, data, rr.calibrate_off_data(model, data, [0])


@pytest.mark.full
def test_calibrated_ring_refuses_clamps_off_the_data(ring):
    model, data, calibrated = ring
    assert calibrated.support is not None and model.support is None
    assert calibrated.support.points.shape == (2048, 2)
    assert bool(jnp.all(calibrated.support.clamp == jnp.array([True, False])))
    # The data's x reaches about 1 + 3 * 0.05; clamps from 1.25 to 1.45 are past
    # it by two sds or more.
    far = jnp.linspace(1.25, 1.45, 16)
    before = x_queries(model, far)
    after = x_queries(calibrated, far)
    # uncalibrated, these converge, are stable and pass (clamp loads under 3)
    assert int(jnp.sum(passes(before))) == far.size
    assert bool(jnp.all(jnp.isnan(before.support_ratio)))
    # calibrated, every one is flagged, by the support test
    assert bool(jnp.all(after.off_data)) and bool(jnp.all(after.support_ratio > 1))
    assert int(jnp.sum(passes(after))) == 0
    # the answers themselves are unchanged by the calibration
    assert bool(jnp.all(after.value == before.value))
    assert bool(jnp.all(after.clamp_load == before.clamp_load))


@pytest.mark.full
def test_calibrated_ring_keeps_clamps_on_the_data(ring):
    _, _, calibrated = ring
    fresh = ring_data(jax.random.key(2), 512)
    # the upper half of the ring, solved for y from above
    xs = fresh[fresh[:, 1] > 0.3][:, 0]
    sols = x_queries(calibrated, xs, start=0.8)
    assert xs.size > 150
    assert int(jnp.sum(passes(sols))) >= 0.99 * xs.size
    assert float(jnp.nanmax(sols.support_ratio)) < 2.0


@pytest.mark.full
def test_other_clamp_patterns_and_explicit_tolerance(ring):
    model, _, calibrated = ring
    # y clamped (not calibrated): no support test, the clamp load decides
    rho = jnp.array([0.0, INF])
    z0 = jnp.array([0.5, 1.4])
    sol = rr.implicit_infer(calibrated, z0, rho)
    ref = rr.implicit_infer(model, z0, rho)
    assert bool(jnp.isnan(sol.support_ratio))
    assert bool(sol.off_data == (sol.clamp_load > 3.0)) and bool(
        sol.off_data == ref.off_data
    )
    # no clamps: on the data, ratio 0
    free = rr.implicit_infer(calibrated, jnp.array([0.9, 0.3]), jnp.zeros(2))
    assert float(free.support_ratio) == 0.0 and not bool(free.off_data)
    # an explicit tolerance wins over the calibration
    far = jnp.array([1.4])
    loose = x_queries(calibrated, far, tol=1e6)
    assert bool(loose.support_ratio[0] > 1) and not bool(loose.off_data[0])
    strict = x_queries(calibrated, far, tol=0.0)
    assert bool(strict.off_data[0])
    with pytest.raises(TypeError, match="off_data_tol"):
        rr.implicit_infer(calibrated, z0, rho, off_data_tol="3")


@pytest.mark.full
def test_factors_and_indexed_relations_carry_the_calibration(ring):
    _, _, calibrated = ring
    factor = rr.Factor(calibrated, {"x": 1, "y": 1})
    out = rr.factor_infer(factor, {"x": rr.Observed(jnp.array([1.4]))}, throw=False)
    on = rr.factor_infer(factor, {"x": rr.Observed(jnp.array([0.6]))})
    assert bool(out.off_data) and float(out.support_ratio) > 1
    assert not bool(on.off_data) and float(on.support_ratio) <= 1
    # on coordinates 1, 2 of a 3-d state; a clamp on coordinate 0 does not
    # touch it
    indexed = rr.IndexedRelation(calibrated, [1, 2], 3)
    rho = jnp.array([INF, INF, 0.0])
    sol = rr.implicit_infer(indexed, jnp.array([7.0, 1.4, 0.5]), rho, throw=False)
    direct = x_queries(calibrated, jnp.array([1.4]))
    assert float(sol.support_ratio) == pytest.approx(float(direct.support_ratio[0]))


@pytest.mark.slow
def test_products_and_roots_carry_the_calibration(ring):
    _, _, calibrated = ring
    indexed = rr.IndexedRelation(calibrated, [1, 2], 3)
    rho = jnp.array([INF, INF, 0.0])
    direct = x_queries(calibrated, jnp.array([1.4]))
    # a product with an uncalibrated member clamped: not calibrated
    other = rr.IndexedRelation(ring_model(), [0, 1], 3)
    product = rr.ProductRelation([indexed, other])
    mixed = rr.implicit_infer(product, jnp.array([0.6, 0.8, 0.0]), rho, throw=False)
    assert bool(jnp.isnan(mixed.support_ratio))
    alone = rr.ProductRelation([indexed])
    sol = rr.implicit_infer(alone, jnp.array([7.0, 1.4, 0.5]), rho, throw=False)
    assert float(sol.support_ratio) == pytest.approx(float(direct.support_ratio[0]))
    roots = rr.implicit_roots(
        calibrated,
        jnp.array([1.4, 0.5]),
        jnp.array([INF, 0.0]),
        starts=jnp.array([[1.4, -0.5]]),
        throw=False,
    )
    assert roots.support_ratio.shape == (2,) and bool(jnp.all(roots.off_data))


@pytest.mark.full
def test_calibration_survives_a_checkpoint(ring, tmp_path):
    model, data, calibrated = ring
    retrax.save_checkpoint(tmp_path, 3, calibrated)
    like = eqx.filter_eval_shape(rr.calibrate_off_data, model, data, [0])
    found = retrax.load_checkpoint(tmp_path, like)
    assert found is not None
    back = found.tree
    for a, b in zip(
        jax.tree.leaves(back.support), jax.tree.leaves(calibrated.support), strict=True
    ):
        assert bool(jnp.all(jnp.asarray(a) == jnp.asarray(b)))
    sol = x_queries(back, jnp.array([1.4, 0.6]))
    assert bool(sol.off_data[0]) and not bool(sol.off_data[1])


@pytest.mark.full
def test_calibration_options(ring):
    model, data, calibrated = ring
    # jitted, the same numbers
    jitted = eqx.filter_jit(rr.calibrate_off_data)(model, data, [0])
    assert float(jitted.support.tol) == float(calibrated.support.tol)
    # the stored rows: evenly spaced without a key, drawn with one
    few = rr.calibrate_off_data(model, data, [0], max_points=256)
    assert few.support.points.shape == (256, 2)
    drawn = rr.calibrate_off_data(
        model, data, [0], max_points=256, key=jax.random.key(5)
    )
    assert drawn.support.points.shape == (256, 2)
    assert not bool(jnp.all(drawn.support.points == few.support.points))
    # fewer rows are farther apart; a lower quantile is a tighter tolerance
    assert float(few.support.tol) > float(calibrated.support.tol)
    low = rr.calibrate_off_data(model, data, [0], quantile=0.5)
    assert float(low.support.tol) < float(calibrated.support.tol)
    # the tolerance is the quantile of the leave-one-out distances (brute force)
    pts = np.asarray(few.support.points)[:, 0]
    gaps = np.abs(pts[:, None] - pts[None, :])
    np.fill_diagonal(gaps, np.inf)
    want = np.quantile(gaps.min(axis=1), 0.999)
    assert float(few.support.tol) == pytest.approx(want, rel=1e-12)
    # calibrated on both coordinates, a query clamping one of them is tested
    # over that one against the (larger) two-coordinate tolerance
    both = rr.calibrate_off_data(model, data, [0, 1])
    assert float(both.support.tol) > float(calibrated.support.tol)
    sub = x_queries(both, jnp.array([1.4, 0.6]))
    assert bool(jnp.all(jnp.isfinite(sub.support_ratio)))
    assert bool(sub.off_data[0]) and not bool(sub.off_data[1])


@pytest.mark.full
def test_calibration_errors(ring):
    model, data, _ = ring
    for q in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="quantile"):
            rr.calibrate_off_data(model, data, [0], quantile=q)
    with pytest.raises((ValueError, TypeError), match="data"):
        rr.calibrate_off_data(model, data[:, :1], [0])
    with pytest.raises((ValueError, TypeError), match="data"):
        rr.calibrate_off_data(model, data[0], [0])
    with pytest.raises((ValueError, TypeError), match="data"):
        rr.calibrate_off_data(model, data[:1], [0])
    for clamp in ([2], [-1], [], [0, 0]):
        with pytest.raises(ValueError, match="clamp"):
            rr.calibrate_off_data(model, data, clamp)
    with pytest.raises((ValueError, TypeError), match="clamp"):
        rr.calibrate_off_data(model, data, [0.5])
    with pytest.raises(ValueError, match="max_points"):
        rr.calibrate_off_data(model, data, [0], max_points=1)
    with pytest.raises(TypeError, match="ImplicitDiffusion"):
        rr.calibrate_off_data(rr.Factor(model, {"x": 1, "y": 1}), data, [0])
    with pytest.raises(ValueError, match="finite"):
        rr.calibrate_off_data(model, data.at[3, 1].set(jnp.nan), [0])
    with pytest.raises(ValueError, match="distance is 0"):
        rr.calibrate_off_data(model, jnp.zeros((8, 2)).at[0, 1].set(1.0), [0])


@pytest.mark.float32
def test_calibration_float32():
    model = ring_model(jnp.float32)
    data = ring_data(jax.random.key(1), 1024, jnp.float32)
    calibrated = rr.calibrate_off_data(model, data, [0])
    assert calibrated.support.points.dtype == jnp.float32
    far = x_queries(calibrated, jnp.linspace(1.25, 1.5, 8, dtype=jnp.float32))
    assert int(jnp.sum(passes(far))) == 0
    fresh = ring_data(jax.random.key(2), 256, jnp.float32)
    xs = fresh[fresh[:, 1] > 0.3][:, 0]
    sols = x_queries(calibrated, xs, start=0.8)
    assert int(jnp.sum(passes(sols))) >= 0.98 * xs.size
