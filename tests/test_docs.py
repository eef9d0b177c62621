"""Every public name of every subpackage has an entry in the API pages."""

import pathlib
import re

import pytest

import retrax


DOCS = pathlib.Path(__file__).parent.parent / "docs" / "api"
SUBPACKAGES = ["ops", "dynamics", "filters", "effects", "diffusion", "synth", "losses"]


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


@pytest.mark.parametrize("subpackage", SUBPACKAGES)
def test_every_public_name_is_documented(subpackage):
    module = getattr(retrax, subpackage)
    public = {
        f"retrax.{subpackage}.{name}"
        for name in dir(module)
        if not name.startswith("_")
        and not isinstance(getattr(module, name), type(retrax))
    }
    documented = _documented()
    # A re-export (`retrax.effects.SVF` is `retrax.filters.SVF`) is documented
    # once, where it is defined; its own page must name it.
    page = (DOCS / f"{subpackage}.md").read_text()
    objects = {id(_resolve(name)) for name in documented}
    reexported = {
        name
        for name in public - documented
        if id(_resolve(name)) in objects and f"`{name}`" in page
    }
    missing = sorted(public - documented - reexported)
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
