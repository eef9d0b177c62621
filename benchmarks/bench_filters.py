"""Time retrax's biquad `lfilter`/`lfilter_tv` and `ballistics` against their peers.

float32, T = 44,100 (1 s at 44.1 kHz), B = 1 and B = 8 (retrax batches with
`jax.vmap`), forward and gradient with respect to every input. If the peers
are importable (philtorch's C++ DF2 `lfilter`, torchcomp's `compressor_core`,
faustax's `lfilter` and `ballistics`; see `shared/bench/peers.md`), they run
interleaved with retrax in the same process, so the ratios are taken under the
same machine load; a missing peer is skipped with a note. Run from the
repository root, e.g.

    python benchmarks/bench_filters.py
    /path/to/peer-venv/bin/python benchmarks/bench_filters.py --rounds 300

Reports medians (ms) over interleaved rounds; the machine is noisy.
"""

import argparse
import pathlib
import statistics
import sys
import time


# time the checkout this script lives in, even from a venv with another retrax
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import retrax.ops as rops  # noqa: E402


T = 44_100


def median_ms(fns: dict, rounds: int) -> dict:
    """Call every function once per round, interleaved; median ms of each."""
    times = {name: [] for name in fns}
    for fn in fns.values():  # warm up (compile, numba JIT)
        for _ in range(3):
            fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}, {
        name: 1e3 * min(t) for name, t in times.items()
    }


def blocked(f, *args):
    return lambda: jax.block_until_ready(f(*args))


def load_peers(torch_threads):
    peers = {}
    try:
        import faustax.ops

        peers["faustax"] = faustax.ops
    except Exception as err:  # noqa: BLE001 - any failure means "not available"
        print(f"note: faustax not importable ({type(err).__name__}): skipped")
    try:
        import torch

        torch.set_num_threads(torch_threads)
        peers["torch"] = torch
    except ImportError:
        print("note: torch not importable: torch peers skipped")
        return peers
    try:
        from philtorch.lpv import lfilter as plpv
        from philtorch.lti import lfilter as plti

        peers["philtorch"] = (plti, plpv)
    except ImportError:
        print("note: philtorch not importable: skipped")
    try:
        from torchcomp import compressor_core

        peers["torchcomp"] = compressor_core
    except ImportError:
        print("note: torchcomp not importable: skipped")
    return peers


def torch_timer(torch, fn):
    def run():
        with torch.no_grad():
            fn()

    return run


def torch_grad_timer(fn, leaves):
    def run():
        for leaf in leaves:
            leaf.grad = None
        fn().sum().backward()

    return run


def biquad_cases(peers, batch, time_varying, rounds):
    rng = np.random.default_rng(0)
    b = np.array([0.2, 0.4, 0.2], np.float32)
    a = np.array([-0.6, 0.3], np.float32)
    x = rng.normal(size=(batch, T)).astype(np.float32)
    if time_varying:
        wobble = 1 + 0.1 * np.sin(np.linspace(0, 20, T, dtype=np.float32))[:, None]
        b, a = b * wobble, a * wobble
    jb, ja, jx = jnp.asarray(b), jnp.asarray(a), jnp.asarray(x)

    fwd_fns, grad_fns = {}, {}
    if time_varying:

        def ours(b, a, x):
            return rops.lfilter_tv(x, b=b, a=a)

    else:
        # scipy's convention: the denominator with its leading 1
        def ours(b, a, x):
            return rops.lfilter(b, jnp.concatenate([jnp.ones(1, a.dtype), a]), x)

    for name, op in [("retrax", ours), ("faustax", peers.get("faustax"))]:
        if op is None:
            continue
        if name == "faustax":
            op = op.lfilter

        def fwd(b, a, x, op=op):
            return jax.vmap(op, (None, None, 0))(b, a, x)

        def loss(b, a, x, fwd=fwd):
            return jnp.sum(fwd(b, a, x))

        fwd_fns[name] = blocked(jax.jit(fwd), jb, ja, jx)
        grad_fns[name] = blocked(jax.jit(jax.grad(loss, argnums=(0, 1, 2))), jb, ja, jx)
    if "philtorch" in peers:
        torch = peers["torch"]
        plti, plpv = peers["philtorch"]
        tb, ta, tx = (torch.from_numpy(v.copy()) for v in (b, a, x))
        if time_varying:
            call = lambda b, a, x: plpv(b, a, x, form="df2", backend="torchlpc")
        else:
            call = lambda b, a, x: plti(b, a, x, form="df2")
        fwd_fns["philtorch"] = torch_timer(torch, lambda: call(tb, ta, tx))
        leaves = [v.clone().requires_grad_() for v in (tb, ta, tx)]
        grad_fns["philtorch"] = torch_grad_timer(lambda: call(*leaves), leaves)
    return (*median_ms(fwd_fns, rounds), *median_ms(grad_fns, rounds))


def ballistics_cases(peers, batch, rounds):
    rng = np.random.default_rng(1)
    x = np.abs(rng.normal(size=(batch, T))).astype(np.float32)
    at = np.full(batch, 0.3, np.float32)
    rt = np.full(batch, 0.01, np.float32)
    zi = np.ones(batch, np.float32)
    args = tuple(jnp.asarray(v) for v in (x, at, rt, zi))
    fwd_fns, grad_fns = {}, {}
    for name, op in [("retrax", rops.ballistics), ("faustax", peers.get("faustax"))]:
        if op is None:
            continue
        fwd = jax.vmap(op if name == "retrax" else op.ballistics)
        loss = lambda *v, fwd=fwd: jnp.sum(fwd(*v))
        fwd_fns[name] = blocked(jax.jit(fwd), *args)
        grad = jax.grad(loss, argnums=(0, 1, 2, 3))
        grad_fns[name] = blocked(jax.jit(grad), *args)
    if "torchcomp" in peers:
        torch = peers["torch"]
        core = peers["torchcomp"]
        tx, tat, trt, tzi = (torch.from_numpy(v.copy()) for v in (x, at, rt, zi))
        fwd_fns["torchcomp"] = torch_timer(torch, lambda: core(tx, tzi, tat, trt))
        leaves = [v.clone().requires_grad_() for v in (tx, tat, trt, tzi)]
        lx, lat, lrt, lzi = leaves
        grad_fns["torchcomp"] = torch_grad_timer(
            lambda: core(lx, lzi, lat, lrt), leaves
        )
    return (*median_ms(fwd_fns, rounds), *median_ms(grad_fns, rounds))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=2,
        help="torch's intra-op threads (shared/bench/peers.md used 2; on a loaded "
        "machine 1 avoids spinning threads competing with the other processes)",
    )
    args = parser.parse_args()
    run_table(args.rounds, args.torch_threads)


def run_table(rounds: int, torch_threads: int, ballistics: bool = True) -> list:
    """Print the lfilter and (unless not `ballistics`) ballistics table; also
    called by bench_ops.py, which times ballistics itself.

    Returns `(case, peer, retrax ms, peer ms)` for every row."""
    rows = []
    peers = load_peers(torch_threads)
    print(f"jax {jax.__version__}, float32, T = {T}, median ms of {rounds}")
    print(
        f"{'case':<32}{'pass':<6}{'retrax':>9}{'peer':>11}{'peer ms':>9}{'ratio':>8}"
        f"{'min ratio':>10}"
    )
    for batch in (1, 8):
        for label, run in (
            (
                "biquad lfilter LTI",
                lambda batch=batch: biquad_cases(peers, batch, False, rounds),
            ),
            (
                "biquad lfilter time-varying",
                lambda batch=batch: biquad_cases(peers, batch, True, rounds),
            ),
            (
                "ballistics",
                lambda batch=batch: ballistics_cases(peers, batch, rounds),
            ),
        ):
            if label == "ballistics" and not ballistics:
                continue
            fwd, fwd_min, grad, grad_min = run()
            for kind, res, low in (("fwd", fwd, fwd_min), ("grad", grad, grad_min)):
                ours = res.pop("retrax")
                ours_min = low.pop("retrax")
                for peer, ms in res.items() or [("-", float("nan"))]:
                    ratio = ours / ms
                    min_ratio = ours_min / low[peer] if peer in low else ratio
                    if peer != "-":
                        rows.append((f"{label} B={batch} {kind}", peer, ours, ms))
                    print(
                        f"{label + f' B={batch}':<32}{kind:<6}{ours:>9.3f}{peer:>11}"
                        f"{ms:>9.3f}{ratio:>8.2f}{min_ratio:>10.2f}"
                    )
    print("median ms; ratio = retrax / peer (below 1: retrax faster), of medians")
    print("and of the fastest runs (less sensitive to other load on the machine)")
    return rows


if __name__ == "__main__":
    main()
