"""Peak memory of a gradient over long stereo audio, in bytes per sample.

What a user training on whole songs meets: the jitted gradient of
`mean(y ** 2)` with respect to the filter's coefficients and the signal, on
stereo float32 audio `(2, T)` at 48 kHz, for

- `allpole`: order 2, constant coefficients (the reference: one output);
- `lfilter`: a Butterworth band-pass, order 2 x 2 (`b`, `a` of length 5);
- `sosfilt`: the same design as 4 sections (an order-8 band-pass);
- `chain`: `Chain([ParametricEQ, Compressor, FDNReverb])` (three bands, the
  compressor's defaults, a four-line reverb), with respect to its parameters
  and the signal;
- `chain_segments`: the same chain with `segment_length=65536` (1.4 s at
  48 kHz): its gradient recomputes each segment's forward pass instead of
  keeping every stage's signals.

Each case runs in a fresh process, which builds the signal, compiles the
gradient, returns freed memory to the system (`malloc_trim`), reads its
resident memory (`VmRSS`, the baseline: the interpreter, JAX, the compiled
program and the signal), resets the
kernel's high-water mark (`/proc/self/clear_refs`) and calls the gradient
once; the table gives (`VmHWM` - baseline) / samples (both channels), the
memory the gradient itself needed at its peak, and the ratio to `allpole`'s.
Linux only.

Run: `python benchmarks/bench_gradient_memory.py [--minutes 10]
[--cases allpole,lfilter,sosfilt,chain,chain_segments] [--markdown PATH]`.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parent.parent
RATE = 48_000

CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np

case, length = sys.argv[1], int(sys.argv[2])


def status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024


x = jax.jit(lambda k: jax.random.normal(k, (2, length), jnp.float32))(
    jax.random.key(0)
)
if case == "allpole":
    from retrax.ops import allpole

    params = jnp.asarray([-1.6, 0.81], jnp.float32)
    apply = lambda p, x: jax.vmap(allpole, in_axes=(0, None))(x, p)
elif case in ("lfilter", "sosfilt"):
    import scipy.signal as ss
    from retrax.ops import lfilter, sosfilt

    if case == "lfilter":
        b, a = ss.butter(2, [0.05, 0.2], btype="band")
        params = (jnp.asarray(b, jnp.float32), jnp.asarray(a, jnp.float32))
        apply = lambda p, x: lfilter(p[0], p[1], x)
    else:
        sos = ss.butter(4, [0.05, 0.2], btype="band", output="sos")
        params = jnp.asarray(sos, jnp.float32)
        apply = lambda p, x: sosfilt(p, x)
elif case in ("chain", "chain_segments"):
    import equinox as eqx
    from retrax.effects import Chain, FDNReverb
    from retrax.filters import Compressor, ParametricEQ

    chain = Chain([
        ParametricEQ([100.0, 1000.0, 6000.0], [3.0, -4.0, 2.0], [0.7, 1.0, 0.7],
                     sample_rate=48000.0),
        Compressor(sample_rate=48000.0),
        FDNReverb(t60=0.8, mix=0.25, delays=(113, 151, 199, 263),
                  sample_rate=48000.0),
    ], segment_length=65536 if case == "chain_segments" else None)
    params, static = eqx.partition(chain, eqx.is_inexact_array)
    apply = lambda p, x: eqx.combine(p, static)(x)
else:
    raise SystemExit(f"unknown case {case!r}")


def loss(p, x):
    return jnp.mean(apply(p, x) ** 2)


grad = jax.jit(jax.grad(loss, argnums=(0, 1)))
compiled = grad.lower(params, x).compile()
jax.block_until_ready(x)
import ctypes, gc

gc.collect()
ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system
base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current resident size
out = compiled(params, x)
jax.block_until_ready(out)
peak = status("VmHWM")
finite = all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree.leaves(out))
print("MEMORY " + json.dumps({"base": base, "peak": peak, "finite": finite}))
"""


def run_case(case: str, length: int) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")])
    )
    env.pop("XLA_FLAGS", None)
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, case, str(length)],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY "):
            return json.loads(line[len("MEMORY ") :])
    raise RuntimeError(f"case {case} printed no result:\n{proc.stdout[-2000:]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--cases", default="allpole,lfilter,sosfilt,chain")
    parser.add_argument("--markdown", default=None, help="also write the table here")
    args = parser.parse_args(argv)
    length = int(args.minutes * 60 * RATE)
    samples = 2 * length
    lines = [
        f"Jitted gradient of `mean(y ** 2)` w.r.t. the parameters and the "
        f"signal, stereo float32, {args.minutes:g} min at 48 kHz "
        f"({samples:,} samples); memory at the peak over the process's "
        f"resident size before the call, one fresh process per case.",
        "",
        "| case | baseline MiB | peak over baseline MiB | bytes per sample "
        "| x allpole |",
        "|---|---:|---:|---:|---:|",
    ]
    print("\n".join(lines), flush=True)
    reference = None
    for case in args.cases.split(","):
        r = run_case(case, length)
        extra = r["peak"] - r["base"]
        per_sample = extra / samples
        if case == "allpole":
            reference = per_sample
        ratio = f"{per_sample / reference:.2f}" if reference else "-"
        line = (
            f"| {case} | {r['base'] / 2**20:.0f} | {extra / 2**20:.0f} | "
            f"{per_sample:.1f} | {ratio} |"
        )
        if not r["finite"]:
            line += " (non-finite gradient)"
        print(line, flush=True)
        lines.append(line)
    if args.markdown:
        pathlib.Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
