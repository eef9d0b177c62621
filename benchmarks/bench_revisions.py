"""Nothing gets slower: warm, jitted user routes timed at two git revisions.

A structural change (one recurrence core, a new solver loop, a new argument
order) should leave every compiled call as fast as before. This script checks
out two revisions of this repository (`git worktree add --detach`, in a
temporary folder removed at the end, also on error) and times the same
routes at both, each route at each revision in its own fresh process
(`python -c <code>` with `PYTHONPATH=<worktree>/src` first; the child fails
loudly if `retrax` is imported from anywhere else, such as this checkout's
editable install). The revisions alternate in every round (base first in
even rounds, head first in odd ones), so slow drifts of a shared machine hit
both alike. The head is a commit too (default `HEAD`): uncommitted changes in
this checkout are not timed.

In each process a route builds its inputs before the clock, jits its calls,
runs each twice (compiling and warming up), then takes the median of as many
calls as fit in about `--budget` seconds (5 to 2,000). The table gives, per
call, the median over `--rounds` rounds at each revision, the ratio head /
base of those medians (above 1: the head is slower), and each revision's
spread over the rounds, (max - min) / median. The code of every route is the
same at both revisions: where the API changed (the ops that take the signal
first on HEAD, a solution module instead of a tuple from `diffusion.fit`),
the call is written so that it runs on both (keywords, attributes read only
through the timed value).

Compiled kernels: retrax loads `src/retrax/_native/_kernels.so` from beside
its own `_native/__init__.py` and nowhere else, and a fresh worktree has none
(the library is built at install, see `hatch_build.py`). Where a revision's
kernel sources (`*.cc`, `*.h`) equal those of this checkout, this checkout's
built library is copied into its worktree, so both revisions run the same
kernels; otherwise `RETRAX_DISABLE_KERNELS=1` is set for both and both run
the pure-JAX loops. The table's header says which, and what `retrax.kernels()`
reported in the children.

Routes (`--routes` picks some by key): `allpole` (order 2, forward and
gradient w.r.t. `a`, float32); `lfilter` (Butterworth order 4, forward and
gradient w.r.t. `(b, a)`, float32); `sosfilt` (8 sections, forward and
gradient w.r.t. `sos`, float64); `sosfiltfilt` (8 sections, (8, 44,100),
float64); `train-step` (one Adam step of `examples/fit_chain.py`'s effect
chain with the multi-resolution STFT loss, 8 x 512 samples; the chain is
written here, so both revisions run the same one); `losses` (`ESRLoss`,
`SISDRLoss`, `MultiResolutionSTFTLoss`, value and gradient, (4, 2, 44,100)
float32); `relation` (the README's `implicit_infer` query and its gradient);
`diffusion-fit` (`retrax.diffusion.fit` of a small MLP, per step); and
`solve-graph` (`solve_graph` on a chain of 100 2-D poses, Gaussian factors).

Run from the repository root, on a quiet machine:
`python benchmarks/bench_revisions.py --base 78f89a2 [--head HEAD]
[--rounds 5] [--cpus 1] [--routes allpole,losses] [--small] [--markdown
PATH]` (`--small` shrinks every size and the time budget for a smoke test).
"""

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile


HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

import bench_first_call  # noqa: E402  (its routes' code strings; no jax at import)


NATIVE = pathlib.Path("src", "retrax", "_native")
KERNELS = "_kernels.so"


# Sizes, by `--small`; the routes' code reads them by name.
SIZES = {
    False: {
        "audio_samples": 44_100,  # 1 s at 44.1 kHz
        "grad_samples": 15_360,  # 60 s at 256 Hz
        "channels": 8,
        "loss_batch": 4,
        "blocks": 8,  # 8 blocks of 512 samples
        "fit_steps": 300,
        "poses": 100,
        "budget_s": 1.0,
    },
    True: {
        "audio_samples": 2_048,  # the STFT loss needs 2,048 samples
        "grad_samples": 256,
        "channels": 2,
        "loss_batch": 1,
        "blocks": 4,
        "fit_steps": 10,
        "poses": 10,
        "budget_s": 0.02,
    },
}


@dataclasses.dataclass(frozen=True)
class Route:
    """One route as code, run in a fresh process: `setup` (imports, inputs
    and jitted functions, before any clock), then each of `calls` (label,
    formatted with SIZES -> expression) timed warm. `per` (an expression)
    divides the times, e.g. into per-step times."""

    setup: str
    calls: dict[str, str]
    x64: bool = False
    per: str = "1"


NOISE = """
import numpy as np
import scipy.signal

rng = np.random.default_rng(0)
"""

# The solutions' answer is `.value` on HEAD, `.z` (implicit queries) and
# `.values` (graphs) before.
ANSWER = """
def answer(solution, old):
    return solution.value if hasattr(solution, "value") else getattr(solution, old)
"""

RING = (
    ANSWER
    + """
import retrax.diffusion as rd
import retrax.relations as rr

angles = jnp.linspace(0, 2 * jnp.pi, 48, endpoint=False)
ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(48, 0.05))
model = rr.ImplicitDiffusion(pred, rr.field_nodes(jax.random.key(0), 2, samples=8))
rho = jnp.array([jnp.inf, 0.0])
query = eqx.filter_jit(lambda m, x: answer(rr.implicit_infer(m, x, rho), "z"))
query_grad = eqx.filter_jit(
    lambda m, x: jax.grad(
        lambda s: answer(rr.implicit_infer(m, jnp.stack([s, x[1]]), rho), "z")[1]
    )(x[0])
)
x = jnp.array([0.6, 0.5])
"""
)

# examples/fit_chain.py's channel strip and its Adam step (the script's "fit"
# snippet), written out here so that both revisions run the same chain. The
# target stands in for the hidden chain's output: the step's cost does not
# depend on its values.
CHAIN = (
    NOISE
    + """
import optax
from retrax.effects import Chain, Distortion, FDNReverb, FeedbackDelay
from retrax.filters import Compressor, ParametricEQ
from retrax.losses import MultiResolutionSTFTLoss

RATE = 16_000
template = Chain(
    [
        ParametricEQ(
            [60.0, 400.0, 3000.0], [5.0, -6.0, 4.0], [0.7, 1.4, 0.7],
            sample_rate=RATE, ordered=True,
        ),
        Compressor(
            threshold_db=-20.0, ratio=4.0, attack_ms=5.0, release_ms=80.0,
            makeup_db=6.0, sample_rate=RATE,
        ),
        Distortion(drive_db=9.0),
        FeedbackDelay(feedback=0.4, mix=0.3, delay_samples=2400),
        FDNReverb(
            t60=0.8, hf_ratio=0.5, mix=0.25, delays=(113, 151, 199, 263),
            sample_rate=RATE,
        ),
    ]
)
x = jnp.asarray(0.3 * rng.standard_normal(blocks * 512), jnp.float32)
target = 0.5 * x
stft_loss = MultiResolutionSTFTLoss()
p = template.to_normalised()
p = jnp.clip(p + rng.uniform(-0.15, 0.15, p.shape), 0.01, 0.99).astype(jnp.float32)

def loss_fn(theta, x, target):
    chain = template.with_normalised(jax.nn.sigmoid(theta))
    return stft_loss(chain(x), target)

optimizer = optax.adam(optax.cosine_decay_schedule(0.03, 300, 0.05))

@jax.jit
def step(theta, state, x, target):
    loss, grad = jax.value_and_grad(loss_fn)(theta, x, target)
    updates, state = optimizer.update(grad, state)
    return optax.apply_updates(theta, updates), state, loss

theta = jnp.log(p / (1 - p))
state = optimizer.init(theta)
"""
)

LOSSES = (
    NOISE
    + """
import retrax.losses as rl

shape = (loss_batch, 2, audio_samples)
pred = jnp.asarray(rng.standard_normal(shape), jnp.float32)
target = jnp.asarray(pred + 0.3 * rng.standard_normal(shape), jnp.float32)
value, grad = {}, {}
for name in ("ESRLoss", "SISDRLoss", "MultiResolutionSTFTLoss"):
    loss = getattr(rl, name)()
    value[name] = jax.jit(loss)
    grad[name] = jax.jit(jax.grad(loss))
"""
)

# tests/diffusion/test_train_sample.py's small setup: an MLP on 2-D data.
# `fit` runs its own jitted chunks of steps; one chunk of all the steps, so
# that none is padded. Its return value differs between revisions (a tuple,
# then a solution module); only the blocked value is timed.
DIFFUSION_FIT = """
import optax
import retrax.diffusion as rd

data = jax.random.normal(jax.random.key(0), (2048, 2), jnp.float32)
model = rd.TimeMLP(2, hidden=32, dtype=jnp.float32, key=jax.random.key(1))
pred = rd.NoisePredictor(model, rd.VPSDE())
optimizer = optax.adam(3e-3)
key = jax.random.key(2)

def train():
    return rd.fit(
        pred, data, key, optimizer=optimizer, steps=fit_steps, batch_size=128,
        progress=False, chunk_size=fit_steps,
    )
"""

# bench_first_call.py's chain of 2-D poses, built the same way
POSE_GRAPH = (
    ANSWER
    + "import retrax.relations as rr\n"
    + bench_first_call.POSE_CHAIN
    + bench_first_call.POSE_GRAPH
    + """
solve = eqx.filter_jit(lambda g: answer(rr.solve_graph(g), "values")["p"])
"""
)

ROUTES = {
    "allpole": Route(
        NOISE
        + """
import retrax.ops as ops

x = jnp.asarray(rng.standard_normal(audio_samples), jnp.float32)
a = jnp.asarray([-2 * 0.9 * np.cos(0.1), 0.81], jnp.float32)  # poles 0.9 e^(+-0.1i)
forward = jax.jit(lambda x, a: ops.allpole(x, a))
grad = jax.jit(jax.grad(lambda a, x: jnp.sum(ops.allpole(x, a) ** 2)))
""",
        {
            "`ops.allpole` K=2, float32 T={audio_samples}": "forward(x, a)",
            "its `jax.grad` w.r.t. `a`": "grad(a, x)",
        },
    ),
    "lfilter": Route(
        NOISE
        + """
import retrax.ops as ops

b, a = (jnp.asarray(c, jnp.float32) for c in scipy.signal.butter(4, 0.2))
x = jnp.asarray(rng.standard_normal(audio_samples), jnp.float32)
forward = jax.jit(lambda b, a, x: ops.lfilter(b, a, x))
grad = jax.jit(
    jax.grad(lambda b, a, x: jnp.sum(ops.lfilter(b, a, x) ** 2), argnums=(0, 1))
)
""",
        {
            "`ops.lfilter` butter(4), float32 T={audio_samples}": "forward(b, a, x)",
            "its `jax.grad` w.r.t. `(b, a)`": "grad(b, a, x)",
        },
    ),
    "sosfilt": Route(
        NOISE
        + """
import retrax.ops as ops

sos = jnp.asarray(scipy.signal.butter(8, [1, 40], "band", fs=256, output="sos"))
x = jnp.asarray(rng.standard_normal(grad_samples))
forward = jax.jit(lambda sos, x: ops.sosfilt(sos, x))
grad = jax.jit(jax.grad(lambda sos, x: jnp.sum(ops.sosfilt(sos, x) ** 2)))
""",
        {
            "`ops.sosfilt` 8 sections, float64 T={grad_samples}": "forward(sos, x)",
            "its `jax.grad` w.r.t. `sos`": "grad(sos, x)",
        },
        x64=True,
    ),
    "sosfiltfilt": Route(
        NOISE
        + """
import retrax.ops as ops

sos = jnp.asarray(scipy.signal.butter(8, [0.01, 0.3], "band", output="sos"))
x = jnp.asarray(rng.standard_normal((channels, audio_samples)))
forward = jax.jit(lambda sos, x: ops.sosfiltfilt(sos, x))
""",
        {
            "`ops.sosfiltfilt` 8 sections, float64 ({channels}, {audio_samples})": (
                "forward(sos, x)"
            )
        },
        x64=True,
    ),
    "train-step": Route(
        CHAIN,
        {
            "Adam step of `fit_chain.py`'s chain, STFT loss ({blocks} x 512)": (
                "step(theta, state, x, target)"
            )
        },
    ),
    "losses": Route(
        LOSSES,
        {
            f"`{name}` {kind}, float32 ({{loss_batch}}, 2, {{audio_samples}})"
            if kind == "value"
            else f"`{name}` gradient": f"{kind}[{name!r}](pred, target)"
            for name in ("ESRLoss", "SISDRLoss", "MultiResolutionSTFTLoss")
            for kind in ("value", "grad")
        },
    ),
    "relation": Route(
        RING,
        {
            "README relation query (`implicit_infer`)": "query(model, x)",
            "its gradient w.r.t. the clamped coordinate": "query_grad(model, x)",
        },
    ),
    "diffusion-fit": Route(
        DIFFUSION_FIT,
        {
            "`diffusion.fit`, MLP 2-32, batch 128, per step ({fit_steps} steps)": (
                "train()"
            )
        },
        per="fit_steps",
    ),
    "solve-graph": Route(
        POSE_GRAPH,
        {"`solve_graph`, a chain of {poses} 2-D poses": "solve(graph)"},
    ),
}

# The child process. It times the routes with these lines at both revisions;
# only `retrax` comes from the revision's worktree.
CHILD = """
import json, os, pathlib, statistics, sys, time
sys.path.append({harness!r})
from _harness import median_ms, pin_cpus

affinity = pin_cpus({cpus!r})  # before jax starts XLA's threads
import jax
jax.config.update("jax_enable_x64", {x64!r})
import equinox as eqx
import jax.numpy as jnp
import retrax

where = pathlib.Path(retrax.__file__).resolve()
if not where.is_relative_to({worktree!r}):
    sys.exit(f"retrax was imported from {{where}}, not from the worktree {worktree}")
ns = dict(jax=jax, jnp=jnp, eqx=eqx, **{sizes!r})
exec({setup!r}, ns)
per = eval({per!r}, ns)
rows = []
for label, call in {calls!r}:
    code = compile(call, label, "eval")
    fn = lambda: jax.block_until_ready(eval(code, ns))
    for _ in range(2):  # compile and warm up
        fn()
    start = time.perf_counter()
    fn()
    once = time.perf_counter() - start
    number = int(min(max(ns["budget_s"] / max(once, 1e-6), 5), 2000))
    rows.append([label, median_ms(fn, number) / per, number])
kernels = {{k: v.active for k, v in retrax.kernels().items()}}
print(json.dumps(dict(rows=rows, retrax=str(where), kernels=kernels,
                      affinity=affinity, jax=jax.__version__)))
"""


def child_code(key: str, worktree: pathlib.Path, small: bool, cpus: str | None):
    route = ROUTES[key]
    sizes = SIZES[small]
    calls = [(label.format(**sizes), call) for label, call in route.calls.items()]
    return CHILD.format(
        harness=str(HERE),
        cpus=cpus,
        x64=route.x64,
        worktree=str(worktree.resolve()),
        sizes=sizes,
        setup=route.setup,
        per=route.per,
        calls=calls,
    )


def run_child(key, worktree, small, cpus, env) -> dict:
    env = dict(env)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(worktree / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    code = child_code(key, worktree, small, cpus)
    # a cwd without a `retrax` folder: `-c` puts it first on sys.path
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=worktree.parent,
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"route {key} failed at {worktree.name}:\n{out.stderr[-3000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def git(*args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def kernel_sources(src: pathlib.Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes()
        for p in sorted(src.iterdir())
        if p.suffix in (".cc", ".h")
    }


def share_kernels(worktrees: list[pathlib.Path]) -> str | None:
    """Copy this checkout's built kernels into every worktree whose kernel
    sources equal this checkout's; `None` if that holds for all, else why
    not (then the caller disables the kernels for all)."""
    built = ROOT / NATIVE / KERNELS
    if not built.is_file():
        return f"this checkout has no built {KERNELS}"
    ours = kernel_sources(ROOT / NATIVE)
    for tree in worktrees:
        if not (tree / NATIVE).is_dir() or kernel_sources(tree / NATIVE) != ours:
            return f"the kernel sources at {tree.name} differ from this checkout's"
    for tree in worktrees:
        shutil.copy2(built, tree / NATIVE / KERNELS)
    return None


@contextlib.contextmanager
def worktrees(revisions: dict[str, str]):
    """`git worktree add --detach` of each revision in a temporary folder,
    removed (and pruned) on the way out, also on error."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="bench_revisions_"))
    made = []
    try:
        for name, commit in revisions.items():
            path = scratch / name
            git("worktree", "add", "--detach", str(path), commit)
            made.append(path)
        yield made
    finally:
        for path in made:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                capture_output=True,
            )
        shutil.rmtree(scratch, ignore_errors=True)
        subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"])


def spread(times: list[float]) -> str:
    if len(times) < 2:
        return "-"
    return f"{100 * (max(times) - min(times)) / statistics.median(times):.0f}%"


def table(labels: list[str], times: dict) -> tuple[list[str], list[str]]:
    """The markdown rows, and the labels where the head is slower by more
    than 5% with the two revisions' ranges apart."""
    lines = [
        "| route | base ms | head ms | head / base | base spread | head spread |",
        "|---|---|---|---|---|---|",
    ]
    slower = []
    for label in labels:
        base, head = times["base"][label], times["head"][label]
        b, h = statistics.median(base), statistics.median(head)
        cells = [label, f"{b:.3f}", f"{h:.3f}", f"{h / b:.2f}"]
        lines.append("| " + " | ".join([*cells, spread(base), spread(head)]) + " |")
        if h > 1.05 * b and min(head) > max(base):
            slower.append(label)
    return lines, slower


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier revision")
    parser.add_argument("--head", default="HEAD", help="the later revision")
    parser.add_argument("--rounds", type=int, default=5, help="fresh processes")
    parser.add_argument("--routes", default=",".join(ROUTES), help="keys, by commas")
    parser.add_argument("--small", action="store_true", help="tiny sizes (smoke)")
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin each route's process to (e.g. 1)",
    )
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table")
    args = parser.parse_args(argv)
    keys = [k for k in args.routes.split(",") if k]
    unknown = sorted(set(keys) - set(ROUTES))
    if unknown:
        parser.error(f"unknown routes {unknown}; choose from {list(ROUTES)}")
    commits = {
        "base": git("rev-parse", "--verify", args.base + "^{commit}"),
        "head": git("rev-parse", "--verify", args.head + "^{commit}"),
    }

    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env.pop("RETRAX_DISABLE_KERNELS", None)
    labels, results = [], []
    times = {"base": {}, "head": {}}
    with worktrees(commits) as trees:
        no_sharing = share_kernels(trees)
        if no_sharing is None:
            kernels = f"both revisions load this checkout's built {KERNELS}"
        else:
            env["RETRAX_DISABLE_KERNELS"] = "1"
            kernels = (
                f"{no_sharing}: RETRAX_DISABLE_KERNELS=1 at both revisions "
                "(pure-JAX loops)"
            )
        tree = dict(zip(commits, trees, strict=True))
        for rnd in range(args.rounds):
            order = ["base", "head"] if rnd % 2 == 0 else ["head", "base"]
            for key in keys:
                for name in order:
                    r = run_child(key, tree[name], args.small, args.cpus, env)
                    results.append(r)
                    for label, ms, _ in r["rows"]:
                        if label not in labels:
                            labels.append(label)
                        times[name].setdefault(label, []).append(ms)
                    print(
                        f"  round {rnd + 1}/{args.rounds} {key} @ {name}: "
                        + ", ".join(f"{ms:.3f} ms" for _, ms, _ in r["rows"]),
                        file=sys.stderr,
                        flush=True,
                    )

    active = sorted({k for r in results for k, on in r["kernels"].items() if on})
    load = os.getloadavg()
    header = (
        f"Warm jitted calls at two revisions: base {args.base} "
        f"({commits['base'][:10]}), head {args.head} ({commits['head'][:10]}); "
        f"medians over {args.rounds} rounds of fresh processes, revisions "
        f"alternating{' (--small sizes)' if args.small else ''}. Kernels: "
        f"{kernels}; active in the children: {', '.join(active) or 'none'}. "
        f"jax {results[0]['jax']}, {os.cpu_count()} CPU cores "
        f"({results[0]['affinity']}), Python {platform.python_version()}, load "
        f"average {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} at the end. "
        "Spread: (max - min) / median over the rounds."
    )
    lines, slower = table(labels, times)
    if args.rounds < 3:
        verdict = "fewer than 3 rounds: no verdict on which routes got slower"
    else:
        verdict = "head slower by more than 5%, outside the base's range: " + (
            "; ".join(slower) if slower else "none"
        )
    text = "\n".join([header, "", *lines, "", verdict])
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    return times


if __name__ == "__main__":
    main()
