"""One process of the cheap two-process test (`tests/distribution/test_distributed.py`).

Run as `distributed_worker.py COORDINATOR NUM_PROCESSES PROCESS_ID OUT`; every
process writes a JSON file `OUT.<process id>` with what it saw. Checks a small
filtered batch against this process alone, and that bad input raises the same
clear error on every process instead of hanging a peer.
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
    import jax.numpy as jnp
    import numpy as np

    import retrax
    from retrax import diffusion as rd
    from retrax.ops import allpole

    result = {"rank": jax.process_index(), "count": jax.process_count()}
    mesh = retrax.batch_mesh()
    rng = np.random.default_rng(0)
    x_all = rng.standard_normal((4, 16))
    a_all = np.stack([np.full((4, 16), -0.5), np.full((4, 16), 0.25)], -1)
    x, a = retrax.shard_batch(retrax.process_share((x_all, a_all)), mesh)
    y = jax.jit(jax.vmap(allpole))(x, a)
    result["rows_here"] = [s.data.shape[0] for s in y.addressable_shards]
    whole = np.asarray(jax.experimental.multihost_utils.process_allgather(y, True))
    alone = np.asarray(jax.vmap(allpole)(jnp.asarray(x_all), jnp.asarray(a_all)))
    result["filter_error"] = float(np.max(np.abs(whole - alone)) / np.max(alone))

    # a batch the processes cannot share evenly
    result["indivisible"] = raised(lambda: retrax.process_share(x_all[:3]))
    # shares of different shapes: process 1 holds one row fewer
    short = retrax.process_share(x_all)[: 2 - rank]
    result["mismatch"] = raised(lambda: retrax.shard_batch(short, mesh))
    # fit: a minibatch that does not split over the devices, data that differ
    data = jnp.asarray(rng.standard_normal((16, 2)))
    model = rd.TimeMLP(2, hidden=4, depth=1, key=jax.random.key(1))
    pred = rd.NoisePredictor(model, rd.VPSDE())
    key = jax.random.key(2)
    kw = dict(steps=1, progress=False, mesh=mesh)
    result["batch_size"] = raised(lambda: rd.fit(pred, data, key, batch_size=3, **kw))
    result["data"] = raised(lambda: rd.fit(pred, data + rank, key, batch_size=4, **kw))
    ckpt = f"{out}.checkpoints"
    result["checkpoint"] = raised(
        lambda: rd.fit(pred, data, key, batch_size=4, checkpoint_dir=ckpt, **kw)
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
