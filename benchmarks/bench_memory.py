"""Peak memory of an `allpole` gradient, one fresh process per case.

The case of `bench_ops.py` at ten seconds: the gradient of
`sum(allpole(x, a, zi) ** 2)` with respect to `x`, `a` and `zi`, order 2,
time-varying coefficients, float32, T = 441,000, B = 1 and B = 8 (`jax.vmap`).
Each case runs in a subprocess of its own, which imports retrax, builds the
inputs, compiles the gradient and calls it `--calls` times; its peak resident
memory is `resource.getrusage(RUSAGE_CHILDREN).ru_maxrss` read after it
exits, so each number is one process's peak (the interpreter, JAX and XLA
included: compare numbers of this script with each other). The subprocess
also prints XLA's own accounting of the compiled gradient
(`compile().memory_analysis()`: temporaries, arguments and outputs).

Paths: the compiled kernel (`kernel`), and the pure-JAX `lax.scan`
(`scan`, `RETRAX_DISABLE_KERNELS=1`). With `--baseline-src PATH` the same
cases also run against another source tree (prepended to `PYTHONPATH` in the
subprocess), so that a before/after comparison is one command, e.g.

    git worktree add /tmp/baseline 82fe9f1^1
    python benchmarks/bench_memory.py --baseline-src /tmp/baseline/src

Run: `python benchmarks/bench_memory.py [--length 441000] [--batches 1,8]`
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parent.parent

# Run in the subprocess: one case, then a JSON line of XLA's accounting.
CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from retrax.ops import allpole

batch, length, calls, eager = (int(v) for v in sys.argv[1:5])
rng = np.random.default_rng(0)
x = rng.standard_normal((batch, length)).astype(np.float32)
theta = np.linspace(0.1, 2.5, length, dtype=np.float32)[None, :].repeat(batch, 0)
a = np.stack([-2 * 0.9 * np.cos(theta), np.full_like(theta, 0.81)], -1)
zi = rng.standard_normal((batch, 2)).astype(np.float32)
args = [jnp.asarray(v) for v in (x, a, zi)]
del x, a, theta, zi
f = allpole if batch == 1 else jax.vmap(allpole)
if batch == 1:
    args = [v[0] for v in args]

def loss(x, a, zi):
    return jnp.sum(f(x, a, zi) ** 2)

grad = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
compiled = grad.lower(*args).compile()
stats = compiled.memory_analysis()
if eager:  # `jax.grad` op by op, as an interactive session runs it
    del compiled
    compiled = jax.grad(loss, argnums=(0, 1, 2))
for _ in range(calls):
    jax.block_until_ready(compiled(*args))
info = {"finite": bool(all(np.isfinite(np.asarray(g)).all() for g in compiled(*args)))}
import retrax
status = retrax.kernels().get("allpole")  # absent before the kernel existed
info["kernel"] = bool(status is not None and status.active)
if stats is not None:
    for key in ("temp_size_in_bytes", "argument_size_in_bytes",
                "output_size_in_bytes", "alias_size_in_bytes"):
        info[key] = getattr(stats, key, None)
print("MEMORY " + json.dumps(info))
"""

MIB = 1024 * 1024


def run_case(
    batch: int, length: int, calls: int, src: str, kernels: bool, eager: bool = False
) -> dict:
    """One case in a fresh subprocess: its peak RSS (MiB) and XLA's numbers."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.pop("XLA_FLAGS", None)
    env.pop("RETRAX_DISABLE_KERNELS", None)
    if not kernels:
        env["RETRAX_DISABLE_KERNELS"] = "1"
    # `RUSAGE_CHILDREN` keeps the largest peak of any waited-for child, so
    # each case waits on a throwaway parent of its own: the parent's reading
    # is then the peak of this one case.
    wrapper = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "sys.stdout.write(p.stdout); sys.stderr.write(p.stderr)\n"
        "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(p.returncode)\n"
    )
    command = [sys.executable, "-c", wrapper, sys.executable, "-c", CHILD]
    command += [str(batch), str(length), str(calls), str(int(eager))]
    proc = subprocess.run(command, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"case B={batch} failed:\n{proc.stderr[-3000:]}")
    result = {}
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY "):
            result.update(json.loads(line[len("MEMORY ") :]))
        elif line.startswith("MAXRSS_KB "):
            result["peak_mib"] = int(line.split()[1]) * 1024 / MIB  # Linux: KiB
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=441_000)
    parser.add_argument("--batches", default="1,8", help="comma-separated")
    parser.add_argument("--calls", type=int, default=3, help="calls per process")
    parser.add_argument(
        "--runs",
        type=int,
        default=3,
        help="processes per case: the table gives their median peak and range "
        "(one process's peak RSS varies by tens of MiB from run to run)",
    )
    parser.add_argument(
        "--paths", default="kernel,scan", help="kernel, scan or both (comma)"
    )
    parser.add_argument(
        "--baseline-src",
        default=None,
        help="another source tree (its `src` folder) to measure alongside",
    )
    parser.add_argument(
        "--eager",
        action="store_true",
        help="call `jax.grad` without `jax.jit` (op by op) instead of compiled",
    )
    parser.add_argument("--markdown", default=None, help="also write a table here")
    args = parser.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",")]
    paths = args.paths.split(",")
    trees = [("this tree", str(ROOT / "src"))]
    if args.baseline_src:
        trees.append(("baseline", str(pathlib.Path(args.baseline_src).resolve())))

    # The baseline and this tree alternate within each case, so that a
    # machine whose load changes during the run affects both alike.
    head = (
        "| case | tree | peak RSS MiB | XLA temp MiB | XLA args+out MiB "
        "| all-pole kernel |"
    )
    lines = [
        f"allpole gradient (x, a, zi), order 2, float32, T = {args.length:,}; "
        f"peak RSS of one process per case (`ru_maxrss`; median and range of "
        f"{args.runs} processes), {args.calls} calls each"
        + (", eager (no `jax.jit`)" if args.eager else ", jitted"),
        "",
        head,
        "|---|---|---:|---:|---:|---|",
    ]
    print("\n".join(lines), flush=True)
    results = []
    for batch in batches:
        for path in paths:
            # the trees alternate run by run, so load changes hit them alike
            runs = {tree: [] for tree, _ in trees}
            for _ in range(args.runs):
                for tree, src in trees:
                    runs[tree].append(
                        run_case(
                            batch,
                            args.length,
                            args.calls,
                            src,
                            path == "kernel",
                            args.eager,
                        )
                    )
            for tree, _ in trees:
                r = runs[tree][0]
                peaks = sorted(run["peak_mib"] for run in runs[tree])
                peak = f"{statistics.median(peaks):.0f}"
                if len(peaks) > 1:
                    peak += f" ({peaks[0]:.0f}-{peaks[-1]:.0f})"
                temp = r.get("temp_size_in_bytes")
                io = (r.get("argument_size_in_bytes") or 0) + (
                    r.get("output_size_in_bytes") or 0
                )
                line = (
                    f"| B={batch} {path} | {tree} | {peak} | "
                    + (f"{temp / MIB:.1f}" if temp is not None else "-")
                    + f" | {io / MIB:.1f} | {'yes' if r.get('kernel') else 'no'} |"
                )
                if not all(run.get("finite", True) for run in runs[tree]):
                    line += " (non-finite gradient)"
                print(line, flush=True)
                lines.append(line)
                results.append(
                    {"B": batch, "path": path, "tree": tree, "peaks": peaks, **r}
                )
    if args.markdown:
        pathlib.Path(args.markdown).write_text("\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main()
