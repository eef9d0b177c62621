"""Recover an all-pole filter's coefficients from audio by gradient descent.

A resonant order-4 all-pole filter colours white noise. Starting from a flat
spectrum, Adam (optax) fits the filter, parametrised by reflection
coefficients so that every step stays stable, until the same filter applied
to the same noise reproduces the target. Every gradient step runs the adjoint
filter backwards in time: no back-propagation through the 16,000-sample loop.

Run: `python examples/quickstart.py` (add `--smoke` for a few-second check, and
`--plot PATH` to save the loss curve and the magnitude responses as a PNG).
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

# --8<-- [start:parametrisation]
# rc2lpc is the step-up recursion of linear prediction: reflection
# coefficients in (-1, 1) to the coefficients of a stable all-pole filter.
from retrax.filters import rc2lpc
from retrax.ops import allpole


# --8<-- [end:parametrisation]


def poles_to_coefficients(radius, angle):
    """Denominator coefficients (leading 1 dropped) of conjugate pole pairs."""
    poles = jnp.concatenate(
        [radius * jnp.exp(1j * angle), radius * jnp.exp(-1j * angle)]
    )
    poly = jnp.ones((1,), poles.dtype)
    for p in poles:
        poly = jnp.convolve(poly, jnp.asarray([1.0, -p]))
    return jnp.real(poly[1:])


def magnitude_db(a, freqs, sample_rate):
    """The magnitude response of 1 / (1 + sum_k a_k z^-k-1) in dB."""
    z = np.exp(-2j * np.pi * np.asarray(freqs) / sample_rate)
    denominator = 1 + sum(ak * z ** (k + 1) for k, ak in enumerate(np.asarray(a)))
    return -20 * np.log10(np.abs(denominator))


def save_plot(path, losses, a_true, a, sample_rate):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.2), layout="constrained")
    left.semilogy(losses)
    left.set_xlabel("Adam step")
    left.set_ylabel("relative loss")
    left.set_title("Training loss")
    freqs = np.linspace(0, sample_rate / 2, 512)
    right.plot(freqs, magnitude_db(a_true, freqs, sample_rate), label="true")
    right.plot(freqs, magnitude_db(a, freqs, sample_rate), "--", label="fitted")
    right.set_xlabel("frequency (Hz)")
    right.set_ylabel("magnitude (dB)")
    right.set_title("Magnitude response")
    right.legend()
    fig.savefig(path, dpi=80)
    plt.close(fig)
    print(f"wrote {path}")


def main(smoke: bool = False, plot: str | None = None) -> dict:
    sample_rate = 16_000
    length = 4_000 if smoke else 16_000
    steps = 500 if smoke else 2_000
    key = jax.random.key(0)
    x = jax.random.normal(key, (length,))

    # --8<-- [start:target]
    # The unknown filter: resonances at 700 Hz and 2.2 kHz.
    true_radius = jnp.asarray([0.97, 0.9])
    true_angle = 2 * jnp.pi * jnp.asarray([700.0, 2200.0]) / sample_rate
    a_true = poles_to_coefficients(true_radius, true_angle)
    target = allpole(x, a_true)
    # --8<-- [end:target]

    # --8<-- [start:training]
    # Learn reflection coefficients tanh(theta): every step stays stable.
    def loss_fn(theta):
        a = rc2lpc(jnp.tanh(theta))
        return jnp.mean((allpole(x, a) - target) ** 2) / jnp.mean(target**2)

    optimizer = optax.adam(1e-2)
    theta = jnp.zeros(4)
    state = optimizer.init(theta)

    @jax.jit
    def step(theta, state):
        loss, grad = jax.value_and_grad(loss_fn)(theta)
        updates, state = optimizer.update(grad, state)
        return optax.apply_updates(theta, updates), state, loss

    # --8<-- [end:training]

    losses = []
    start = time.perf_counter()
    for i in range(steps):
        theta, state, loss = step(theta, state)
        losses.append(loss)
        if i % max(steps // 5, 1) == 0:
            print(f"step {i:5d}  relative loss {float(loss):.3e}")
    elapsed = time.perf_counter() - start
    a = rc2lpc(jnp.tanh(theta))

    np.set_printoptions(precision=4, suppress=True)
    print(f"\n{steps} Adam steps on {length} samples in {elapsed:.2f} s")
    print("true coefficients      ", np.asarray(a_true))
    print("recovered coefficients ", np.asarray(a))
    error = float(jnp.max(jnp.abs(a - a_true)))
    print(f"max coefficient error  {error:.2e}")
    if plot is not None:
        save_plot(plot, np.asarray(losses), a_true, a, sample_rate)
    return {"a_true": a_true, "a": a, "loss": float(loss_fn(theta)), "error": error}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="a short run")
    parser.add_argument("--plot", metavar="PATH", help="save a PNG of the fit")
    args = parser.parse_args()
    main(args.smoke, args.plot)
