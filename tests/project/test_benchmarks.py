"""The benchmark scripts run end to end, at tiny sizes and without peers.

They run in a fresh process with `PYTHONPATH=src` (this session's x64 mode is
not theirs), compiled as this session compiles (conftest.py: XLA's CPU fusion
emitters off and most optimisation passes skipped): at these sizes the times
mean nothing and compiling is most of the run, while the values the scripts
check against scipy and the C loops do not depend on the passes. Each starts a
process and compiles its programs afresh, so they run in the slow set.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import jax
import pytest


pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).parents[2]
FUSION_EMITTERS_OFF = "--xla_cpu_use_fusion_emitters=false"


def _compile_as_this_session(env: dict) -> None:
    """Pass this session's compilation choices (conftest.py) on to a fresh
    process in `env`, and none of its other XLA flags."""
    session_flags = os.environ.get("XLA_FLAGS", "").split()
    env["XLA_FLAGS"] = (
        FUSION_EMITTERS_OFF if FUSION_EMITTERS_OFF in session_flags else ""
    )
    env["JAX_DISABLE_MOST_OPTIMIZATIONS"] = str(
        jax.config.read("jax_disable_most_optimizations")
    )


def test_bench_effects_smoke(tmp_path):
    table = tmp_path / "bench_effects.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    _compile_as_this_session(env)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_effects.py"),
            "--smoke",
            "--no-peers",
            "--markdown",
            str(table),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = table.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    # every effect (the reverb twice) at both batch sizes, forward and
    # gradient; every loss at both batch sizes, forward and gradient, jitted
    # and eager (as a torch user calls it)
    assert len(rows) == (9 + 1) * 2 * 2 + 4 * 2 * 2 * 2
    eager = [row for row in rows if "eager" in row]
    assert len(eager) == 4 * 2 * 2
    for row in rows:
        retrax_ms = float(row.split("|")[2])
        assert retrax_ms > 0


def _run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """`benchmarks/<script> args` in a fresh process on this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    _compile_as_this_session(env)
    env.pop("RETRAX_DISABLE_KERNELS", None)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _table_rows(text: str, title: str) -> list[list[str]]:
    """The body rows of the markdown table that follows the line `title`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(title))
    rows = []
    for line in lines[start + 1 :]:
        if line.startswith("| ") and not rows and "---" not in line:
            rows.append(None)  # the header
        elif line.startswith("|") and "---" in line:
            continue
        elif line.startswith("| "):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
        elif rows:
            break
    return rows[1:]


def test_bench_ops_smoke(tmp_path):
    report = tmp_path / "bench_ops.md"
    args = ["--quick", "--length", "300", "--batches", "1,8,16"]
    args += ["--repeats", "1", "--number", "1", "--no-filters", "--no-peers"]
    cpu = min(os.sched_getaffinity(0))
    _run("bench_ops.py", *args, "--cpus", str(cpu), "--markdown", str(report))
    text = report.read_text()
    assert f"(pinned to CPU {cpu})" in text.splitlines()[0]
    allpole_rows = _table_rows(text, "All-pole filter")
    ballistics_rows = _table_rows(text, "Ballistics")
    assert [row[0].split(" T=")[0] for row in ballistics_rows] == [
        f"ballistics B={b}" for b in (1, 1, 8, 8, 16, 16)
    ]
    # the all-pole rows add the user-batched gradient at B = 8
    assert [row[0].split(" T=")[0] for row in allpole_rows] == [
        f"allpole K=2 B={b}" for b in (1, 1, 8, 8, 8, 16, 16)
    ]
    assert allpole_rows[4][0].endswith(" user-grad")
    for rows in (allpole_rows, ballistics_rows):
        assert all(float(row[1]) > 0 for row in rows)  # retrax's ms
    assert "rows where a peer beats retrax by more than 5%: none" in text
    if shutil.which(os.environ.get("CC", "cc")):
        # the C loops ran, matched retrax's output and entered the summary
        for line in (
            "allpole fwd B=1: retrax/C loop = ",
            "allpole fwd B=8: retrax/C loop = ",
            "allpole grad B=8: retrax grad / loop fwd = ",
            "allpole user-batched grad B=8 (grad of a loss of vmap): retrax / loop "
            "fwd = ",
            "ballistics fwd B=8: retrax/C loop = ",
            "allpole per-signal cost B=16 vs B=8 (grad) = ",
        ):
            assert line in text
        assert "differs" not in text


def test_bench_compile_smoke(tmp_path):
    # one row, one fresh process: the stages are timed and the program sized
    report = tmp_path / "bench_compile.md"
    _run("bench_compile.py", "--rows", "Gain-fwd", "--repeats", "1", "--markdown",
         str(report))  # fmt: skip
    rows = [line.split("|")[1:-1] for line in report.read_text().splitlines()]
    (row,) = [r for r in rows if r and r[0].strip() == "Gain-fwd"]
    stages = [float(v) for v in row[2:8]]
    assert all(v >= 0 for v in stages) and stages[-1] > 0
    assert int(row[8]) > 0 and float(row[9]) > 0  # equations and HLO size


def test_plot_scaling_smoke(tmp_path):
    pytest.importorskip("matplotlib")
    _run("plot_scaling.py", "--smoke", "--out", str(tmp_path))
    assert (tmp_path / "scaling.png").stat().st_size > 0
    text = (tmp_path / "scaling.md").read_text()
    rows = _table_rows(text, "Cost per signal against batch size")
    assert [row[0] for row in rows] == ["1", "2"]
    # kernel and pure-JAX forward and gradient (and the C loop, if built)
    assert all(float(cell) > 0 for row in rows for cell in row[1:5])


def test_bench_memory_smoke(tmp_path):
    report = tmp_path / "memory.md"
    args = ["--length", "1000", "--batches", "2", "--calls", "1", "--runs", "1"]
    args += ["--paths", "scan"]
    args += ["--baseline-src", str(ROOT / "src"), "--markdown", str(report)]
    _run("bench_memory.py", *args)
    rows = [line for line in report.read_text().splitlines() if line.startswith("| B")]
    # the pure-JAX path in this tree and in the "baseline" (here the same tree)
    assert len(rows) == 2
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert cells[0] == "B=2 scan"
        assert 10 < float(cells[2]) < 10_000  # MiB
        assert cells[5] == "no"  # the kernel switched off in the subprocess


def test_bench_gradient_memory_smoke(tmp_path):
    report = tmp_path / "gradient_memory.md"
    _run("bench_gradient_memory.py", "--minutes", "0.05", "--markdown", str(report))
    rows = [line for line in report.read_text().splitlines() if line.startswith("| ")]
    cases = [row.strip("|").split("|")[0].strip() for row in rows[1:]]
    assert cases == ["allpole", "lfilter", "sosfilt", "chain"]
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[1]) > 10  # the baseline, MiB
        assert float(cells[3]) > 0  # bytes per sample over it
        assert "non-finite" not in row


def test_bench_scipy_smoke(tmp_path):
    report = tmp_path / "bench_scipy.md"
    names = "lfilter,lfilter+zi,filtfilt,sosfilt,sosfiltfilt,freqz,sosfreqz"
    args = ["--names", names, "--orders", "2", "--seconds", "0.01"]
    args += ["--batches", "1,8", "--repeats", "1", "--budget", "0.001"]
    _run("bench_scipy.py", *args, "--markdown", str(report))
    text = report.read_text()
    assert "CPU affinity: not pinned" in text
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    # every name, both dtypes, one signal and a batch: each matched scipy
    # (a mismatch is reported and its row dropped)
    assert len(rows) == 7 * 2 * 2, text
    assert "differs from scipy" not in text
    for row in rows:
        eager, jit, scipy = (float(c) for c in row.split("|")[2:5])
        assert eager > 0 and jit > 0 and scipy > 0


def test_bench_scipy_layouts_and_streams_smoke(tmp_path):
    report = tmp_path / "bench_scipy_layouts.md"
    args = ["--names", "", "--layouts", "--layout-seconds", "0.01", "--stream"]
    args += ["--stream-channels", "4", "--stream-block", "100", "--stream-blocks", "3"]
    args += ["--repeats", "1", "--budget", "0.001"]
    _run("bench_scipy.py", *args, "--markdown", str(report))
    text = report.read_text()
    assert "differs from scipy" not in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    # four names in both layouts and both dtypes; two streams in both dtypes
    layouts = [row for row in rows if " axis=" in row]
    streams = [row for row in rows if "+zi " in row]
    assert len(layouts) == 4 * 2 * 2 and len(streams) == 2 * 2, text
    for row in layouts + streams:
        assert all(float(c.strip().rstrip("x")) > 0 for c in row.split("|")[2:-1])


def test_bench_eager_smoke():
    out = _run(
        "bench_eager.py", "--lengths", "32", "--repeats", "1", "--budget", "0.001"
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    assert [row.split("|")[1].strip() for row in rows] == [
        "allpole T=32",
        "grad T=32",
        "JAX's grad floor T=32",
    ]
    for row in rows:
        assert all(float(c) > 0 for c in row.split("|")[2:4])


def test_bench_fit_checks_smoke():
    out = _run(
        "bench_fit_checks.py", "--widths", "8", "--steps", "20", "--repeats", "1"
    )
    rows = [line for line in out.stdout.splitlines() if line.startswith("| ")][1:]
    assert len(rows) == 1
    width, checked, unchecked, ratio = (float(c) for c in rows[0].split("|")[1:5])
    assert width == 8 and checked > 0 and unchecked > 0 and ratio > 0


def test_bench_first_call_smoke(tmp_path):
    # every route in its own fresh process, at tiny sizes: each answers, and
    # the table and the JSON report the same routes
    report, results = tmp_path / "first_call.md", tmp_path / "first_call.json"
    cpu = min(os.sched_getaffinity(0))
    _run("bench_first_call.py", "--small", "--repeats", "1", "--cpus", str(cpu),
         "--markdown", str(report), "--json", str(results), timeout=900)  # fmt: skip
    text = report.read_text()
    assert f"(pinned to CPU {cpu})" in text.splitlines()[0]
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    routes = json.loads(results.read_text())["routes"]
    assert [r["route"] for r in routes] == [
        "import", "import-ops", "relation", "relation-grad", "sosfiltfilt",
        "lfilter", "sosfilt-grad", "train-step", "solve-graph",
    ]  # fmt: skip
    assert len(rows) == len(routes)
    for r in routes:
        assert 0 < r["retrax_import_s"] <= r["first_s"] and r["jax_import_s"] > 0
        # the import routes have no warm call; every other route one
        assert len(r["warm_all_s"]) == (0 if r["route"].startswith("import") else 1)


def test_bench_factor_graph_pose2_smoke(tmp_path):
    # the Pose2 rows at 20 poses in both dtypes (GTSAM's columns when it is
    # installed): each solve converges and reports its steps
    report = tmp_path / "factor_graph.md"
    _run("bench_factor_graph.py", "--smoke", "--arm-poses", "",
         "--markdown", str(report), timeout=600)  # fmt: skip
    rows = [r for r in report.read_text().splitlines() if r.startswith("| Pose2")]
    assert [r.split("|")[1].strip() for r in rows] == [
        "Pose2 20 poses, float64",
        "Pose2 20 poses, float32",
    ]
    for row in rows:
        assert "| successful |" in row, row


def test_bench_graph_laplace_smoke():
    # one small banded Pose2 graph: its marginals are computed and the solve
    # that precedes them succeeded (GTSAM's columns when it is installed)
    out = _run("bench_graph_laplace.py", "--poses", "30", timeout=600).stdout
    (row,) = [r for r in out.splitlines() if r.split()[:1] == ["30"]]
    assert row.split()[-1] == "successful", row
    warm_ms = float(row.split()[4])
    assert warm_ms > 0


def test_bench_revisions_smoke(tmp_path):
    # HEAD against HEAD, two cheap routes, one round: both revisions are
    # checked out, each route runs from its worktree, the table prints and the
    # worktrees are gone afterwards
    def worktrees():
        out = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"],
                             capture_output=True, text=True, check=True)  # fmt: skip
        return out.stdout

    before = worktrees()
    report = tmp_path / "revisions.md"
    out = _run("bench_revisions.py", "--small", "--rounds", "1", "--routes",
               "allpole,sosfiltfilt", "--base", "HEAD", "--markdown", str(report),
               timeout=900).stdout  # fmt: skip
    text = report.read_text()
    assert text.strip() in out
    assert text.startswith("Warm jitted calls at two revisions: base HEAD")
    assert "Kernels: " in text.splitlines()[0]
    rows = _table_rows(text, "Warm jitted calls")
    assert [row[0].split(",")[0] for row in rows] == [
        "`ops.allpole` K=2",
        "its `jax.grad` w.r.t. `a`",
        "`ops.sosfiltfilt` 8 sections",
    ]
    for row in rows:
        base, head, ratio = (float(cell) for cell in row[1:4])
        assert base > 0 and head > 0 and ratio > 0
        assert row[4:] == ["-", "-"]  # no spread from one round
    assert worktrees() == before


def test_bench_gradients_smoke(tmp_path):
    report = tmp_path / "bench_gradients.md"
    args = ["--length", "64", "--repeats", "1", "--number", "1", "--budget", "0.001"]
    _run("bench_gradients.py", *args, "--markdown", str(report))
    text = report.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")][1:]
    # sosfilt and lfilter at three orders, allpole constant and per sample
    # at four, in both dtypes: forward and both gradients timed
    assert len(rows) == (3 + 3 + 4 + 4) * 2, text
    for row in rows:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert float(cells[1]) > 0
        assert all(cell.endswith("x)") for cell in cells[2:])
