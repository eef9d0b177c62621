"""The benchmark scripts run end to end, at tiny sizes and without peers.

They run as users run them, in a fresh process with `PYTHONPATH=src` (this
session's x64 mode and XLA flags are not theirs).
"""

import os
import pathlib
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).parent.parent


@pytest.mark.slow
def test_bench_effects_smoke(tmp_path):
    table = tmp_path / "bench_effects.md"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    env.pop("XLA_FLAGS", None)
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
    # every effect at both batch sizes, forward and gradient, the reverb twice
    assert len(rows) == (8 + 1) * 2 * 2
    for row in rows:
        retrax_ms = float(row.split("|")[2])
        assert retrax_ms > 0
