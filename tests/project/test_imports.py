"""`import retrax` loads only what is used.

Each check runs in a fresh interpreter: this process has imported everything
already. The checks are on the modules loaded, never on time.
"""

import json
import subprocess
import sys
import textwrap


SUBPACKAGES = (
    "diffusion",
    "dynamics",
    "effects",
    "filters",
    "losses",
    "ops",
    "relations",
    "synth",
)
# Subpackages for audio, which must not load the diffusion and relations stack.
SIGNAL_SUBPACKAGES = ("dynamics", "effects", "filters", "losses", "ops", "synth")
DIFFUSION_STACK = {"retrax.diffusion", "retrax.relations", "diffrax", "optimistix"}


def _run(code: str) -> str:
    """Run `code` in a fresh interpreter; its standard output."""
    process = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert process.returncode == 0, process.stderr
    return process.stdout


def _modules_after(statement: str) -> set[str]:
    """The modules loaded by `statement` in a fresh interpreter."""
    code = textwrap.dedent(statement) + (
        "\nimport json, sys\nprint(json.dumps(list(sys.modules)))"
    )
    return set(json.loads(_run(code)))


def test_import_retrax_loads_no_subpackage_and_no_scipy():
    loaded = _modules_after("import retrax")
    assert "scipy" not in loaded
    assert not DIFFUSION_STACK & loaded
    assert not {f"retrax.{name}" for name in SUBPACKAGES} & loaded


def test_import_retrax_ops_leaves_out_the_diffusion_stack():
    loaded = _modules_after("import retrax.ops")
    assert "retrax.ops" in loaded
    assert not DIFFUSION_STACK & loaded
    assert "scipy" not in loaded


def test_signal_subpackages_leave_out_the_diffusion_stack_and_scipy():
    imports = "\n".join(f"import retrax.{name}" for name in SIGNAL_SUBPACKAGES)
    loaded = _modules_after(imports)
    assert not DIFFUSION_STACK & loaded
    assert "scipy" not in loaded


def test_no_module_imports_scipy_at_import_time():
    # Every Python module of the package, the diffusion stack included.
    loaded = _modules_after(
        """
        import importlib, pathlib
        import retrax

        root = pathlib.Path(retrax.__file__).parent
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root.parent).with_suffix("").parts
            importlib.import_module(".".join(parts).removesuffix(".__init__"))
        """
    )
    assert "retrax.relations._solver" in loaded
    assert not {name for name in loaded if name.split(".")[0] == "scipy"}


def test_every_name_resolves_on_first_use():
    out = _run(
        """
        import importlib, json, types
        import retrax

        values = {name: getattr(retrax, name) for name in retrax.__all__}
        print(json.dumps({
            "modules": sorted(
                name for name, value in values.items()
                if isinstance(value, types.ModuleType)
            ),
            "same": all(
                isinstance(values[name], types.ModuleType)
                or values[name] is getattr(
                    importlib.import_module(values[name].__module__), name
                )
                for name in values
            ),
            "dir": dir(retrax),
            "version": retrax.__version__,
        }))
        """
    )
    result = json.loads(out)
    assert result["modules"] == sorted(SUBPACKAGES)
    assert result["same"]
    assert set(SUBPACKAGES) <= set(result["dir"])
    assert {
        "Checkpoint",
        "InvalidArgumentError",
        "KernelStatus",
        "batch_mesh",
        "filter_jit",
        "kernels",
        "load_checkpoint",
        "process_share",
        "save_checkpoint",
        "shard_batch",
        "__version__",
    } <= set(result["dir"])
    assert result["version"]


def test_unknown_name_is_an_attribute_error():
    _run(
        """
        import retrax

        try:
            retrax.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise AssertionError("no AttributeError")
        assert not hasattr(retrax, "no_such_name")
        """
    )


def test_every_import_form_works():
    # Relations first: the relation modules import the diffusion package's
    # modules, and the diffusion package's deprecated aliases name relations.
    _run(
        """
        from retrax.relations import ImplicitDiffusion
        import retrax
        import retrax.ops
        from retrax import ops
        from retrax.diffusion import implicit_infer

        assert retrax.ops is ops
        assert retrax.ops.allpole is ops.allpole
        assert retrax.relations.ImplicitDiffusion is ImplicitDiffusion
        assert retrax.diffusion.ImplicitDiffusion is ImplicitDiffusion
        assert implicit_infer is retrax.relations.implicit_infer
        assert "ImplicitDiffusion" in dir(retrax.diffusion)
        """
    )
    _run(
        """
        import retrax.diffusion
        import sys

        # The deprecated aliases load the relations on first use only.
        assert "retrax.relations" not in sys.modules
        assert retrax.diffusion.Factor is retrax.relations.Factor
        """
    )


def test_filter_design_without_scipy_names_the_extra():
    _run(
        """
        import sys

        sys.modules["scipy"] = None  # as if scipy were not installed
        import retrax.losses

        try:
            retrax.losses.octave_band_sos(48000.0)
        except ImportError as e:
            assert "retrax[scipy]" in str(e), e
        else:
            raise AssertionError("no ImportError")
        """
    )
