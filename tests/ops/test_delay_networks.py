"""The effects' ops: feedback comb, Schroeder allpass, fractional delay line,
feedback delay network, and the network's frequency-sampling evaluation.

Values against scipy.signal.lfilter (constant gains) and plain numpy loops of
the definitions (per-sample gains, the interpolators' closed forms);
derivatives against finite differences; streaming, vmap, float32; the
parameter errors eagerly and under `jit`; and the gradients of the comb, the
allpass and the network as one forward and one reversed recursion on the core.
"""

import re

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.signal

from helpers import (
    assert_close,
    check_grads,
    linear_eqns_in,
    raises_eagerly_and_under_jit,
    scans_in,
    unchecked,
)
from retrax.ops import (
    comb,
    delay,
    fdn,
    fdn_frequency_response,
    fdn_impulse_response,
    schroeder_allpass,
)


# --- references --------------------------------------------------------------


def np_comb(x, D, g, zi):
    """y[t] = x[t] + g[t] y[t - D], with y[-k-1] = zi[k]."""
    g = np.broadcast_to(g, x.shape)
    y = np.zeros(len(x))
    past = lambda t: y[t] if t >= 0 else zi[-t - 1]  # noqa: E731
    for t in range(len(x)):
        y[t] = x[t] + g[t] * past(t - D)
    return y


def np_allpass(x, D, g, zi):
    """y[t] = -g[t] x[t] + x[t - D] + g[t] y[t - D], with zi[0] the past
    inputs and zi[1] the past outputs, newest first."""
    g = np.broadcast_to(g, x.shape)
    y = np.zeros(len(x))
    for t in range(len(x)):
        xd = x[t - D] if t >= D else zi[0][D - t - 1]
        yd = y[t - D] if t >= D else zi[1][D - t - 1]
        y[t] = -g[t] * x[t] + xd + g[t] * yd
    return y


def _lagrange3(p):
    nodes = range(4)
    return [np.prod([(p - j) / (k - j) for j in nodes if j != k]) for k in nodes]


def np_delay(x, d, zi, interpolation):
    """y[t] = x(t - d[t]) by the interpolator's closed form, with x[-k-1] =
    zi[k] (zero before zi)."""
    d = np.broadcast_to(d, x.shape)

    def at(i):
        if i >= 0:
            return x[i]
        return zi[-i - 1] if -i - 1 < len(zi) else 0.0

    y = np.zeros(len(x))
    for t in range(len(x)):
        n = int(np.floor(d[t]))
        f = d[t] - n
        if interpolation == "linear":
            y[t] = (1 - f) * at(t - n) + f * at(t - n - 1)
        else:
            m = max(n - 1, 0)
            w = _lagrange3(d[t] - m)
            y[t] = sum(w[k] * at(t - m - k) for k in range(4))
    return y


def np_fdn(x, delays, A, b, c, d, zi):
    """The delay network as a plain sample loop: s_i[t] = b_i x[t] + sum_j
    A[i, j] s_j[t - m_j], y[t] = sum_i c_i s_i[t - m_i] + d x[t], with
    s_i[-k-1] = zi[i, k]; also the final state in that layout."""
    lines, longest, length = len(delays), max(delays), len(x)
    s = np.zeros((length, lines))
    y = np.zeros(length)

    def value(i, t):
        return s[t, i] if t >= 0 else zi[i, -t - 1]

    for t in range(length):
        o = np.array([value(i, t - m) for i, m in enumerate(delays)])
        s[t] = b * x[t] + A @ o
        y[t] = c @ o + d * x[t]
    zf = [[value(i, length - 1 - k) for k in range(longest)] for i in range(lines)]
    return y, np.array(zf)


def _fdn_case(rng, lines=4, gain=0.9):
    A = gain * np.linalg.qr(rng.standard_normal((lines, lines)))[0]
    b, c = rng.standard_normal(lines), rng.standard_normal(lines)
    return A, b, c


def _sparse(D, g):
    """scipy's (b, a) of the comb and of the allpass with delay D, gain g."""
    a = np.zeros(D + 1)
    a[0], a[D] = 1.0, -g
    b = np.zeros(D + 1)
    b[0], b[D] = -g, 1.0
    return b, a


# --- values ------------------------------------------------------------------


@pytest.mark.parametrize("D", [1, 3, 7, 60])
def test_comb_equals_lfilter(D):
    rng = np.random.default_rng(D)
    x = rng.standard_normal(50)
    g = -0.7 if D == 3 else 0.8
    zi = rng.standard_normal(D)
    _, a = _sparse(D, g)
    ref, ref_zf = scipy.signal.lfilter(
        [1.0], a, x, zi=scipy.signal.lfiltic([1.0], a, zi)
    )
    y, zf = comb(jnp.asarray(x), D, g, zi=jnp.asarray(zi), return_zf=True)
    assert_close(y, ref, rtol=1e-12)
    assert_close(comb(jnp.asarray(x), D, g), scipy.signal.lfilter([1.0], a, x))
    # zf: the last D outputs newest first (the history where T < D)
    expected_zf = np.concatenate([ref[::-1], zi])[:D]
    assert_close(zf, expected_zf)
    del ref_zf


@pytest.mark.parametrize("D", [1, 4, 60])
def test_schroeder_allpass_equals_lfilter(D):
    rng = np.random.default_rng(10 + D)
    x = rng.standard_normal(50)
    g = 0.65
    zi = rng.standard_normal((2, D))
    b, a = _sparse(D, g)
    zi_scipy = scipy.signal.lfiltic(b, a, zi[1], zi[0])
    ref, _ = scipy.signal.lfilter(b, a, x, zi=zi_scipy)
    y, zf = schroeder_allpass(jnp.asarray(x), D, g, zi=jnp.asarray(zi), return_zf=True)
    assert_close(y, ref, rtol=1e-12)
    assert_close(schroeder_allpass(jnp.asarray(x), D, g), scipy.signal.lfilter(b, a, x))
    assert_close(zf[0], np.concatenate([x[::-1], zi[0]])[:D])
    assert_close(zf[1], np.concatenate([ref[::-1], zi[1]])[:D])


def test_schroeder_allpass_has_unit_magnitude():
    # |H| = 1 at every frequency: the impulse response's spectrum.
    x = np.zeros(4096)
    x[0] = 1.0
    h = schroeder_allpass(jnp.asarray(x), 5, 0.7)
    assert_close(np.abs(np.fft.rfft(np.asarray(h))), np.ones(2049), rtol=1e-9)


def test_per_sample_gain_equals_loop():
    rng = np.random.default_rng(1)
    x = rng.standard_normal(40)
    g = rng.uniform(-0.95, 0.95, 40)
    zi = rng.standard_normal((2, 6))
    y = comb(jnp.asarray(x), 6, jnp.asarray(g), zi=jnp.asarray(zi[1]))
    assert_close(y, np_comb(x, 6, g, zi[1]), rtol=1e-12)
    y = schroeder_allpass(jnp.asarray(x), 6, jnp.asarray(g), zi=jnp.asarray(zi))
    assert_close(y, np_allpass(x, 6, g, zi), rtol=1e-12)


def test_associative_method_equals_sequential():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.standard_normal(45))
    g = jnp.asarray(rng.uniform(-0.9, 0.9, 45))
    zi = jnp.asarray(rng.standard_normal(4))
    assert_close(
        comb(x, 4, g, zi=zi, method="associative"), comb(x, 4, g, zi=zi), rtol=1e-12
    )


@pytest.mark.parametrize("interpolation", ["linear", "lagrange3"])
def test_integer_delay_is_an_exact_shift(interpolation):
    rng = np.random.default_rng(3)
    x = rng.standard_normal(30)
    for n in (0, 1, 2, 5):
        y = delay(jnp.asarray(x), float(n), interpolation=interpolation)
        np.testing.assert_array_equal(y, np.concatenate([np.zeros(n), x[: 30 - n]]))
    # per-sample integer delays, reading the history zi
    zi = rng.standard_normal(9)
    d = rng.integers(0, 8, 30).astype(float)
    y = delay(jnp.asarray(x), jnp.asarray(d), zi=jnp.asarray(zi),
              interpolation=interpolation)  # fmt: skip
    full = np.concatenate([zi[::-1], x])
    np.testing.assert_array_equal(y, full[9 + np.arange(30) - d.astype(int)])


@pytest.mark.parametrize("interpolation", ["linear", "lagrange3"])
def test_fractional_delay_equals_closed_form(interpolation):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(40)
    zi = rng.standard_normal(12)
    d = rng.uniform(0.0, 10.0, 40)  # both sides of d = 1 for lagrange3
    y = delay(jnp.asarray(x), jnp.asarray(d), zi=jnp.asarray(zi),
              interpolation=interpolation)  # fmt: skip
    assert_close(y, np_delay(x, d, zi, interpolation), rtol=1e-12)
    for dc in (0.3, 2.75):  # constant delays, zero history
        y = delay(jnp.asarray(x), dc, interpolation=interpolation)
        assert_close(y, np_delay(x, dc, [], interpolation), rtol=1e-12)


def test_interpolators_frequency_responses():
    # The responses the docstring states: linear |H|^2 = 1 - 2f(1-f)(1 - cos w)
    # with a zero at Nyquist at half a sample; the centred cubic never
    # exceeds 1 and keeps -1 dB up to 0.49 pi at half a sample.
    impulse = jnp.zeros(64).at[0].set(1.0)
    w = np.linspace(0.0, np.pi, 33)
    for d in (2.25, 2.5, 4.8):
        f = d - np.floor(d)
        h = np.asarray(delay(impulse, d))
        response = np.abs(np.fft.rfft(h))
        assert_close(response**2, 1 - 2 * f * (1 - f) * (1 - np.cos(w)), rtol=1e-12)
    assert np.abs(np.fft.rfft(np.asarray(delay(impulse, 2.5))))[-1] < 1e-12
    for d in (1.0, 1.3, 2.5, 3.75):
        h = np.asarray(delay(impulse, d, interpolation="lagrange3"))
        assert np.max(np.abs(np.fft.rfft(h, 1024))) <= 1 + 1e-12
    h = np.asarray(delay(impulse, 2.5, interpolation="lagrange3"))
    gain_db = 20 * np.log10(np.abs(np.fft.rfft(h, 1024))[:-1])  # Nyquist: a zero
    assert gain_db[int(0.49 * 512)] >= -1.0
    assert abs(gain_db[256] - (-1.07)) < 0.01  # at pi / 2


def test_lagrange3_is_closer_to_a_band_limited_delay():
    # A slow sinusoid delayed by a fraction of a sample: the cubic's error is
    # far below the linear one's (order w^4 against w^2).
    t = np.arange(200)
    w = 0.2 * np.pi
    x = jnp.asarray(np.sin(w * t))
    exact = np.sin(w * (t - 3.4))
    err = {
        i: np.max(np.abs(np.asarray(delay(x, 3.4, interpolation=i)) - exact)[10:])
        for i in ("linear", "lagrange3")
    }
    assert err["lagrange3"] < 0.1 * err["linear"], err


@pytest.mark.parametrize("delays", [(3, 5, 7, 11), (6,), (8, 1, 5)])
def test_fdn_equals_loop(delays):
    rng = np.random.default_rng(sum(delays))
    A, b, c = _fdn_case(rng, len(delays))
    x = rng.standard_normal(60)
    zi = rng.standard_normal((len(delays), max(delays)))
    y, zf = fdn(jnp.asarray(x), delays, A, b, c, 0.3, zi=jnp.asarray(zi),
                return_zf=True)  # fmt: skip
    ref, ref_zf = np_fdn(x, delays, A, b, c, 0.3, zi)
    assert_close(y, ref, rtol=1e-10)
    assert_close(zf, ref_zf, rtol=1e-10)
    zero = np.zeros_like(zi)
    assert_close(fdn(x, delays, A, b, c), np_fdn(x, delays, A, b, c, 0.0, zero)[0],
                 rtol=1e-10)  # fmt: skip


def test_lossless_fdn_keeps_its_energy():
    # An orthogonal feedback matrix and delays filled with a state: the
    # lines' energy is preserved sample after sample (no input).
    rng = np.random.default_rng(12)
    delays = (3, 4, 7)
    A, _, _ = _fdn_case(rng, 3, gain=1.0)
    zi = np.zeros((3, 7))
    for i, m in enumerate(delays):
        zi[i, :m] = rng.standard_normal(m)
    _, zf = fdn(jnp.zeros(200), delays, A, np.zeros(3), np.zeros(3),
                zi=jnp.asarray(zi), return_zf=True)  # fmt: skip
    energy = lambda z: sum(
        np.sum(np.asarray(z)[i, :m] ** 2) for i, m in enumerate(delays)
    )  # noqa: E501, E731
    assert abs(energy(zf) - energy(zi)) <= 1e-12 * energy(zi)


# --- streaming, vmap, float32 ------------------------------------------------


def test_streaming_equals_one_call():
    rng = np.random.default_rng(5)
    T = 40
    x = jnp.asarray(rng.standard_normal(T))
    g = jnp.asarray(rng.uniform(-0.9, 0.9, T))
    d = jnp.asarray(rng.uniform(0.0, 6.0, T))
    A, fb, fc = (jnp.asarray(v) for v in _fdn_case(rng, 3))

    @jax.jit  # every op at once: one compilation per block length
    def ops(x, g, d, zi):
        outs = [
            comb(x, 5, g, zi=zi[0], return_zf=True),
            schroeder_allpass(x, 5, g, zi=zi[1], return_zf=True),
            delay(x, d, zi=zi[2], return_zf=True),
            delay(x, d, zi=zi[3], interpolation="lagrange3", return_zf=True),
            fdn(x, (3, 4, 7), A, fb, fc, 0.2, zi=zi[4], return_zf=True),
        ]
        return [y for y, _ in outs], [zf for _, zf in outs]

    # histories for delays up to 6 samples, and the network's lines
    zi = [jnp.zeros(5), jnp.zeros((2, 5)), jnp.zeros(7), jnp.zeros(8)]
    zi.append(jnp.asarray(rng.standard_normal((3, 7))))
    whole, zf = ops(x, g, d, zi)
    ys, state = [], zi
    # blocks shorter and longer than the delays, of two lengths (compilations)
    for lo, hi in [(0, 3), (3, 20), (20, 37), (37, 40)]:
        y, state = ops(x[lo:hi], g[lo:hi], d[lo:hi], state)
        ys.append(y)
    for i in range(5):
        assert_close(jnp.concatenate([y[i] for y in ys]), whole[i])
        assert_close(state[i], zf[i])
    # the same final state when the history comes from `max_delay`
    assert_close(delay(x, d, max_delay=6, return_zf=True)[1], zf[2])


def test_vmap_over_a_batch():
    rng = np.random.default_rng(6)
    x = jnp.asarray(rng.standard_normal((3, 30)))
    g = jnp.asarray(rng.uniform(-0.9, 0.9, (3, 30)))
    d = jnp.asarray(rng.uniform(0.0, 4.0, (3, 30)))

    def ops(x, g, d):
        return jnp.stack([
            comb(x, 4, g),
            schroeder_allpass(x, 4, g),
            delay(x, d, max_delay=4, interpolation="lagrange3"),
            fdn(x, (2, 5), A, g[:2], g[2:4]),
        ])  # fmt: skip

    A = jnp.asarray(_fdn_case(rng, 2)[0])
    batched = jax.jit(jax.vmap(ops))(x, g, d)
    one = jax.jit(ops)
    for i in range(3):
        assert_close(batched[i], one(x[i], g[i], d[i]))


def test_float32():
    rng = np.random.default_rng(7)
    x = rng.standard_normal(64)
    g = rng.uniform(-0.9, 0.9, 64)
    d = rng.uniform(0.0, 5.0, 64)

    def ops(x, g, d):
        return jnp.stack([
            comb(x, 3, g),
            schroeder_allpass(x, 3, g),
            delay(x, d),
            delay(x, d, interpolation="lagrange3"),
            fdn(x, (2, 3), A, g[:2], g[2:4]),
        ])  # fmt: skip

    A = np.asarray(_fdn_case(rng, 2)[0], np.float32)
    refs = [
        np_comb(x, 3, g, np.zeros(3)),
        np_allpass(x, 3, g, np.zeros((2, 3))),
        np_delay(x, d, [], "linear"),
        np_delay(x, d, [], "lagrange3"),
        np_fdn(x, (2, 3), A, g[:2], g[2:4], 0.0, np.zeros((2, 3)))[0],
    ]
    args32 = [jnp.asarray(v, jnp.float32) for v in (x, g, d)]
    y = jax.jit(ops)(*args32)
    assert y.dtype == jnp.float32
    for row, ref in zip(y, refs, strict=True):
        assert_close(row, ref, rtol=1e-5)
    loss = jax.jit(jax.grad(lambda *a: jnp.sum(ops(*a) ** 2), argnums=(0, 1, 2)))
    assert all(v.dtype == jnp.float32 for v in loss(*args32))


# --- derivatives -------------------------------------------------------------
# One `check_grads` per function of several ops (it compiles dozens of
# derivative programs, whatever the function holds).


@pytest.mark.full
def test_comb_and_allpass_derivatives():
    rng = np.random.default_rng(8)
    x = jnp.asarray(rng.standard_normal(12))
    g = jnp.asarray(rng.uniform(-0.8, 0.8, 12))
    zi = jnp.asarray(rng.standard_normal((2, 3)))

    def f(x, g, g0, zi):
        return jnp.concatenate([
            comb(x, 3, g, zi=zi[1]),
            comb(x, 5, g0),  # a constant gain
            schroeder_allpass(x, 3, g, zi=zi),
        ])  # fmt: skip

    check_grads(f, (x, g, jnp.asarray(0.6), zi))


@pytest.mark.full
def test_fdn_derivatives():
    rng = np.random.default_rng(13)
    x = jnp.asarray(rng.standard_normal(12))
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3, gain=0.8))
    zi = jnp.asarray(rng.standard_normal((3, 5)))

    def f(x, A, b, c, d, zi):
        return fdn(x, (2, 3, 5), A, b, c, d, zi=zi)

    check_grads(f, (x, A, b, c, jnp.asarray(0.4), zi))


@pytest.mark.full
def test_delay_derivatives():
    rng = np.random.default_rng(10)
    x = jnp.asarray(rng.standard_normal(12))
    # away from integers (the interpolators' kinks), below and above 1
    d = jnp.asarray(rng.integers(0, 4, 12) + rng.uniform(0.1, 0.9, 12))
    zi = jnp.asarray(rng.standard_normal(6))

    def f(x, d, d0, zi):
        return jnp.concatenate([
            delay(x, d, zi=zi, interpolation="lagrange3"),
            delay(x, d0),  # a constant delay, linear
        ])  # fmt: skip

    check_grads(f, (x, d, jnp.asarray(2.3), zi))


def _recurrences(jaxpr):
    """The time recursions, as their `reverse` flags: scans and the core's
    diagonal and dense primitive (its `adjoint` runs backwards in time)."""
    flags = [eqn.params["reverse"] for eqn in scans_in(jaxpr)]
    flags += [eqn.params["adjoint"] for eqn in linear_eqns_in(jaxpr)]
    return sorted(flags)


def _carry(eqn):
    """The shapes a scan carries from step to step."""
    first = eqn.params["num_consts"]
    return eqn.params["jaxpr"].in_avals[first : first + eqn.params["num_carry"]]


def test_comb_gradient_is_the_adjoint_recursion():
    # One forward and one reversed scan on the core, each carrying the D
    # lagged outputs only: no per-sample loop with its own gradient.
    rng = np.random.default_rng(11)
    x = jnp.asarray(rng.standard_normal(100))
    g = jnp.asarray(rng.uniform(-0.9, 0.9, 100))
    zi = jnp.zeros(7)
    for op, zi_ in ((comb, zi), (schroeder_allpass, jnp.zeros((2, 7)))):

        def loss(x, g, zi, op=op):
            return jnp.sum(jnp.sin(op(x, 7, g, zi=zi)))

        jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(x, g, zi_).jaxpr
        assert _recurrences(jaxpr) == [False, True]
        for eqn in scans_in(jaxpr):
            carry = _carry(eqn)
            assert sum(int(np.prod(v.shape)) for v in carry) == 7
            assert eqn.params["length"] == 15  # ceil(100 / 7) blocks
        for eqn in linear_eqns_in(jaxpr):  # a state of 7, over 15 blocks
            assert eqn.invars[2].aval.shape == (7,)
            assert eqn.invars[1].aval.shape == (15, 7)
        batched = jax.make_jaxpr(jax.vmap(jax.grad(loss, argnums=(0, 1, 2))))(
            x[None].repeat(3, 0), g[None].repeat(3, 0), zi_[None].repeat(3, 0)
        )
        assert _recurrences(batched.jaxpr) == [False, True]


def test_fdn_gradient_is_the_adjoint_recursion():
    # One scan each way over blocks of the shortest line (3), each carrying
    # the lines' history: the max(delays) = 7 values before the start and the
    # 34 blocks of the signal, N x (7 + 34 x 3) numbers, updated in place.
    rng = np.random.default_rng(14)
    x = jnp.asarray(rng.standard_normal(100))
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3))

    def loss(x, A, b, c):
        return jnp.sum(jnp.sin(fdn(x, (3, 4, 7), A, b, c)))

    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2, 3)))(x, A, b, c).jaxpr
    assert _recurrences(jaxpr) == [False, True]
    for eqn in scans_in(jaxpr):
        carry = _carry(eqn)
        assert sum(int(np.prod(v.shape)) for v in carry) == 3 * (7 + 34 * 3)
        assert eqn.params["length"] == 34  # ceil(100 / 3) blocks


def _loop_bodies(hlo: str) -> dict[str, str]:
    """The computations of compiled HLO text that run as `while` bodies."""
    names = set(re.findall(r"body=%([\w.\-]+)", hlo))
    bodies = {}
    for block in re.split(r"\n(?=%)", hlo):
        name = re.match(r"%([\w.\-]+)", block)
        if name and name.group(1) in names:
            bodies[name.group(1)] = block
    assert set(bodies) == names
    return bodies


@pytest.mark.parametrize("shortest", [1, 3])
def test_fdn_loops_update_the_history_in_place(shortest):
    # Neither loop copies the lines' history at a step, forward or backward:
    # a copy a step costs O(N T) a step, O(N T^2) in all, what shifting a
    # buffer of the last max(delays) values once cost (FDNReverb, whose
    # filters are one-sample lines, took seconds for a second of audio).
    rng = np.random.default_rng(15)
    x = jnp.asarray(rng.standard_normal(100))
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3))
    delays = (shortest, 4, 7)

    def loss(x, A):
        return jnp.sum(jnp.sin(fdn(x, delays, A, b, c)))

    rows = -(-100 // shortest)
    shape = rf"f{x.dtype.itemsize * 8}\[{7 + rows * shortest},3\]"
    for fn in (loss, jax.grad(loss, argnums=(0, 1))):
        hlo = jax.jit(fn).lower(x, A).compile().as_text()
        bodies = _loop_bodies(hlo)
        assert any(re.search(shape, body) for body in bodies.values())
        for body in bodies.values():
            assert not re.search(shape + r"\{[\d,]*\} copy\(", body)


def test_fdn_reverse_mode_saves_no_history_of_lines(capsys):
    # What reverse mode keeps: the input, the (T, N) feedback reads and the
    # lines' output, the matrix, the initial lines; never a (blocks, N, M)
    # history of the carried delay lines.
    length, lines = 100, 3
    rng = np.random.default_rng(16)
    x = jnp.asarray(rng.standard_normal(length))
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, lines))

    def loss(x, A, b, c):
        return jnp.sum(jnp.sin(fdn(x, (3, 4, 7), A, b, c)))

    jax.ad_checkpoint.print_saved_residuals(loss, x, A, b, c)
    shapes = []
    for line in capsys.readouterr().out.splitlines():
        match = re.match(r"\s*\w+\[([\d,]*)\]", line)
        assert match, line
        shapes.append(tuple(int(n) for n in match.group(1).split(",") if n))
    assert all(len(s) <= 2 for s in shapes), shapes
    assert sum(int(np.prod(s)) for s in shapes) <= 4 * length * lines + 2 * length


# --- bad parameters ----------------------------------------------------------


def test_bad_delay_lengths():
    x = jnp.ones(10)
    for bad in (0, -2, 1.5, 2.0, True, None):
        with pytest.raises(ValueError, match="`delay` must be a Python int >= 1"):
            unchecked(comb)(x, bad, 0.5)
        with pytest.raises(ValueError, match="`delay` must be a Python int >= 1"):
            unchecked(schroeder_allpass)(x, bad, 0.5)
    with pytest.raises(ValueError, match="`delay` must be a Python int >= 1"):
        jax.jit(unchecked(comb))(x, 3, 0.5)  # a traced delay


@pytest.mark.parametrize("op", [comb, schroeder_allpass])
def test_unstable_or_non_finite_gains_raise(op):
    x = jnp.ones(10)
    match = r"`g` must be finite with \|g\| < 1"

    def f(x, g):  # one function, so that `jit` compiles it once per shape
        return op(x, 3, g)

    for g in (1.0, -1.0, 1.5, float("nan")):
        with pytest.raises(ValueError, match=match):
            op(x, 3, g)  # a Python number: at once
        raises_eagerly_and_under_jit(f, x, jnp.asarray(g), match=match)
    per_sample = jnp.full(10, 0.5).at[7].set(1.0)
    raises_eagerly_and_under_jit(f, x, per_sample, match=match)
    raises_eagerly_and_under_jit(f, x, per_sample.at[7].set(jnp.inf), match=match)
    # and inside a gradient
    with pytest.raises(Exception, match=match):
        jax.jit(jax.grad(lambda g: jnp.sum(op(x, 3, g))))(per_sample)


def test_comb_and_allpass_shapes():
    x = jnp.ones(10)
    with pytest.raises(ValueError, match="`zi` must be the last 3 outputs"):
        unchecked(comb)(x, 3, 0.5, zi=jnp.zeros(4))
    with pytest.raises(ValueError, match="`zi` must be the last 3 inputs and outputs"):
        unchecked(schroeder_allpass)(x, 3, 0.5, zi=jnp.zeros(3))
    with pytest.raises(ValueError, match="`g` must be a scalar or have one value"):
        unchecked(comb)(x, 3, jnp.full(9, 0.5))
    with pytest.raises(TypeError, match="`x` must be real"):
        comb(x.astype(jnp.complex128), 3, 0.5)


def test_bad_delays_raise():
    x = jnp.ones(10)
    match = "`d` must be a finite delay >= 0"

    def f(x, d):
        return delay(x, d)

    for d in (-0.5, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=match):
            delay(x, d)
        raises_eagerly_and_under_jit(f, x, jnp.asarray(d), match=match)
    per_sample = jnp.full(10, 2.5).at[4].set(-1.0)
    raises_eagerly_and_under_jit(f, x, per_sample, match=match)


def test_delay_longer_than_the_history_raises():
    x = jnp.ones(10)
    match = "`d` must be at most `max_delay` = 4.0"
    with pytest.raises(ValueError, match=match):
        delay(x, 4.5, max_delay=4)
    per_sample = jnp.full(10, 2.5).at[4].set(4.01)
    raises_eagerly_and_under_jit(
        lambda x, d: delay(x, d, max_delay=4), x, per_sample, match=match
    )
    # the history a zi holds: 5 samples support delays up to 4 (linear) or 3
    raises_eagerly_and_under_jit(
        lambda x, d: delay(x, d, zi=jnp.zeros(5)), x, per_sample, match=match
    )
    with pytest.raises(ValueError, match="`d` must be at most `max_delay` = 3.0"):
        delay(x, 3.5, zi=jnp.zeros(5), interpolation="lagrange3")
    assert delay(x, 4.0, zi=jnp.zeros(5)).shape == (10,)  # the bound is allowed


def test_delay_bad_arguments():
    x = jnp.ones(10)
    with pytest.raises(ValueError, match="`interpolation` must be one of"):
        delay(x, 1.0, interpolation="cubic")
    with pytest.raises(ValueError, match="`max_delay` must be a finite number >= 0"):
        delay(x, 1.0, max_delay=-1)
    with pytest.raises(TypeError, match="`max_delay` is fixed when the program"):
        jax.jit(lambda m: unchecked(delay)(x, 1.0, max_delay=m))(4.0)
    with pytest.raises(ValueError, match=r"`zi` must be the last 5 inputs .* \(5,\)"):
        delay(x, 1.0, max_delay=4, zi=jnp.zeros(4))
    with pytest.raises(ValueError, match=r"H >= 3 for 'lagrange3'"):
        delay(x, 1.0, zi=jnp.zeros(2), interpolation="lagrange3")
    with pytest.raises(ValueError, match="`return_zf=True` needs a bounded history"):
        delay(x, 1.0, return_zf=True)
    with pytest.raises(ValueError, match="`d` must be a scalar or have one value"):
        unchecked(delay)(x, jnp.ones(9))


def test_fdn_bad_parameters():
    rng = np.random.default_rng(15)
    x = jnp.ones(10)
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3, gain=1.0))
    match = "`A` must have spectral norm at most 1"

    def f(x, A):
        return fdn(x, (2, 3, 4), A, b, c)

    assert f(x, A).shape == (10,)  # lossless (orthogonal) is allowed
    with pytest.raises(ValueError, match=match):
        fdn(x, (2, 3, 4), 1.01 * np.asarray(A), b, c)  # NumPy: at once
    raises_eagerly_and_under_jit(f, x, 1.01 * A, match=match)
    raises_eagerly_and_under_jit(f, x, A.at[0, 0].set(jnp.nan),
                                 match="`A` has non-finite")  # fmt: skip
    for bad in ((2, 0, 4), (2, 3.0, 4), ()):
        with pytest.raises(ValueError, match="delay"):
            unchecked(fdn)(x, bad, A, b, c)
    with pytest.raises(ValueError, match=r"`b` must have shape \(3,\)"):
        unchecked(fdn)(x, (2, 3, 4), A, b[:2], c)
    with pytest.raises(ValueError, match=r"`A` must have shape \(2, 2\)"):
        unchecked(fdn)(x, (2, 3), A, b, c)
    with pytest.raises(ValueError, match=r"`zi` must be the last 4 values"):
        unchecked(fdn)(x, (2, 3, 4), A, b, c, zi=jnp.zeros((3, 3)))


# --- the network by frequency sampling -----------------------------------------


def np_fdn_response(delays, A, b, c, d, z, gains=None):
    """c^T (D(z)^-1 Gamma^-1 - A)^-1 b + d at each z, by numpy solves."""
    m = np.asarray(delays)
    gains = np.ones((len(z), len(m))) if gains is None else gains
    gains = np.broadcast_to(gains, (len(z), len(m)))
    return np.array([
        c @ np.linalg.solve(np.diag(zk**m / gk) - A, b) + d
        for zk, gk in zip(z, gains, strict=True)
    ])  # fmt: skip


@pytest.mark.parametrize("delays", [(3, 5, 7, 11), (8, 1, 5)])
def test_fdn_frequency_response_is_the_decayed_response_fft(delays):
    rng = np.random.default_rng(30 + len(delays))
    A, b, c = _fdn_case(rng, len(delays), gain=0.5)
    n_fft = 512  # the response has decayed below 1e-11 by then
    h = fdn_impulse_response(delays, A, b, c, 0.3, length=n_fft)
    assert np.max(np.abs(h[-50:])) < 1e-11 * np.max(np.abs(h))
    response = fdn_frequency_response(delays, A, b, c, 0.3, n_fft=n_fft)
    assert response.dtype == jnp.complex128 and response.shape == (257,)
    assert_close(response, np.fft.rfft(np.asarray(h)), rtol=1e-8)
    z = np.exp(2j * np.pi * np.arange(257) / n_fft)
    assert_close(response, np_fdn_response(delays, A, b, c, 0.3, z), rtol=1e-12)
    h_freq = fdn_impulse_response(
        delays, A, b, c, 0.3, length=300, method="frequency", n_fft=n_fft
    )
    assert_close(h_freq, h[:300], rtol=1e-8)


def test_fdn_line_gains():
    rng = np.random.default_rng(34)
    delays = (3, 4, 7)
    A, b, c = _fdn_case(rng, 3, gain=1.0)  # lossless; the gains make it decay
    gains = rng.uniform(0.6, 0.9, 3)
    h = fdn_impulse_response(delays, A, b, c, length=512, line_gains=gains)
    h_freq = fdn_impulse_response(delays, A, b, c, length=512, n_fft=2048,
                                  method="frequency", line_gains=gains)  # fmt: skip
    assert_close(h_freq, h, rtol=1e-8)  # decayed within 2048 samples
    assert_close(h, fdn(np.eye(1, 512)[0], delays, A * gains, b, c * gains))
    # a response per line and frequency (real: zero phase)
    n_fft = 64
    per_bin = rng.uniform(0.3, 0.9, (33, 3))
    z = np.exp(2j * np.pi * np.arange(33) / n_fft)
    response = fdn_frequency_response(delays, A, b, c, 0.2, n_fft=n_fft,
                                      line_gains=per_bin)  # fmt: skip
    assert_close(response, np_fdn_response(delays, A, b, c, 0.2, z, per_bin),
                 rtol=1e-12)  # fmt: skip


@pytest.mark.full
def test_fdn_frequency_response_derivatives():
    rng = np.random.default_rng(35)
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3, gain=0.5))
    gains = jnp.asarray(rng.uniform(0.3, 0.6, (9, 3)))

    def f(A, b, c, d, gains):
        # every bin's real and imaginary part reach the 16 samples (except
        # the imaginary parts of z = 1 and z = -1, which are zero)
        return fdn_impulse_response((2, 3, 5), A, b, c, d, length=16,
                                    method="frequency", line_gains=gains)  # fmt: skip

    check_grads(f, (A, b, c, jnp.asarray(0.4), gains))


def test_fdn_frequency_response_vmap_and_jit():
    rng = np.random.default_rng(36)
    A = jnp.asarray(_fdn_case(rng, 2)[0])
    bc = jnp.asarray(rng.standard_normal((3, 2, 2)))

    def ir(bc):
        return fdn_impulse_response((3, 5), A, bc[0], bc[1], length=64,
                                    method="frequency", n_fft=256)  # fmt: skip

    batched = jax.jit(jax.vmap(ir))(bc)
    one = jax.jit(ir)
    for i in range(3):
        assert_close(batched[i], one(bc[i]), rtol=1e-12)


def test_fdn_frequency_response_bad_parameters():
    rng = np.random.default_rng(37)
    A, b, c = (jnp.asarray(v) for v in _fdn_case(rng, 3, gain=1.0))
    norm = "`A` must have spectral norm at most 1"

    def f(A, gains):
        return fdn_frequency_response((2, 3, 4), A, b, c, n_fft=32,
                                      line_gains=gains)  # fmt: skip

    def ir(A, gains):
        return fdn_impulse_response((2, 3, 4), A, b, c, length=32,
                                    line_gains=gains)  # fmt: skip

    ok = jnp.full(3, 0.9)
    assert f(A, ok).shape == (17,)  # lossless (orthogonal) is allowed
    with pytest.raises(ValueError, match=norm):
        fdn_frequency_response((2, 3, 4), 1.01 * np.asarray(A), b, c, n_fft=32)
    for g in (f, ir):
        raises_eagerly_and_under_jit(g, 1.01 * A, ok, match=norm)
        raises_eagerly_and_under_jit(g, A, ok.at[1].set(1.2),
                                     match="`line_gains` must be finite")  # fmt: skip
    raises_eagerly_and_under_jit(f, A.at[0, 1].set(jnp.inf), ok,
                                 match="`A` has non-finite")  # fmt: skip
    # a lossless network with a pole on a sampled frequency (A = I at z = 1)
    raises_eagerly_and_under_jit(f, jnp.eye(3), ok.at[:].set(1.0),
                                 match="pole on a sampled frequency")  # fmt: skip
    with pytest.raises(ValueError, match="delay"):
        unchecked(fdn_frequency_response)((2, 0, 4), A, b, c, n_fft=32)
    with pytest.raises(ValueError, match=r"`line_gains` must have shape \(3,\)"):
        unchecked(f)(A, jnp.ones((16, 3)))
    with pytest.raises(ValueError, match="`n_fft` must be a positive integer"):
        unchecked(fdn_frequency_response)((2, 3, 4), A, b, c, n_fft=0)
    with pytest.raises(ValueError, match=r"`n_fft` \(16\) must be at least"):
        unchecked(fdn_impulse_response)((2, 3, 4), A, b, c, length=32,
                                        method="frequency", n_fft=16)  # fmt: skip
    with pytest.raises(ValueError, match='method="time" takes constant real'):
        unchecked(ir)(A, jnp.ones((17, 3)))
    with pytest.raises(ValueError, match="`method` must be"):
        unchecked(fdn_impulse_response)((2, 3, 4), A, b, c, length=8,
                                        method="freq")  # fmt: skip


@pytest.mark.float32
def test_fdn_frequency_response_float32():
    rng = np.random.default_rng(38)
    A, b, c = (np.asarray(v, np.float32) for v in _fdn_case(rng, 3, gain=0.7))
    delays = (2, 3, 5)

    def ir(A, b, c):
        return fdn_impulse_response(delays, A, b, c, length=256,
                                    method="frequency")  # fmt: skip

    h = jax.jit(ir)(A, b, c)
    assert h.dtype == jnp.float32
    x = np.eye(1, 256)[0]
    ref = np_fdn(x, delays, *(v.astype(np.float64) for v in (A, b, c)), 0.0,
                 np.zeros((3, 5)))[0]  # fmt: skip
    assert_close(h, ref, rtol=1e-5)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(ir(*a) ** 2), argnums=(0, 1, 2)))
    assert all(v.dtype == jnp.float32 for v in grads(A, b, c))
