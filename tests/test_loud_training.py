"""Training never fails quietly: diverging runs, checkpoint directories,
the arguments of training through inference, and processes that disagree."""

import json
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from retrax import diffusion as rd
from retrax.diffusion import _train


# one object each, so that the calls share their compiled chunks
DIVERGING = optax.sgd(optax.piecewise_constant_schedule(1e-3, {10: 1e12}))
NAN_RATE = optax.sgd(float("nan"))


def _problem(getkey, dtype=jnp.float64):
    data = jax.random.normal(getkey(), (32, 2), dtype)
    model = rd.TimeMLP(2, hidden=8, depth=1, key=getkey(), dtype=dtype)
    return rd.NoisePredictor(model, rd.VPSDE()), data


def _finite(tree) -> bool:
    leaves = jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))
    return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


def _kw(**changes):
    kw = dict(batch_size=8, progress=False)
    kw.update(changes)
    return kw


# ---- fit: a diverging run stops, naming the step ----


@pytest.mark.parametrize("dtype", [jnp.float64, jnp.float32])
def test_fit_nan_learning_rate_raises_naming_the_step(getkey, dtype):
    pred, data = _problem(getkey, dtype)
    with pytest.raises(FloatingPointError, match="stopped at step 0 .*parameters"):
        rd.fit(pred, data, getkey(), optimizer=NAN_RATE, steps=3, **_kw())


def test_fit_diverging_schedule_keeps_the_finite_checkpoints(getkey, tmp_path):
    """The issue's run: the loss leaves the floats after step 10. It stops
    with an error, and every checkpoint left holds a finite state."""
    pred, data = _problem(getkey)
    key = getkey()
    kw = _kw(optimizer=DIVERGING, steps=20, checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d ") as info:
        rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)
    assert str(tmp_path) in str(info.value)
    files = sorted(tmp_path.glob("checkpoint-*.ckpt"))
    assert len(files) == 3
    params, _ = eqx.partition(pred, eqx.is_inexact_array)
    like = {
        "state": rd.TrainState(params, DIVERGING.init(params), None, 0, key, None),
        "losses": jnp.zeros(20),
    }
    found = rd.load_checkpoint(tmp_path, like)
    assert _finite(found.tree["state"].params)
    assert _finite(found.tree["state"].opt_state)
    # the steps before the failure are the ones an unchecked run takes
    stopped = found.step
    _, losses = rd.fit(pred, data, key, **_kw(optimizer=DIVERGING, steps=stopped))
    np.testing.assert_array_equal(found.tree["losses"][:stopped], losses)
    # running the script again resumes and stops at the same step, loudly
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d "):
        rd.fit(pred, data, key, checkpoint_dir=tmp_path, **kw)


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


@pytest.mark.parametrize(
    "part, why", [("parameters", "parameters"), ("state", "optimiser state")]
)
def test_fit_names_the_step_whose_update_failed(getkey, part, why):
    """A chunk checks its losses at every step and its parameters and
    optimiser state after it; the step named is still the one whose update
    failed: here a loss that stays finite (a non-finite state nothing
    reads), or one that fails a step after the parameters did."""
    pred, data = _problem(getkey)
    kw = _kw(optimizer=_poisoned(5, part), steps=12, chunk_size=4)
    with pytest.raises(FloatingPointError, match=f"stopped at step 5 .*{why}"):
        rd.fit(pred, data, getkey(), **kw)
    # with "skip" every step from 5 on is skipped: the count that reaches
    # the poison is part of the state each skip throws away
    with pytest.warns(RuntimeWarning, match="skipped 7 of 12 steps"):
        run = rd.fit_solution(pred, data, getkey(), nonfinite="skip", **kw)
    assert _finite(run.pred) and _finite(run.state.opt_state)


def test_fit_nonfinite_skip_keeps_the_last_finite_state(getkey):
    pred, data = _problem(getkey)
    key = getkey()
    with pytest.warns(RuntimeWarning, match=r"skipped \d+ of 20 steps") as record:
        run = rd.fit_solution(
            pred,
            data,
            key,
            **_kw(optimizer=DIVERGING, steps=20, nonfinite="skip"),
        )
    trained, losses, state = run.pred, run.losses, run.state
    # the skipped steps are counted in the run's statistics too, as the
    # warning counts them
    skipped = int(run.stats["num_skipped"])
    assert skipped >= int(jnp.sum(~jnp.isfinite(losses))) > 0
    assert any(f"skipped {skipped} of 20" in str(w.message) for w in record)
    assert int(run.stats["num_steps"]) == 20
    assert losses.shape == (20,)
    assert not bool(jnp.all(jnp.isfinite(losses)))
    assert _finite(trained) and _finite(state.opt_state)
    assert state.step == 20
    with pytest.raises(ValueError, match="`nonfinite` must be 'raise' or 'skip'"):
        rd.fit(pred, data, key, **_kw(steps=1, nonfinite="ignore"))


@pytest.mark.float32
def test_fit_diverges_loudly_in_float32(getkey, tmp_path):
    """x64 off, the users' default: float32 overflows sooner, and still stops."""
    pred, data = _problem(getkey, jnp.float32)
    kw = _kw(optimizer=DIVERGING, steps=20, checkpoint_every=2)
    with pytest.raises(FloatingPointError, match=r"stopped at step 1\d "):
        rd.fit(pred, data, getkey(), checkpoint_dir=tmp_path, **kw)
    params, _ = eqx.partition(pred, eqx.is_inexact_array)
    found = rd.load_checkpoint(
        tmp_path,
        {
            "state": rd.TrainState(
                params, DIVERGING.init(params), None, 0, getkey(), None
            ),
            "losses": jnp.zeros(20, jnp.float32),
        },
    )
    assert _finite(found.tree["state"].params)
    with pytest.raises(FloatingPointError, match="stopped at step 0 "):
        rd.fit(pred, data, getkey(), optimizer=NAN_RATE, steps=2, **_kw())


# ---- checkpoint rotation never removes the last finite state ----


def test_save_checkpoint_rotation_keeps_the_last_finite_checkpoint(tmp_path):
    good = {"w": jnp.ones(3)}
    bad = {"w": jnp.array([1.0, jnp.nan, 2.0])}
    rd.save_checkpoint(tmp_path, 1, good, keep=2)
    for step in range(2, 6):
        rd.save_checkpoint(tmp_path, step, bad, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    # the newest two, and the last finite one
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (1, 4, 5)]
    # the inf of a diverged run counts as non-finite too
    rd.save_checkpoint(tmp_path, 6, {"w": jnp.full(3, jnp.inf)}, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (1, 5, 6)]
    # once a finite state is saved again, the old one rotates away as usual
    rd.save_checkpoint(tmp_path, 7, good, keep=2)
    names = sorted(p.name for p in tmp_path.glob("checkpoint-*.ckpt"))
    assert names == [f"checkpoint-00000000{s}.ckpt" for s in (6, 7)]


# ---- the checkpoint directory is checked before the first step ----


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a training step ran before the check")

    monkeypatch.setattr(_train, "_train_chunk", refuse)


def test_checkpoint_dir_under_a_regular_file(getkey, tmp_path, no_training):
    pred, data = _problem(getkey)
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    for path in (blocker / "checkpoints", blocker):
        with pytest.raises(ValueError, match="`checkpoint_dir` .* is not a writable"):
            rd.fit(pred, data, getkey(), checkpoint_dir=path, **_kw(steps=5))
    assert blocker.read_text() == "not a directory"


def test_checkpoint_dir_writable_leaves_no_probe(getkey, tmp_path, monkeypatch):
    pred, data = _problem(getkey)
    target = tmp_path / "new" / "checkpoints"
    rd.fit(pred, data, getkey(), checkpoint_dir=target, **_kw(steps=2))
    assert sorted(p.name for p in target.iterdir()) == ["checkpoint-000000002.ckpt"]


@pytest.mark.skipif(not pathlib.Path("/sys").is_dir(), reason="needs sysfs")
def test_checkpoint_dir_on_a_read_only_filesystem(getkey, no_training):
    """sysfs refuses new entries even to root (a chmod would not stop root)."""
    target = pathlib.Path("/sys/retrax-checkpoints")
    try:
        target.mkdir()
    except OSError:
        pass
    else:
        target.rmdir()
        pytest.skip("/sys accepts new directories here")
    pred, data = _problem(getkey)
    with pytest.raises(ValueError, match="`checkpoint_dir` .* is not a writable"):
        rd.fit(pred, data, getkey(), checkpoint_dir=target, **_kw(steps=5))


# ---- fit_through_inference: its solver settings and weights ----


def _inference_problem():
    sched = rd.VPSDE()
    angle = jnp.arange(8.0) * (2 * jnp.pi / 8)
    means = jnp.stack([jnp.cos(angle), jnp.sin(angle)], axis=1)
    relation = rd.ImplicitDiffusion(
        rd.GaussianMixtureEps(sched, means, 0.05),
        rd.field_nodes(jax.random.key(1), 2, samples=2),
    )
    xs = jnp.linspace(-0.5, 0.5, 3)
    z0 = jnp.stack([xs, jnp.full_like(xs, -0.5)], axis=1)
    return relation, z0, xs**2 - 0.5


RHO = jnp.array([jnp.inf, 0.0])


def _squared_error(z, target):
    return (z[1] - target) ** 2


def _means(relation):
    return relation.pred.means


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
        rd.fit_through_inference(
            relation,
            z0,
            RHO,
            targets,
            _squared_error,
            getkey(),
            epochs=1,
            where=_means,
            progress=False,
            **changes,
        )


@pytest.mark.parametrize("tol", [0.0, -1.0, float("nan")])
def test_task_gradient_refuses_bad_tol_under_jit(tol):
    """`task_gradient` is jitted; the tolerance is fixed when it is traced."""
    relation, z0, targets = _inference_problem()
    with pytest.raises(ValueError, match="`tol` must be a positive, finite"):
        rd.task_gradient(relation, z0, RHO, targets, _squared_error, tol=tol)


def test_fit_through_inference_nan_learning_rate_raises(getkey):
    relation, z0, targets = _inference_problem()
    for progress in (False, True):
        with pytest.raises(FloatingPointError, match="stopped at epoch 0"):
            rd.fit_through_inference(
                relation,
                z0,
                RHO,
                targets,
                _squared_error,
                getkey(),
                epochs=2,
                optimizer=NAN_RATE,
                where=_means,
                max_steps=4,
                progress=progress,
            )


# ---- processes that disagree on `fit`'s arguments ----


@pytest.mark.slow
def test_two_processes_that_disagree_raise_on_both(tmp_path):
    """Each argument that differs between the two processes raises the same
    error on both, naming it and what each holds, instead of hanging one in a
    collective or training parameters that are not replicated."""
    from test_distributed import ROOT, _free_port, _run_group

    coordinator = f"127.0.0.1:{_free_port()}"
    worker = str(ROOT / "tests" / "distributed_agreement_worker.py")
    out = tmp_path / "result"
    commands = [
        [sys.executable, worker, coordinator, "2", str(rank), str(out)]
        for rank in range(2)
    ]
    _run_group(commands, timeout=300, log=tmp_path / "log.txt")
    results = [json.loads(pathlib.Path(f"{out}.{r}").read_text()) for r in (0, 1)]
    want = {
        "steps": ("steps=2", "steps=3"),
        "batch_size": ("batch_size=4", "batch_size=3"),
        "chunk_size": ("chunk_size=1", "chunk_size=2"),
        "t_range": ("t_range[1]=0.2", "t_range[1]=0.30000000000000004"),
        "ema": ("ema=None", "ema=0.9"),
        "key": ("key=key ", "key=key "),
        "pred": ("pred.model", "pred.model"),
        "optimizer": ("step_size=-0.001", "step_size=-0.002"),
        "schedule": ("[10]=1.0", "[10]=2.0"),
        "injected": ("learning_rate']=0.1", "learning_rate']=1.1"),
        "data": ("sha256:", "sha256:"),
    }
    names = {"schedule": "optimizer", "injected": "optimizer"}
    for result in results:
        for case, (zero, one) in want.items():
            message = result[case]
            assert message is not None, case
            name = names.get(case, case)
            assert message.startswith(f"`{name}` differs across processes"), message
            assert f"process 0 holds {name}" in message, message
            assert zero in message.split("; process 1")[0], (case, message)
            assert one in message.split("; process 1")[1], (case, message)
    # both processes give the same message, and then train together
    assert {k: v for k, v in results[0].items() if k != "rank"} == {
        k: v for k, v in results[1].items() if k != "rank"
    }
    assert len(results[0]["losses"]) == 2
    assert len(results[0]["continued"]) == 2
    message = results[0]["opt_state"]
    assert message.startswith("`opt_state` differs across processes"), message
    assert "opt_state.step=2; process 1 holds opt_state.step=3" in message
