"""Benchmark retrax's recursive ops against torchlpc and the JAX peers.

Order-2 time-varying all-pole filter, float32, forward and forward+gradient
with respect to every input (x, a, zi), B = 1, 8 and 512 signals (`--batches`),
1 s and 10 s at 44.1 kHz. Peers are optional: a missing one is skipped with a
note. The column `c_loop` is the hardware limit: a plain C loop of the same
recursion (`allpole_loop.c`, shipped with this script and compiled by it with
`cc -O3 -march=native`), forward only, on data already laid out time-major;
its output is checked against retrax's before it is timed.

Then the biquad `lfilter` (constant and time-varying coefficients) and
`ballistics` table of `bench_filters.py` against philtorch and torchcomp.

Run: `python benchmarks/bench_ops.py [--repeats 5] [--number 20] [--quick]`
"""

import argparse
import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, optional_import, print_table, run_table  # noqa: E402

from retrax.ops import allpole  # noqa: E402


ORDER = 2


def make_inputs(batch: int, length: int):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, length)).astype(np.float32)
    # A slowly swept resonance, stable everywhere: radius 0.9, angle varies.
    theta = np.linspace(0.1, 2.5, length)[None, :].repeat(batch, 0)
    a = np.stack([-2 * 0.9 * np.cos(theta), np.full_like(theta, 0.81)], -1)
    zi = rng.standard_normal((batch, ORDER)).astype(np.float32)
    return x, a.astype(np.float32), zi


def jax_case(filt, case: Case, *, batched_fn: bool = False):
    """Time a JAX all-pole `filt(x, a, zi)`: unbatched at B=1, vmapped above."""
    x, a, zi = (jnp.asarray(v) for v in make_inputs(case.params["B"], case.params["T"]))
    if not batched_fn:
        if case.params["B"] == 1:
            x, a, zi = x[0], a[0], zi[0]
            f = filt
        else:
            f = jax.vmap(filt)
    else:
        f = filt

    if case.params["mode"] == "fwd":
        g = jax.jit(f)
    else:

        def loss(x, a, zi):
            return jnp.sum(f(x, a, zi) ** 2)

        g = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    return lambda: jax.block_until_ready(g(x, a, zi))


LOOP_SOURCE = pathlib.Path(__file__).with_name("allpole_loop.c")


def compile_loop(notes: list[str]):
    """`allpole_loop.c` as a shared library, or `None` (with a note)."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        notes.append("c_loop: no C compiler found; skipped")
        return None
    library = pathlib.Path(tempfile.mkdtemp()) / "allpole_loop.so"
    command = [compiler, "-O3", "-march=native", "-shared", "-fPIC"]
    result = subprocess.run(
        [*command, str(LOOP_SOURCE), "-o", str(library)],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        notes.append(f"c_loop: compilation failed ({result.stderr[-300:]}); skipped")
        return None
    loop = ctypes.CDLL(str(library)).allpole2
    pointer = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    loop.argtypes = [pointer] * 5 + [ctypes.c_int64] * 2
    loop.restype = None
    return loop


def loop_case(loop, case: Case):
    """The C loop, forward, on time-major copies of the benchmark's inputs;
    checked against retrax's `allpole` first."""
    if case.params["mode"] != "fwd":
        return None
    batch, length = case.params["B"], case.params["T"]
    x, a, zi = make_inputs(batch, length)
    xt = np.ascontiguousarray(x.T)
    a1, a2 = (np.ascontiguousarray(a[..., k].T) for k in range(ORDER))
    zi = np.ascontiguousarray(zi)
    y = np.empty_like(xt)
    loop(xt, a1, a2, zi, y, batch, length)
    ref = np.asarray(jax.jit(jax.vmap(allpole))(x, a, zi)).T
    scale = np.max(np.abs(ref))
    if not np.max(np.abs(y - ref)) <= 1e-4 * scale:
        raise AssertionError("the C loop's output differs from retrax's allpole")
    return lambda: loop(xt, a1, a2, zi, y, batch, length)


def torch_case(lpc, torch, case: Case):
    x, a, zi = (
        torch.from_numpy(v) for v in make_inputs(case.params["B"], case.params["T"])
    )
    if case.params["mode"] == "fwd":

        def run():
            with torch.no_grad():
                return lpc(x, a, zi)

        return run
    xs = [v.clone().requires_grad_(True) for v in (x, a, zi)]

    def run():
        for v in xs:
            v.grad = None
        lpc(*xs).square().sum().backward()

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="1 s signals only")
    parser.add_argument(
        "--batches", default="1,8,512", help="comma-separated batch sizes"
    )
    parser.add_argument(
        "--no-filters",
        action="store_true",
        help="skip the biquad lfilter and ballistics table (bench_filters.py)",
    )
    parser.add_argument("--filter-rounds", type=int, default=150)
    parser.add_argument("--torch-threads", type=int, default=2)
    args = parser.parse_args()

    notes = []
    libraries = {"retrax": lambda c: jax_case(allpole, c)}
    loop = compile_loop(notes)
    if loop is not None:
        libraries["c_loop"] = lambda c: loop_case(loop, c)
    torch = optional_import("torch", notes)
    torchlpc = optional_import("torchlpc", notes) if torch else None
    if torchlpc is not None:
        torch.set_num_threads(os.cpu_count() or 1)
        libraries["torchlpc"] = lambda c: torch_case(torchlpc.sample_wise_lpc, torch, c)
    faustax_ops = optional_import("faustax.ops", notes)
    if faustax_ops is not None:
        libraries["faustax"] = lambda c: jax_case(faustax_ops.allpole, c)
    korvax_ltv = optional_import("korvax.filter.ltv", notes)
    if korvax_ltv is not None:
        libraries["korvax"] = lambda c: jax_case(korvax_ltv.allpole, c)
    jaxpole = optional_import("jaxpole.filter", notes)
    if jaxpole is not None:
        # jaxpole's filter takes a batch axis itself.
        libraries["jaxpole"] = lambda c: (
            jax_case(jaxpole.allpole, c, batched_fn=True)
            if c.params["T"] < 100_000 and c.params["B"] <= 8
            else None
        )

    lengths = [44_100] if args.quick else [44_100, 441_000]
    batches = [int(b) for b in args.batches.split(",")]
    cases = [
        Case(
            f"allpole K=2 B={b} T={t // 44_100}s {mode}", {"B": b, "T": t, "mode": mode}
        )
        for t in lengths
        for b in batches
        for mode in ("fwd", "grad")
        if b <= 8 or t == 44_100  # a long signal at a large batch: too slow
    ]
    print(
        f"jax {jax.__version__}, {os.cpu_count()} CPU cores, float32, median ms "
        f"over {args.repeats} interleaved repeats of {args.number} calls",
        file=sys.stderr,
    )
    rows = run_table(cases, libraries, repeats=args.repeats, number=args.number)
    print("All-pole filter: ratio = peer / retrax (above 1: retrax is faster)")
    print_table(rows, list(libraries))
    by_name = {row["case"]: row for row in rows}
    if 8 in batches and max(batches) > 8:
        top = max(batches)
        for mode in ("fwd", "grad"):
            small = by_name.get(f"allpole K=2 B=8 T=1s {mode}", {}).get("retrax")
            large = by_name.get(f"allpole K=2 B={top} T=1s {mode}", {}).get("retrax")
            if small and large:
                ratio = (large / top) / (small / 8)
                print(
                    f"retrax {mode}: per-signal cost at B={top} is {ratio:.2f}x "
                    "that at B=8"
                )
    for note in notes:
        print(f"note: {note}")
    if not args.no_filters:
        import bench_filters

        print("\nBiquad lfilter and ballistics (bench_filters.py):")
        bench_filters.run_table(args.filter_rounds, args.torch_threads)


if __name__ == "__main__":
    main()
