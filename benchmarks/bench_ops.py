"""Benchmark retrax's recursive ops against plain C loops and the peer libraries.

One run, every timing interleaved with every other (see `_harness.py`), float32:

- `allpole`, order 2, time-varying coefficients, forward and forward + the
  gradient of `sum(y ** 2)` with respect to every input (x, a, zi): B = 1, 8
  and 512 signals of 1 s (44,100 samples; `--batches`) and B = 1 and 8 of
  10 s (not with `--quick`), against torchlpc, faustax, korvax and jaxpole;
  and at B = 8, the gradient batched as a user writes it ("user-grad"): the
  jitted `jax.grad` of a mean squared error against a target of
  `jax.vmap(allpole)` over the `(8, T)` batch, with respect to x, a and zi;
- `allpole` at speech (LPC) orders, 16, 24 and 32 (`--orders`; not with
  `--quick` unless given), time-varying coefficients `(B, T, K)`, forward
  and the gradient of `sum(y ** 2)` with respect to x, a and zi: B = 1, 8
  and 32 signals (`--order-batches`) of 24,000 and 48,000 samples
  (`--order-lengths`), against torchlpc's `sample_wise_lpc` and philtorch's
  all-pole (`philtorch.lpv.allpole`);
- `ballistics` (the switched attack/release one-pole), forward and gradient
  with respect to (x, at, rt, zi), B = 1, 8 and 512 at 1 s, against
  torchcomp's `compressor_core` and faustax's `ballistics`;
- then the biquad `lfilter` table of `bench_filters.py` against philtorch and
  faustax (`--no-filters` skips it).

Peers are optional: a missing one is skipped with a note. A peer's time
counts only after its output (and, for a gradient case, every gradient) matched
retrax's on the same inputs; one that does not is timed but marked "differs"
in the table and left out of the comparisons (korvax 0.3.0's `allpole` does
not apply the recursion; see `shared/bench/peers.md`).

The column `c_loop` is the hardware limit: plain C loops of the same
recursions (`recursion_loops.c`, shipped with this script and compiled by it
with `cc -O3 -march=native`), forward only, on data already laid out
time-major, checked against retrax's output in the same way.

At the end it prints the acceptance lines: retrax's forward against the C
loop, its gradient against the loop's forward, its per-signal cost at the
largest batch against B = 8, and the rows where a peer beats retrax by more
than 5%.

Each repeat takes the median of `--number` calls of every case and library,
or of as many as fit in about `--budget` seconds when fewer (a B = 512
gradient takes seconds a call); the tables give the median over repeats.

Run: `python benchmarks/bench_ops.py [--repeats 5] [--number 20] [--quick]
[--markdown PATH]`; with the peers installed in another environment, e.g.
`PYTHONPATH=src /path/to/peer-venv/bin/python benchmarks/bench_ops.py`.
"""

import argparse
import ctypes
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile


# torchcomp's forward is a numba kernel: with more than one numba thread its
# pool and torch's collide on a small machine (see bench_dynamics.py). This
# must be set before numba loads.
os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402


sys.path.insert(0, os.path.dirname(__file__))
from _harness import Case, optional_import, pin_cpus, run_table  # noqa: E402

from retrax.ops import allpole, ballistics  # noqa: E402


ORDER = 2
SAMPLE_RATE = 44_100
# A peer's output must lie within this fraction of the peak of retrax's (per
# output and per gradient): float32 rounding of the same recursion in another
# order of operations stays far below it, a different computation does not.
TOLERANCE = 1e-3
# "A peer beats retrax": retrax takes more than this factor of the peer's time.
MARGIN = 1.05

# Acceptance targets the summary prints next to each measured ratio.
TARGET_FWD_LOOP = 2.0  # retrax forward / C loop forward
TARGET_GRAD_LOOP = 6.0  # retrax gradient / C loop forward
TARGET_USER_GRAD_LOOP = 4.0  # retrax user-batched gradient / C loop forward
TARGET_PER_SIGNAL = 1.5  # per-signal cost at the largest batch / at B = 8
# At speech orders, B = 8 and 32: torchlpc's time / retrax's, at least.
TARGET_LPC_FWD = 1.0
TARGET_LPC_GRAD = 2.0


def make_inputs(batch: int, length: int):
    """All-pole inputs `(x, a, zi)` of shapes `(B, T)`, `(B, T, 2)`, `(B, 2)`."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, length)).astype(np.float32)
    # A slowly swept resonance, stable everywhere: radius 0.9, angle varies.
    theta = np.linspace(0.1, 2.5, length, dtype=np.float32)[None, :]
    theta = theta.repeat(batch, 0)
    a = np.stack([-2 * 0.9 * np.cos(theta), np.full_like(theta, 0.81)], -1)
    zi = rng.standard_normal((batch, ORDER)).astype(np.float32)
    return x, a.astype(np.float32), zi


def make_ballistics_inputs(batch: int, length: int):
    """Ballistics inputs `(x, at, rt, zi)`: a positive level `(B, T)` and one
    attack and release coefficient and initial value per signal (`(B,)`)."""
    rng = np.random.default_rng(1)
    x = np.abs(rng.standard_normal((batch, length))).astype(np.float32)
    at = np.full(batch, 0.3, np.float32)
    rt = np.full(batch, 0.01, np.float32)
    zi = np.ones(batch, np.float32)
    return x, at, rt, zi


# The pole radius of the speech-order filters. Real LPC filters of speech
# have a few sharper resonances (formants), but the nearer the poles of an
# order-32 filter are to the unit circle, the larger its coefficients and
# gain, and the float32 rounding each library makes in its own order of
# summation with them. At 0.8 a plain float32 loop stays within 2e-5 of the
# peak of the float64 recursion at order 32, far inside TOLERANCE.
LPC_RADIUS = 0.8


def lpc_coefficients(length: int, order: int) -> np.ndarray:
    """Per-sample coefficients `(T, K)` of a stable all-pole filter: `K // 2`
    resonances of radius `LPC_RADIUS` spread over the band, each angle
    sweeping slowly (and a real pole for an odd order), multiplied out in
    float64."""
    t = np.linspace(0.0, 1.0, length)[:, None]
    poly = np.ones((length, 1))
    pairs = order // 2
    for j in range(pairs):
        theta = np.pi * (j + 0.5) / (pairs + 1) * (1 + 0.1 * np.sin(2 * np.pi * t))
        factor = np.concatenate(
            [
                np.ones_like(t),
                -2 * LPC_RADIUS * np.cos(theta),
                np.full_like(t, LPC_RADIUS**2),
            ],
            axis=1,
        )
        grown = np.zeros((length, poly.shape[1] + 2))
        for k in range(3):
            grown[:, k : k + poly.shape[1]] += poly * factor[:, k : k + 1]
        poly = grown
    if order % 2:
        grown = np.zeros((length, poly.shape[1] + 1))
        grown[:, :-1] += poly
        grown[:, 1:] -= 0.5 * poly
        poly = grown
    return poly[:, 1:].astype(np.float32)


def make_lpc_inputs(batch: int, length: int, order: int):
    """Speech-order inputs `(x, a, zi)` of shapes `(B, T)`, `(B, T, K)` and
    `(B, K)`: each signal's coefficients are the same sweep started at
    another sample."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batch, length)).astype(np.float32)
    sweep = lpc_coefficients(length, order)
    shifts = (np.arange(batch) * 997) % max(length, 1)
    a = np.stack([np.roll(sweep, s, axis=0) for s in shifts])
    zi = (0.1 * rng.standard_normal((batch, order))).astype(np.float32)
    return x, a, zi


def inputs(case: Case):
    if case.params.get("op") == "ballistics":
        return make_ballistics_inputs(case.params["B"], case.params["T"])
    if case.params.get("op") == "lpc":
        return make_lpc_inputs(case.params["B"], case.params["T"], case.params["K"])
    return make_inputs(case.params["B"], case.params["T"])


def jax_function(filt, case: Case, *, batched_fn: bool = False):
    """A jitted `filt` (forward) or its gradient on the case's inputs:
    unbatched at B = 1 (unless `batched_fn`), `jax.vmap`ped above."""
    args = [jnp.asarray(v) for v in inputs(case)]
    if batched_fn:
        f = filt
    elif case.params["B"] == 1:
        args = [v[0] for v in args]
        f = filt
    else:
        f = jax.vmap(filt)
    if case.params["mode"] == "fwd":
        return jax.jit(f), args
    if case.params["mode"] == "user-grad":
        # the target a user fits to, closed over as a user's loss does
        target = jnp.asarray(np.random.default_rng(2).standard_normal(args[0].shape))
        target = target.astype(args[0].dtype)

        def loss(*args):
            return jnp.mean((f(*args) - target) ** 2)

        return jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))), args

    def loss(*args):
        return jnp.sum(f(*args) ** 2)

    return jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))), args


def jax_case(filt, case: Case, *, batched_fn: bool = False):
    """Time a JAX op `filt(x, a, zi)` (or `filt(x, at, rt, zi)`): a callable
    that runs it once and waits for the result."""
    g, args = jax_function(filt, case, batched_fn=batched_fn)
    return lambda: jax.block_until_ready(g(*args))


# ---------------------------------------------------------------- checking


class Checks:
    """retrax's outputs (the reference) and every peer's verdict, per case."""

    def __init__(self):
        self.references = {}
        self.verdicts = {}  # (case name, library) -> None (matches) or why not

    def reference(self, case: Case) -> list[np.ndarray]:
        if case.name not in self.references:
            op = ballistics if case.params["op"] == "ballistics" else allpole
            g, args = jax_function(op, case)
            self.references[case.name] = as_numpy(g(*args))
        return self.references[case.name]

    def check(self, case: Case, library: str, outputs) -> None:
        """Compare `outputs` (arrays, in retrax's order) with retrax's."""
        ref = self.reference(case)
        outputs = as_numpy(outputs)
        why = None
        names = ["y"] if case.params["mode"] == "fwd" else self.grad_names(case)
        if len(outputs) != len(ref):
            why = f"{len(outputs)} outputs, retrax has {len(ref)}"
        for name, out, want in zip(names, outputs, ref, strict=False):
            if why:
                break
            if out.size != want.size:
                why = f"{name} has shape {out.shape}, retrax's {want.shape}"
                break
            err = np.max(np.abs(out.reshape(want.shape) - want), initial=0.0)
            scale = np.max(np.abs(want), initial=0.0)
            if not err <= TOLERANCE * scale:  # also catches NaN
                why = f"{name} differs by {err:.3g} (retrax's peak {scale:.3g})"
        self.verdicts[case.name, library] = why
        if why:
            print(
                f"  {case.name} / {library}: output differs from retrax's ({why}); "
                "timed but not counted",
                file=sys.stderr,
                flush=True,
            )

    @staticmethod
    def grad_names(case: Case):
        if case.params["op"] == "ballistics":
            return ["dx", "dat", "drt", "dzi"]
        return ["dx", "da", "dzi"]

    def counts(self, case_name: str, library: str) -> bool:
        return self.verdicts.get((case_name, library)) is None


def as_numpy(outputs) -> list[np.ndarray]:
    if not isinstance(outputs, (tuple, list)):
        outputs = [outputs]
    arrays = []
    for out in outputs:
        if hasattr(out, "detach"):  # a torch tensor
            out = out.detach().numpy()
        arrays.append(np.asarray(out, dtype=np.float32))
    return arrays


def checked_jax(checks: Checks, library: str, filt, case: Case, **kwargs):
    """`jax_case`, after checking the output against retrax's."""
    g, args = jax_function(filt, case, **kwargs)
    checks.check(case, library, g(*args))
    return lambda: jax.block_until_ready(g(*args))


# ---------------------------------------------------------------- C loops


LOOP_SOURCE = pathlib.Path(__file__).with_name("recursion_loops.c")


def compile_loops(notes: list[str]):
    """`recursion_loops.c` as a shared library (`ctypes.CDLL`), or `None`."""
    compiler = shutil.which(os.environ.get("CC", "cc"))
    if compiler is None:
        notes.append("c_loop: no C compiler found; skipped")
        return None
    library = pathlib.Path(tempfile.mkdtemp()) / "recursion_loops.so"
    command = [compiler, "-O3", "-march=native", "-shared", "-fPIC"]
    result = subprocess.run(
        [*command, str(LOOP_SOURCE), "-o", str(library), "-lm"],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        notes.append(f"c_loop: compilation failed ({result.stderr[-300:]}); skipped")
        return None
    lib = ctypes.CDLL(str(library))
    pointer = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    for fn in (lib.allpole2, lib.ballistics):
        fn.argtypes = [pointer] * 5 + [ctypes.c_int64] * 2
        fn.restype = None
    return lib


def loop_case(lib, checks: Checks, case: Case):
    """A C loop, forward, on time-major copies of the case's inputs; its
    output checked against retrax's first."""
    if case.params["mode"] != "fwd" or case.params["op"] == "lpc":
        return None
    batch, length = case.params["B"], case.params["T"]
    if case.params["op"] == "ballistics":
        x, at, rt, zi = inputs(case)
        xt = np.ascontiguousarray(x.T)
        y = np.empty_like(xt)
        args = (xt, at, rt, zi, y, batch, length)
        loop = lib.ballistics
    else:
        x, a, zi = inputs(case)
        xt = np.ascontiguousarray(x.T)
        a1, a2 = (np.ascontiguousarray(a[..., k].T) for k in range(ORDER))
        y = np.empty_like(xt)
        args = (xt, a1, a2, np.ascontiguousarray(zi), y, batch, length)
        loop = lib.allpole2
    loop(*args)
    checks.check(case, "c_loop", y.T)
    return lambda: loop(*args)


# ---------------------------------------------------------------- torch peers


def torch_case(torch, checks: Checks, library: str, call, case: Case):
    """A torch op `call(*tensors)` taking the case's inputs in retrax's order,
    forward (under `no_grad`) or forward + backward of `sum(y ** 2)`."""
    if case.params["mode"] == "user-grad":
        return None
    tensors = [torch.from_numpy(v.copy()) for v in inputs(case)]
    if case.params["mode"] == "fwd":

        def run():
            with torch.no_grad():
                return call(*tensors)

    else:
        leaves = [v.clone().requires_grad_(True) for v in tensors]

        def run():
            for v in leaves:
                v.grad = None
            call(*leaves).square().sum().backward()
            return [v.grad for v in leaves]

    checks.check(case, library, run())
    return run


# ---------------------------------------------------------------- the run


def length_label(length: int) -> str:
    """`T=1s` for whole tenths of a second at 44.1 kHz, else the samples."""
    if length % (SAMPLE_RATE // 10) == 0:
        return f"T={length / SAMPLE_RATE:g}s"
    return f"T={length}"


def order_cases(orders, batches, lengths):
    """The speech-order rows: `allpole` of each order, batch and length."""
    cases = []
    for k in orders:
        for t in lengths:
            for b in batches:
                for mode in ("fwd", "grad"):
                    name = f"allpole K={k} B={b} {length_label(t)} {mode}"
                    params = {"op": "lpc", "K": k, "B": b, "T": t, "mode": mode}
                    cases.append(Case(name, params))
    return cases


def all_cases(batches, lengths):
    cases = []
    for t in lengths:
        for b in batches:
            if b > 8 and t > SAMPLE_RATE:
                continue  # a long signal at a large batch: too slow to repeat
            for mode in ("fwd", "grad"):
                name = f"allpole K=2 B={b} {length_label(t)} {mode}"
                cases.append(
                    Case(name, {"op": "allpole", "B": b, "T": t, "mode": mode})
                )
            if b == 8:
                name = f"allpole K=2 B=8 {length_label(t)} user-grad"
                params = {"op": "allpole", "B": 8, "T": t, "mode": "user-grad"}
                cases.append(Case(name, params))
    for b in batches:
        for mode in ("fwd", "grad"):
            t = lengths[0]
            name = f"ballistics B={b} {length_label(t)} {mode}"
            cases.append(Case(name, {"op": "ballistics", "B": b, "T": t, "mode": mode}))
    return cases


def guarded(library: str, make, notes: list[str]):
    """`make`, but a peer that fails on a case is skipped with a note instead
    of ending the run."""

    def run(case: Case):
        try:
            return make(case)
        except Exception as err:  # noqa: BLE001 - a peer's failure is reported
            notes.append(
                f"{library} failed on {case.name} ({type(err).__name__}: "
                f"{str(err)[:200]}); skipped"
            )
            return None

    return run


def libraries_for(args, checks: Checks, notes: list[str]):
    """Every library's case maker; a maker returns `None` for a case it lacks."""

    def only(op, make):
        return lambda c: make(c) if c.params["op"] == op else None

    libraries = {
        "retrax": lambda c: checked_jax(
            checks,
            "retrax",
            ballistics if c.params["op"] == "ballistics" else allpole,
            c,
        )
    }
    if not args.no_loop:
        lib = compile_loops(notes)
        if lib is not None:
            libraries["c_loop"] = lambda c: loop_case(lib, checks, c)
    if args.no_peers:
        return libraries
    torch = optional_import("torch", notes)
    if torch is not None:
        torch.set_num_threads(args.torch_threads)
        torchlpc = optional_import("torchlpc", notes)
        if torchlpc is not None:
            libraries["torchlpc"] = lambda c: (
                torch_case(torch, checks, "torchlpc", torchlpc.sample_wise_lpc, c)
                if c.params["op"] in ("allpole", "lpc")
                else None
            )
        philtorch_lpv = optional_import("philtorch.lpv", notes)
        if philtorch_lpv is not None:

            def philtorch_allpole(x, a, zi):
                out = philtorch_lpv.allpole(a, x, zi=zi)
                return out[0] if isinstance(out, tuple) else out  # (y, zf)

            libraries["philtorch"] = only(
                "lpc",
                lambda c: torch_case(torch, checks, "philtorch", philtorch_allpole, c),
            )
        torchcomp = optional_import("torchcomp", notes)
        if torchcomp is not None:

            def core(x, at, rt, zi):
                return torchcomp.compressor_core(x, zi, at, rt)

            libraries["torchcomp"] = only(
                "ballistics", lambda c: torch_case(torch, checks, "torchcomp", core, c)
            )
    faustax_ops = optional_import("faustax.ops", notes)
    if faustax_ops is not None:

        def faustax(c):
            if c.params["op"] == "lpc":
                return None
            op = faustax_ops.ballistics if c.params["op"] == "ballistics" else None
            op = op or faustax_ops.allpole
            return checked_jax(checks, "faustax", op, c)

        libraries["faustax"] = faustax
    korvax_ltv = optional_import("korvax.filter.ltv", notes)
    if korvax_ltv is not None:
        libraries["korvax"] = only(
            "allpole", lambda c: checked_jax(checks, "korvax", korvax_ltv.allpole, c)
        )
    jaxpole = optional_import("jaxpole.filter", notes)
    if jaxpole is not None:
        # jaxpole's filter takes a batch axis itself; a long or wide batch
        # takes it minutes to compile.
        libraries["jaxpole"] = only(
            "allpole",
            lambda c: (
                checked_jax(checks, "jaxpole", jaxpole.allpole, c, batched_fn=True)
                if c.params["T"] < 100_000 and c.params["B"] <= 8
                else None
            ),
        )
    return {
        lib: make if lib in ("retrax", "c_loop") else guarded(lib, make, notes)
        for lib, make in libraries.items()
    }


def table(rows, libraries, checks: Checks) -> str:
    """Markdown: retrax's ms, then each library's ms and its ratio to retrax
    (above 1: retrax is faster), "differs" where its output did not match."""
    peers = [lib for lib in libraries if lib != "retrax"]
    peers = [p for p in peers if any(p in row for row in rows)]
    head = ["case", "retrax ms"] + [f"{p} ms (ratio)" for p in peers]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        ours = row.get("retrax")
        cells = [row["case"], f"{ours:.3f}" if ours else "-"]
        for p in peers:
            if p not in row:
                cells.append("-")
                continue
            cell = f"{row[p]:.3f}"
            if ours:
                cell += f" ({row[p] / ours:.2f}x)"
            if not checks.counts(row["case"], p):
                cell += " differs"
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict(value: float, target: float) -> str:
    return (
        f"{value:.2f} (target <= {target:g}: {'met' if value <= target else 'NOT met'})"
    )


def order_acceptance(rows, checks: Checks) -> list[str]:
    """At each speech order, B = 8 and 32 and length: torchlpc's time over
    retrax's, forward (target at least 1) and gradient (at least 2)."""
    lines = []
    for row in rows:
        name = row["case"]
        if name.startswith("allpole K=2 ") or not name.startswith("allpole K="):
            continue
        if " B=1 " in name or not (row.get("retrax") and row.get("torchlpc")):
            continue
        if not (checks.counts(name, "retrax") and checks.counts(name, "torchlpc")):
            continue
        ratio = row["torchlpc"] / row["retrax"]
        target = TARGET_LPC_GRAD if name.endswith(" grad") else TARGET_LPC_FWD
        met = "met" if ratio >= target else "NOT met"
        lines.append(
            f"{name}: torchlpc/retrax = {ratio:.2f} (target >= {target:g}: {met})"
        )
    return lines


def acceptance(rows, checks: Checks, filter_rows, length: int) -> list[str]:
    """The acceptance lines (see the module docstring); `length` is the short
    signals' number of samples."""
    by_name = {row["case"]: row for row in rows}
    lines = order_acceptance(rows, checks)

    def get(name, lib):
        return by_name.get(name, {}).get(lib) if checks.counts(name, lib) else None

    one = length_label(length)
    batches = sorted({int(r["case"].split("B=")[1].split()[0]) for r in rows})
    for b in (1, 8):
        ours = get(f"allpole K=2 B={b} {one} fwd", "retrax")
        loop = get(f"allpole K=2 B={b} {one} fwd", "c_loop")
        if ours and loop:
            ratio = verdict(ours / loop, TARGET_FWD_LOOP)
            lines.append(f"allpole fwd B={b}: retrax/C loop = {ratio}")
    for b in (1, 8):
        ours = get(f"allpole K=2 B={b} {one} grad", "retrax")
        loop = get(f"allpole K=2 B={b} {one} fwd", "c_loop")
        if ours and loop:
            lines.append(
                f"allpole grad B={b}: retrax grad / loop fwd = "
                + verdict(ours / loop, TARGET_GRAD_LOOP)
            )
    ours = get(f"allpole K=2 B=8 {one} user-grad", "retrax")
    loop = get(f"allpole K=2 B=8 {one} fwd", "c_loop")
    if ours and loop:
        lines.append(
            "allpole user-batched grad B=8 (grad of a loss of vmap): retrax / loop "
            "fwd = " + verdict(ours / loop, TARGET_USER_GRAD_LOOP)
        )
    for b in sorted({1, 8, max(batches)}):
        ours = get(f"ballistics B={b} {one} fwd", "retrax")
        loop = get(f"ballistics B={b} {one} fwd", "c_loop")
        if ours and loop:
            target = f" = {verdict(ours / loop, TARGET_FWD_LOOP)}" if b == 8 else ""
            lines.append(
                f"ballistics fwd B={b}: retrax/C loop"
                + (target or f" = {ours / loop:.2f}")
            )
    top = max(batches)
    if 8 in batches and top > 8:
        for prefix in ("allpole K=2", "ballistics"):
            for mode in ("fwd", "grad"):
                small = get(f"{prefix} B=8 {one} {mode}", "retrax")
                large = get(f"{prefix} B={top} {one} {mode}", "retrax")
                if small and large:
                    ratio = (large / top) / (small / 8)
                    lines.append(
                        f"{prefix.split()[0]} per-signal cost B={top} vs B=8 "
                        f"({mode}) = {verdict(ratio, TARGET_PER_SIGNAL)}"
                    )
    beaten = []
    for row in rows:
        ours = row.get("retrax")
        for lib, ms in row.items():
            if lib in ("case", "retrax", "c_loop") or not ours:
                continue
            if checks.counts(row["case"], lib) and ours > MARGIN * ms:
                beaten.append(f"{row['case']}: {lib} {ms:.3f} ms, retrax {ours:.3f} ms")
    for label, lib, ours, ms in filter_rows:
        if ours > MARGIN * ms:
            beaten.append(
                f"{label}: {lib} {ms:.3f} ms, retrax {ours:.3f} ms "
                "(bench_filters.py: outputs not cross-checked)"
            )
    lines.append(
        f"rows where a peer beats retrax by more than {100 * (MARGIN - 1):.0f}%: "
        + (str(len(beaten)) if beaten else "none")
    )
    lines += [f"  - {b}" for b in beaten]
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument(
        "--budget",
        type=float,
        default=2.0,
        help="at most about this many seconds per case and library in a repeat: "
        "a slow call runs fewer than --number times (at least once)",
    )
    parser.add_argument("--quick", action="store_true", help="1 s signals only")
    parser.add_argument(
        "--batches", default="1,8,512", help="comma-separated batch sizes"
    )
    parser.add_argument(
        "--length",
        type=int,
        default=None,
        help="samples of the short signals (default 44,100; 10x for the long)",
    )
    parser.add_argument(
        "--no-filters",
        action="store_true",
        help="skip the biquad lfilter table (bench_filters.py)",
    )
    parser.add_argument(
        "--orders",
        default=None,
        help="comma-separated speech orders of the LPC rows (default 16,24,32; "
        "none with --quick; an empty string: none)",
    )
    parser.add_argument(
        "--order-batches", default="1,8,32", help="batch sizes of the LPC rows"
    )
    parser.add_argument(
        "--only-orders",
        action="store_true",
        help="the LPC rows only (no order-2 all-pole, ballistics or biquad rows)",
    )
    parser.add_argument(
        "--order-lengths", default="24000,48000", help="samples of the LPC rows"
    )
    parser.add_argument("--no-peers", action="store_true", help="retrax and C only")
    parser.add_argument("--no-loop", action="store_true", help="no C loops")
    parser.add_argument("--filter-rounds", type=int, default=150)
    parser.add_argument("--torch-threads", type=int, default=2)
    parser.add_argument(
        "--cpus",
        default=None,
        help="comma-separated CPUs to pin the process to (e.g. 1): on a 2-core "
        "machine, the kernels and the C loops then run on the same core",
    )
    parser.add_argument("--markdown", default=None, help="also write the report here")
    args = parser.parse_args(argv)
    affinity = pin_cpus(args.cpus)

    length = args.length or SAMPLE_RATE
    lengths = [length] if args.quick else [length, 10 * length]
    batches = [int(b) for b in args.batches.split(",")]
    notes = []
    checks = Checks()
    libraries = libraries_for(args, checks, notes)
    cases = [] if args.only_orders else all_cases(batches, lengths)
    orders = (
        args.orders if args.orders is not None else ("" if args.quick else "16,24,32")
    )
    if orders:
        cases += order_cases(
            [int(k) for k in orders.split(",")],
            [int(b) for b in args.order_batches.split(",")],
            [int(t) for t in args.order_lengths.split(",")],
        )
    header = (
        f"jax {jax.__version__}, {os.cpu_count()} CPU cores ({affinity}), float32, "
        "median ms "
        f"over {args.repeats} interleaved repeats of up to {args.number} calls "
        f"(about {args.budget:g} s a case)"
    )
    print(header, file=sys.stderr)
    rows = run_table(
        cases,
        libraries,
        repeats=args.repeats,
        number=args.number,
        budget_s=args.budget or None,
    )

    def is_order_row(name):
        return name.startswith("allpole K=") and not name.startswith("allpole K=2 ")

    sections = [
        (
            "All-pole filter, order 2, time-varying (ratio = peer / retrax):",
            lambda name: name.startswith("allpole K=2 "),
        ),
        (
            "All-pole filter at speech orders (LPC), time-varying "
            "(ratio = peer / retrax):",
            is_order_row,
        ),
        ("Ballistics (ratio = peer / retrax):", lambda n: n.startswith("ballistics")),
    ]
    tables = [header]
    for title, belongs in sections:
        section = [r for r in rows if belongs(r["case"])]
        if section:
            tables += ["", title, "", table(section, libraries, checks)]
    print("\n".join(tables), flush=True)
    filter_rows = []
    if not (args.no_filters or args.only_orders):
        import bench_filters

        print("\nBiquad lfilter (bench_filters.py):", flush=True)
        filter_rows = bench_filters.run_table(
            args.filter_rounds, args.torch_threads, ballistics=False
        )
    report = ["", "Acceptance:", ""]
    report += acceptance(rows, checks, filter_rows, length)
    report += [""] + [f"note: {n}" for n in notes]
    differing = sorted({lib for (_, lib), why in checks.verdicts.items() if why})
    if differing:
        report.append(
            "note: output differs from retrax's, times not counted: "
            + ", ".join(differing)
        )
    print("\n".join(report))
    if args.markdown:
        pathlib.Path(args.markdown).write_text("\n".join(tables + report) + "\n")
    return rows


if __name__ == "__main__":
    main()
