"""Training through inference: a task loss on the answers of queries."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import retrax.diffusion as rd
import retrax.relations as rr


SCHED = rd.VPSDE()
RHO = jnp.array([jnp.inf, 0.0])  # x clamped, y free


def ring(components=48, scale=0.05, dtype=jnp.float64):
    angle = jnp.arange(components, dtype=dtype) * (2 * jnp.pi / components)
    means = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    return rd.GaussianMixtureEps(SCHED, means, scale)


def parabola_problem(dtype=jnp.float64):
    """VariationalDiffusion.jl's test: move a ring's means so that inference
    x -> y reproduces y = x^2 - 0.5 at nine clamped x, starting from y = -0.5."""
    relation = rr.ImplicitDiffusion(
        ring(dtype=dtype),
        rr.field_nodes(jax.random.key(1), 2, samples=2, dtype=dtype),
    )
    xs = jnp.linspace(-0.8, 0.8, 9, dtype=dtype)
    z0 = jnp.stack([xs, jnp.full_like(xs, -0.5)], axis=1)
    return relation, z0, xs**2 - 0.5


def squared_error(z, target):
    return (z[1] - target) ** 2


def means(relation):
    return relation.pred.means


@eqx.filter_jit
def cold_loss(relation, z0, targets):
    """The task loss with cold starts, solved independently of the library loop."""
    sols = jax.vmap(lambda q: rr.implicit_infer(relation, q, RHO))(z0)
    return jnp.mean((sols.value[:, 1] - targets) ** 2), sols


ADAM = optax.adam(0.01)  # one object: calls with it share the compiled epoch


@pytest.mark.full
def test_fit_through_inference_learns_the_parabola(capsys):
    relation, z0, targets = parabola_problem()
    # A tenth query with a NaN target: its loss is not finite, so it is masked
    # out and counted in every epoch, and the other nine are VD's test.
    z0 = jnp.concatenate([z0, jnp.array([[0.1, 0.2]])])
    targets = jnp.concatenate([targets, jnp.array([jnp.nan])])

    def fit(relation, epochs, progress=False):
        return rr.fit_through_inference(
            relation,
            z0,
            RHO,
            targets,
            squared_error,
            jax.random.key(0),
            epochs=epochs,
            optimizer=ADAM,
            where=means,
            progress=progress,
        )

    trained, history = fit(relation, 60, progress=True)
    assert "fit" in capsys.readouterr().err  # the tqdm bar
    # The first epoch's loss is the task loss with cold starts (its starts are
    # z0), before any update; a one-epoch run from the trained relation gives
    # the same at the end, with the same compiled program. (That this number
    # is the loss of independent solves is checked in the slow set.)
    start = float(history.task_loss[0])
    _, after = fit(trained, 1)
    end = float(after.task_loss[0])
    # VariationalDiffusion.jl's acceptance: below 1/50 of the start in 60 epochs
    assert end < start / 50, (start, end)
    # every query but the NaN one converged to a stable root, in every epoch
    assert bool(jnp.all(history.failed == 1)) and int(after.failed[0]) == 1
    assert history.task_loss.shape == (60,) and history.failed.shape == (60,)
    assert float(history.task_loss[-1]) < start / 50
    assert bool(jnp.all(history.denoising_loss == 0))
    # only the means moved; the nodes and the scales are as they were
    assert not np.allclose(trained.pred.means, relation.pred.means)
    assert np.array_equal(trained.pred.scales, relation.pred.scales)
    assert np.array_equal(trained.nodes.eps, relation.nodes.eps)
    # warm starts: the last valid answers; the masked query keeps its start
    np.testing.assert_allclose(history.z_init[:9, 0], z0[:9, 0])
    np.testing.assert_allclose(history.z_init[9], [0.1, 0.2])


@pytest.mark.float32
def test_fit_through_inference_float32():
    relation, z0, targets = parabola_problem(jnp.float32)

    def fit(relation, epochs):
        return rr.fit_through_inference(
            relation,
            z0,
            RHO.astype(jnp.float32),
            targets,
            squared_error,
            jax.random.key(0),
            epochs=epochs,
            optimizer=ADAM,
            where=means,
            progress=False,
        )

    trained, history = fit(relation, 60)
    assert history.task_loss.dtype == jnp.float32
    assert trained.pred.means.dtype == jnp.float32
    _, after = fit(trained, 1)
    assert float(after.task_loss[0]) < float(history.task_loss[0]) / 50
    assert int(jnp.sum(history.failed)) == 0 and int(after.failed[0]) == 0


@pytest.mark.slow
def test_fit_with_denoising_loss_masks_and_counts_failures(getkey):
    model = rd.TimeMLP(2, hidden=8, depth=1, key=getkey())
    relation = rr.ImplicitDiffusion(
        rd.NoisePredictor(model, SCHED), rr.field_nodes(getkey(), 2, samples=1)
    )
    angle = jax.random.uniform(getkey(), (64,), jnp.float64, 0, 2 * jnp.pi)
    data = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    z0 = jnp.array([[0.6, 0.5], [0.0, 0.7], [-0.6, -0.5], [0.3, -0.9]])
    targets = jnp.array([0.8, 1.0, -0.8, -0.95])
    # four Newton steps: some queries do not converge, and must be masked
    kwargs = dict(epochs=3, where=lambda r: r.pred, max_steps=4, progress=False)
    run = rr.fit_through_inference(
        relation, z0, RHO, targets, squared_error, getkey(), data=data, **kwargs
    )
    assert isinstance(run, rr.InferenceFit) and run.result == rr.RESULTS.successful
    assert int(run.stats["num_steps"]) == 3
    trained, history = run  # unpacks as the pair it was
    assert trained is run.value and history is run.history
    sols = jax.vmap(
        lambda q: rr.implicit_infer(relation, q, RHO, max_steps=4, throw=False)
    )(z0)
    expected = int(jnp.sum(~(sols.converged & sols.stable)))
    assert 0 < expected < 4, "the case must mix converged and failed solves"
    assert int(history.failed[0]) == expected
    ok = sols.converged & sols.stable
    want = jnp.sum(jnp.where(ok, (sols.value[:, 1] - targets) ** 2, 0)) / jnp.sum(
        ok
    ).astype(float)
    np.testing.assert_allclose(history.task_loss[0], want, rtol=1e-9)
    assert bool(jnp.all(jnp.isfinite(history.task_loss)))
    assert bool(jnp.all(history.denoising_loss > 0))
    assert history.z_init.shape == z0.shape
    w0 = trained.pred.model.layers[0].weight
    assert bool(jnp.all(jnp.isfinite(w0)))
    assert not np.allclose(w0, relation.pred.model.layers[0].weight)


def test_fit_through_inference_bad_input(getkey):
    relation, z0, targets = parabola_problem()
    key = getkey()

    def call(**changes):
        args = dict(
            relation=relation,
            z0=z0,
            rho=RHO,
            targets=targets,
            loss=squared_error,
            key=key,
            epochs=1,
            where=means,
            progress=False,
        )
        args.update(changes)
        return rr.fit_through_inference(**args)

    cases = [
        (dict(z0=z0[:, :1]), ValueError, "`z0` must have shape \\(queries, 2\\)"),
        (dict(z0=z0.astype(int)), TypeError, "`z0` must have a real floating"),
        (dict(rho=jnp.ones(3)), ValueError, "`rho` must have shape \\(2,\\)"),
        (dict(z_init=z0[:2]), ValueError, "`z_init` must have the shape of `z0`"),
        (dict(targets=targets[:3]), ValueError, "leading axis of length 9"),
        (dict(epochs=0), ValueError, "`epochs` must be a positive integer"),
        (dict(gradient="exact"), ValueError, "`gradient` must be 'implicit'"),
        (dict(denoising_weight=-1.0), ValueError, "`denoising_weight` must be"),
        (dict(t_range=(0.5, 0.1)), ValueError, "`t_range` must be an interval"),
        (dict(where=lambda r: r.nope), ValueError, "`where` must select parts"),
        (dict(where=lambda r: r.pred.schedule), ValueError, "nothing to train"),
        (dict(data=jnp.zeros((4, 2))), TypeError, "`where\\(relation\\)` must be"),
        (
            dict(where=lambda r: r.pred, data=jnp.zeros((4, 3))),
            ValueError,
            "`data` must have shape \\(num_examples, 2\\)",
        ),
        (
            dict(where=lambda r: r.pred, data=jnp.full((4, 2), jnp.nan)),
            ValueError,
            "`data` must be finite",
        ),
    ]
    for changes, kind, match in cases:
        with pytest.raises(kind, match=match):
            call(**changes)


@pytest.mark.slow
def test_task_gradient_equals_grad_through_implicit_infer():
    # The mean of the per-query adjoints against jax.grad through the solves
    # (optimistix's implicit adjoint), an independent path.
    relation, z0, targets = parabola_problem()
    exact = rr.task_gradient(relation, z0, RHO, targets, squared_error, where=means)
    assert int(exact.failed) == 0
    assert isinstance(exact, rd.AbstractSolution)
    assert exact.stats["num_steps"].shape == (z0.shape[0],)
    assert bool(jnp.all(exact.stats["num_steps"] >= 1))

    def mean_loss(mu):
        r = eqx.tree_at(lambda r: r.pred.means, relation, mu)
        return cold_loss(r, z0, targets)[0]

    want = jax.grad(mean_loss)(relation.pred.means)
    np.testing.assert_allclose(exact.value.pred.means, want, rtol=1e-8, atol=1e-12)
    with pytest.warns(DeprecationWarning, match=r"TaskGradient\.grads"):
        assert exact.grads is exact.value
    np.testing.assert_allclose(exact.loss, mean_loss(relation.pred.means), rtol=1e-12)


@pytest.mark.slow
def test_jacobian_free_gradient_against_the_exact_one():
    # The Jacobian-free gradient, measured against the exact one on the
    # parabola problem (the numbers quoted in the docs), and the training it
    # drives.
    relation, z0, targets = parabola_problem()
    exact = rr.task_gradient(relation, z0, RHO, targets, squared_error, where=means)
    free = rr.task_gradient(
        relation,
        z0,
        RHO,
        targets,
        squared_error,
        where=means,
        gradient="jacobian_free",
    )
    a = np.ravel(exact.value.pred.means)
    b = np.ravel(free.value.pred.means)
    cosine = a @ b / (np.linalg.norm(a) * np.linalg.norm(b))
    ratio = np.linalg.norm(b) / np.linalg.norm(a)
    print(f"Jacobian-free vs exact: cosine {cosine:.3f}, norm ratio {ratio:.3f}")
    assert 0.9 < cosine < 0.98 and 0.3 < ratio < 0.6
    start, _ = cold_loss(relation, z0, targets)
    trained, history = rr.fit_through_inference(
        relation,
        z0,
        RHO,
        targets,
        squared_error,
        jax.random.key(0),
        epochs=60,
        optimizer=optax.adam(0.01),
        where=means,
        gradient="jacobian_free",
        progress=False,
    )
    end, _ = cold_loss(trained, z0, targets)
    print(f"Jacobian-free training: loss {float(start):.4f} -> {float(end):.5f}")
    assert float(end) < float(start) / 50
    assert int(jnp.sum(history.failed)) == 0


NAN_RATE = optax.sgd(float("nan"))


def _inference_problem():
    sched = rd.VPSDE()
    angle = jnp.arange(8.0) * (2 * jnp.pi / 8)
    means = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    relation = rr.ImplicitDiffusion(
        rd.GaussianMixtureEps(sched, means, 0.05),
        rr.field_nodes(jax.random.key(1), 2, samples=2),
    )
    xs = jnp.linspace(-0.5, 0.5, 3)
    z0 = jnp.stack([xs, jnp.full_like(xs, -0.5)], axis=1)
    return relation, z0, xs**2 - 0.5


@pytest.mark.loud
@pytest.mark.parametrize(
    "changes, match",
    [
        (dict(denoising_weight=float("inf")), "`denoising_weight` must be"),
        (dict(denoising_weight=float("nan")), "`denoising_weight` must be"),
        (dict(denoising_weight=-1.0), "`denoising_weight` must be"),
        (dict(tol=0.0), "`tol` must be a positive, finite"),
        (dict(tol=-1.0), "`tol` must be a positive, finite"),
        (dict(tol=float("nan")), "`tol` must be a positive, finite"),
        (dict(tol=float("inf")), "`tol` must be a positive, finite"),
        (dict(max_steps=0), "`max_steps` must be a positive integer"),
    ],
)
def test_fit_through_inference_refuses_bad_settings(getkey, changes, match):
    relation, z0, targets = _inference_problem()
    with pytest.raises(ValueError, match=match):
        rr.fit_through_inference(
            relation,
            z0,
            RHO,
            targets,
            squared_error,
            getkey(),
            epochs=1,
            where=means,
            progress=False,
            **changes,
        )


@pytest.mark.loud
@pytest.mark.parametrize("tol", [0.0, -1.0, float("nan")])
def test_task_gradient_refuses_bad_tol_under_jit(tol):
    """`task_gradient` is jitted; the tolerance is fixed when it is traced."""
    relation, z0, targets = _inference_problem()
    with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
        rr.task_gradient(relation, z0, RHO, targets, squared_error, tol=tol)


def _fit_small(key, **options):
    """`fit_through_inference` on `_inference_problem`'s queries, training
    the means: `(relation it started from, InferenceFit)`."""
    relation, z0, targets = _inference_problem()
    fit = rr.fit_through_inference(
        relation, z0, RHO, targets, squared_error, key, where=means, **options
    )
    return relation, fit


@pytest.mark.loud
@pytest.mark.full
def test_fit_through_inference_nan_learning_rate_raises(getkey):
    for progress in (False, True):
        with pytest.raises(FloatingPointError, match="stopped at epoch 0"):
            _fit_small(
                getkey(), epochs=2, optimizer=NAN_RATE, max_steps=4, progress=progress
            )


@pytest.mark.loud
@pytest.mark.full
def test_fit_through_inference_without_throw_returns_the_run_up_to_the_stop(getkey):
    # a NaN learning rate makes the first update non-finite: with
    # `throw=False` the run stops there, nothing applied, and says why
    for progress in (False, True):
        relation, fit = _fit_small(
            getkey(),
            epochs=3,
            optimizer=NAN_RATE,
            max_steps=4,
            progress=progress,
            throw=False,
        )
        assert fit.result == rr.RESULTS.nonfinite_update
        assert int(fit.stats["num_steps"]) == 0
        # the failed epoch's task loss is recorded, and no later epoch
        assert fit.history.task_loss.shape == (1,)
        np.testing.assert_array_equal(fit.value.pred.means, relation.pred.means)


@pytest.mark.full
def test_fit_through_inference_reports_its_steps(getkey):
    relation, fit = _fit_small(
        getkey(), epochs=2, optimizer=ADAM, max_steps=8, progress=False, throw=False
    )
    assert fit.result == rr.RESULTS.successful
    assert int(fit.stats["num_steps"]) == 2
    assert not np.array_equal(fit.value.pred.means, relation.pred.means)


@pytest.mark.loud
@pytest.mark.full
def test_task_gradient_over_no_valid_query_is_loud_or_nan():
    # one Newton step cannot converge: no query enters the loss, whose mean
    # over nothing is not 0
    relation, z0, targets = _inference_problem()
    args = (relation, z0, RHO, targets, squared_error)
    with pytest.raises(Exception, match="no query entered the loss"):
        rr.task_gradient(*args, where=means, max_steps=1)
    task = rr.task_gradient(*args, where=means, max_steps=1, throw=False)
    assert int(task.failed) == z0.shape[0] and not bool(jnp.any(task.valid))
    assert bool(jnp.isnan(task.loss))
    assert bool(jnp.all(jnp.isnan(task.value.pred.means)))
    assert bool(jnp.all(task.result != rr.RESULTS.successful))
    # some valid queries: a finite loss, the failures counted, no error
    ok = rr.task_gradient(*args, where=means)
    assert bool(jnp.isfinite(ok.loss)) and int(ok.failed) < z0.shape[0]
