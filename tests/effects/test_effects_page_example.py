"""The batch example of docs/api/effects.md runs as written and gives each
chain its own signal."""

import pathlib
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest


PAGE = pathlib.Path(__file__).parents[2] / "docs" / "api" / "effects.md"


def _member(batch, i):
    """Member `i` of a batch of modules built by `eqx.filter_vmap`."""
    arrays, static = eqx.partition(batch, eqx.is_array)
    return eqx.combine(jax.tree.map(lambda a: a[i], arrays), static)


@pytest.mark.full
def test_the_batch_example_runs_each_chain_on_its_own_signal():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    (example,) = [b for b in blocks if "filter_vmap" in b]
    scope: dict = {}
    exec(compile(example, str(PAGE), "exec"), scope)
    chains, x, y = scope["chains"], scope["x"], scope["y"]
    assert y.shape == x.shape == (8, 4096)
    for i in (0, 5):
        np.testing.assert_allclose(y[i], _member(chains, i)(x[i]), rtol=1e-5, atol=1e-6)
    # different signals in, different signals out
    assert not bool(jnp.allclose(y[0], y[5]))
