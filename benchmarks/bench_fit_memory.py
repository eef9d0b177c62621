"""Resident memory of a long `fit` run with checkpoints, chunk by chunk.

Trains a tiny `TimeMLP` noise predictor on 2-D data for `--steps` steps,
checkpointing every `--every` steps (one chunk each), and prints the process's
resident set size (from `/proc/self/statm`, or the peak from `resource` where
`/proc` is missing) after every checkpoint. A healthy run is flat after the
first chunks (the compiled chunk, the checkpoint writer's buffers); a run that
compiles or keeps something per chunk grows by a step every chunk. The last
line compares the RSS at the end with the RSS after the third chunk.

    python3 benchmarks/bench_fit_memory.py --steps 20000 --every 1000

This is a measurement, not a test: the numbers depend on the machine, the
allocator and the versions of JAX and XLA.
"""

import argparse
import os
import pathlib
import sys
import tempfile


def rss_mb() -> float:
    """The resident set size of this process, in MB."""
    try:
        with open("/proc/self/statm") as f:
            pages = int(f.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / (2**20 if sys.platform == "darwin" else 2**10)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--every", type=int, default=1000)
    parser.add_argument("--width", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    # the checkout's sources, not another installed copy
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "src"))
    import jax

    import retrax.diffusion as rd
    from retrax.diffusion import _train

    key = jax.random.key(0)
    data = jax.random.normal(jax.random.key(1), (256, 2))
    model = rd.TimeMLP(2, hidden=args.width, depth=2, key=key)
    pred = rd.NoisePredictor(model, rd.VPSDE())

    readings = []
    save = _train._save

    def save_and_measure(*a, **kw):
        out = save(*a, **kw)
        readings.append(rss_mb())
        print(f"step {a[1]:>7d}: RSS {readings[-1]:7.1f} MB", flush=True)
        return out

    _train._save = save_and_measure
    print(f"before fit: RSS {rss_mb():.1f} MB", flush=True)
    with tempfile.TemporaryDirectory() as directory:
        rd.fit(
            pred,
            data,
            jax.random.key(2),
            steps=args.steps,
            batch_size=args.batch_size,
            checkpoint_dir=directory,
            checkpoint_every=args.every,
            progress=False,
        )
    _train._save = save
    if len(readings) > 3:
        early, last = readings[2], readings[-1]
        print(
            f"after chunk 3: {early:.1f} MB, at the end: {last:.1f} MB "
            f"({100 * (last - early) / early:+.1f}%)"
        )


if __name__ == "__main__":
    main()
