"""`import retrax` loads only what is used.

Each check runs in a fresh interpreter: this process has imported everything
already. The checks are on the modules loaded, never on time.
"""

import json
import subprocess
import sys
import textwrap

import pytest


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


@pytest.mark.full
def test_import_retrax_ops_leaves_out_the_diffusion_stack():
    loaded = _modules_after("import retrax.ops")
    assert "retrax.ops" in loaded
    assert not DIFFUSION_STACK & loaded
    assert "scipy" not in loaded


@pytest.mark.full
def test_signal_subpackages_leave_out_the_diffusion_stack_and_scipy():
    imports = "\n".join(f"import retrax.{name}" for name in SIGNAL_SUBPACKAGES)
    loaded = _modules_after(imports)
    assert not DIFFUSION_STACK & loaded
    assert "scipy" not in loaded


@pytest.mark.full
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


@pytest.mark.full
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


@pytest.mark.full
def test_every_import_form_works():
    _run(
        """
        from retrax.relations import ImplicitDiffusion
        import retrax
        import retrax.ops
        from retrax import ops
        from retrax.relations import implicit_infer

        assert retrax.ops is ops
        assert retrax.ops.allpole is ops.allpole
        assert retrax.relations.ImplicitDiffusion is ImplicitDiffusion
        assert implicit_infer is retrax.relations.implicit_infer
        """
    )


@pytest.mark.full
def test_diffusion_does_not_load_relations():
    # Imports run one way: `retrax.relations` uses `retrax.diffusion`, never
    # the other way round, so diffusion loads alone.
    _run(
        """
        import sys

        import retrax.diffusion

        assert "retrax.relations" not in sys.modules, "diffusion loaded relations"
        import retrax.relations as rr

        assert issubclass(rr.RESULTS, retrax.diffusion.RESULTS)
        """
    )


@pytest.mark.full
def test_removed_diffusion_aliases_are_gone():
    # The relation names `retrax.diffusion` re-exported as deprecated aliases
    # (and its checkpoint aliases) were removed; each has one home now.
    _run(
        """
        import retrax
        import retrax.diffusion as rd
        import retrax.relations as rr

        removed = [
            "AbstractChannel", "AbstractGaussian", "AbstractImplicitRelation",
            "CanonicalGaussian", "Factor", "FieldNodes", "GuardedNewton",
            "ImplicitDiffusion", "ImplicitPullback", "ImplicitRoots",
            "ImplicitSolution", "IndexedRelation", "InferenceHistory",
            "LaplaceBelief", "Latent", "MixtureBelief", "MomentGaussian",
            "Observed", "ProductRelation", "TaskGradient", "Unobserved",
            "assemble_state", "blockranges", "channel_anchor", "combine",
            "data_levels", "density_lambda", "divide", "factor_infer",
            "factor_messages", "factor_pullback", "field_nodes",
            "fit_through_inference", "implicit_energy", "implicit_infer",
            "implicit_laplace", "implicit_mixture", "implicit_pullback",
            "implicit_roots", "laplace_belief", "local_free_energy",
            "named_relation", "noisefree_nodes", "roots_by_energy",
            "task_gradient",
        ]
        for name in removed:
            try:
                getattr(rd, name)
            except AttributeError:
                pass
            else:
                raise AssertionError(f"retrax.diffusion.{name} still exists")
            assert hasattr(rr, name), name
        for name in ["save_checkpoint", "load_checkpoint", "Checkpoint"]:
            assert not hasattr(rd, name), name
            assert hasattr(retrax, name), name
        """
    )


@pytest.mark.full
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
