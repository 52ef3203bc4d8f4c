"""Run mmengine's and mmpretrain's own test suites with and without the plugin.

The plugin's only process-wide changes are the security workarounds of
``mmae_plugin.compat``, applied when it registers its components; mmengine's
and mmpretrain's own tests are the best check that nothing else changes for
them. Each suite runs twice in the same environment: once plain, once with
``import mmae_plugin.registration`` before collection (through the pytest
plugin module ``mmae_import_plugin`` beside this file). The outcome of every
test id is compared and the differences are written out.

Usage (see ``dev/upstream_suites/run.sh``)::

    python dev/upstream_suites/upstream_suites.py SUITE=SOURCE[:PATHS] ... \
        --out OUT

``SOURCE`` is a source tree holding ``tests/`` at the release tag or a git
repository (bare or not), from which the release tag is exported.
"""
import argparse
import os
import os.path as osp
import subprocess
import sys
import sysconfig
import xml.etree.ElementTree as ET
from typing import Dict, List, Tuple

RELEASE_TAGS = {'mmengine': 'v0.10.7', 'mmpretrain': 'v1.2.0'}
# What each suite's tests read besides tests/ (mmpretrain's read configs/).
EXPORTED_PATHS = {
    'mmengine': ['tests', 'pytest.ini'],
    'mmpretrain': ['tests', 'configs', 'setup.cfg']
}
# Test-only requirements of the upstream suites that the plugin's own
# environment does not need; installed into an overlay venv, never into it.
TEST_REQUIREMENTS = ['parameterized', 'pytest-timeout', 'scikit-learn']
# This folder (its pytest plugin module) and the repository (mmae_plugin).
HERE = osp.dirname(osp.abspath(__file__))
REPO_ROOT = osp.dirname(osp.dirname(HERE))


def source_tree(suite: str, source: str, out: str) -> str:
    """A folder holding ``suite``'s tests at its release tag.

    Args:
        suite: ``'mmengine'`` or ``'mmpretrain'``.
        source: A source tree with ``tests/`` or a git repository.
        out: Output folder; exported trees go to ``out/src/<suite>``.

    Returns:
        The folder to run pytest in.
    """
    if osp.isdir(osp.join(source, 'tests')):
        return osp.abspath(source)
    tree = osp.join(out, 'src', suite)
    if osp.isdir(osp.join(tree, 'tests')):
        return tree
    os.makedirs(tree, exist_ok=True)
    git_dir = source if osp.isdir(osp.join(source, 'objects')) else \
        osp.join(source, '.git')
    if not osp.isdir(git_dir):
        raise SystemExit(f'{suite} source {source!r} is neither a tree with '
                         'tests/ nor a git repository')
    archive = subprocess.run(
        ['git', f'--git-dir={git_dir}', 'archive', RELEASE_TAGS[suite]] +
        EXPORTED_PATHS[suite],
        check=True,
        stdout=subprocess.PIPE).stdout
    subprocess.run(['tar', '-x', '-C', tree], input=archive, check=True)
    return tree


def overlay_python(out: str) -> str:
    """A venv that sees this interpreter's packages plus the test extras.

    Args:
        out: Output folder; the venv goes to ``out/venv``.

    Returns:
        Path of the overlay venv's python.
    """
    venv = osp.join(out, 'venv')
    python = osp.join(venv, 'bin', 'python')
    if not osp.exists(python):
        subprocess.run([sys.executable, '-m', 'venv', venv], check=True)
        purelib = subprocess.run([
            python, '-c', 'import sysconfig; '
            'print(sysconfig.get_paths()["purelib"])'
        ],
                                 check=True,
                                 stdout=subprocess.PIPE,
                                 text=True).stdout.strip()
        with open(osp.join(purelib, '_base_environment.pth'), 'w') as pth:
            pth.write(sysconfig.get_paths()['purelib'] + '\n')
        subprocess.run(
            [python, '-m', 'pip', 'install', '-q'] + TEST_REQUIREMENTS,
            check=True)
    return python


def run_suite(python: str, tree: str, paths: List[str], junit: str,
              with_plugin: bool, timeout: int) -> int:
    """Run one suite once and write its junit XML.

    Args:
        python: Interpreter to run pytest with.
        tree: Folder to run in (the suite's rootdir).
        paths: Test paths relative to ``tree``.
        junit: Where the junit XML goes.
        with_plugin: Whether ``mmae_plugin`` is imported before collection.
        timeout: Per-test timeout in seconds.

    Returns:
        pytest's exit status.
    """
    env = dict(os.environ)
    env['PYTHONPATH'] = os.pathsep.join([HERE, REPO_ROOT] + (
        [env['PYTHONPATH']] if env.get('PYTHONPATH') else []))
    # A module that fails to import (a missing optional dependency) fails the
    # same way in both runs; the rest of the suite still runs.
    # --tb=native: pytest's own traceback formatting re-parses sources and
    # crashes the whole session on Python 3.11's AST recursion check after
    # some of mmengine's tests.
    command = [
        python, '-m', 'pytest', '-q', '-p', 'no:cacheprovider',
        '--continue-on-collection-errors', '--tb=native',
        f'--junitxml={junit}', f'--timeout={timeout}', '-o',
        'junit_family=xunit1'
    ] + paths
    if with_plugin:
        command[3:3] = ['-p', 'mmae_import_plugin']
    log = junit[:-len('.xml')] + '.log'
    with open(log, 'w') as log_file:
        return subprocess.run(
            command,
            cwd=tree,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT).returncode


def expand_paths(tree: str, paths: List[str]) -> List[str]:
    """Split ``tests`` into its top-level folders and files.

    One pytest session per part: a part that crashes or hangs pytest costs
    that part only.

    Args:
        tree: The suite's folder.
        paths: Test paths relative to it.

    Returns:
        The paths, with ``tests`` replaced by its ``test_*`` entries.
    """
    expanded = []
    for path in paths:
        if path.rstrip('/') != 'tests':
            expanded.append(path)
            continue
        for name in sorted(os.listdir(osp.join(tree, 'tests'))):
            if name.startswith('test_') and (name.endswith('.py') or osp.isdir(
                    osp.join(tree, 'tests', name))):
                expanded.append(f'tests/{name}')
    return expanded


def outcomes(junits: List[str]) -> Dict[str, str]:
    """Outcome of every test case in some junit XML files.

    Args:
        junits: Paths of the XML files pytest wrote (missing ones, from a
            session that crashed before writing, are skipped).

    Returns:
        ``{test id: 'passed' | 'failed' | 'error' | 'skipped'}``.
    """
    result = {}
    cases = []
    for junit in junits:
        if osp.exists(junit):
            cases += list(ET.parse(junit).getroot().iter('testcase'))
    for case in cases:
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = 'passed'
        for child in case:
            if child.tag in ('failure', 'error', 'skipped'):
                outcome = {'failure': 'failed'}.get(child.tag, child.tag)
                break
        # A case reported twice (error in teardown) keeps its worst outcome.
        if result.get(test_id) not in ('failed', 'error'):
            result[test_id] = outcome
    return result


def junit_path(out: str, suite: str, mode: str, test_path: str) -> str:
    """Where the junit XML of one part of one run goes."""
    part = test_path.replace('/', '.').replace('.py', '')
    return osp.join(out, 'junit', f'{suite}-{mode}-{part}.xml')


def differences(plain: Dict[str, str],
                plugin: Dict[str, str]) -> List[Tuple[str, str, str]]:
    """Tests whose outcome differs between the two runs.

    Args:
        plain: Outcomes without the plugin.
        plugin: Outcomes with the plugin imported.

    Returns:
        ``(test id, plain outcome, plugin outcome)``, sorted; a test missing
        from one run reads ``'absent'`` there.
    """
    return sorted((test, plain.get(test, 'absent'), plugin.get(test, 'absent'))
                  for test in set(plain) | set(plugin)
                  if plain.get(test) != plugin.get(test))


def summary(name: str, results: Dict[str, str]) -> str:
    counts = {}
    for outcome in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    return f'{name}: ' + ', '.join(f'{counts[k]} {k}' for k in sorted(counts))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        'suites',
        nargs='+',
        metavar='SUITE=SOURCE[:PATHS]',
        help='e.g. mmengine=/src/mmengine or '
        'mmpretrain=/src/mmpretrain:tests/test_apis,'
        'tests/test_engine')
    parser.add_argument('--out', required=True, help='output folder')
    parser.add_argument(
        '--timeout', type=int, default=900, help='per-test timeout in seconds')
    parser.add_argument(
        '--modes',
        default='plain,plugin',
        help='which runs to do (comma separated)')
    args = parser.parse_args()
    out = osp.abspath(args.out)
    os.makedirs(osp.join(out, 'junit'), exist_ok=True)
    python = overlay_python(out)
    report = []
    for spec in args.suites:
        suite, _, rest = spec.partition('=')
        if suite not in RELEASE_TAGS:
            raise SystemExit(f'suite must be one of {sorted(RELEASE_TAGS)}, '
                             f'got {suite!r}')
        source, _, paths = rest.partition(':')
        tree = source_tree(suite, source, out)
        test_paths = expand_paths(tree,
                                  paths.split(',') if paths else ['tests'])
        for mode in args.modes.split(','):
            for path in test_paths:
                junit = junit_path(out, suite, mode, path)
                status = run_suite(python, tree, [path], junit,
                                   mode == 'plugin', args.timeout)
                print(
                    f'{suite} {mode} {path}: pytest exit status {status}',
                    flush=True)
        junits = {
            mode: [junit_path(out, suite, mode, path) for path in test_paths]
            for mode in ('plain', 'plugin')
        }
        if not all(osp.exists(j) for j in junits['plain'] + junits['plugin']):
            continue
        plain, plugin = outcomes(junits['plain']), outcomes(junits['plugin'])
        diff = differences(plain, plugin)
        with open(osp.join(out, f'{suite}-diff.txt'), 'w') as diff_file:
            diff_file.write(f'{summary("plain", plain)}\n'
                            f'{summary("plugin", plugin)}\n'
                            f'{len(diff)} differing test(s)\n')
            for test, before, after in diff:
                diff_file.write(f'{test}\t{before} -> {after}\n')
        report.append(f'{suite}: {summary("plain", plain)}; '
                      f'{summary("plugin", plugin)}; {len(diff)} differ')
    print('\n'.join(report))


if __name__ == '__main__':
    main()
