"""Check retrax.dynamics against torchcomp 0.2: outputs and gradients, float64.

Random signals and parameter sets (away from attack/release switch points and
gain-curve corners, which random draws avoid with probability 1, and with a
non-silent start, where torchcomp's gradients are NaN). Prints the largest
relative difference of each quantity and exits non-zero above 1e-9.

Run: `python benchmarks/compare_torchcomp.py` (needs torch and torchcomp).
"""

import sys

import jax
import numpy as np


jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402

from retrax.dynamics import compexp_gain, limiter_gain  # noqa: E402


def _rel(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if not np.any(a) and not np.any(b):
        return 0.0  # e.g. the expander's parameters while it never engages
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


VERBOSE = "-v" in sys.argv


def main(trials: int = 20, length: int = 2_000) -> float:
    try:
        import torch
        import torchcomp
    except ImportError as err:
        print(f"torch/torchcomp not available ({err}); nothing to compare")
        return 0.0
    rng = np.random.default_rng(0)
    worst = 0.0
    for trial in range(trials):
        env = np.abs(np.sin(np.linspace(0, rng.uniform(2, 8) * np.pi, length))) + 0.01
        x_rms = env * rng.uniform(0.5, 1.5, length)
        params = [
            rng.uniform(-20, -5),  # comp_thresh
            rng.uniform(1.5, 10),  # comp_ratio
            rng.uniform(-40, -25),  # exp_thresh
            rng.uniform(0.2, 0.9),  # exp_ratio
            rng.uniform(0.01, 0.5),  # at
            rng.uniform(0.001, 0.2),  # rt
        ]
        w = rng.standard_normal(length)

        tx = torch.tensor(x_rms, requires_grad=True)
        tp = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in params]
        ty = torchcomp.compexp_gain(tx[None], *tp)[0]
        (ty * torch.from_numpy(w)).sum().backward()
        t_grads = [tx.grad.numpy()] + [p.grad.numpy() for p in tp]

        def loss(x, *p, w=w):
            return jnp.sum(compexp_gain(x, *p) * w)

        args = (jnp.asarray(x_rms), *(jnp.asarray(p) for p in params))
        y = compexp_gain(*args)
        grads = jax.grad(loss, argnums=tuple(range(7)))(*args)
        errs = [_rel(y, ty.detach().numpy())] + [
            _rel(g, t) for g, t in zip(grads, t_grads, strict=True)
        ]

        sig = rng.standard_normal(length) * rng.uniform(0.2, 2.0)
        lparams = [
            rng.uniform(-12, -1),
            rng.uniform(0.05, 0.6),
            rng.uniform(0.001, 0.1),
        ]
        tx = torch.tensor(sig, requires_grad=True)
        tp = [torch.tensor(p, dtype=torch.float64, requires_grad=True) for p in lparams]
        ty = torchcomp.limiter_gain(tx[None], *tp)[0]
        (ty * torch.from_numpy(w)).sum().backward()
        t_grads = [tx.grad.numpy()] + [p.grad.numpy() for p in tp]

        def lloss(x, *p, w=w):
            return jnp.sum(limiter_gain(x, *p) * w)

        largs = (jnp.asarray(sig), *(jnp.asarray(p) for p in lparams))
        y = limiter_gain(*largs)
        grads = jax.grad(lloss, argnums=(0, 1, 2, 3))(*largs)
        errs += [_rel(y, ty.detach().numpy())] + [
            _rel(g, t) for g, t in zip(grads, t_grads, strict=True)
        ]
        worst = max(worst, max(errs))
        if VERBOSE:
            print("  ", " ".join(f"{e:.1e}" for e in errs))
        print(f"trial {trial:2d}: max relative difference {max(errs):.2e}")
    print(f"worst over {trials} trials: {worst:.2e} (tolerance 1e-9)")
    return worst


if __name__ == "__main__":
    sys.exit(0 if main() <= 1e-9 else 1)
