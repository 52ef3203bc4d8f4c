"""The built wheel carries configs and tools and runs outside the repository.

The wheel is built from a copy of the working tree, installed with
``--no-deps`` into a fresh virtual environment layered on this one (its
site-packages come after the new environment's own, so the wheel's
``mmae_plugin`` shadows the editable one), and a Fashion-MNIST config is
trained from the installed copy in a folder outside the repository.
"""
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
import sysconfig
import zipfile

import pytest

# dev/ is copied too, so that a setup.py that shipped it would be caught.
# studies/ likewise: the wheel must not carry the repository's study code.
COPIED = ('setup.py', 'README.md', 'LICENSE', 'MANIFEST.in', 'model-index.yml',
          'mmae_plugin', 'mmae_compare', 'studies', 'configs', 'tools',
          'checkpoints', 'dev')
IGNORED = shutil.ignore_patterns('__pycache__', '*.pyc', '.mim', 'work_dirs')


def run(args, **kwargs):
    proc = subprocess.run(
        args, capture_output=True, text=True, timeout=600, **kwargs)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def tracked_files(repo_root, *paths):
    out = run(['git', 'ls-files', '--', *paths], cwd=repo_root).stdout
    return [
        path for path in out.splitlines()
        if osp.exists(osp.join(repo_root, path))
    ]


@pytest.fixture(scope='module')
def wheel(repo_root, tmp_path_factory):
    source = tmp_path_factory.mktemp('source')
    for item in COPIED:
        path = osp.join(repo_root, item)
        if osp.isdir(path):
            shutil.copytree(path, source / item, ignore=IGNORED)
        elif osp.isfile(path):
            shutil.copy2(path, source / item)
    dist = tmp_path_factory.mktemp('dist')
    run([
        sys.executable, '-m', 'pip', 'wheel', '-q', '--no-deps',
        '--no-build-isolation', '-w',
        str(dist),
        str(source)
    ])
    (wheel_path, ) = dist.glob('mmae_plugin-*.whl')
    return wheel_path


# Tools that only work in a repository checkout (they set up or test its
# .venv from setup.py / constraints.txt / tests/, or rebuild the study
# pages from studies/).
REPO_ONLY = ('tools/quickstart.sh', 'tools/setup_env.sh', 'tools/run_tests.sh',
             'tools/analysis/information_flow.py',
             'tools/analysis/heldout_variants.py',
             'tools/analysis/label_free_predictors.py')
# What a user runs, in mmpretrain's layout: every file the wheel ships under
# .mim/tools is one of these (a file or a folder ending in '/').
USER_TOOLS = ('tools/_cli.py', 'tools/train.py', 'tools/test.py',
              'tools/dist_train.sh', 'tools/dist_test.sh',
              'tools/slurm_train.sh', 'tools/slurm_test.sh',
              'tools/compare.py', 'tools/analysis/', 'tools/model_converters/',
              'tools/dataset_converters/', 'tools/theory/')
# Names of the development harness (dev/, never shipped).
DEV_NAMES = ('gpu_check', 'gpu_wheels', 'compat_check', 'upstream_suites',
             'benchmarks', 'bench_', 'export_zoo', 'legacy_runs',
             'start_cluster', 'stop_cluster')


def is_repo_only(path):
    return any(path == item or path.startswith(item) for item in REPO_ONLY)


def test_wheel_ships_configs_tools_and_model_index(repo_root, wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    tracked = tracked_files(repo_root, 'configs', 'tools', 'model-index.yml',
                            'checkpoints')
    shipped = [p for p in tracked if not is_repo_only(p)]
    assert 'configs/mmae_vit-base_200e.py' in shipped
    assert 'tools/analysis/evaluate_frozen.py' in shipped
    missing = [p for p in shipped if f'mmae_plugin/.mim/{p}' not in names]
    assert not missing, missing
    repo_only = [p for p in tracked if is_repo_only(p)]
    assert 'tools/quickstart.sh' in repo_only
    leaked = [p for p in repo_only if f'mmae_plugin/.mim/{p}' in names]
    assert not leaked, leaked
    metadata_name = next(n for n in names if n.endswith('.dist-info/METADATA'))
    with zipfile.ZipFile(wheel) as archive:
        version = [
            line for line in archive.read(metadata_name).decode().splitlines()
            if line.startswith('Version:')
        ]
    import mmae_plugin
    assert version == [f'Version: {mmae_plugin.__version__}']
    assert not [n for n in names if '__pycache__' in n]
    metadata = next(n for n in names if n.endswith('.dist-info/METADATA'))
    with zipfile.ZipFile(wheel) as archive:
        requires = [
            line for line in archive.read(metadata).decode().splitlines()
            if line.startswith('Requires-Dist:')
        ]
    # Ranges, never pins; mmcv only through the optional [lite] extra.
    assert not [r for r in requires if '==' in r.split(';')[0]], requires
    assert [r.split(';')[1].strip() for r in requires
            if 'mmcv' in r] == ['extra == "lite"']


def test_wheel_ships_no_development_script(repo_root, wheel):
    """dev/ stays in the repository; .mim/tools holds what a user runs."""
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    dev = [
        n for n in names if '/dev/' in n or n.startswith('dev/') or any(
            part in osp.basename(n) for part in DEV_NAMES)
    ]
    assert not dev, dev
    # The comparison tool is its own package beside the plugin; the
    # repository's studies are not shipped at all.
    packages = {n.split('/')[0] for n in names if '.dist-info/' not in n}
    assert packages == {'mmae_plugin', 'mmae_compare'}, packages
    assert 'mmae_compare/jobs.py' in names
    assert not [
        n for n in names if n.split('/')[:2] == ['mmae_plugin', 'comparison']
    ]
    prefix = 'mmae_plugin/.mim/'
    tools = sorted(n[len(prefix):] for n in names
                   if n.startswith(prefix + 'tools/'))
    assert 'tools/train.py' in tools and 'tools/compare.py' in tools
    not_user = [
        p for p in tools
        if not any(p == item or (item.endswith('/') and p.startswith(item))
                   for item in USER_TOOLS)
    ]
    assert not not_user, f'shipped tools that are not user tools: {not_user}'
    # The harness itself is tracked, in dev/ (not left behind in tools/).
    harness = tracked_files(repo_root, 'dev')
    for path in ('dev/gpu_check.sh', 'dev/gpu_wheels.sh',
                 'dev/compat_check.sh', 'dev/upstream_suites/run.sh',
                 'dev/benchmarks/bench_gpu.py', 'dev/README.md'):
        assert path in harness, path
    assert not [
        p for p in tracked_files(repo_root, 'tools')
        if any(part in p for part in DEV_NAMES)
    ]


@pytest.fixture(scope='module')
def installed(wheel, tmp_path_factory):
    """The wheel in a fresh venv layered on this one: its python, its
    ``.mim`` folder and the environment to run it in (no PYTHONPATH)."""
    venv = tmp_path_factory.mktemp('installed') / 'venv'
    run([sys.executable, '-m', 'venv', '--without-pip', str(venv)])
    python = str(venv / 'bin' / 'python')
    site = run([
        python, '-c', 'import sysconfig; '
        'print(sysconfig.get_paths()["purelib"])'
    ]).stdout.strip()
    # Layer this environment (torch, mmpretrain, pip, ...) under the new one.
    with open(osp.join(site, 'project_env.pth'), 'w') as f:
        f.write(sysconfig.get_paths()['purelib'] + '\n')
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    run([python, '-m', 'pip', 'install', '-q', '--no-deps',
         str(wheel)],
        cwd=str(venv.parent),
        env=env)
    return python, osp.join(site, 'mmae_plugin', '.mim'), env


def test_installed_wheel_trains_a_config_outside_the_repo(
        repo_root, installed, tmp_path):
    python, mim, env = installed
    outside = tmp_path / 'elsewhere'
    outside.mkdir()
    located = run(
        [python, '-c', 'import mmae_plugin; print(mmae_plugin.__file__)'],
        cwd=outside,
        env=env).stdout.strip()
    assert located == osp.join(osp.dirname(mim), '__init__.py')
    assert not osp.islink(osp.join(mim, 'configs'))
    run([
        python,
        osp.join(mim, 'tools', 'train.py'),
        osp.join(mim, 'configs', 'fashion_mnist',
                 'mmae_fmnist.py'), '--work-dir', 'run', '--cfg-options',
        'train_dataloader.dataset.indices=32',
        'train_dataloader.batch_size=16', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False', 'train_cfg.max_epochs=1'
    ],
        cwd=outside,
        env=env)
    assert (outside / 'run' / 'epoch_1.pth').is_file()
    assert not str(outside).startswith(repo_root)
    # The model zoo's stand-in for `mim download`, from the installed copy.
    name = 'mmae_vit-tiny-p4_fmnist_linear'
    run([python, '-m', 'mmae_plugin.download', name, '--dest', 'zoo'],
        cwd=outside,
        env=env)
    with open(osp.join(mim, 'checkpoints', 'fmnist', f'{name}.pth'),
              'rb') as f:
        assert (outside / 'zoo' / f'{name}.pth').read_bytes() == f.read()
    assert (outside / 'zoo' / f'{name}.py').is_file()


@pytest.mark.long
def test_installed_wheel_runs_a_comparison_writing_only_its_out_dir(
        installed, tmp_path):
    """tools/compare.py from the wheel, configs named as in the repository
    (found in the package's .mim), everything under --out-dir. Long: the
    default suite tests the tool from the repository (test_comparison.py)
    and a tool running from the installed .mim (the training above)."""
    python, mim, env = installed
    outside = tmp_path / 'elsewhere'
    outside.mkdir()
    proc = run([
        python,
        osp.join(mim, 'tools',
                 'compare.py'), 'run', '--out-dir', 'cmp', '--arm',
        'mae=configs/fashion_mnist/mae_fmnist.py', '--arm', 'init=random',
        '--reference', 'mae', '--seeds', '0', '--epochs', '1', '--images',
        '256', '--eval-config', 'configs/fashion_mnist/knn_fmnist_clsmean.py',
        '--bank-images', '100', '--test-images', '100', '--shots', '2',
        '--cfg-options', 'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False'
    ],
               cwd=outside,
               env=env)
    assert 'report written to' in proc.stdout
    assert os.listdir(outside) == ['cmp']
    report = (outside / 'cmp' / 'report.md').read_text()
    assert '| init | ' in report and '(n=1, no interval)' in report
    data = json.loads((outside / 'cmp' / 'runs.json').read_text())
    assert sorted(r['arm'] for r in data['runs']) == ['init', 'mae']
