"""Every public op and module of `retrax.ops`, `retrax.dynamics` and
`retrax.filters` on a batch sharded over 8 devices, against one device.

Run by `tests/distribution/test_sharding.py` in a subprocess (the device count is fixed
when JAX starts): `XLA_FLAGS=--xla_force_host_platform_device_count=8`.
Each case is one function of one example, vmapped over a batch of 16
examples; its batched arguments are split over the mesh's `"batch"` axis and
its shared arguments (modules, static settings) replicated. For each case,
one compiled program computes the outputs and the gradient of
`sum |outputs|^2` with respect to every floating argument, in three ways:

- on one device (the reference);
- `jax.jit` with `NamedSharding` inputs on a `jax.sharding.Mesh` (automatic
  axes); the compiled program is also searched for all-gathers;
- inside `jax.shard_map` (each device runs its own examples).

The docs' recipe, a `jax.make_mesh` mesh (`Explicit` axes) set with
`jax.set_mesh`, is run for `Compressor` and `lfilter`.

Then a few bad inputs, one example's coefficients made non-finite, must
raise the op's message inside `shard_map`. (Under `jit` with sharded inputs
the checks are compiled in, but a failing check cannot be raised cleanly:
XLA runs the host callback that raises on one device, and the others wait
for it in the next collective until the runtime aborts the process.)
The script prints one line `RESULT {json}`; `python tests/sharded_ops.py
NAME ...` runs only the named cases.
"""

import os


os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import functools  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import sys  # noqa: E402

import equinox as eqx  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

from retrax import dynamics as dyn, filters as flt, ops  # noqa: E402


jax.config.update("jax_enable_x64", True)
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get(
        "RETRAX_TEST_CACHE", str(pathlib.Path(__file__).parent.parent / ".jax_cache")
    ),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

BATCH, T, SR = 16, 16, 44_100.0
rng = np.random.default_rng(0)


def batch(*shape, low=-1.0, high=1.0):
    return rng.uniform(low, high, (BATCH, *shape))


def poles(order):
    """Per-example stable denominators `[1, a1, ..., a_order]`."""
    roots = batch(order, low=0.2, high=0.9) * np.where(batch(order) > 0, 1, -1)
    return np.stack([np.poly(r) for r in roots])


def sections():
    """Per-example stable second-order sections, `(2, 6)` each."""
    den = np.stack([poles(2), poles(2)], 1)
    num = batch(2, 3)
    return np.concatenate([num, den], -1)


# The filter ops' calls, in one place: (b, a, x) and (sos, x) as scipy.signal.
def call_lfilter(b, a, x):
    return ops.lfilter(b, a, x)


def call_sosfilt(sos, x):
    return ops.sosfilt(sos, x)


def call_filtfilt(b, a, x):
    return ops.filtfilt(b, a, x)


def call_freqz(b, a):
    return ops.freqz(b, a, 8)[1]  # the response; the frequencies are constants


def call_sosfreqz(sos):
    return ops.sosfreqz(sos, 8)[1]


# name: (function of (shared, *batched), shared, batched)
x = batch(T)
level = batch(T, low=0.05, high=1.0)
CASES = {
    "allpole": (lambda _, x, a: ops.allpole(x, a), None, (x, poles(2)[:, 1:])),
    "linear_recurrence": (
        lambda _, d, x: ops.linear_recurrence(x, decay=d, method="associative"),
        None,
        (batch(T, low=0.1, high=0.9), x),
    ),
    "ballistics": (
        lambda _, x, at, rt, zi: ops.ballistics(x, at, rt, zi),
        None,
        (level, batch(low=0.1, high=0.5), batch(low=0.01, high=0.1), batch(low=0.0)),
    ),
    "ballistics per sample": (
        lambda _, x, at, rt: ops.ballistics(x, at, rt),
        None,
        (level, batch(T, low=0.1, high=0.5), batch(T, low=0.01, high=0.1)),
    ),
    "fir": (lambda _, b, x: ops.fir(x, b=b), None, (batch(3), x)),
    "lfilter": (
        lambda _, b, a, x: call_lfilter(b, a, x),
        None,
        (batch(3), poles(2), x),
    ),
    "lfilter_zi": (lambda _, b, a: ops.lfilter_zi(b, a), None, (batch(3), poles(2))),
    "lfiltic": (
        lambda _, b, a, y: ops.lfiltic(b, a, y),
        None,
        (batch(3), poles(2), batch(2)),
    ),
    "sosfilt": (lambda _, sos, x: call_sosfilt(sos, x), None, (sections(), x)),
    "filtfilt": (
        lambda _, b, a, x: call_filtfilt(b, a, x),
        None,
        (batch(3), poles(2), x),
    ),
    "freqz": (lambda _, b, a: call_freqz(b, a), None, (batch(3), poles(2))),
    "sosfreqz": (lambda _, sos: call_sosfreqz(sos), None, (sections(),)),
    "diag_state_space": (
        lambda _, a, B, C, D, x: ops.diag_state_space(x, a=a, B=B, C=C, D=D),
        None,
        (
            batch(3, low=-0.9, high=0.9),
            batch(3, 1),
            batch(1, 3),
            batch(1, 1),
            x[..., None],
        ),
    ),
    "state_space": (
        lambda _, A, B, C, D, x: ops.state_space(x, A=A, B=B, C=C, D=D),
        None,
        (
            batch(2, 2, low=-0.4, high=0.4),
            batch(2, 1),
            batch(1, 2),
            batch(1, 1),
            x[..., None],
        ),
    ),
    "amp2db": (lambda _, v: dyn.amp2db(v), None, (level,)),
    "db2amp": (lambda _, v: dyn.db2amp(v), None, (batch(T, low=-20.0, high=6.0),)),
    "ms2coef": (lambda _, ms: dyn.ms2coef(ms, SR), None, (batch(low=1.0, high=100.0),)),
    "coef2ms": (lambda _, c: dyn.coef2ms(c, SR), None, (batch(low=0.001, high=0.5),)),
    "avg": (lambda _, v, c: dyn.avg(v, c), None, (level, batch(low=0.01, high=0.5))),
    "compexp_gain": (
        lambda _, v, ct, cr, et, er, at, rt: dyn.compexp_gain(
            v, ct, cr, et, er, at, rt
        ),
        None,
        (
            level,
            batch(low=-20.0, high=-5.0),
            batch(low=2.0, high=8.0),
            batch(low=-60.0, high=-40.0),
            batch(low=0.3, high=0.8),
            batch(low=0.1, high=0.5),
            batch(low=0.01, high=0.1),
        ),
    ),
    "limiter_gain": (
        lambda _, v, th, at, rt: dyn.limiter_gain(v, th, at, rt),
        None,
        (
            x,
            batch(low=-12.0, high=-3.0),  # dB
            batch(low=0.1, high=0.5),
            batch(low=0.01, high=0.1),
        ),
    ),
    "rbj_section": (
        lambda _, f, g, q: flt.rbj_section("peak", f, g, q, SR),
        None,
        (
            batch(low=100.0, high=5000.0),
            batch(low=-6.0, high=6.0),
            batch(low=0.5, high=2.0),
        ),
    ),
    "biquad_denominator": (
        lambda _, r, w: flt.biquad_denominator(r, w),
        None,
        (batch(low=0.1, high=0.9), batch(low=0.1, high=3.0)),
    ),
    "lpc2rc": (lambda _, a: flt.lpc2rc(a), None, (poles(3)[:, 1:],)),
    "rc2lpc": (lambda _, k: flt.rc2lpc(k), None, (batch(3, low=-0.9, high=0.9),)),
    "svf": (
        lambda _, x, f, q: flt.svf(x, f, q, SR),
        None,
        (x, batch(low=100.0, high=5000.0), batch(low=0.5, high=2.0)),
    ),
    "Biquad": (
        lambda m, x: m(x),
        flt.Biquad(jnp.asarray([0.5, 0.2, 0.1]), radius=0.7, angle=0.8),
        (x,),
    ),
    "ParametricEQ": (
        lambda m, x: m(x),
        flt.ParametricEQ(jnp.asarray([200.0, 2000.0]), jnp.asarray([3.0, -4.0])),
        (x,),
    ),
    "Compressor": (lambda m, x: m(x), flt.Compressor(), (x,)),
    "StateSpaceFilter": (
        lambda m, x: m(x),
        flt.StateSpaceFilter(3, jax.random.key(0)),
        (x,),
    ),
    "SVF": (lambda m, x: m(x), flt.SVF(1000.0, 0.9), (x,)),
}

# Bad inputs: example 5's coefficients made non-finite; the op must raise
# its message (naming the argument) inside `shard_map`.
nan_at = np.zeros((BATCH, 1))
nan_at[5] = np.nan
BAD = {
    "lfilter a": ("`a`", "lfilter", lambda a: a + nan_at),
    "ballistics at": ("`at`", "ballistics", lambda at: at + nan_at[:, 0]),
    "svf cutoff": ("`cutoff`", "svf", lambda f: f + nan_at[:, 0]),
}


def program(fn, shard=None):
    """`(outputs, gradients)` of `fn` vmapped over the batched arguments,
    as one function of `(shared, batched)`; inside `shard_map` if `shard`
    holds a mesh."""

    def forward(shared, batched):
        if shard is None:
            return jax.vmap(lambda *b: fn(shared, *b))(*batched)
        return jax.shard_map(
            lambda shared, batched: jax.vmap(lambda *b: fn(shared, *b))(*batched),
            mesh=shard,
            in_specs=(P(), P("batch")),
            out_specs=P("batch"),
        )(shared, batched)

    def loss(args):
        out = forward(*args)
        return sum(jnp.sum(jnp.abs(v) ** 2) for v in jax.tree.leaves(out)), out

    @jax.jit
    def both(args):
        (_, out), grads = eqx.filter_value_and_grad(loss, has_aux=True)(args)
        return out, grads

    return both


def max_relative_error(got, want):
    errors = []
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        scale = max(np.max(np.abs(b), initial=0.0), 1e-300)
        errors.append(float(np.max(np.abs(a - b), initial=0.0) / scale))
    return max(errors)


def main(names) -> dict:
    devices = jax.devices()
    mesh = Mesh(np.array(devices), ("batch",))  # automatic axes
    one = jax.sharding.SingleDeviceSharding(devices[0])
    split, whole = NamedSharding(mesh, P("batch")), NamedSharding(mesh, P())
    results, failures = {}, {}
    for name in names:
        fn, shared, batched = CASES[name]
        batched = tuple(jnp.asarray(v) for v in batched)
        try:
            ref_out, ref_grad = program(fn)(jax.device_put((shared, batched), one))
            args = (jax.device_put(shared, whole), jax.device_put(batched, split))
            auto = program(fn).lower(args).compile()
            auto_out, auto_grad = auto(args)
            manual_out, manual_grad = program(fn, mesh)(args)
        except Exception as e:  # reported, so that one failure shows them all
            failures[name] = f"{type(e).__name__}: {str(e)[:500]}"
            continue
        results[name] = {
            "auto_error": max_relative_error(
                (auto_out, auto_grad), (ref_out, ref_grad)
            ),
            "shard_map_error": max_relative_error(
                (manual_out, manual_grad), (ref_out, ref_grad)
            ),
            # Every output keeps the batch's sharding: each device its rows.
            "outputs_split": all(
                v.sharding.is_equivalent_to(split, v.ndim)
                for v in jax.tree.leaves((auto_out, manual_out))
            ),
            "all_gathers": auto.as_text().count("all-gather"),
            # The input checks are in the sharded program (host callbacks).
            "checks": auto.as_text().count('custom_call_target="xla_ffi_python'),
        }

    # The docs' recipe: `jax.make_mesh` (`Explicit` axes) and `jax.set_mesh`.
    explicit = {}
    for name in ("Compressor", "lfilter"):
        fn, shared, batched = CASES[name]
        batched = tuple(jnp.asarray(v) for v in batched)
        run = jax.jit(jax.vmap(functools.partial(fn, shared)))
        ref = run(*batched)
        recipe = jax.make_mesh((len(devices),), ("batch",))
        with jax.set_mesh(recipe):
            rows = NamedSharding(recipe, P("batch"))
            out = run(*jax.device_put(batched, rows))
        explicit[name] = {
            "error": max_relative_error(out, ref),
            "split": out.sharding.is_equivalent_to(rows, out.ndim),
        }

    errors = {}
    for name, (needle, case, spoil) in BAD.items():
        fn, shared, batched = CASES[case]
        batched = tuple(jnp.asarray(v) for v in batched)
        batched = (batched[0], spoil(batched[1]), *batched[2:])
        args = (jax.device_put(shared, whole), jax.device_put(batched, split))
        try:
            jax.block_until_ready(program(fn, mesh)(args))
            errors[name] = "no error"
        except Exception as e:
            errors[name] = needle if needle in str(e) else str(e)[:300]
    return {
        "devices": len(devices),
        "cases": results,
        "failures": failures,
        "explicit": explicit,
        "bad_inputs": errors,
    }


if __name__ == "__main__":
    # Optionally only the cases named on the command line (to debug one).
    print("RESULT " + json.dumps(main(sys.argv[1:] or list(CASES))))
