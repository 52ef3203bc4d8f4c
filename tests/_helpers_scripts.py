"""Test helper: import a repository script (``dev/``, ``tools/``) by path.

The scripts are not modules of a package, so tests load them from their
file, as ``python SCRIPT`` would run them (without running ``main``).
"""
import importlib.util
import os.path as osp
from types import ModuleType

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))


def load_script(relative_path: str) -> ModuleType:
    """The script at ``relative_path`` (from the repository root), imported.

    Args:
        relative_path: E.g. ``'dev/benchmarks/bench_pipeline.py'``.

    Returns:
        A fresh module named after the file (each call executes it again).
    """
    name = osp.splitext(osp.basename(relative_path))[0]
    spec = importlib.util.spec_from_file_location(
        name, osp.join(REPO, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
