"""mmae-plugin: matrix information theory for MMPretrain self-supervision.

Requirements are compatible ranges (oldest tested version up to the next
major), so the plugin installs next to an existing OpenMMLab stack without
replacing its torch or its mmcv; the exact versions the test suite runs on
are in constraints.txt (``pip install -c constraints.txt ...``, as
tools/setup_env.sh does).

Like mmpretrain, the package carries its configs, tools and model index
under ``mmae_plugin/.mim/`` (what ``mim`` and a non-editable install use):
symbolic links into the repository for an editable install, copies in a
wheel.
"""
import os
import os.path as osp
import re
import shutil
from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

ROOT = osp.dirname(osp.abspath(__file__))
MIM_DIR = osp.join('mmae_plugin', '.mim')
# What the `.mim` folder holds: repository paths, shipped as they are
# (checkpoints/: the Fashion-MNIST model-zoo weights, mmae-zoo://).
MIM_ITEMS = ('configs', 'tools', 'model-index.yml', 'checkpoints')
# Repository-only tools, left out of a wheel: they set up or test the
# checkout's own .venv (setup.py, constraints.txt, tests/ are not shipped),
# or rebuild this repository's study pages from its studies/ package (not
# shipped either). The development harness (GPU check, benchmarks,
# compatibility and upstream suite runs, zoo export) is in dev/, which is
# not in MIM_ITEMS.
MIM_REPO_ONLY = ('tools/quickstart.sh', 'tools/setup_env.sh',
                 'tools/run_tests.sh', 'tools/analysis/information_flow.py',
                 'tools/analysis/heldout_variants.py',
                 'tools/analysis/label_free_predictors.py')
_IGNORE_BUILD_LEFTOVERS = shutil.ignore_patterns('__pycache__', '*.pyc',
                                                 'work_dirs')


def mim_ignore(folder: str, names: list) -> set:
    """``shutil.copytree`` filter: build leftovers, repository-only tools."""
    ignored = set(_IGNORE_BUILD_LEFTOVERS(folder, names))
    relative = osp.relpath(folder, ROOT)
    for name in names:
        if osp.normpath(osp.join(relative, name)) in MIM_REPO_ONLY:
            ignored.add(name)
    return ignored


INSTALL_REQUIRES = [
    # torch 2.4 is the first with torch.serialization.add_safe_globals, which
    # the weights_only allow-list (mmae_plugin.compat) needs; torchvision
    # 0.19 is its match. Tested on 2.4, 2.11 and the constraints.txt pin
    # (dev/compat_check.sh builds and tests such a stack).
    'torch>=2.4,<3',
    'torchvision>=0.19,<1',
    'numpy>=1.26,<3',  # 1.x and 2.x both tested
    'mmengine>=0.10.7,<1',
    'mmpretrain>=1.2.0,<2',
    # mmengine 0.10.7 resolves `mmpretrain::` bases through pkg_resources,
    # which setuptools 82 removed.
    'setuptools<82',
    # mmcv is left out on purpose, as in mmpretrain: full mmcv (with CUDA
    # ops) or mmcv-lite both work; `[lite]` installs the latter.
]
EXTRAS_REQUIRE = {
    'lite': ['mmcv-lite>=2.1.0,<2.4'],  # mmpretrain 1.2 wants mmcv < 2.4
    # tests read TensorBoard event files written by MatrixInfoHook runs and
    # check the checkpoint converter against timm's ViT; pytest-xdist runs
    # the suite on every core (tools/run_tests.sh).
    'tests': [
        'pytest>=9.2,<10', 'pytest-xdist>=3.8,<4', 'scipy>=1.17,<2',
        'tensorboard>=2.21,<3', 'timm>=1.0.31,<2'
    ],
    'analysis': ['matplotlib>=3.11,<4', 'tensorboard>=2.21,<3'],
    # tools/compare.py (the mmae_compare package, shipped beside the plugin,
    # which never imports it): jobs through submitit (local processes or
    # Slurm), paired t-intervals (scipy), figures.
    'compare': ['submitit>=1.5.4,<2', 'scipy>=1.17,<2', 'matplotlib>=3.11,<4'],
    # .pre-commit-config.yaml's hooks run these installed tools (no hook
    # repository is fetched, so CI runs them offline); versions as
    # mmpretrain's pre-commit configuration where it names them.
    'lint': [
        'pre-commit>=4,<5', 'pre-commit-hooks>=4.6,<5', 'flake8>=7.5,<8',
        'isort>=5.11.5,<6', 'yapf>=0.32,<0.33'
    ],
}
# `all` leaves mmcv alone: `pip install 'mmae-plugin[all]'` into an
# environment with full mmcv must not lay mmcv-lite over it.
EXTRAS_REQUIRE['all'] = sorted({
    req
    for extra, reqs in EXTRAS_REQUIRE.items() if extra != 'lite'
    for req in reqs
})


def read_version() -> str:
    """``__version__`` of ``mmae_plugin/__init__.py``, the one version source.

    Read as text: importing the package would import torch and mmengine,
    which a build environment need not have.
    """
    with open(
            osp.join(ROOT, 'mmae_plugin', '__init__.py'),
            encoding='utf-8') as f:
        match = re.search(r"^__version__ = '([^']+)'$", f.read(), re.M)
    if match is None:
        raise RuntimeError('mmae_plugin/__init__.py has no '
                           "__version__ = '...' line")
    return match.group(1)


def _remove(path: str) -> None:
    if osp.islink(path) or osp.isfile(path):
        os.remove(path)
    elif osp.isdir(path):
        shutil.rmtree(path)


def link_mim_items() -> None:
    """Point ``mmae_plugin/.mim/*`` at the repository (editable installs)."""
    mim_dir = osp.join(ROOT, MIM_DIR)
    os.makedirs(mim_dir, exist_ok=True)
    for item in MIM_ITEMS:
        target = osp.join(ROOT, item)
        link = osp.join(mim_dir, item)
        # Linked even before the target exists (model-index.yml), so a file
        # added later is found without reinstalling.
        relative = osp.relpath(target, mim_dir)
        if osp.islink(link) and os.readlink(link) == relative:
            continue
        _remove(link)
        os.symlink(relative, link)


def copy_mim_items(package_dir: str) -> None:
    """Copy configs, tools and the model index into a built package."""
    mim_dir = osp.join(package_dir, '.mim')
    os.makedirs(mim_dir, exist_ok=True)
    for item in MIM_ITEMS:
        source = osp.join(ROOT, item)
        dest = osp.join(mim_dir, item)
        _remove(dest)
        if osp.isdir(source):
            shutil.copytree(source, dest, ignore=mim_ignore)
        elif osp.isfile(source):
            shutil.copy2(source, dest)


class BuildPyWithMim(build_py):
    """``build_py`` that also lays out ``mmae_plugin/.mim``."""

    def run(self) -> None:
        super().run()
        if getattr(self, 'editable_mode', False):
            link_mim_items()
        else:
            copy_mim_items(osp.join(self.build_lib, 'mmae_plugin'))


setup(
    name='mmae-plugin',
    version=read_version(),
    description='M-MAE, U-MAE and matrix-information tools for MMPretrain',
    long_description=open(osp.join(ROOT, 'README.md'),
                          encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    # The plugin and the comparison tool built on it; studies/ (this
    # repository's study code) stays in the repository.
    packages=find_packages(include=[
        'mmae_plugin', 'mmae_plugin.*', 'mmae_compare', 'mmae_compare.*'
    ]),
    cmdclass={'build_py': BuildPyWithMim},
    python_requires='>=3.11',
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS_REQUIRE,
    # No `url`: the project has no public home yet, and a placeholder would
    # send `mim list` / pip users to a wrong address (mim only displays it).
    license='Apache-2.0',
    license_files=['LICENSE'],
    classifiers=[
        'Programming Language :: Python :: 3',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
    ],
    zip_safe=False,
)
