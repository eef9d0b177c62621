"""Run one example's `main` in a fresh process, as a user runs the script, and
print its result as one JSON line (`RESULT {...}`).

The test sessions compile with XLA CPU flags of their own (see conftest.py),
which hold for their whole process; the float32 fits land on their float32
floors differently under other code generation, so the tests of what the
tutorials claim run the scripts here, with the users' defaults.

Usage: `python example_runner.py RELATIVE_PATH [JSON_KWARGS]`.
"""

import importlib.util
import json
import pathlib
import sys

import numpy as np


def _plain(x):
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        return np.asarray(x).tolist()
    if isinstance(x, np.generic):
        return x.item()
    return x


def main() -> None:
    path = pathlib.Path(__file__).parent.parent / "examples" / sys.argv[1]
    kwargs = json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(**kwargs)
    print("RESULT " + json.dumps(_plain(result), default=repr))


if __name__ == "__main__":
    main()
