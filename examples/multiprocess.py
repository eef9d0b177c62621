"""Filter, train and answer relation queries across processes with `jax.distributed`.

One program, run once per process (one per host, or per accelerator). Each
process holds only its share of every batch; `retrax.shard_batch` joins the
shares into global arrays and `jax.jit` runs each share where it lives. Three
uses, each compared with the same computation in a single process:

1. filtering a batch of signals through ops (`sosfilt`, per-signal `allpole`)
   and an effect chain (`ParametricEQ` into `Compressor`), with the gradients
   of a loss with respect to the chain's parameters and the signals;
2. data-parallel training: `retrax.diffusion.fit(..., mesh=...)` of a noise
   predictor, and an optax loop fitting the effect chain to target signals;
3. a batch of relation queries (`implicit_infer`), with gradients.

Run it on one machine with two processes that this script starts itself:

    python examples/multiprocess.py --spawn 2

or start each process by hand (e.g. in two terminals):

    python examples/multiprocess.py --num-processes 2 --process-id 0 \
        --coordinator 127.0.0.1:12345
    python examples/multiprocess.py --num-processes 2 --process-id 1 \
        --coordinator 127.0.0.1:12345

Under a cluster scheduler (SLURM, Open MPI, Kubernetes), `--cluster` lets
`jax.distributed.initialize()` read the processes and the coordinator from the
scheduler's environment (e.g. `srun python examples/multiprocess.py --cluster`).
`--smoke` runs small sizes; `--bench` times the filtering step instead.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import traceback


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-processes", type=int, default=1)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--coordinator", default=None, help="host:port of process 0")
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="let jax.distributed.initialize() read the cluster's environment",
    )
    parser.add_argument(
        "--spawn", type=int, default=0, help="start this many local processes"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before --spawn gives up"
    )
    parser.add_argument("--smoke", action="store_true", help="small sizes")
    parser.add_argument("--bench", action="store_true", help="time the filtering")
    parser.add_argument("--batch", type=int, default=None, help="signals (--bench)")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls (--bench)")
    parser.add_argument("--out", default=None, help="write the result JSON here")
    return parser.parse_args(argv)


# --8<-- [start:spawn]
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(args) -> int:
    """Start `args.spawn` processes of this script on 127.0.0.1 and wait.

    If one fails, or the timeout passes, the others are killed: a peer left
    waiting in a collective would otherwise wait for the dead one.
    """
    coordinator = f"127.0.0.1:{free_port()}"
    forwarded = [a for a in sys.argv[1:] if not a.startswith("--spawn")]
    if "--spawn" in sys.argv[1:]:  # `--spawn N` as two words
        i = sys.argv[1:].index("--spawn")
        forwarded = sys.argv[1:][:i] + sys.argv[1:][i + 2 :]
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, *forwarded]
            + ["--num-processes", str(args.spawn), "--process-id", str(i)]
            + ["--coordinator", coordinator]
        )
        for i in range(args.spawn)
    ]
    deadline = time.monotonic() + args.timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs):
                break
            if time.monotonic() > deadline:
                print(f"timed out after {args.timeout} s", file=sys.stderr)
                break
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    return 0 if all(c == 0 for c in codes) else 1


# --8<-- [end:spawn]


def main(argv=None) -> dict | None:
    args = parse_args(argv)
    if args.spawn:
        sys.exit(spawn(args))

    # --8<-- [start:initialize]
    import jax

    # CPU collectives between processes go through gloo (GPUs use NCCL and
    # ignore this). Set before the runtime starts.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    # The comparisons with one process are to 1e-12: float64 throughout.
    jax.config.update("jax_enable_x64", True)
    if args.cluster:
        jax.distributed.initialize()  # SLURM & co.: read from the environment
    elif args.num_processes > 1:
        jax.distributed.initialize(
            coordinator_address=args.coordinator,
            num_processes=args.num_processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    # --8<-- [end:initialize]
    if jax.process_count() == 1:
        return run(args)
    try:
        return run(args)
    except BaseException:
        # Exit at once: a normal exit waits (minutes) at the runtime's shutdown
        # barrier for peers that may be stuck waiting for this process.
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)


def run(args) -> dict | None:
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from jax.experimental import multihost_utils

    import retrax
    from retrax import diffusion as rd, relations as rr
    from retrax.filters import Compressor, ParametricEQ
    from retrax.ops import allpole, sosfilt

    rank, count = jax.process_index(), jax.process_count()
    clock = time.perf_counter()

    def phase(name):
        if rank == 0 and os.environ.get("MULTIPROCESS_PHASES"):
            wall, cpu = time.perf_counter() - clock, time.process_time()
            print(f"[{wall:6.1f} s wall, {cpu:6.1f} s CPU] {name}", flush=True)

    mesh = retrax.batch_mesh()
    lead = rank == 0
    if lead:
        print(f"{count} processes, {jax.device_count()} devices: {mesh}")
    rate = 16_000.0

    # ---- the problem, the same on every process (same seeds) ----
    def signals(batch, length, seed=0):
        rng = np.random.default_rng(seed)
        x = 0.3 * rng.standard_normal((batch, length))
        theta = np.linspace(0.2, 2.0, length)[None, :] + rng.uniform(0, 0.5, (batch, 1))
        a = np.stack([-1.8 * np.cos(theta), np.full_like(theta, 0.81)], -1)
        return x, a

    # --8<-- [start:filter]
    sos = jnp.asarray(
        [[0.2, 0.4, 0.2, 1.0, -0.5, 0.3], [1.0, -1.0, 0.0, 1.0, -0.9, 0.0]]
    )

    def process(chain, x, a):
        """One signal through two ops and an effect chain (EQ, compressor)."""
        eq, comp = chain
        return comp(eq(allpole(sosfilt(sos, x), a)))

    def loss(chain, x, a):
        y = jax.vmap(process, in_axes=(None, 0, 0))(chain, x, a)
        return jnp.mean(y**2), y

    # the outputs and the gradients with respect to the chain and the signals
    filter_batch = eqx.filter_jit(jax.value_and_grad(loss, (0, 1), has_aux=True))
    # --8<-- [end:filter]

    chain = (
        ParametricEQ([200.0, 1000.0, 5000.0], [3.0, -2.0, 1.0], sample_rate=rate),
        Compressor(threshold_db=-20.0, ratio=3.0, sample_rate=rate),
    )

    if args.bench:
        return bench(args, mesh, chain, signals, filter_batch)

    batch, length = (8, 256) if args.smoke else (64, 4096)
    x_all, a_all = signals(batch, length)

    # --8<-- [start:shard]
    # Each process holds its share: here cut from a batch every process can
    # compute; a real pipeline loads only its own rows.
    x, a = retrax.shard_batch(retrax.process_share((x_all, a_all)), mesh)
    (_, y), (g_chain, g_x) = filter_batch(chain, x, a)
    # y and g_x are split like x; g_chain is replicated, summed over processes
    # --8<-- [end:shard]

    def gather(tree):
        """The whole of every (split or replicated) array, on every process."""
        return jax.tree.map(
            lambda v: np.asarray(multihost_utils.process_allgather(v, tiled=True)),
            tree,
        )

    def host(tree):
        return jax.tree.map(np.asarray, eqx.filter(tree, eqx.is_array))

    result = {"processes": count, "devices": jax.device_count()}
    result["filter_rows_here"] = [s.data.shape[0] for s in y.addressable_shards]
    got = {"filter": gather((y, g_x)), "filter_chain": host(g_chain)}
    phase("filtering done")

    # ---- training: fit of a noise predictor, data parallel ----
    data = jax.random.normal(jax.random.key(0), (256, 2))
    data = data * jnp.asarray([1.0, 0.5]) + jnp.asarray([0.5, -0.2])
    model = rd.TimeMLP(2, hidden=16, depth=1, key=jax.random.key(1))
    pred = rd.NoisePredictor(model, rd.VPSDE())
    fit_kw = dict(steps=3, batch_size=16, optimizer=optax.adam(1e-2))
    # --8<-- [start:fit]
    # every process calls fit alike; only process 0 shows a progress bar
    run = rd.fit(pred, data, jax.random.key(2), mesh=mesh, progress=lead, **fit_kw)
    trained, fit_losses = run.value, run.losses
    # --8<-- [end:fit]
    got["fit"] = host(trained)
    phase("fit done")

    # ---- training: an optax loop of the effect chain, data parallel ----
    # --8<-- [start:train]
    optimiser = optax.adam(1e-2)
    target = (
        ParametricEQ([150.0, 1200.0, 4000.0], [6.0, -4.0, 2.0], sample_rate=rate),
        Compressor(threshold_db=-25.0, ratio=5.0, sample_rate=rate),
    )

    def chain_loss(chain, x, a, y):
        return jnp.mean((jax.vmap(process, in_axes=(None, 0, 0))(chain, x, a) - y) ** 2)

    @eqx.filter_jit
    def train_step(chain, opt_state, x, a, y):
        value, grads = eqx.filter_value_and_grad(chain_loss)(chain, x, a, y)
        updates, opt_state = optimiser.update(grads, opt_state, chain)
        return eqx.apply_updates(chain, updates), opt_state, value

    def train(chain, x, a):
        (_, y), _ = filter_batch(target, x, a)  # the targets, split like x
        opt_state = optimiser.init(eqx.filter(chain, eqx.is_array))
        for _ in range(3):
            chain, opt_state, value = train_step(chain, opt_state, x, a, y)
        return chain, value

    trained_chain, chain_loss_value = train(chain, x, a)  # x, a split
    # --8<-- [end:train]
    got["chain"] = host(trained_chain)

    # The replicated parameters are the same on every process after the steps.
    def spread(tree):
        leaves = np.concatenate([np.ravel(v) for v in jax.tree.leaves(tree)])
        every = np.asarray(multihost_utils.process_allgather(leaves))
        return float(np.max(np.abs(every - every[0])))

    result["param_spread"] = max(spread(got["fit"]), spread(got["chain"]))
    phase("chain training done")

    # ---- relation queries ----
    # --8<-- [start:queries]
    angles = jnp.linspace(0, 2 * jnp.pi, 48, endpoint=False)
    ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
    mixture = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(48, 0.05))
    nodes = rr.field_nodes(jax.random.key(0), 2, samples=8)
    relation = rr.ImplicitDiffusion(mixture, nodes)
    rho = jnp.array([jnp.inf, 0.0])  # x clamped, y free

    def answers(inputs):
        relation, z0 = inputs
        solve = lambda q: rr.implicit_infer(relation, q, rho, tol=1e-12).value
        z = jax.vmap(solve)(z0)
        return jnp.sum(z[:, 1] ** 2), z

    # the answers, and the gradients with respect to the relation and queries
    answer = eqx.filter_jit(eqx.filter_value_and_grad(answers, has_aux=True))
    # --8<-- [end:queries]
    nq = 8 if args.smoke else 64
    z0_all = np.stack(
        [np.linspace(-0.9, 0.9, nq), np.where(np.arange(nq) % 2 == 0, 0.5, -0.5)], -1
    )
    z0 = retrax.shard_batch(retrax.process_share(z0_all), mesh)
    (_, z), (g_relation, g_z0) = answer((relation, z0))
    got["queries"] = gather((z, g_z0))
    got["query_relation"] = host(g_relation)
    phase("queries done")

    if lead:
        # ---- the same computations in this process alone, on one device ----
        one = jax.local_devices()[0]
        x1, a1 = jax.device_put((jnp.asarray(x_all), jnp.asarray(a_all)), one)
        (_, y1), (g_chain1, g_x1) = filter_batch(chain, x1, a1)
        data1 = jax.device_put(data, one)
        fit1 = rd.fit(pred, data1, jax.random.key(2), progress=False, **fit_kw)
        z0_one = jax.device_put(jnp.asarray(z0_all), one)
        (_, z1), (g_relation1, g_z01) = answer((relation, z0_one))
        ref = {
            "filter": (y1, g_x1),
            "filter_chain": host(g_chain1),
            "fit": host(fit1.value),
            "chain": host(train(chain, x1, a1)[0]),
            "queries": (z1, g_z01),
            "query_relation": host(g_relation1),
        }
        phase("single-process reference done")
        errors = {name: relative_error(got[name], ref[name]) for name in ref}
        result["errors"] = errors
        result["fit_losses"] = [float(v) for v in np.asarray(fit_losses)]
        result["chain_loss"] = float(chain_loss_value)
        labels = {
            "filter": "filtered signals and their gradients",
            "filter_chain": "gradient with respect to the effect chain",
            "fit": "fit, parameters after 3 steps",
            "chain": "effect chain, parameters after 3 optax steps",
            "queries": "relation answers and their gradients",
            "query_relation": "gradient with respect to the relation",
        }
        print(f"max |{count} processes - 1 process| / max |1 process|:")
        for name, err in errors.items():
            print(f"  {labels[name]}: {err:.1e}")
        spread = result["param_spread"]
        print(f"parameters: max difference between the processes {spread:.1e}")
        print("RESULT " + json.dumps(result))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    return result


def relative_error(a, b) -> float:
    import jax
    import numpy as np

    def one(u, v):
        u, v = np.asarray(u), np.asarray(v)
        assert u.shape == v.shape, (u.shape, v.shape)
        scale = np.max(np.abs(v)) or 1.0  # an all-zero leaf: absolute
        return float(np.max(np.abs(u - v)) / scale)

    return max(
        one(u, v) for u, v in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def bench(args, mesh, chain, signals, filter_batch) -> dict:
    """Median wall time of one forward-and-gradient call on the whole batch."""
    import jax
    import numpy as np
    from jax.experimental import multihost_utils

    import retrax

    batch = args.batch or 64
    x_all, a_all = signals(batch, 16_000)
    x, a = retrax.shard_batch(retrax.process_share((x_all, a_all)), mesh)
    jax.block_until_ready(filter_batch(chain, x, a))  # compile
    times = []
    for _ in range(args.repeats):
        multihost_utils.sync_global_devices("start")
        start = time.perf_counter()
        jax.block_until_ready(filter_batch(chain, x, a))
        multihost_utils.sync_global_devices("end")
        times.append(time.perf_counter() - start)
    result = {
        "processes": jax.process_count(),
        "batch": batch,
        "median_s": float(np.median(times)),
        "times_s": times,
    }
    if jax.process_index() == 0:
        print("RESULT " + json.dumps(result))
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f)
    return result


if __name__ == "__main__":
    main()
