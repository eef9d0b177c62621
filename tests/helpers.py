"""Shared test utilities: comparisons, references and finite differences."""

import contextlib
import re

import equinox as eqx
import jax
import jax.extend.core
import jax.numpy as jnp
import jax.test_util  # noqa: F401  (explicit import: not loaded by `import jax`)
import numpy as np
import pytest
from jax import lax


@contextlib.contextmanager
def users_compiler():
    """XLA's optimisations on, as users run it, inside the block.

    The x64 test sessions turn most of them off (conftest.py) because compiling
    is most of their time; code that runs long loops, such as training, runs
    about 1.7x faster with them.
    """
    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def tree_allclose(x, y, *, rtol=1e-12, atol=0.0):
    """Leaf-wise closeness with the tolerance relative to each leaf's scale."""
    leaves_x, tree_x = jax.tree.flatten(x)
    leaves_y, tree_y = jax.tree.flatten(y)
    if tree_x != tree_y:
        return False
    for a, b in zip(leaves_x, leaves_y, strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        scale = max(np.max(np.abs(b), initial=0.0), 1e-300)
        if np.max(np.abs(a - b), initial=0.0) > rtol * scale + atol:
            return False
    return True


def assert_close(x, y, rtol=1e-12, atol=0.0):
    """`tree_allclose` with a message giving the relative error."""
    a, b = np.asarray(x), np.asarray(y)
    assert a.shape == b.shape, (a.shape, b.shape)
    scale = max(np.max(np.abs(b), initial=0.0), 1e-300)
    err = np.max(np.abs(a - b), initial=0.0)
    assert err <= rtol * scale + atol, f"max error {err:.3e}, scale {scale:.3e}"


def raises_eagerly_and_under_jit(f, *args, match):
    """`f(*args)` raises an error whose message matches `match`, both when
    called directly and under `jax.jit` (where the arguments are traced)."""
    with pytest.raises(Exception, match=match):
        f(*args)
    with pytest.raises(Exception, match=match):
        jax.jit(f)(*args)


def ring_radius(schedule, nodes, scale, radius=1.0):
    r"""Where the implicit field of a ring of data puts its stable roots.

    Data on a circle of radius `radius`, smoothed by Gaussians of standard
    deviation `scale`: the spec's smoothing bias puts the mode of the data
    smoothed to variance $v$ at $r = R - v/(2r)$ (the radial Gaussian profile
    and the $-\tfrac12\log r$ of the polar measure), with
    $v = s^2 + \sigma^2/\alpha^2$ for a noise-free node. A node with a noise
    draw evaluates the predictor at $\alpha z + \sigma e$, which smooths once
    more by $\sigma^2/\alpha^2$: $v_k = s^2 + 2\sigma_k^2/\alpha_k^2$. The field
    sums the nodes' scores with weights $a_k = w_k\sigma_k^2/\alpha_k^2$, so its
    root solves $\sum_k a_k ((r - R)/v_k + 1/(2r)) = 0$, i.e. the same rule
    with the weighted harmonic mean $v = \sum_k a_k / \sum_k (a_k/v_k)$.
    Neglected: terms of order $v^2/R^3$, the lumps of a ring made of finitely
    many components, and the sampling error of finitely many noise draws.
    """
    t = np.asarray(nodes.t, np.float64)
    alpha = np.asarray(schedule.alpha(jnp.asarray(t)), np.float64)
    sigma = np.asarray(schedule.sigma(jnp.asarray(t)), np.float64)
    u = sigma**2 / alpha**2
    noisy = np.any(np.asarray(nodes.eps) != 0, axis=1)
    v = scale**2 + np.where(noisy, 2.0, 1.0) * u
    a = np.asarray(nodes.w, np.float64) * u
    v_eff = np.sum(a) / np.sum(a / v)
    # r = R - v / (2 r): the larger root of r^2 - R r + v / 2 = 0
    return 0.5 * (radius + np.sqrt(radius**2 - 2 * v_eff))


def naive_allpole(x, a, zi=None):
    """All-pole filter as a plain `lax.scan`, differentiated by JAX directly."""
    a = jnp.broadcast_to(a, x.shape + a.shape[-1:])
    order = a.shape[-1]
    zi = jnp.zeros(order, x.dtype) if zi is None else zi

    def step(state, inp):
        xt, at = inp
        y = xt - jnp.dot(at, state)
        return jnp.concatenate([y[None], state[:-1]]), y

    _, y = lax.scan(step, zi, (x, a))
    return y


def check_grads(f, args, **kwargs):
    """`jax.test_util.check_grads` to second order in both modes, on `jit(f)`.

    Jitting `f` makes every derivative program compile once instead of running
    op by op, which halves the cost of these checks.
    """
    options = dict(order=2, modes=("fwd", "rev"), atol=1e-6, rtol=1e-6)
    options.update(kwargs)
    jax.test_util.check_grads(jax.jit(f), args, **options)


def stable_poly(rng, order, radius=0.95, complex_=False):
    """Denominator coefficients, leading 1 dropped, with poles inside `radius`."""
    if complex_:
        r = radius * np.sqrt(rng.uniform(0.0, 1.0, order))
        poles = r * np.exp(2j * np.pi * rng.uniform(size=order))
    else:
        n_pairs, n_real = divmod(order, 2)
        r = radius * np.sqrt(rng.uniform(0.0, 1.0, n_pairs))
        theta = np.pi * rng.uniform(size=n_pairs)
        poles = np.concatenate(
            [r * np.exp(1j * theta), r * np.exp(-1j * theta)]
            + [rng.uniform(-radius, radius, n_real)]
        )
    coeffs = np.poly(poles)[1:]
    return coeffs if complex_ else coeffs.real


def time_varying_allpole(rng, length, order, radius=0.9, complex_=False):
    """Slowly varying stable coefficients: a different stable filter per sample."""
    rows = [stable_poly(rng, order, radius, complex_) for _ in range(length)]
    return np.stack(rows)


def np_ballistics(x, at, rt, zi):
    """torchcomp's compressor_core for one signal, as a plain loop: the attack
    coefficient while the input is below the previous output, else release."""
    x = np.asarray(x)
    at = np.broadcast_to(at, x.shape)
    rt = np.broadcast_to(rt, x.shape)
    y = np.zeros(x.shape, np.result_type(x.dtype, np.float64))
    prev = zi
    for t in range(len(x)):
        c = at[t] if x[t] < prev else rt[t]
        prev = (1 - c) * prev + c * x[t]
        y[t] = prev
    return y


def unchecked(f):
    """`f` without the test suite's runtime type checker, as users call it.

    Shape and dtype errors then reach the library's own messages (jaxtyping's
    hook rejects some of them first in the test run): those messages are what
    a bad-input test must pin down.
    """
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    return f


def np_svf(x, cutoff, q, sr, mode, zi=(0.0, 0.0)):
    """Cytomic's SVF equations, sample by sample, in numpy."""
    n = len(x)
    cutoff = np.broadcast_to(np.asarray(cutoff, float), n)
    q = np.broadcast_to(np.asarray(q, float), n)
    ic1, ic2 = zi
    out = np.empty(n)
    for t in range(n):
        g = np.tan(np.pi * cutoff[t] / sr)
        k = 1 / q[t]
        a1 = 1 / (1 + g * (g + k))
        a2 = g * a1
        a3 = g * a2
        v0 = x[t]
        v3 = v0 - ic2
        v1 = a1 * ic1 + a2 * v3
        v2 = ic2 + a2 * ic1 + a3 * v3
        ic1, ic2 = 2 * v1 - ic1, 2 * v2 - ic2
        low, band, high = v2, v1, v0 - k * v1 - v2
        out[t] = {
            "lowpass": low,
            "bandpass": band,
            "highpass": high,
            "notch": low + high,
            "allpass": low + high - k * band,
            "peak": low - high,
        }[mode]
    return out, np.asarray([ic1, ic2])


def np_state_space(A, B, C, D, x, zi):
    """h[n+1] = A h[n] + B x[n], y[n] = C h[n] + D x[n], a plain loop."""
    length = x.shape[0]
    per = lambda m: (lambda n: m[n]) if m.ndim == 3 else (lambda n: m)
    A_, B_, C_ = per(A), per(B), per(C)
    D_ = None if D is None else per(D)
    h = np.array(zi)
    ys = []
    for n in range(length):
        y = C_(n) @ h + (0 if D is None else D_(n) @ x[n])
        ys.append(y)
        h = A_(n) @ h + B_(n) @ x[n]
    return np.stack(ys), h


def np_gain_computer(level, ct, cr, et, er, knee=0.0):
    """The static curve of `compexp_gain` in dB, sample by sample: the
    output level of Giannoulis, Massberg and Reiss's (2012) soft-knee gain
    computer minus the input level, for the compressor and (mirrored, as in
    dasp-pytorch's expander) the expander; the lower of the two. `knee=0`
    is torchcomp's hard knee; `knee` a scalar or one width per sample."""
    out = np.zeros(len(level))
    knees = np.broadcast_to(np.asarray(knee, float), out.shape)
    for t, (lv, knee) in enumerate(zip(np.asarray(level, float), knees, strict=True)):
        # compressor: the output level, below / in / above the knee
        if 2 * (lv - ct) < -knee:
            comp = lv
        elif 2 * abs(lv - ct) <= knee and knee > 0:
            comp = lv + (1 / cr - 1) * (lv - ct + knee / 2) ** 2 / (2 * knee)
        else:
            comp = ct + (lv - ct) / cr
        # expander, with its slope 1/er below the threshold
        if 2 * (lv - et) > knee:
            exp = lv
        elif 2 * abs(lv - et) <= knee and knee > 0:
            exp = lv + (1 - 1 / er) * (lv - et - knee / 2) ** 2 / (2 * knee)
        else:
            exp = et + (lv - et) / er
        out[t] = min(comp, exp) - lv
    return out


def np_compexp_gain(x_rms, ct, cr, et, er, at, rt, knee=0.0, zi=1.0):
    """`compexp_gain` in numpy: the static curve in dB, then the ballistics."""
    level = 20 * np.log10(np.asarray(x_rms))
    g = np_gain_computer(level, ct, cr, et, er, knee)
    return np_ballistics(10 ** (g / 20), at, rt, zi)


def np_limiter_gain(x, threshold, at, rt):
    """`limiter_gain` in numpy: peak follower, static ceiling, ballistics."""
    peak = np_ballistics(np.abs(np.asarray(x)), rt, at, 0.0)
    ceiling = 10 ** (threshold / 20)
    static = np.where(peak > ceiling, ceiling / np.maximum(peak, 1e-300), 1.0)
    return np_ballistics(static, at, rt, 1.0)


def np_df2(b, a, x, zi):
    """Direct form II over one delay line, a plain loop (`a` without the 1);
    `b` and `a` constant or one row per sample. Returns `(y, final line)`."""
    length = len(x)
    b = np.broadcast_to(b, (length, b.shape[-1]))
    a = np.broadcast_to(a, (length, a.shape[-1]))
    line = list(zi)
    y = np.zeros(length, np.result_type(b, a, x, zi))
    for t in range(length):
        w = x[t] - sum(a[t, k] * line[k] for k in range(a.shape[1]))
        line = [w] + line
        y[t] = sum(b[t, k] * line[k] for k in range(b.shape[1]))
        line = line[: len(zi)]
    return y, np.array(line)


def primitive_eqns_in(jaxpr, primitive):
    """Every equation of `primitive` in `jaxpr`, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive is primitive:
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(primitive_eqns_in(sub, primitive))
    return found


def copies_in(hlo: str, dims: str) -> list[str]:
    """The `copy` instructions of compiled HLO text whose result shape
    contains `dims` (for example `"[8,1000]"`, or `"1000"` for any shape
    with that extent)."""
    return [
        line.strip()
        for line in hlo.splitlines()
        if " copy(" in line and dims in line.split("=", 1)[1].split()[0]
    ]


def allpole_eqns_in(jaxpr):
    """Every all-pole equation of the linear recursion primitive in `jaxpr` (its
    `adjoint` parameter: the transposed recursion, run backwards in time),
    nested jaxprs included."""
    from retrax.ops._linear_primitive import linear_p

    eqns = primitive_eqns_in(jaxpr, linear_p)
    return [eqn for eqn in eqns if eqn.params["structure"] == "allpole"]


def linear_eqns_in(jaxpr):
    """Every diagonal or dense equation of the linear recursion primitive in
    `jaxpr` (its `adjoint` parameter: the transposed recursion, run backwards in
    time), nested jaxprs included."""
    from retrax.ops._linear_primitive import linear_p

    eqns = primitive_eqns_in(jaxpr, linear_p)
    return [eqn for eqn in eqns if eqn.params["structure"] != "allpole"]


def scans_in(jaxpr):
    """Every `scan` equation in `jaxpr`, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "scan":
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found.extend(scans_in(sub))
    return found


# The float32 session's comparisons: float32 against float64 at this
# tolerance of the reference's largest magnitude.
FLOAT32_RTOL = 1e-4


def _weights(shape):
    return np.random.default_rng(123).standard_normal(shape)


def check_float32(f, args, reference=None):
    """`f(*args)` and the gradient of `sum(w * f(*args))` with respect to every
    argument: float32 against float64 (and `reference`, float64 numpy)."""
    args32 = tuple(jnp.asarray(a, jnp.float32) for a in args)
    y32 = jax.jit(f)(*args32)
    assert y32.dtype == jnp.float32
    w = _weights(y32.shape)

    def loss(*v):
        y = f(*v)
        return jnp.sum(jnp.asarray(w, y.dtype) * y)

    grad = jax.jit(jax.grad(loss, argnums=tuple(range(len(args)))))
    g32 = grad(*args32)
    with jax.enable_x64(True):
        args64 = tuple(jnp.asarray(a, jnp.float64) for a in args)
        y64 = np.asarray(jax.jit(f)(*args64))
        g64 = [np.asarray(g) for g in grad(*args64)]
    assert y64.dtype == np.float64
    if reference is not None:
        assert_close(y64, reference, rtol=1e-10)
        assert_close(y32, reference, rtol=FLOAT32_RTOL)
    assert_close(y32, y64, rtol=FLOAT32_RTOL)
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0  # a derivative that is there to compare
        assert_close(g, r, rtol=FLOAT32_RTOL)


def check_module_float32(make, x):
    """A module built in float32 (`make()` in this process) against the same
    module built under x64: output and parameter gradients."""
    w = _weights(np.shape(x))

    def loss(m, x):
        y = m(x)
        return jnp.sum(jnp.asarray(w, y.dtype) * y)

    m32 = make()
    for leaf in jax.tree.leaves(eqx.filter(m32, eqx.is_inexact_array)):
        assert leaf.dtype == jnp.float32
    y32 = eqx.filter_jit(lambda m, x: m(x))(m32, jnp.asarray(x, jnp.float32))
    g32 = eqx.filter_jit(eqx.filter_grad(loss))(m32, jnp.asarray(x, jnp.float32))
    assert y32.dtype == jnp.float32
    with jax.enable_x64(True):
        m64 = make()
        y64 = np.asarray(eqx.filter_jit(lambda m, x: m(x))(m64, jnp.asarray(x)))
        g64 = eqx.filter_jit(eqx.filter_grad(loss))(m64, jnp.asarray(x))
        g64 = [np.asarray(g) for g in jax.tree.leaves(g64)]
    assert_close(y32, y64, rtol=FLOAT32_RTOL)
    g32 = jax.tree.leaves(g32)
    assert len(g32) == len(g64) > 0
    for g, r in zip(g32, g64, strict=True):
        assert g.dtype == jnp.float32
        assert np.max(np.abs(r)) > 0  # a derivative that is there to compare
        assert_close(g, r, rtol=FLOAT32_RTOL)
    return y64


class QuadraticEnergy(eqx.Module):
    """The energy 0.5 (x - b)^T A (x - b): a Gaussian relation."""

    a: jax.Array
    b: jax.Array

    def __call__(self, x, t):
        d = x - self.b
        return 0.5 * d @ self.a @ d


def gaussian_energy_factor(schedule, dtype=jnp.float64):
    """A factor over `x` (1 coordinate) and `y` (2) whose relation is the
    exact Gaussian energy of `QuadraticEnergy`, on noise-free nodes."""
    import retrax.relations as rr
    from retrax.diffusion import EnergyNetwork

    a = jnp.asarray([[2.0, 0.5, 0.0], [0.5, 1.0, 0.2], [0.0, 0.2, 1.5]], dtype)
    b = jnp.asarray([0.3, -0.2, 0.1], dtype)
    nodes = rr.noisefree_nodes(3, 0.01)
    pred = EnergyNetwork(QuadraticEnergy(a, b), schedule)
    rel = rr.ImplicitDiffusion(pred, nodes, lam=rr.density_lambda(schedule, nodes))
    return rr.Factor(rel, {"x": 1, "y": 2})


def tiny_training_problem(getkey, dtype=jnp.float64):
    """A small network's noise predictor and 32 points of 2-D data to fit."""
    from retrax.diffusion import VPSDE, NoisePredictor, TimeMLP

    data = jax.random.normal(getkey(), (32, 2), dtype)
    model = TimeMLP(2, hidden=8, depth=1, key=getkey(), dtype=dtype)
    return NoisePredictor(model, VPSDE()), data


def tree_is_finite(tree) -> bool:
    leaves = jax.tree.leaves(eqx.filter(tree, eqx.is_inexact_array))
    return all(bool(jnp.all(jnp.isfinite(x))) for x in leaves)


def fit_kwargs(**changes):
    """`fit`'s keyword arguments for the tiny problems: batches of 8, quiet."""
    kw = dict(batch_size=8, progress=False)
    kw.update(changes)
    return kw


def check_signal_first(f, x, coefficients, zi):
    """`f`, one of retrax's ops that took its `coefficients` before the signal
    until this release, takes `f(x, **coefficients, zi=zi)`: calls by keyword
    in either order give its numbers, and a second positional argument (the
    old order, with or without `zi`, or the new order by position) raises a
    `TypeError` naming the new spelling, eagerly and while `jax.jit` traces."""
    name, old = f.__name__, tuple(coefficients.values())
    want = f(x, **coefficients, zi=zi)
    assert_close(f(**coefficients, x=x, zi=zi), want, rtol=0)
    assert_close(f(zi=zi, x=x, **coefficients), want, rtol=0)
    keywords = ", ".join(f"{k}={k}" for k in coefficients)
    new = f"`{name}(x, {keywords})` (it was `{name}({', '.join(coefficients)}, x)`)"
    with_zi = f"`{name}(x, {keywords}, zi=zi)`"
    calls = [
        (lambda: f(*old, x), new),
        (lambda: f(*old, x=x), new),
        (lambda: f(x, *old), new),
        (lambda: jax.jit(f)(*old, x), new),
        (lambda: f(*old, x, zi), with_zi),
        (lambda: jax.jit(lambda *v: f(*v))(*old, x, zi), with_zi),
    ]
    for call, spelling in calls:
        with pytest.raises(TypeError, match=re.escape(spelling)) as info:
            call()
        assert "keyword-only" in str(info.value)
