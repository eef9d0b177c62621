"""Compile time of the effect modules and of an effect chain: a user's first call.

For every effect (and for an EQ -> compressor -> reverb chain), the first
call of the forward and of the gradient, as a user writes them: a stereo
float32 signal `(2, 44100)` (one second at 44.1 kHz), the effect built from
its normalised parameters `p` (`effect.with_normalised(p)`, as a controller
or a fit does) and the gradient of a loss with respect to `p`. The loss is
the mean squared error against a fixed target, or (rows marked `stft`)
auraloss's multi-resolution STFT loss (`retrax.losses.MultiResolutionSTFTLoss`,
its defaults), as in `examples/fit_chain.py`.

Every measurement runs in a fresh Python process with JAX's persistent
compilation cache off, so nothing is cached, and splits the first call into
its stages: `jax.jit(f).trace(...)` (Python tracing), `.lower()` (to
StableHLO), `.compile()` (XLA) and the first run. It also records where the
time goes: the number of jaxpr equations (counting those inside nested
jaxprs: `jit`, `cond`, `scan`, `custom_jvp` bodies) and the size of the
lowered program's text. The table shows the median over `--repeats`
processes of each stage.

`--src DIR` (repeatable) times the same rows against other source trees (for
instance an earlier commit's `src`, from `git archive`), alternating the trees
within each repeat, so that a shared machine's drifts hit them alike.

Run from the repository root:
`PYTHONPATH=src python benchmarks/bench_compile.py [--repeats 3]
[--rows eq-grad-stft,chain-grad-stft] [--src OTHER/src] [--markdown PATH]`.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time


SR = 44_100
SHAPE = (2, SR)  # stereo, one second

# The rows' effects, built in the child process (`_effect`).
EFFECTS = (
    "Gain",
    "ParametricEQ",
    "Biquad",
    "SVF",
    "Compressor",
    "DaspCompressor",
    "Distortion",
    "Delay",
    "FeedbackDelay",
    "PingPongDelay",
    "Chorus",
    "FDNReverb",
    "Freeverb",
    "NoiseShapedReverb",
    "StereoPanner",
    "StereoWidener",
    "Chain",
)
HEADLINE = ("ParametricEQ", "Chain")  # also timed with the STFT loss


def _rows() -> list[str]:
    rows = []
    for name in EFFECTS:
        rows += [f"{name}-fwd", f"{name}-grad"]
        if name in HEADLINE:
            rows.append(f"{name}-grad-stft")
    return rows


def _effect(name: str):
    """The effect of a row, float32 (built in the child)."""
    import jax
    import jax.numpy as jnp

    from retrax import effects as fx
    from retrax.filters import Compressor, ParametricEQ

    f32 = jnp.float32

    def eq():
        freqs = jnp.asarray([80.0, 200.0, 500.0, 1500.0, 5000.0, 12000.0], f32)
        gains = jnp.asarray([3.0, -2.0, 1.0, 2.0, -3.0, 4.0], f32)
        return ParametricEQ(freqs, gains, jnp.full(6, 0.9, f32), SR)

    def compressor():
        return Compressor(
            threshold_db=f32(-20.0), ratio=f32(4.0), attack_ms=f32(5.0),
            release_ms=f32(80.0), makeup_db=f32(3.0), sample_rate=SR,
        )  # fmt: skip

    def reverb():
        return fx.FDNReverb(t60=f32(0.8), mix=f32(0.25), sample_rate=SR)

    makers = {
        "Gain": lambda: fx.Gain(f32(-3.0)),
        "ParametricEQ": eq,
        "Biquad": lambda: fx.Biquad(jnp.asarray([0.5, 0.1, 0.2], f32), f32(0.8)),
        "SVF": lambda: fx.SVF(f32(1000.0), f32(0.9), sample_rate=SR),
        "Compressor": compressor,
        "DaspCompressor": lambda: fx.DaspCompressor(sample_rate=SR),
        "Distortion": lambda: fx.Distortion(f32(12.0)),
        "Delay": lambda: fx.Delay(),
        "FeedbackDelay": lambda: fx.FeedbackDelay(delay_samples=4410),
        "PingPongDelay": lambda: fx.PingPongDelay(),
        "Chorus": lambda: fx.Chorus(),
        "FDNReverb": reverb,
        "Freeverb": lambda: fx.Freeverb(sample_rate=SR),
        "NoiseShapedReverb": lambda: fx.NoiseShapedReverb(key=jax.random.key(0)),
        "StereoPanner": lambda: fx.StereoPanner(f32(0.3)),
        "StereoWidener": lambda: fx.StereoWidener(f32(1.5)),
        "Chain": lambda: fx.Chain([eq(), compressor(), reverb()]),
    }
    effect = makers[name]()
    # float32 throughout: the user's signal is float32
    return jax_tree_astype(effect, f32)


def jax_tree_astype(tree, dtype):
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    def cast(leaf):
        if eqx.is_array(leaf) and jnp.issubdtype(leaf.dtype, jnp.floating):
            return leaf.astype(dtype)
        return leaf

    return jax.tree.map(cast, tree)


def _count_eqns(jaxpr) -> int:
    """Equations of `jaxpr`, counting those of nested jaxprs too."""
    from jax.extend import core

    total = 0
    for eqn in jaxpr.eqns:
        total += 1
        for value in eqn.params.values():
            for sub in value if isinstance(value, list | tuple) else (value,):
                if isinstance(sub, core.ClosedJaxpr):
                    total += _count_eqns(sub.jaxpr)
                elif isinstance(sub, core.Jaxpr):
                    total += _count_eqns(sub)
    return total


def child(row: str) -> dict:
    """Time one row's first call in this (fresh) process."""
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp
    import numpy as np

    from retrax.losses import MultiResolutionSTFTLoss

    name, mode, *rest = row.split("-")
    effect = _effect(name)
    rng = np.random.default_rng(0)
    x = jnp.asarray(0.1 * rng.standard_normal(SHAPE), jnp.float32)
    p = effect.to_normalised()
    target = jax.block_until_ready(effect(x)) * 0.5
    if rest == ["stft"]:
        loss = MultiResolutionSTFTLoss()
    else:

        def loss(y, t):
            return jnp.mean((y - t) ** 2)

    def forward(p, x, target):
        return effect.with_normalised(p)(x)

    def objective(p, x, target):
        return loss(effect.with_normalised(p)(x), target)

    fn = forward if mode == "fwd" else jax.grad(objective)
    args = (p, x, target)
    start = time.perf_counter()
    traced = jax.jit(fn).trace(*args)
    traced_at = time.perf_counter()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    compiled = lowered.compile()
    compiled_at = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    ran_at = time.perf_counter()
    return {
        "trace": traced_at - start,
        "lower": lowered_at - traced_at,
        "compile": compiled_at - lowered_at,
        "run": ran_at - compiled_at,
        "build": compiled_at - start,
        "total": ran_at - start,
        "eqns": _count_eqns(traced.jaxpr.jaxpr),
        "hlo_kchars": len(lowered.as_text()) / 1e3,
    }


def _run_child(row: str, src: str | None) -> dict:
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    if src is not None:
        env["PYTHONPATH"] = os.path.abspath(src)
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--child", row],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{row} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


STAGES = ("trace", "lower", "compile", "run", "build", "total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", default=None, help="comma-separated rows")
    parser.add_argument("--src", action="append", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(child(args.child)))
        return
    rows = args.rows.split(",") if args.rows else _rows()
    unknown = sorted(set(rows) - set(_rows()))
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; rows are {_rows()}")
    sources = args.src or [None]
    results = {(row, src): [] for row in rows for src in sources}
    for repeat in range(args.repeats):
        for row in rows:
            order = sources if repeat % 2 == 0 else sources[::-1]
            for src in order:
                results[row, src].append(_run_child(row, src))
                r = results[row, src][-1]
                print(
                    f"[{repeat}] {row:28s} {src or 'this tree'}: total "
                    f"{r['total']:.2f} s (compile {r['compile']:.2f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    header = (
        "| row | source | trace (s) | lower (s) | compile (s) | first run (s) "
        "| trace+lower+compile (s) | total (s) | jaxpr eqns | HLO (kchars) |"
    )
    lines = [
        f"Compile time, first call in a fresh process (no compilation cache), "
        f"float32 `{SHAPE}`; medians of {args.repeats} processes. "
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python "
        f"{platform.python_version()}.",
        "",
        header,
        "|" + "---|" * 10,
    ]
    for row in rows:
        for src in sources:
            runs = results[row, src]
            med = {k: statistics.median(r[k] for r in runs) for k in STAGES}
            lines.append(
                f"| {row} | {src or 'this tree'} | "
                + " | ".join(f"{med[k]:.2f}" for k in STAGES)
                + f" | {runs[0]['eqns']} | {runs[0]['hlo_kchars']:.0f} |"
            )
    if len(sources) > 1:
        lines += ["", "| row | total ratio (each source / the first) |", "|---|---|"]
        for row in rows:
            base = statistics.median(r["total"] for r in results[row, sources[0]])
            ratios = [
                statistics.median(r["total"] for r in results[row, src]) / base
                for src in sources[1:]
            ]
            lines.append(f"| {row} | " + ", ".join(f"{q:.2f}" for q in ratios) + " |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
