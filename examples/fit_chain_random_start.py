"""Recover a hidden equaliser + compressor chain from random starts.

A four-section `ParametricEQ` (low shelf, two peaks, high shelf) followed by
a `Compressor`: 18 normalised parameters. Adam on the multi-resolution STFT
loss from a random start lowers the loss but leaves the parameters wrong
(a shelf stuck at the top of the band, the ratio off by a factor of three):
that loss is flat and rippled in the frequencies far from the answer. This
script finds the answer in three phases, each a smooth problem that the
previous one starts well:

1. **The equaliser from the spectra.** The compressor multiplies the
   equaliser's output by a slowly varying gain, so in every frame the
   output's band energies in dB are the input's plus the equaliser's
   response plus one gain: $Y_{tf} - X_{tf} = a_t + b_f$. A weighted
   least-squares fit of $a_t + b_f$ gives the response $b_f$ up to a
   constant. The sections are fitted to that curve in dB (the sections'
   response on 73 band centres, with a free constant) by Levenberg-Marquardt
   from 512 random starts in parallel; the best fit is kept.
2. **The compressor from the levels.** With the equaliser fixed, the
   compressor's six parameters are fitted to the output's frame levels in
   dB by Adam from a grid of thresholds and ratios, in parallel; the best
   is kept.
3. **Everything jointly**: Levenberg-Marquardt on the log band energies of
   the chain's output against the target's, frame by frame, from there.
   The multi-resolution STFT loss at the end is reported as a check.

Two sets of parameters give the same chain, and the comparison with the
truth accounts for both: the two peaks may trade places (the sections of a
cascade commute), and a low shelf at $f_1$ with gain $g_1$ and a high shelf
at $f_2$ with gain $g_2$ equal a high shelf at $f_1$ with gain $-g_1$ and a
low shelf at $f_2$ with gain $-g_2$ plus a broadband gain $g_1 + g_2$,
which the compressor's threshold and makeup absorb (`mirror`). Both chains
are put in the form whose low shelf lies below its high shelf before they
are compared.

Each seed draws a hidden chain (ranges in `random_chain`) and the random
starts; the probe signal is half a second of white-noise bursts at levels
from -42 to +6 dB RMS at 44.1 kHz (fixed), float32 throughout. The script
prints, per seed, the errors against the truth and whether they meet the
tolerances: EQ gains within 0.5 dB, frequencies within 5%, the
compressor's threshold within 1 dB and ratio within 10%.

Run: `python examples/fit_chain_random_start.py` (20 seeds; `--seeds N`,
`--first SEED`, `--table PATH` to write the per-seed table as markdown,
`--smoke` for a short check of phase 1's estimate and the symmetry).
"""

import argparse
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import optimistix as optx

from retrax.effects import Chain
from retrax.filters import Compressor, ParametricEQ
from retrax.losses import MultiResolutionSTFTLoss


SAMPLE_RATE = 44_100
N_FFT, HOP = 2048, 512  # the frames of phase 1
BANDS = (30.0, 16_000.0, 96)  # log bands of phase 1: low, high, number
FRAME = 256  # the level frames of phase 2
TOLERANCES = {"gain_db": 0.5, "freq": 0.05, "threshold_db": 1.0, "ratio": 0.10}


def probe(length, seed=0, burst=1_764):
    """White-noise bursts of 40 ms, their levels (dB RMS) spread evenly over
    -42 to +6 dB in random order: every threshold of the hidden chains has
    bursts well above it and well below it."""
    rng = np.random.default_rng(seed)
    bursts = -(-length // burst)
    levels = rng.permutation(np.linspace(-42.0, 6.0, bursts))
    envelope = np.repeat(10 ** (levels / 20), burst)[:length]
    return envelope * rng.standard_normal(length)


# --8<-- [start:hidden]
def random_chain(rng):
    """A hidden chain: every section at least 3 dB away from flat (a flat
    section has no frequency to find), a compressor that compresses."""

    def log_uniform(low, high):
        return float(np.exp(rng.uniform(np.log(low), np.log(high))))

    freqs = [log_uniform(60, 300), log_uniform(200, 1500),
             log_uniform(1500, 6000), log_uniform(3000, 12000)]  # fmt: skip
    gains = [float(rng.choice([-1, 1]) * rng.uniform(3.0, 12.0)) for _ in freqs]
    qs = [rng.uniform(0.5, 1.0), log_uniform(0.7, 3.0), log_uniform(0.7, 3.0),
          rng.uniform(0.5, 1.0)]  # fmt: skip
    return Chain(
        [
            ParametricEQ(freqs, gains, qs, sample_rate=SAMPLE_RATE),
            Compressor(
                threshold_db=rng.uniform(-36.0, -12.0),
                ratio=log_uniform(2.0, 10.0),
                attack_ms=log_uniform(1.0, 20.0),
                release_ms=log_uniform(30.0, 300.0),
                makeup_db=rng.uniform(0.0, 12.0),
                knee_db=rng.uniform(0.0, 6.0),
                sample_rate=SAMPLE_RATE,
            ),
        ]
    )


# --8<-- [end:hidden]


TEMPLATE = Chain(
    [
        ParametricEQ([100.0, 500.0, 2000.0, 8000.0], sample_rate=SAMPLE_RATE),
        Compressor(sample_rate=SAMPLE_RATE),
    ]
)
N_EQ = TEMPLATE.effects[0].n_params  # 12


def logit(p):
    p = jnp.clip(p, 1e-4, 1 - 1e-4)
    return jnp.log(p / (1 - p))


def adam_scan(loss, theta, steps, lr):
    """`steps` Adam steps on `loss` from `theta`, one compiled loop."""
    optimizer = optax.adam(optax.cosine_decay_schedule(lr, steps, 0.05))

    def body(carry, _):
        theta, state = carry
        value, grad = jax.value_and_grad(loss)(theta)
        updates, state = optimizer.update(grad, state)
        return (optax.apply_updates(theta, updates), state), value

    (theta, _), _ = jax.lax.scan(body, (theta, optimizer.init(theta)), None, steps)
    return theta, loss(theta)


# ------------------------------------------------------- phase 1: the EQ
def band_matrix():
    """`(N_FFT // 2 + 1, bands)`: which FFT bins sum into which log band
    (bands without a bin dropped), and the bands' centres in Hz."""
    low, high, n = BANDS
    freqs = np.fft.rfftfreq(N_FFT, 1 / SAMPLE_RATE)
    edges = np.geomspace(low, high, n + 1)
    index = np.digitize(freqs, edges) - 1
    m = (index[:, None] == np.arange(n)[None]).astype(np.float32)
    filled = m.sum(0) > 0
    return jnp.asarray(m[:, filled]), np.sqrt(edges[:-1] * edges[1:])[filled]


def band_db(x, m):
    """The band energies in dB of Hann-windowed frames, `(frames, bands)`."""
    window = jnp.asarray(np.hanning(N_FFT + 1)[:-1], x.dtype)
    n = (x.shape[0] - N_FFT) // HOP + 1
    index = jnp.arange(n)[:, None] * HOP + jnp.arange(N_FFT)[None]
    power = jnp.abs(jnp.fft.rfft(x[index] * window, axis=-1)) ** 2
    return 10 * jnp.log10(power @ m + 1e-20)


# --8<-- [start:response]
def response_estimate(x, y, m):
    r"""The equaliser's response in dB up to a constant, per band, and each
    band's weight: the $b_f$ of $Y_{tf} - X_{tf} = a_t + b_f$ (dB), fitted
    by weighted least squares (alternating closed-form updates), with
    weights that drop bands far below each frame's loudest and quiet frames."""
    xdb, ydb = band_db(x, m), band_db(y, m)
    loudest = xdb.max(axis=1, keepdims=True)
    w = jnp.clip((xdb - loudest + 60.0) / 60.0, 0.0, None)
    w = w * (loudest > xdb.max() - 50.0)
    d = ydb - xdb

    def sweep(b, _):
        a = jnp.sum(w * (d - b), 1, keepdims=True) / jnp.sum(w, 1, keepdims=True)
        a = jnp.where(jnp.sum(w, 1, keepdims=True) > 0, a, 0.0)
        return jnp.sum(w * (d - a), 0) / jnp.sum(w, 0), None

    b, _ = jax.lax.scan(sweep, jnp.zeros(d.shape[1], d.dtype), None, 100)
    weight = jnp.sum(w, 0)
    return b, weight / jnp.max(weight)


# --8<-- [end:response]


def response_db(eq, freqs):
    """The equaliser's magnitude response in dB at `freqs` (Hz)."""
    sos = eq.sos
    z = jnp.exp(-2j * jnp.pi * freqs / SAMPLE_RATE)
    num = sos[:, 0, None] + sos[:, 1, None] * z + sos[:, 2, None] * z**2
    den = sos[:, 3, None] + sos[:, 4, None] * z + sos[:, 5, None] * z**2
    return jnp.sum(20 * jnp.log10(jnp.abs(num / den)), axis=0)


# --8<-- [start:curve]
def least_squares(residuals, theta, steps):
    """Levenberg-Marquardt on `residuals(theta)` from `theta`; the solution
    and its sum of squares."""
    solver = optx.LevenbergMarquardt(rtol=1e-6, atol=1e-9)
    sol = optx.least_squares(
        lambda t, _: residuals(t), solver, theta, max_steps=steps, throw=False
    )
    return sol.value, jnp.sum(residuals(sol.value) ** 2)


def fit_eq_curve(curve, weight, centres, key, starts, steps):
    """The EQ's normalised parameters that best fit `curve` (dB, up to a
    constant) from `starts` random starts, in parallel: the frequencies
    uniform on the log axis and sorted (low shelf lowest, high shelf
    highest), the gains and Qs uniform in their normalised ranges."""
    eq_template = TEMPLATE.effects[0]
    centres = jnp.asarray(centres, jnp.float32)
    root = jnp.sqrt(weight / jnp.sum(weight))

    def residuals(theta):
        eq = eq_template.with_normalised(jax.nn.sigmoid(theta))
        r = curve - response_db(eq, centres)
        offset = jnp.sum(weight * r) / jnp.sum(weight)  # the free constant
        return root * (r - offset)

    keys = jax.random.split(key, 2)
    freqs = jnp.sort(jax.random.uniform(keys[0], (starts, 4), minval=0.05, maxval=0.95))
    rest = jax.random.uniform(keys[1], (starts, 8), minval=0.05, maxval=0.95)
    p0 = jnp.concatenate([freqs, rest], axis=1)
    thetas, losses = jax.vmap(lambda t: least_squares(residuals, t, steps))(logit(p0))
    return thetas[jnp.argsort(losses)], jnp.sort(losses)


# --8<-- [end:curve]


# ------------------------------------------------ phase 2: the compressor
def frame_db(y):
    frames = y[: y.shape[0] // FRAME * FRAME].reshape(-1, FRAME)
    return 10 * jnp.log10(jnp.mean(frames**2, axis=1) + 1e-12)


# --8<-- [start:levels]
def compressor_grid(thresholds, ratios):
    """Normalised starts: a grid of thresholds and ratios, the times and the
    makeup mid-range, a knee of 2.4 dB."""
    ranges = TEMPLATE.effects[1].ranges()
    return np.array(
        [
            [
                ranges["threshold_db"].normalised(t),
                ranges["ratio"].normalised(r),
                0.5,
                0.5,
                0.5,
                0.1,
            ]  # fmt: skip
            for t in thresholds
            for r in ratios
        ],
        np.float32,
    )


def fit_compressor(e, y, grid, steps):
    """The compressor's normalised parameters that best map the equalised
    probe `e` onto `y` in frame levels (dB), from the starts `grid`, in
    parallel."""
    comp_template = TEMPLATE.effects[1]
    target = frame_db(y)
    heard = target > jnp.max(target) - 70.0

    def loss(theta):
        comp = comp_template.with_normalised(jax.nn.sigmoid(theta))
        r = frame_db(comp(e)) - target
        return jnp.sum(jnp.where(heard, r**2, 0.0)) / jnp.sum(heard)

    thetas, losses = jax.vmap(lambda t: adam_scan(loss, t, steps, 0.05))(logit(grid))
    return jax.nn.sigmoid(thetas[jnp.argmin(losses)]), jnp.min(losses)


# --8<-- [end:levels]


# --8<-- [start:mirror]
def mirror(chain):
    """The same chain with its shelves traded: a low shelf at the high
    shelf's frequency with the negated gain, a high shelf at the low shelf's
    with the negated gain, and the broadband gain this leaves (the sum of
    the two shelves' gains) moved into the compressor's threshold and
    makeup. Its output is the chain's, to rounding."""
    eq, comp = chain.effects
    f, g, q = eq.freqs, eq.gains_db, eq.qs
    swap = jnp.arange(f.shape[0]).at[jnp.array([0, -1])].set(jnp.array([-1, 0]))
    g = g.at[jnp.array([0, -1])].set(-g[jnp.array([-1, 0])])
    shift = eq.gains_db[0] + eq.gains_db[-1]
    eq = ParametricEQ(f[swap], g, q[swap], sample_rate=SAMPLE_RATE)
    comp = eqx.tree_at(
        lambda c: (c.threshold_db, c.makeup_db),
        comp,
        (comp.threshold_db - shift, comp.makeup_db + shift),
    )
    return Chain([eq, comp])


# --8<-- [end:mirror]


def canonical(chain):
    """The physical values of the chain in the form whose low shelf lies
    below its high shelf (`mirror` if it does not), its peaks in frequency
    order (sections of a cascade commute)."""
    eq = chain.effects[0]
    if float(eq.freqs[0]) > float(eq.freqs[-1]):
        chain = mirror(chain)
    eq, comp = chain.effects
    f, g, q = (np.asarray(v, np.float64) for v in (eq.freqs, eq.gains_db, eq.qs))
    order = np.concatenate([[0], 1 + np.argsort(f[1:-1]), [len(f) - 1]])
    values = {"freqs": f[order], "gains_db": g[order], "qs": q[order]}
    for name in ("threshold_db", "ratio", "attack_ms", "release_ms", "makeup_db",
                 "knee_db"):  # fmt: skip
        values[name] = float(getattr(comp, name))
    return values


def score(truth, found):
    """Each criterion's error and whether it meets its tolerance."""
    errors = {
        "gain_db": np.max(np.abs(found["gains_db"] - truth["gains_db"])),
        "freq": np.max(np.abs(found["freqs"] / truth["freqs"] - 1)),
        "threshold_db": abs(found["threshold_db"] - truth["threshold_db"]),
        "ratio": abs(found["ratio"] / truth["ratio"] - 1),
    }
    return {k: (float(v), bool(v <= TOLERANCES[k])) for k, v in errors.items()}


# --8<-- [start:joint]
def fit_jointly(x, y, p, m, steps):
    """All 18 normalised parameters from `p`, by Levenberg-Marquardt on the
    log band energies (dB) of the chain's output against `y`'s."""
    target = band_db(y, m)
    heard = (target > jnp.max(target) - 80.0).astype(target.dtype)
    root = jnp.sqrt(heard / jnp.sum(heard))

    def residuals(theta):
        chain = TEMPLATE.with_normalised(jax.nn.sigmoid(theta))
        return (root * (band_db(chain(x), m) - target)).ravel()

    theta, _ = least_squares(residuals, logit(p), steps)
    return jax.nn.sigmoid(theta)


# --8<-- [end:joint]


# --8<-- [start:recover]
def recover(x, y, key, settings, report=print):
    """The chain that maps `x` onto `y`, from random starts (three phases,
    each one compiled program)."""
    m, centres = band_matrix()
    began = time.perf_counter()
    curve, weight = jax.jit(response_estimate)(x, y, m)
    thetas, _ = jax.jit(fit_eq_curve, static_argnums=(4, 5))(
        curve, weight, centres, key, settings["eq_starts"], settings["eq_steps"]
    )
    # the form whose low shelf lies below its high shelf: the compressor's
    # grid of thresholds is centred on levels of the equaliser it is given
    eq = TEMPLATE.effects[0].with_normalised(jax.nn.sigmoid(thetas[0]))
    eq = canonical(Chain([eq, TEMPLATE.effects[1]]))
    eq = ParametricEQ(eq["freqs"], eq["gains_db"], eq["qs"], sample_rate=SAMPLE_RATE)
    phase1 = time.perf_counter()
    grid = compressor_grid(settings["thresholds"], settings["ratios"])
    p_comp, _ = jax.jit(fit_compressor, static_argnums=3)(
        jax.jit(lambda eq: eq(x))(eq), y, grid, settings["comp_steps"]
    )
    p = jnp.concatenate([eq.to_normalised(), p_comp])
    phase2 = time.perf_counter()
    p = jax.jit(fit_jointly, static_argnums=4)(x, y, p, m, settings["joint_steps"])
    phase3 = time.perf_counter()
    report(f"  phases {phase1 - began:.0f} s, {phase2 - phase1:.0f} s, "
           f"{phase3 - phase2:.0f} s")  # fmt: skip
    return TEMPLATE.with_normalised(p), jnp.concatenate([eq.to_normalised(), p_comp])


# --8<-- [end:recover]

FULL = {
    "length": SAMPLE_RATE // 2,  # 0.5 s
    "eq_starts": 512,
    "eq_steps": 100,
    "thresholds": np.arange(-54.0, 0.0, 6.0),
    "ratios": (1.5, 3.0, 8.0),
    "comp_steps": 60,
    "joint_steps": 40,
}


def response_error(hidden, x, y):
    """The weighted RMS error (dB) of phase 1's response estimate against
    the hidden equaliser's response, the constant removed."""
    m, centres = band_matrix()
    curve, weight = jax.jit(response_estimate)(x, y, m)
    r = curve - response_db(hidden.effects[0], jnp.asarray(centres, jnp.float32))
    r = r - jnp.sum(weight * r) / jnp.sum(weight)
    return float(jnp.sqrt(jnp.sum(weight * r**2) / jnp.sum(weight)))


def run_seed(seed, x, settings):
    rng = np.random.default_rng(seed)
    hidden = random_chain(rng)
    run = jax.jit(lambda c: c(x))
    y = run(hidden)
    began = time.perf_counter()
    fitted, p_init = recover(x, y, jax.random.key(seed), settings)
    seconds = time.perf_counter() - began
    stft = MultiResolutionSTFTLoss()
    loss = float(jax.jit(lambda c: stft(c(x), y))(fitted))
    truth = canonical(hidden)
    before = score(truth, canonical(TEMPLATE.with_normalised(p_init)))
    print(
        "  before the joint fit: "
        + ", ".join(
            f"{k} {v:.3g}{'' if ok else ' (out)'}" for k, (v, ok) in before.items()
        )
    )
    found = canonical(fitted)
    checks = {
        "response_error_db": response_error(hidden, x, y),
        "mirror_difference": float(jnp.max(jnp.abs(run(mirror(hidden)) - y))
                                   / jnp.max(jnp.abs(y))),
    }  # fmt: skip
    return truth, found, score(truth, found), loss, seconds, checks


def table_rows(seed, truth, found, scores, loss):
    def pair(key, fmt, i=None):
        t = truth[key] if i is None else truth[key][i]
        f = found[key] if i is None else found[key][i]
        return f"{f:{fmt}} ({t:{fmt}})"

    marks = {k: "pass" if ok else "FAIL" for k, (_, ok) in scores.items()}
    return (
        f"| {seed} | "
        + " ".join(pair("freqs", ".0f", i) for i in range(4))
        + f" | {marks['freq']} | "
        + " ".join(pair("gains_db", "+.1f", i) for i in range(4))
        + f" | {marks['gain_db']} | "
        + pair("threshold_db", ".1f")
        + f" | {marks['threshold_db']} | "
        + pair("ratio", ".2f")
        + f" | {marks['ratio']} | {loss:.3g} |"
    )


def smoke_check(settings):
    """Phase 1's response estimate and the mirror symmetry on seed 0, without
    the fits (whose compilation alone takes a minute)."""
    x = jnp.asarray(probe(settings["length"]), jnp.float32)
    hidden = random_chain(np.random.default_rng(0))
    y = jax.jit(lambda c: c(x))(hidden)
    error = response_error(hidden, x, y)
    difference = float(jnp.max(jnp.abs(mirror(hidden)(x) - y)) / jnp.max(jnp.abs(y)))
    scores = score(canonical(hidden), canonical(mirror(hidden)))
    print(f"phase 1's response estimate within {error:.2f} dB RMS; the mirrored "
          f"chain's output equal to {difference:.1e} of the peak, its canonical "
          "form " + ", ".join(f"{k} {v:.2g}" for k, (v, _) in scores.items())
          + " from the hidden chain's")  # fmt: skip
    return {"response_error_db": error, "mirror_difference": difference,
            "mirror_scores": scores}  # fmt: skip


def main(
    smoke: bool = False, seeds: int = 20, first: int = 0, table: str | None = None
) -> dict:
    if smoke:
        return smoke_check(FULL | {"length": SAMPLE_RATE // 4})
    settings = FULL
    x = jnp.asarray(probe(settings["length"]), jnp.float32)
    results, lines = [], []
    for seed in range(first, first + seeds):
        truth, found, scores, loss, seconds, checks = run_seed(seed, x, settings)
        ok = all(passed for _, passed in scores.values())
        results.append(
            {"seed": seed, "truth": truth, "found": found, "scores": scores,
             "loss": loss, "passed": ok, **checks}
        )  # fmt: skip
        print(f"  phase 1's response estimate within {checks['response_error_db']:.2f}"
              f" dB RMS; the mirrored chain's output equal to "
              f"{checks['mirror_difference']:.1e} of the peak")  # fmt: skip
        lines.append(table_rows(seed, truth, found, scores, loss))
        print(
            f"seed {seed:2d} {'PASS' if ok else 'FAIL'} ({seconds:.0f} s, "
            f"STFT loss {loss:.3g}): "
            + ", ".join(f"{k} {v:.3g}" for k, (v, _) in scores.items()),
            flush=True,
        )
        if table is not None:  # after every seed: a long run can be read as it goes
            write_table(table, lines, results)
    passed = sum(r["passed"] for r in results)
    print(f"recovered {passed} of {len(results)} hidden chains")
    return {"results": results, "passed": passed, "seeds": len(results)}


def write_table(path, lines, results):
    passed = sum(r["passed"] for r in results)
    header = (
        "| seed | frequencies, Hz: found (true) | | gains, dB: found (true) "
        "| | threshold, dB | | ratio | | final STFT loss |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    with open(path, "w") as f:
        f.write(header + "\n".join(lines) + "\n\n")
        f.write(f"Recovered {passed} of {len(results)} hidden chains.\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--first", type=int, default=0, help="the first seed")
    parser.add_argument("--table", metavar="PATH", help="write a markdown table")
    args = parser.parse_args()
    main(smoke=args.smoke, seeds=args.seeds, first=args.first, table=args.table)
