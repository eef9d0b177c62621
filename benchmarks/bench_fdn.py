"""Time a feedback delay network's impulse response: time domain against
frequency sampling, as the response grows.

`fdn_impulse_response(..., method="time")` runs the network on the recurrence
core (sequential over blocks of the shortest delay);
`method="frequency"` samples the transfer function at `length // 2 + 1`
points of the unit circle (batched 8 x 8 complex solves) and takes an inverse
FFT. Both are timed forward and for the gradient of an L2 loss against a
target response with respect to `A`, `b` and `c` (the gradient includes the
forward pass), in float32 at 48 kHz, N = 8 lines with a broadband T60 of
about 1 s, from 0.1 s to 3 s of response, for two sets of delays: long
(17 to 31 ms, a hall) and short (0.6 to 1.3 ms; the time domain then takes
many more sequential blocks). Each number is the median over `--repeats`
interleaved repeats of the median of `--number` calls.

Run from the repository root: `python benchmarks/bench_fdn.py`
(`--markdown docs/assets/fdn_methods.md` also writes the table).
"""

import argparse
import pathlib
import statistics
import sys
import time


sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "src"))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from retrax.ops import fdn_impulse_response  # noqa: E402


FS = 48000
DELAYS = {
    "long": (809, 877, 937, 1049, 1151, 1249, 1373, 1499),
    "short": (31, 37, 41, 43, 47, 53, 59, 61),
}


def network(delays, dtype=np.float32):
    rng = np.random.default_rng(0)
    n = len(delays)
    u = rng.standard_normal(n)
    u /= np.linalg.norm(u)
    householder = np.eye(n) - 2 * np.outer(u, u)
    # a broadband T60 of about 1 s: gain per sample 10^(-3 / (FS * T60))
    gains = 10.0 ** (-3 * np.asarray(delays) / FS)
    A = householder * gains[None, :]  # spectral norm <= 1
    b, c = rng.standard_normal(n) / np.sqrt(n), rng.standard_normal(n) / np.sqrt(n)
    return tuple(jnp.asarray(v, dtype) for v in (A, b, c))


def cases(delays, length):
    def forward(method):
        def f(A, b, c, target):
            return fdn_impulse_response(delays, A, b, c, length=length, method=method)

        return f

    def gradient(method):
        def loss(A, b, c, target):
            h = fdn_impulse_response(delays, A, b, c, length=length, method=method)
            return jnp.sum((h - target) ** 2)

        return jax.grad(loss, argnums=(0, 1, 2))

    return {
        ("time", "forward"): forward("time"),
        ("frequency", "forward"): forward("frequency"),
        ("time", "grad"): gradient("time"),
        ("frequency", "grad"): gradient("frequency"),
    }


def measure(delays, length, repeats, number):
    A, b, c = network(delays)
    target = jnp.asarray(
        np.random.default_rng(1).standard_normal(length) * 1e-2, jnp.float32
    )
    args = (A, b, c, target)
    fns = {key: jax.jit(fn) for key, fn in cases(delays, length).items()}
    for fn in fns.values():  # compile and warm up
        jax.block_until_ready(fn(*args))
        jax.block_until_ready(fn(*args))
    medians = {key: [] for key in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            times = []
            for _ in range(number):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times.append(time.perf_counter() - start)
            medians[key].append(statistics.median(times))
    return {key: 1e3 * statistics.median(v) for key, v in medians.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+",
                        default=[0.1, 0.3, 1.0, 3.0])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--number", type=int, default=5)
    parser.add_argument("--markdown", type=pathlib.Path, default=None)
    args = parser.parse_args()
    header = (
        "| delays | response | samples | time fwd (ms) | freq fwd (ms) | fwd ratio "
        "| time grad (ms) | freq grad (ms) | grad ratio |\n"
        "|:--|---:|---:|---:|---:|---:|---:|---:|---:|"
    )
    rows = []
    for name, delays in DELAYS.items():
        for seconds in args.seconds:
            length = int(round(seconds * FS))
            t = measure(delays, length, args.repeats, args.number)
            fwd = t["time", "forward"] / t["frequency", "forward"]
            grad = t["time", "grad"] / t["frequency", "grad"]
            rows.append(
                f"| {name} ({delays[0]}-{delays[-1]}) | {seconds:g} s | {length} "
                f"| {t['time', 'forward']:.2f} "
                f"| {t['frequency', 'forward']:.2f} | {fwd:.2f} "
                f"| {t['time', 'grad']:.2f} | {t['frequency', 'grad']:.2f} "
                f"| {grad:.2f} |"
            )
            print(rows[-1], file=sys.stderr, flush=True)
    device = jax.devices()[0]
    note = (
        f"float32, N = {len(DELAYS['long'])} lines, {FS} Hz, on {device.platform} "
        f"({device.device_kind}); ratio = time domain / frequency sampling "
        "(above 1: frequency sampling is faster)."
    )
    table = "\n".join([header, *rows]) + "\n\n" + note + "\n"
    print(table)
    if args.markdown is not None:
        args.markdown.write_text(table)


if __name__ == "__main__":
    main()
