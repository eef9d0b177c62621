"""Wall time of the filtering step on one process against several (`jax.distributed`).

Runs `examples/multiprocess.py --bench` (one jitted call: the batch through
`sosfilt`, `allpole`, `ParametricEQ` and `Compressor`, with the gradients
with respect to the chain and the signals; 1 s signals at 16 kHz, float64)
alternately on 1 process and on `--processes` processes of this machine
(`--spawn`), `--runs` times each; every run reports the median of
`--repeats` timed calls after one compiling call. Writes a markdown table of
the medians over the runs, with the machine's load average, to
`docs/assets/multiprocess_timing.md`.

Run: `python benchmarks/bench_multiprocess.py [--batch 64] [--runs 3]`
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile


ROOT = pathlib.Path(__file__).parent.parent
SCRIPT = ROOT / "examples" / "multiprocess.py"


def one_run(processes: int, batch: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "result.json"
        command = [sys.executable, str(SCRIPT), "--bench", "--batch", str(batch)]
        command += ["--repeats", str(repeats), "--out", str(out)]
        if processes > 1:
            command += ["--spawn", str(processes)]
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL, timeout=1800)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "docs" / "assets"))
    args = parser.parse_args()

    load_before = os.getloadavg()
    medians = {1: [], args.processes: []}
    for _ in range(args.runs):
        for processes in medians:
            result = one_run(processes, args.batch, args.repeats)
            medians[processes].append(result["median_s"])
            print(f"{processes} process(es): median {result['median_s']:.3f} s")
    load_after = os.getloadavg()

    one = statistics.median(medians[1])
    many = statistics.median(medians[args.processes])
    command = (
        f"python benchmarks/bench_multiprocess.py --batch {args.batch} "
        f"--processes {args.processes} --runs {args.runs} --repeats {args.repeats}"
    )
    lines = [
        f"One forward-and-gradient call on {args.batch} signals of 1 s at "
        f"16 kHz (float64; `sosfilt`, `allpole`, `ParametricEQ`, `Compressor`), "
        f"on a machine with {os.cpu_count()} CPU cores. Each run is the median "
        f"of {args.repeats} calls after the compiling one; the table gives the "
        f"median of {args.runs} runs (`{command}`).",
        "",
        "| processes | median per call (s) | the runs' medians (s) | speed-up |",
        "|---|---|---|---|",
        f"| 1 | {one:.3f} | {', '.join(f'{m:.3f}' for m in medians[1])} | 1 |",
        f"| {args.processes} | {many:.3f} | "
        f"{', '.join(f'{m:.3f}' for m in medians[args.processes])} | "
        f"{one / many:.2f} |",
        "",
        f"Load average (1 min) of the machine: {load_before[0]:.1f} before, "
        f"{load_after[0]:.1f} after (other work shared its cores).",
        "",
    ]
    path = pathlib.Path(args.out) / "multiprocess_timing.md"
    path.write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
