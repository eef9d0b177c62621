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


@pytest.mark.full
def test_the_segments_example_gives_the_unsegmented_gradient():
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    (example,) = [b for b in blocks if "segment_length=" in b]
    # three seconds instead of a minute: two whole segments and a shorter one
    assert "48_000 * 60" in example
    example = example.replace("48_000 * 60", "48_000 * 3")
    scope: dict = {}
    exec(compile(example, str(PAGE), "exec"), scope)
    chain, x, g, grad = scope["chain"], scope["x"], scope["g"], scope["grad"]
    assert chain.segment_length == 65_536 < x.shape[1] // 2
    plain = type(chain)(chain.effects)
    want = grad(plain, x)
    leaves = jax.tree.leaves(g)
    assert len(leaves) == len(jax.tree.leaves(want)) > 10
    for a, b in zip(leaves, jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-15)
