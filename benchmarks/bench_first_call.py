"""The first answer: import, trace, compile and run, in a fresh process.

A user waits for the first answer of a script (importing retrax, building the
objects, tracing, compiling and running the first call) more often than for a
warm call. Each route below runs in its own fresh Python process, with JAX's
persistent compilation cache off (`JAX_COMPILATION_CACHE_DIR` unset), and
reports:

- `import`: `import jax` (numpy with it), the first thing the process does,
  before the clock;
- `first call`: from just before `import retrax` to the blocked answer:
  retrax's import, building the inputs and objects, tracing, compiling and
  running the call once. What the route needs from other libraries (scipy's
  filter design, optax) is imported and its inputs drawn before the clock;
- `warm call`: the median of `--repeats` more of the same call in that
  process (no rebuilding: the objects and jitted functions of the first call
  are reused); none for the import routes.

Routes (`--routes` picks some by key): `import retrax` and `import
retrax.ops`; the README's relation query (`implicit_infer` on a ring
mixture) and its gradient with respect to the clamped coordinate; eager
`ops.sosfiltfilt` of an EEG-sized float64 batch (64 channels, 10 minutes at
256 Hz) and eager `ops.lfilter` of one second of float32 audio; the jitted
gradient of a `sosfilt` loss with respect to `sos` (float64, 60 s at 256 Hz);
the first Adam step of `examples/fit_chain.py`'s effect chain; and
`solve_graph` on a 100-pose chain of Gaussian factors (a prior, odometry and
position measurements).

Run from the repository root:
`python benchmarks/bench_first_call.py [--cpus 1] [--repeats 5] [--routes
relation,lfilter] [--small] [--json PATH] [--markdown PATH]` (`--small`
shrinks every size for a smoke test).
"""

import argparse
import dataclasses
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time


# time the checkout this script lives in, even from a venv with another retrax
HERE = pathlib.Path(__file__).resolve().parent
SRC = HERE.parent / "src"
EXAMPLES = HERE.parent / "examples"
sys.path.insert(0, str(HERE))

from _harness import pin_cpus  # noqa: E402  (stdlib only: no jax here)


# Sizes, by `--small`; the routes' code reads them by name.
SIZES = {
    False: {
        "channels": 64,
        "eeg_samples": 153_600,  # 10 minutes at 256 Hz
        "audio_samples": 44_100,  # 1 s at 44.1 kHz
        "grad_samples": 15_360,  # 60 s at 256 Hz
        "blocks": 32,  # fit_chain.py's 32 blocks of 512 samples
        "poses": 100,
    },
    True: {
        "channels": 2,
        "eeg_samples": 1_024,
        "audio_samples": 256,
        "grad_samples": 256,
        "blocks": 8,  # the STFT loss needs 2,048 samples
        "poses": 10,
    },
}


@dataclasses.dataclass(frozen=True)
class Route:
    """One route as code: `setup` runs before the clock (other libraries,
    inputs), `imports` and `build` start the first call, `call` (an
    expression, blocked) is the call itself, timed again warm."""

    label: str  # formatted with SIZES
    imports: str
    setup: str = ""
    build: str = ""
    call: str | None = None
    x64: bool = False


RING = """
angles = jnp.linspace(0, 2 * jnp.pi, 48, endpoint=False)
ring = jnp.stack([jnp.cos(angles), jnp.sin(angles)], -1)
pred = rd.GaussianMixtureEps(rd.VPSDE(), ring, jnp.full(48, 0.05))
model = rr.ImplicitDiffusion(pred, rr.field_nodes(jax.random.key(0), 2, samples=8))
rho = jnp.array([jnp.inf, 0.0])
"""

BAND_PASS = """
import numpy as np
import scipy.signal

sos = scipy.signal.butter(8, [1, 40], btype="band", fs=256, output="sos")
rng = np.random.default_rng(0)
"""

FIT_CHAIN = """
import numpy as np
import optax

sys.path.insert(0, EXAMPLES)
"""

# The Adam step of examples/fit_chain.py (its "fit" snippet), on its chain and
# drum loop. The target stands in for the hidden chain's output (the example
# computes it with a second jitted program): the step's cost does not depend
# on the target's values.
FIT_CHAIN_BUILD = """
length = blocks * fit_chain.BLOCK
dry = fit_chain.drum_loop(length, fit_chain.SAMPLE_RATE)
x = jnp.asarray(dry, jnp.float32)
target = jnp.asarray(0.5 * dry, jnp.float32)
template = fit_chain.hidden_chain()
p_target = template.to_normalised()
offset = np.random.default_rng(1).uniform(-0.15, 0.15, template.n_params)
p_start = jnp.clip(p_target + offset, 0.01, 0.99).astype(jnp.float32)
stft_loss = MultiResolutionSTFTLoss()

def loss_fn(theta):
    chain = template.with_normalised(jax.nn.sigmoid(theta))
    return stft_loss(chain(x), target)

optimizer = optax.adam(optax.cosine_decay_schedule(0.03, 300, 0.05))

@jax.jit
def step(theta, state):
    loss, grad = jax.value_and_grad(loss_fn)(theta)
    updates, state = optimizer.update(grad, state)
    return optax.apply_updates(theta, updates), state, loss

theta = jnp.log(p_start / (1 - p_start))
state = optimizer.init(theta)
"""

POSE_CHAIN = """
import numpy as np

rng = np.random.default_rng(0)
heading = np.linspace(0, 3, poses - 1)
moves = 0.1 * np.stack([np.cos(heading), np.sin(heading)], -1)
truth = np.concatenate([np.zeros((1, 2)), np.cumsum(moves, 0)])
odometry = (moves + 0.01 * rng.standard_normal(moves.shape)).astype(np.float32)
measured = (truth + 0.1 * rng.standard_normal(truth.shape)).astype(np.float32)
"""

POSE_GRAPH = """
graph = rr.FactorGraph(
    {"p": (poses, 2)},
    [
        rr.GaussianFactor.prior(("p", [0]), np.zeros(2, np.float32), 1e4),
        rr.GaussianFactor.between(
            ("p", range(poses - 1)), ("p", range(1, poses)), 1e4, offset=odometry
        ),
        rr.GaussianFactor([("p", range(poses))], np.eye(2, dtype=np.float32),
                          measured, 100.0),
    ],
)
"""

ROUTES = {
    "import": Route("`import retrax`", imports="import retrax"),
    "import-ops": Route("`import retrax.ops`", imports="import retrax.ops"),
    "relation": Route(
        "README relation query (`implicit_infer`)",
        imports="import retrax.relations as rr, retrax.diffusion as rd",
        build=RING,
        call="rr.implicit_infer(model, jnp.array([0.6, 0.5]), rho).value",
    ),
    "relation-grad": Route(
        "its gradient (`jax.grad` of `.value[1]`)",
        imports="import retrax.relations as rr, retrax.diffusion as rd",
        build=RING,
        call="jax.grad(lambda x: rr.implicit_infer(model, jnp.array([x, 0.5]), "
        "rho).value[1])(0.6)",
    ),
    "sosfiltfilt": Route(
        "eager `ops.sosfiltfilt`, order-16 band-pass, float64 "
        "({channels}, {eeg_samples})",
        setup=BAND_PASS + "x = rng.standard_normal((channels, eeg_samples))",
        imports="import retrax.ops as ops",
        call="ops.sosfiltfilt(sos, x)",
        x64=True,
    ),
    "lfilter": Route(
        "eager `ops.lfilter`, Butterworth order 4, float32 T={audio_samples}",
        setup="""
import numpy as np
import scipy.signal

b, a = (c.astype(np.float32) for c in scipy.signal.butter(4, 0.2))
x = np.random.default_rng(0).standard_normal(audio_samples).astype(np.float32)
""",
        imports="import retrax.ops as ops",
        call="ops.lfilter(b, a, x)",
    ),
    "sosfilt-grad": Route(
        "`jax.jit(jax.grad(...))` of a `sosfilt` loss wrt `sos`, float64 "
        "T={grad_samples}",
        setup=BAND_PASS + "x = rng.standard_normal(grad_samples)",
        imports="import retrax.ops as ops",
        build="grad = jax.jit(jax.grad(lambda s: jnp.sum(ops.sosfilt(s, x) ** 2)))",
        call="grad(sos)",
        x64=True,
    ),
    "train-step": Route(
        "first Adam step of `examples/fit_chain.py` ({blocks} x 512 samples)",
        setup=FIT_CHAIN,
        imports="import fit_chain\nfrom retrax.losses import MultiResolutionSTFTLoss",
        build=FIT_CHAIN_BUILD,
        call="step(theta, state)",
    ),
    "solve-graph": Route(
        "`solve_graph`, a chain of {poses} 2-D poses (Gaussian factors)",
        setup=POSE_CHAIN,
        imports="import retrax.relations as rr",
        build=POSE_GRAPH,
        call='rr.solve_graph(graph).value["p"]',
    ),
}


def child(key: str, small: bool, repeats: int, cpus: str | None) -> dict:
    """Run one route in this (fresh) process and time it."""
    affinity = pin_cpus(cpus)  # before jax starts XLA's threads
    route = ROUTES[key]
    start = time.perf_counter()
    import jax

    jax_import = time.perf_counter() - start
    jax.config.update("jax_enable_x64", route.x64)
    jax.config.update("jax_enable_compilation_cache", False)
    import jax.numpy as jnp

    ns = {"jax": jax, "jnp": jnp, "sys": sys, "EXAMPLES": str(EXAMPLES)}
    ns.update(SIZES[small])
    exec(route.setup, ns)
    call = None if route.call is None else compile(route.call, key, "eval")

    start = time.perf_counter()
    exec(route.imports, ns)
    retrax_import = time.perf_counter() - start
    exec(route.build, ns)
    if call is not None:
        jax.block_until_ready(eval(call, ns))
    first = time.perf_counter() - start

    warm = []
    for _ in range(repeats if call is not None else 0):
        start = time.perf_counter()
        jax.block_until_ready(eval(call, ns))
        warm.append(time.perf_counter() - start)
    return {
        "route": key,
        "label": route.label.format(**SIZES[small]),
        "jax_import_s": jax_import,
        "retrax_import_s": retrax_import,
        "first_s": first,
        "warm_s": statistics.median(warm) if warm else None,
        "warm_all_s": warm,
        "affinity": affinity,
        "jax": jax.__version__,
    }


def run_child(key: str, small: bool, repeats: int, cpus: str | None) -> dict:
    env = dict(os.environ, JAX_ENABLE_COMPILATION_CACHE="false")
    env.pop("JAX_COMPILATION_CACHE_DIR", None)  # nothing compiled before counts
    env["PYTHONPATH"] = os.pathsep.join(
        [str(SRC), *filter(None, [env.get("PYTHONPATH")])]
    )
    command = [sys.executable, str(HERE / "bench_first_call.py"), "--child", key]
    command += ["--repeats", str(repeats)] + ["--small"] * small
    command += ["--cpus", cpus] if cpus else []
    out = subprocess.run(command, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"route {key} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def seconds(t: float | None) -> str:
    if t is None:
        return "-"
    if t >= 1:
        return f"{t:.2f} s"
    if t >= 1e-3:
        return f"{1e3 * t:.1f} ms"
    return f"{1e3 * t:.3f} ms"


def table(results: list[dict]) -> list[str]:
    lines = [
        "| route | import | first call | warm call | first / warm |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        ratio = "-" if r["warm_s"] is None else f"{r['first_s'] / r['warm_s']:,.0f}x"
        cells = [
            r["label"],
            seconds(r["jax_import_s"]),
            seconds(r["first_s"]),
            seconds(r["warm_s"]),
            ratio,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", default=",".join(ROUTES), help="keys, by commas")
    parser.add_argument("--repeats", type=int, default=5, help="warm calls")
    parser.add_argument("--small", action="store_true", help="tiny sizes (smoke)")
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin each route's process to (e.g. 1)",
    )
    parser.add_argument("--json", type=pathlib.Path, help="also write the results")
    parser.add_argument("--markdown", type=pathlib.Path, help="also write the table")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(child(args.child, args.small, args.repeats, args.cpus)))
        return None
    keys = [k for k in args.routes.split(",") if k]
    unknown = sorted(set(keys) - set(ROUTES))
    if unknown:
        parser.error(f"unknown routes {unknown}; choose from {list(ROUTES)}")

    results = []
    for key in keys:
        results.append(run_child(key, args.small, args.repeats, args.cpus))
        r = results[-1]
        print(f"  {key}: first {seconds(r['first_s'])}, warm {seconds(r['warm_s'])}",
              file=sys.stderr, flush=True)  # fmt: skip
    load = os.getloadavg()
    header = (
        f"First call in a fresh process (JAX's compilation cache off) and warm "
        f"call (median of {args.repeats}); jax {results[0]['jax']}, "
        f"{os.cpu_count()} CPU cores ({results[0]['affinity']}), Python "
        f"{platform.python_version()}, load average {load[0]:.2f}, "
        f"{load[1]:.2f}, {load[2]:.2f} at the end. import: `import jax`, before "
        "the clock; first call: from just before `import retrax` to the blocked "
        "answer."
    )
    text = "\n".join([header, "", *table(results)])
    print(text)
    if args.markdown:
        args.markdown.write_text(text + "\n")
    if args.json:
        args.json.write_text(json.dumps({"header": header, "routes": results}) + "\n")
    return results


if __name__ == "__main__":
    main()
