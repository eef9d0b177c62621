"""retrax: gradients that do not unroll loops.

Differentiable recursive filters for audio, and small diffusion models used as
relations, in JAX and Equinox.
"""

# `import retrax` loads nothing else: each subpackage, and each top-level name,
# is imported on first use by the module `__getattr__` below (PEP 562), as
# scipy and jax load theirs, so that a script using `retrax.ops` does not pay
# for the diffusion and relations stack (diffrax, optimistix, optax).
import importlib
import typing


if typing.TYPE_CHECKING:
    # What the lazy names are, for type checkers, IDEs and the docs.
    from . import (
        diffusion as diffusion,
        dynamics as dynamics,
        effects as effects,
        filters as filters,
        losses as losses,
        ops as ops,
        relations as relations,
        synth as synth,
    )
    from ._checkpoint import (
        Checkpoint as Checkpoint,
        load_checkpoint as load_checkpoint,
        save_checkpoint as save_checkpoint,
    )
    from ._distributed import (
        batch_mesh as batch_mesh,
        process_share as process_share,
        shard_batch as shard_batch,
    )
    from ._errors import (
        InvalidArgumentError as InvalidArgumentError,
        filter_jit as filter_jit,
    )
    from ._native import KernelStatus as KernelStatus, kernels as kernels

    __version__: str


__all__ = [
    "Checkpoint",
    "InvalidArgumentError",
    "KernelStatus",
    "batch_mesh",
    "diffusion",
    "dynamics",
    "effects",
    "filter_jit",
    "filters",
    "kernels",
    "load_checkpoint",
    "losses",
    "ops",
    "process_share",
    "relations",
    "save_checkpoint",
    "shard_batch",
    "synth",
]

_SUBPACKAGES = frozenset(
    {
        "diffusion",
        "dynamics",
        "effects",
        "filters",
        "losses",
        "ops",
        "relations",
        "synth",
    }
)
# Top-level name -> the private module that defines it.
_DEFINED_IN = {
    "Checkpoint": "_checkpoint",
    "load_checkpoint": "_checkpoint",
    "save_checkpoint": "_checkpoint",
    "batch_mesh": "_distributed",
    "process_share": "_distributed",
    "shard_batch": "_distributed",
    "InvalidArgumentError": "_errors",
    "filter_jit": "_errors",
    "KernelStatus": "_native",
    "kernels": "_native",
}


def __getattr__(name: str) -> typing.Any:
    if name in _SUBPACKAGES:
        # Importing a subpackage also binds it here, so this runs once.
        return importlib.import_module(f"{__name__}.{name}")
    if name in _DEFINED_IN:
        module = importlib.import_module(f"{__name__}.{_DEFINED_IN[name]}")
        value = getattr(module, name)
    elif name == "__version__":
        from importlib import metadata

        value = metadata.version("retrax")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__, "__version__"})
