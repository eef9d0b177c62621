"""Every public name of every subpackage has an entry in the API pages."""

import pathlib
import re

import pytest

import retrax


DOCS = pathlib.Path(__file__).parents[2] / "docs" / "api"
SUBPACKAGES = [
    "ops",
    "dynamics",
    "filters",
    "effects",
    "diffusion",
    "relations",
    "synth",
    "losses",
]


def _documented() -> set[str]:
    names = set()
    for page in DOCS.glob("*.md"):
        names.update(re.findall(r"^::: (retrax\.[\w.]+)", page.read_text(), re.M))
    return names


def _resolve(name: str):
    obj = retrax
    for part in name.split(".")[1:]:
        obj = getattr(obj, part)
    return obj


def _undocumented(public: set[str]) -> list[str]:
    # A re-export (a deprecated alias such as `retrax.diffusion.implicit_infer`
    # of `retrax.relations.implicit_infer`) is documented once, at its home: a
    # name counts as documented when the same object is.
    documented = _documented()
    objects = [_resolve(name) for name in documented]
    return sorted(
        name
        for name in public - documented
        if not any(_resolve(name) is obj for obj in objects)
    )


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_every_public_name_is_documented(subpackage):
    module = getattr(retrax, subpackage)
    public = {
        f"retrax.{subpackage}.{name}"
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), type(retrax))
    }
    missing = _undocumented(public)
    assert not missing, f"add these to docs/api/{subpackage}.md: {missing}"


def test_documented_names_exist():
    for name in _documented():
        module, attr = name.rsplit(".", 1)
        obj = retrax
        for part in module.split(".")[1:]:
            obj = getattr(obj, part)
        assert hasattr(obj, attr), name


def test_every_top_level_name_is_documented():
    public = {
        f"retrax.{name}"
        for name in dir(retrax)
        if not name.startswith("_")
        and not isinstance(getattr(retrax, name), type(retrax))
    }
    missing = sorted(public - _documented())
    assert not missing, f"add these to a page of docs/api/: {missing}"
