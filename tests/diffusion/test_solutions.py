"""Every public sampler, solve and trainer of `retrax.diffusion` answers in one
shape: an `AbstractSolution` with its answer as `value`, a `result`, `stats`
holding `num_steps` once, and the `throw=` argument."""

import dataclasses
import inspect
import typing
import warnings

import equinox as eqx
import jax
import jax.numpy as jnp
import pytest

import retrax.diffusion as rd
from helpers import fit_kwargs, tiny_training_problem


SCHED = rd.VPSDE()
MIX = rd.GaussianMixtureEps(
    SCHED,
    jnp.array([[1.0, 0.5], [-1.0, 0.0]]),
    jnp.array([0.3, 0.5]),
    jnp.array([0.6, 0.4]),
)
H = jnp.array([[1.0, 0.5]])
Y = jnp.array([0.4])


def _returns_a_solution(f) -> type | None:
    """The `AbstractSolution` subclass `f`'s return annotation names, if any."""
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    if not inspect.isfunction(f):
        return None
    hint = typing.get_type_hints(f).get("return")
    if inspect.isclass(hint) and issubclass(hint, rd.AbstractSolution):
        return hint
    return None


# `fit_solution` is deprecated: `fit` under its old name, with `fit`'s
# arguments passed through
DEPRECATED = {"fit_solution"}


def _public_solvers() -> dict[str, typing.Any]:
    found = {}
    for name in dir(rd):
        obj = getattr(rd, name)
        if name.startswith("_") or inspect.isclass(obj) or name in DEPRECATED:
            continue
        if _returns_a_solution(obj) is not None:
            found[name] = obj
    return found


def _call(name, key):
    """One small call of each public solver, with its default `throw=True`."""
    calls = {
        "sample_ancestral": lambda: rd.sample_ancestral(MIX, key, 2, steps=8),
        "sample_euler_maruyama": lambda: rd.sample_euler_maruyama(MIX, key, 2, steps=8),
        "sample_ddim": lambda: rd.sample_ddim(MIX, key, 2, steps=8),
        "sample_ode": lambda: rd.sample_ode(MIX, key, 2),
        "sample_conditional": lambda: rd.sample_conditional(
            MIX, key, jnp.array([True, False]), jnp.array([0.5, 0.0]), steps=8
        ),
        "sample_dps": lambda: rd.sample_dps(MIX, key, H, Y, 0.3, steps=8),
        "sample_tweedie_projection": lambda: rd.sample_tweedie_projection(
            MIX, key, H, Y, 0.3, steps=8
        ),
        "log_likelihood": lambda: rd.log_likelihood(MIX, jnp.array([0.5, 0.2])),
        "reddiff_solve": lambda: rd.reddiff_solve(
            MIX,
            rd.REDDiff(steps=8),
            jnp.zeros(2),
            lambda x: H.T @ (H @ x - Y),
            key=key,
        ),
        "prox_infer": lambda: rd.prox_infer(
            rd.MixtureProx(MIX),
            jnp.array([0.5, 0.0]),
            jnp.array([jnp.inf, 0.0]),
            0.01,
        ),
        "proxdm_sample": lambda: rd.proxdm_sample(
            rd.MixtureProx(MIX), key, 2, steps=8, hybrid=True
        ),
        "fit": lambda: rd.fit(
            *tiny_training_problem(lambda: jax.random.fold_in(key, 1)),
            key,
            **fit_kwargs(steps=3),
        ),
    }
    return calls[name]()


def test_every_solver_is_walked():
    # a new public solver needs a call in `_call`, and is then checked below
    assert set(_public_solvers()) == {
        "fit",
        "log_likelihood",
        "prox_infer",
        "proxdm_sample",
        "reddiff_solve",
        "sample_ancestral",
        "sample_conditional",
        "sample_ddim",
        "sample_dps",
        "sample_euler_maruyama",
        "sample_ode",
        "sample_tweedie_projection",
    }


@pytest.mark.parametrize("name", sorted(_public_solvers()))
def test_solver_answers_in_one_shape(name, getkey):
    f = _public_solvers()[name]
    throw = inspect.signature(f).parameters.get("throw")
    assert throw is not None and throw.default is True
    kind = _returns_a_solution(f)
    fields = [field.name for field in dataclasses.fields(kind)]
    assert fields[0] == "value"
    assert {"result", "stats"} <= set(fields)
    # the step count lives in `stats` only
    assert "steps" not in fields and "num_steps" not in fields
    with warnings.catch_warnings():
        # the answer's own names, not a deprecated one, are read below
        warnings.simplefilter("error", DeprecationWarning)
        sol = _call(name, getkey())
        assert isinstance(sol, kind)
        assert sol.result == rd.RESULTS.successful
        assert set(sol.stats) >= {"num_steps"}
        assert int(sol.stats["num_steps"]) > 0
        leaves = jax.tree.leaves(eqx.filter(sol.value, eqx.is_inexact_array))
        assert leaves and all(bool(jnp.all(jnp.isfinite(v))) for v in leaves)


@pytest.mark.parametrize(
    "kind, old",
    [
        (rd.Sample, "x"),
        (rd.ProxSample, "x"),
        (rd.REDDiffSolution, "x"),
        (rd.ProxSolution, "z"),
        (rd.LogLikelihood, "log_p"),
        (rd.TrainSolution, "pred"),
    ],
)
def test_old_answer_names_read_value_and_warn(kind, old):
    # only the answer is set: the old name reads nothing else
    sol = object.__new__(kind)
    object.__setattr__(sol, "value", jnp.arange(3.0))
    with pytest.warns(
        DeprecationWarning, match=rf"`{kind.__name__}\.{old}` .*`\.value`"
    ):
        got = getattr(sol, old)
    assert got is sol.value
