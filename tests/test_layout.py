"""The repository's layers: the plugin, the comparison tool built on it,
and the studies built on both; imports point down the layers only."""
import ast
import os
import os.path as osp

import pytest

#: Package -> the top-level packages of this repository it may not import.
FORBIDDEN = {
    'mmae_plugin': ('mmae_compare', 'studies'),
    'mmae_compare': ('studies', ),
}


def imported_modules(path):
    """Every module ``path`` imports (absolute names; relative ones as
    ``.name``), function-local imports included."""
    with open(path, encoding='utf-8') as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield '.' * node.level + (node.module or '')


def python_files(repo_root, package):
    for folder, _, names in os.walk(osp.join(repo_root, package)):
        yield from (osp.join(folder, n) for n in names if n.endswith('.py'))


@pytest.mark.parametrize('package', sorted(FORBIDDEN))
def test_no_import_goes_up_a_layer(repo_root, package):
    arrows_up = [(osp.relpath(path, repo_root), module)
                 for path in python_files(repo_root, package)
                 for module in imported_modules(path)
                 if module.split('.')[0] in FORBIDDEN[package]]
    assert not arrows_up, arrows_up


def test_the_plugin_holds_no_comparison_or_study_module(repo_root):
    assert not osp.exists(osp.join(repo_root, 'mmae_plugin', 'comparison'))
    assert osp.isfile(osp.join(repo_root, 'mmae_compare', 'jobs.py'))
    assert osp.isfile(osp.join(repo_root, 'studies', 'predictors.py'))
