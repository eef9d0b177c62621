"""One process of the two-process agreement test
(`tests/distribution/test_distributed.py`).

Run as `distributed_agreement_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID
OUT`; every process writes a JSON file `OUT.<process id>` with the error that
each disagreeing `fit` raised there (or `None`), then the losses of a run on
which both agree.
"""

import json
import os
import sys
import traceback

import jax


jax.config.update("jax_cpu_collectives_implementation", "gloo")
jax.config.update("jax_enable_x64", True)


def raised(f):
    try:
        f()
    except ValueError as err:
        return str(err)
    return None


def main(coordinator, count, rank, out):
    jax.distributed.initialize(
        coordinator, num_processes=count, process_id=rank, initialization_timeout=60
    )
    import equinox as eqx
    import jax.numpy as jnp
    import numpy as np
    import optax

    import retrax
    from retrax import diffusion as rd

    mesh = retrax.batch_mesh()
    rng = np.random.default_rng(0)
    data = jnp.asarray(rng.standard_normal((16, 2)))
    model = rd.TimeMLP(2, hidden=4, depth=1, key=jax.random.key(1))
    pred = rd.NoisePredictor(model, rd.VPSDE())
    other = rd.NoisePredictor(
        rd.TimeMLP(2, hidden=4, depth=1, key=jax.random.key(1 + rank)), rd.VPSDE()
    )
    key = jax.random.key(2)
    adam = optax.adam(1e-3)
    base = dict(steps=2, batch_size=4, progress=False, mesh=mesh, optimizer=adam)
    cases = {
        "steps": dict(steps=2 + rank),
        # 3 is no multiple of the 2 devices: one process alone would refuse it
        "batch_size": dict(batch_size=4 - rank),
        "chunk_size": dict(chunk_size=1 + rank),
        "t_range": dict(t_range=(1e-3, 0.2 + 0.1 * rank)),
        "ema": dict(ema=None if rank == 0 else 0.9),
        "key": dict(key=jax.random.key(2 + rank)),
        "pred": dict(pred=other),
        "optimizer": dict(optimizer=optax.adam(1e-3 * (1 + rank))),
        "schedule": dict(
            optimizer=optax.sgd(
                optax.piecewise_constant_schedule(1e-3, {10: 1.0 + rank})
            )
        ),
        "injected": dict(
            optimizer=optax.inject_hyperparams(optax.sgd)(learning_rate=0.1 + rank)
        ),
        "data": dict(data=data + rank),
    }
    result = {"rank": jax.process_index()}
    for name, changes in cases.items():
        kw = {"pred": pred, "data": data, "key": key, **base, **changes}
        result[name] = raised(
            lambda kw=kw: rd.fit(kw.pop("pred"), kw.pop("data"), kw.pop("key"), **kw)
        )
    # after all that, a run on which both agree trains
    run = rd.fit(pred, data, key, **base)
    losses, state = run.losses, run.state
    result["losses"] = np.asarray(losses).tolist()
    # a continued run compares its (replicated, global) `opt_state` too
    more = rd.fit(pred, data, key, **base, opt_state=state).losses
    result["continued"] = np.asarray(more).tolist()
    later = eqx.tree_at(lambda s: s.step, state, state.step + rank)
    result["opt_state"] = raised(
        lambda: rd.fit(pred, data, key, **base, opt_state=later)
    )
    with open(f"{out}.{rank}", "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    coordinator, count, rank, out = sys.argv[1:]
    try:
        main(coordinator, int(count), int(rank), out)
    except BaseException:
        # exit at once, not after the runtime's shutdown barrier waits for peers
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
