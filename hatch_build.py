"""Build hook: compile retrax's CPU kernels (`src/retrax/_native`).

The kernels speed up loops that XLA runs slowly (see `ballistics.cc`,
`allpole.cc`, `linear.cc`, `sections.cc` and `graph.cc`). They are compiled
against the XLA FFI headers shipped with jaxlib, so jaxlib is a build
requirement.
Without a C++ compiler, or if compilation fails, the build still succeeds:
retrax then runs its pure-JAX loops, which give the same numbers. `CXX`
selects the compiler (default `c++`).

pip shows a build backend's messages only with `pip install -v` (or when the
build fails), so the warning below is seldom seen. retrax therefore also
says it at run time: the first op that would use a missing kernel on the CPU
warns (`retrax._native.KernelWarning`), and `retrax.kernels()` gives the
reason.
"""

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


NATIVE = pathlib.Path("src", "retrax", "_native")
SOURCES = ["ballistics.cc", "allpole.cc", "linear.cc", "sections.cc", "graph.cc"]
LIBRARY = "_kernels.so"


class KernelBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        root = pathlib.Path(self.root)
        library = root / NATIVE / LIBRARY
        if not self._compile(root, library):
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if version != "editable":
            build_data["artifacts"].append(str(library.relative_to(root)))

    def _compile(self, root: pathlib.Path, library: pathlib.Path) -> bool:
        compiler = shutil.which(os.environ.get("CXX", "c++"))
        if compiler is None or sys.platform == "win32":
            self._skip("no C++ compiler found")
            return False
        try:
            import jaxlib
            import jaxlib.version
        except ImportError:
            self._skip("jaxlib is not importable in the build environment")
            return False
        include = pathlib.Path(jaxlib.__file__).parent / "include"
        flags = [
            "-O3",
            # the all-pole loop's multiply-subtracts fuse where the CPU has FMA
            "-ffp-contract=fast",
            "-std=c++17",
            "-fPIC",
            f'-DRETRAX_JAXLIB_VERSION="{jaxlib.version.__version__}"',
        ]
        # A library built from the same sources, headers, compiler and flags
        # is kept: reinstalling (another extra, `pip install -e` again) then
        # costs no compilation.
        stamp = library.with_suffix(".stamp")
        digest = hashlib.sha256(json.dumps([compiler, flags]).encode())
        for path in sorted((root / NATIVE).iterdir()):
            if path.suffix in (".cc", ".h"):
                digest.update(path.name.encode() + path.read_bytes())
        if (
            library.exists()
            and stamp.exists()
            and stamp.read_text() == digest.hexdigest()
        ):
            return True
        stamp.unlink(missing_ok=True)
        # one compiler process a source, run together, then one link
        with tempfile.TemporaryDirectory() as scratch:
            objects = [pathlib.Path(scratch, f"{s}.o") for s in SOURCES]
            jobs = [
                subprocess.Popen(
                    [compiler, *flags, f"-I{include}", "-c", str(root / NATIVE / s)]
                    + ["-o", str(o)],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                for s, o in zip(SOURCES, objects, strict=True)
            ]
            errors = [
                out[-2000:]
                for job in jobs
                for out in [job.communicate()[0]]
                if job.returncode != 0
            ]
            if not errors:
                link = [compiler, "-shared", *objects, "-o", str(library)]
                result = subprocess.run(link, capture_output=True, text=True)
                if result.returncode != 0:
                    errors.append(result.stderr[-2000:])
        if errors:
            self._skip("compilation failed:\n" + "\n".join(errors))
            library.unlink(missing_ok=True)
            return False
        stamp.write_text(digest.hexdigest())
        return True

    def _skip(self, why: str) -> None:
        self.app.display_warning(
            f"retrax: CPU kernels not built ({why}); the pure-JAX loops are used "
            "(check with `retrax.kernels()`)."
        )
