"""``import mmae_plugin.registration`` leaves mmengine and torch as they are.

Each test runs a fresh interpreter, records upstream objects, imports the
plugin and compares: only the documented process-wide changes (the
security fixes, mmcv's hue shift and DropPath rates,
``docs/upstream_workarounds.md``) may differ, and with their opt-out
variables set nothing does. Also: the framework-free subpackages import no
mmengine, and the plugin's import causes no ``pkg_resources`` warning.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: The opt-out variable of each process-wide module.
OPT_OUTS = {
    'checkpoint_allowlist': 'MMAE_NO_CHECKPOINT_ALLOWLIST',
    'weights_only_load': 'MMAE_UNSAFE_PICKLE_LOAD',
    'safe_resume_config': 'MMAE_UNSAFE_RESUME_CONFIG',
    'inferencer_checkpoint_config': 'MMAE_UNSAFE_INFERENCER_CONFIG',
    'adjust_hue_overflow': 'MMAE_NO_ADJUST_HUE_FIX',
    'drop_path_float': 'MMAE_NO_DROP_PATH_FLOAT',
}

#: Records every upstream object the plugin once replaced (and those the
#: process-wide modules still replace), by a readable name.
RECORD = '''
import builtins, json, sys
import torch
import mmcv
import mmcv.image
import mmcv.image.photometric as photometric
import mmengine.dist
import mmengine.dist.utils as dist_utils
import mmengine.hooks.checkpoint_hook as checkpoint_hook_module
import mmengine.runner
import mmengine.runner._flexible_runner as flexible_runner_module
import mmengine.runner.checkpoint as checkpoint_module
import mmengine.runner.runner as runner_module
import mmengine.config.config as config_module
import mmengine.utils.dl_utils.hub as hub
from mmcv.cnn.bricks.drop import DropPath
from mmengine._strategy import DDPStrategy, FSDPStrategy
from mmengine.fileio.backends import LocalBackend
from mmengine.hooks import CheckpointHook
from mmengine.infer import BaseInferencer
from mmengine.logging import HistoryBuffer
from mmengine.runner import CheckpointLoader, FlexibleRunner, Runner
from torch.distributed.fsdp import _optim_utils
import torch._weights_only_unpickler as unpickler


def methods(cls):
    return {f'{cls.__name__}.{name}': value
            for name, value in vars(cls).items()
            if not name.startswith('__') or name == '__init__'}


def record():
    objects = {
        'LocalBackend.put': vars(LocalBackend)['put'],
        'LocalBackend.put_text': vars(LocalBackend)['put_text'],
        'checkpoint_hook.open': vars(checkpoint_hook_module).get(
            'open', builtins.open),
        'builtins.open': builtins.open,
        'Runner.build_dataloader': vars(Runner)['build_dataloader'],
        'Runner.wrap_model': vars(Runner)['wrap_model'],
        'Runner.setup_env': vars(Runner)['setup_env'],
        'FlexibleRunner.build_dataloader':
            vars(FlexibleRunner)['build_dataloader'],
        'FlexibleRunner.build_strategy':
            vars(FlexibleRunner)['build_strategy'],
        'dist.utils._init_dist_pytorch': dist_utils._init_dist_pytorch,
        'dist.init_dist': mmengine.dist.init_dist,
        'dist.utils.init_dist': dist_utils.init_dist,
        'DDPStrategy._wrap_model': vars(DDPStrategy)['_wrap_model'],
        'torch _unflatten_orig_param_states':
            _optim_utils._unflatten_orig_param_states,
        "CheckpointLoader._schemes['']": CheckpointLoader._schemes[''],
        'config.is_installed': config_module.is_installed,
        'config.get_installed_path': config_module.get_installed_path,
        # Documented process-wide changes (docs/upstream_workarounds.md).
        'checkpoint.torch [weights_only_load]': checkpoint_module.torch,
        'hub.load_url [weights_only_load]': hub.load_url,
        'checkpoint.load_url [weights_only_load]': checkpoint_module.load_url,
        'runner.mmengine [safe_resume_config]': runner_module.mmengine,
        'flexible_runner.mmengine [safe_resume_config]':
            flexible_runner_module.mmengine,
        'BaseInferencer._init_model [inferencer_checkpoint_config]':
            vars(BaseInferencer)['_init_model'],
        'HistoryBuffer.register_statistics [checkpoint_allowlist]':
            vars(HistoryBuffer)['register_statistics'].__func__,
        '_get_user_allowed_globals [checkpoint_allowlist]':
            unpickler._get_user_allowed_globals,
        'mmcv.adjust_hue [adjust_hue_overflow]': mmcv.adjust_hue,
        'mmcv.image.adjust_hue [adjust_hue_overflow]':
            mmcv.image.adjust_hue,
        'photometric.adjust_hue [adjust_hue_overflow]':
            photometric.adjust_hue,
        'DropPath.__init__ [drop_path_float]': vars(DropPath)['__init__'],
    }
    for owner in (checkpoint_module, mmengine.runner, runner_module,
                  flexible_runner_module):
        if hasattr(owner, 'find_latest_checkpoint'):
            objects[f'{owner.__name__}.find_latest_checkpoint'] = \\
                owner.find_latest_checkpoint
    for cls in (CheckpointHook, FSDPStrategy):
        objects.update(methods(cls))
    for prefix, loader in CheckpointLoader._schemes.items():
        objects[f'CheckpointLoader._schemes[{prefix!r}]'] = loader
    return objects


def not_torchs_own(entries):
    """Allow-list entries torch did not add itself (importing
    torch.distributed.tensor registers DTensor's classes)."""
    found = [entry[0] if isinstance(entry, tuple) else entry
             for entry in entries]
    return {repr(entry) for entry in found
            if not getattr(entry, '__module__', '').startswith('torch')}


before = record()
safe_globals = not_torchs_own(torch.serialization.get_safe_globals())
import mmae_plugin.registration
after = record()
print(json.dumps(dict(
    changed=sorted(name for name in before if after[name] is not before[name]),
    added=sorted(set(after) - set(before)),
    count=len(before),
    safe_globals_added=len(not_torchs_own(
        torch.serialization.get_safe_globals()) - safe_globals))))
'''

#: What may change, each a documented process-wide workaround.
DOCUMENTED = {
    'checkpoint.torch [weights_only_load]',
    'hub.load_url [weights_only_load]',
    'checkpoint.load_url [weights_only_load]',
    'runner.mmengine [safe_resume_config]',
    'flexible_runner.mmengine [safe_resume_config]',
    'BaseInferencer._init_model [inferencer_checkpoint_config]',
    'HistoryBuffer.register_statistics [checkpoint_allowlist]',
    '_get_user_allowed_globals [checkpoint_allowlist]',
    'mmcv.adjust_hue [adjust_hue_overflow]',
    'mmcv.image.adjust_hue [adjust_hue_overflow]',
    'photometric.adjust_hue [adjust_hue_overflow]',
    'DropPath.__init__ [drop_path_float]',
}


def run_python(code, **env):
    """Run ``code`` in a fresh interpreter (no GPU); its last stdout line."""
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES='', **env)
    for variable in OPT_OUTS.values():
        environment.setdefault(variable, '')
    environment.update(env)
    proc = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(code)],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def recorded(**env):
    proc = run_python(RECORD, **env)
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_only_documented_changes_are_process_wide():
    result, _ = recorded()
    assert result['count'] > 60  # the hook's and FSDP's methods included
    assert set(result['changed']) == DOCUMENTED, result['changed']
    # The plugin adds a scheme of its own (mmae-zoo://), replaces none.
    assert result['added'] == ["CheckpointLoader._schemes['mmae-zoo://']"]
    assert result['safe_globals_added'] > 0


def test_with_every_opt_out_nothing_upstream_changes():
    result, stderr = recorded(**{v: '1' for v in OPT_OUTS.values()})
    assert result['changed'] == [], result['changed']
    assert result['safe_globals_added'] == 0
    for variable in OPT_OUTS.values():
        assert f'{variable}=1: mmae_plugin leaves upstream behaviour' \
            in stderr


@pytest.mark.parametrize('module', sorted(OPT_OUTS))
def test_each_opt_out_keeps_only_its_own_module_upstream(module):
    result, stderr = recorded(**{OPT_OUTS[module]: '1'})
    kept = {name for name in DOCUMENTED if f'[{module}]' in name}
    assert set(result['changed']) == DOCUMENTED - kept
    assert f'{OPT_OUTS[module]}=1' in stderr
    assert (result['safe_globals_added'] == 0) is \
        (module == 'checkpoint_allowlist')


def test_an_unclear_opt_out_value_is_refused_by_name():
    environment = dict(os.environ, MMAE_UNSAFE_RESUME_CONFIG='yes')
    proc = subprocess.run(
        [sys.executable, '-c', 'import mmae_plugin.registration'],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=300)
    assert proc.returncode != 0
    assert "MMAE_UNSAFE_RESUME_CONFIG='yes': set it to 1" in proc.stderr


# --------------------------------------------------------------------------
# framework-free subpackages; registration
# --------------------------------------------------------------------------
def test_matrix_info_imports_no_framework_and_configs_still_register():
    proc = run_python(f'''
        import sys
        import mmae_plugin.matrix_info as mi
        import mmae_plugin.theory.metrics  # noqa: F401
        import torch
        mi.effective_rank(torch.randn(16, 4))
        print('framework-free:', 'mmengine' not in sys.modules,
              'mmpretrain' not in sys.modules)
        # A config loaded later still registers everything (the shipped
        # configs import mmae_plugin.registration).
        from mmengine.config import Config
        from mmengine.registry import RUNNERS, STRATEGIES
        from mmpretrain.registry import MODELS
        cfg = Config.fromfile('{REPO}/configs/fashion_mnist/mmae_fmnist.py')
        print('registered:', MODELS.get(cfg.model.type) is not None,
              RUNNERS.get('MMAERunner') is not None,
              STRATEGIES.get('MMAEFSDPStrategy') is not None)
    ''')
    assert 'framework-free: True True' in proc.stdout, proc.stdout
    assert 'registered: True True True' in proc.stdout, proc.stdout


#: Imports mmengine and mmpretrain before or after the plugin, then says
#: whether the plugin's components (and its runner) are registered.
ORDERED_IMPORT = '''
import sys
if {framework_first}:
    import mmengine, mmpretrain  # noqa: F401
import {plugin}  # noqa: F401
import mmengine, mmpretrain  # noqa: F401
from mmengine.registry import RUNNERS
from mmpretrain.registry import MODELS
print('registered:', 'MMAE' in MODELS.module_dict,
      'MMAERunner' in RUNNERS.module_dict,
      'mmae_plugin.registration' in sys.modules)
'''


@pytest.mark.parametrize('framework_first', [True, False])
@pytest.mark.parametrize('plugin, registers',
                         [('mmae_plugin', False),
                          ('mmae_plugin.registration', True)])
def test_only_the_registration_module_registers_in_either_order(
        plugin, registers, framework_first):
    """``import mmae_plugin`` means the same whether mmengine and
    mmpretrain were imported before or after it: nothing registered;
    ``import mmae_plugin.registration`` registers in both orders."""
    proc = run_python(
        ORDERED_IMPORT.format(plugin=plugin, framework_first=framework_first))
    assert f'registered: {registers} {registers} {registers}' in \
        proc.stdout, proc.stdout + proc.stderr


#: A config of a tiny MMAE that names ``{imports}`` in ``custom_imports``.
TINY_MMAE_CONFIG = '''
default_scope = 'mmpretrain'
custom_imports = dict(imports=[{imports!r}], allow_failed_imports=False)
model = dict(
    type='MMAE',
    backbone=dict(
        type='MAEViT',
        arch=dict(
            embed_dims=16, num_layers=1, num_heads=2,
            feedforward_channels=32),
        img_size=8,
        patch_size=4,
        mask_ratio=0.75),
    neck=dict(
        type='MAEPretrainDecoder',
        num_patches=4,
        patch_size=4,
        in_chans=3,
        embed_dim=16,
        decoder_embed_dim=16,
        decoder_depth=1,
        decoder_num_heads=2),
    head=dict(
        type='MAEPretrainHead',
        patch_size=4,
        loss=dict(type='PixelReconstructionLoss', criterion='L2')))
'''


@pytest.mark.parametrize('imports',
                         ['mmae_plugin', 'mmae_plugin.registration'])
def test_a_config_importing_the_bare_package_fails_at_build(tmp_path, imports):
    """What a user sees with ``imports=['mmae_plugin']``: the real
    ``Runner.from_cfg`` stops with mmengine's registry KeyError naming the
    plugin's component; ``imports=['mmae_plugin.registration']`` builds."""
    config = tmp_path / 'tiny_mmae.py'
    config.write_text(TINY_MMAE_CONFIG.format(imports=imports))
    proc = subprocess.run([
        sys.executable, '-c',
        textwrap.dedent(f'''
            from mmengine.config import Config
            from mmengine.runner import Runner
            cfg = Config.fromfile({str(config)!r})
            cfg.work_dir = {str(tmp_path / 'work')!r}
            runner = Runner.from_cfg(cfg)
            print('built:', type(runner.model).__name__)
        ''')
    ],
                          cwd=REPO,
                          env=dict(os.environ, CUDA_VISIBLE_DEVICES=''),
                          capture_output=True,
                          text=True,
                          timeout=300)
    if imports == 'mmae_plugin.registration':
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert 'built: MMAE' in proc.stdout
        return
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(
        'KeyError: \'MMAE is not in the mmpretrain::model registry.'), \
        proc.stderr[-3000:]


def test_framework_attribute_registers_a_plugin_imported_first():
    proc = run_python('''
        import sys
        import mmae_plugin
        print('nothing yet:', 'mmengine' not in sys.modules)
        mmae_plugin.models  # first use of a framework attribute
        from mmpretrain.registry import MODELS
        print('registered:', MODELS.get('MMAE') is not None,
              'mmae_plugin.registration' in sys.modules)
    ''')
    assert 'nothing yet: True' in proc.stdout
    assert 'registered: True True' in proc.stdout


# --------------------------------------------------------------------------
# pkg_resources: never imported by the plugin, warning quiet in its tools
# --------------------------------------------------------------------------
PLAIN_CONFIG = 'model = dict(type="MAE")\n'
PACKAGE_CONFIG = "_base_ = ['mmpretrain::_base_/default_runtime.py']\n"


def test_plugin_import_neither_imports_pkg_resources_nor_warns(tmp_path):
    plain = tmp_path / 'plain.py'
    plain.write_text(PLAIN_CONFIG)
    proc = run_python(
        f'''
        import sys, warnings
        warnings.simplefilter('always')
        with warnings.catch_warnings(record=True) as caught:
            import mmengine
            import mmae_plugin.registration  # noqa: F401
            from mmengine.config import Config
            Config.fromfile({str(plain)!r})
        print('pkg_resources:', 'pkg_resources' in sys.modules,
              any('pkg_resources' in str(w.message) for w in caught))
    ''',
        PYTHONWARNINGS='default')
    assert 'pkg_resources: False False' in proc.stdout


def test_only_the_plugin_tools_quiet_the_deprecation_warning():
    proc = run_python('''
        import importlib, warnings
        import pkg_resources
        from mmae_plugin.compat.pkg_resources_check import \\
            quiet_pkg_resources_deprecation
        warnings.simplefilter('always')
        with warnings.catch_warnings(record=True) as outside:
            importlib.reload(pkg_resources)  # what mmengine's lookup does
        with warnings.catch_warnings(record=True) as inside:
            with quiet_pkg_resources_deprecation():
                importlib.reload(pkg_resources)
        def count(caught):
            return sum('pkg_resources is deprecated' in str(w.message)
                       for w in caught)
        print('warnings:', count(outside), count(inside))
    ''')
    setuptools_warns = 'warnings: 1 0' in proc.stdout
    assert setuptools_warns or 'warnings: 0 0' in proc.stdout, proc.stdout


def test_tools_say_what_to_install_without_pkg_resources(tmp_path):
    package = tmp_path / 'package.py'
    package.write_text(PACKAGE_CONFIG)
    environment = dict(os.environ, CUDA_VISIBLE_DEVICES='')
    proc = subprocess.run([
        sys.executable, '-c',
        textwrap.dedent(f'''
        import sys
        sys.modules['pkg_resources'] = None  # as after setuptools 82
        sys.path.insert(0, 'tools')
        sys.argv = ['train.py', {str(package)!r},
                    '--work-dir', {str(tmp_path / 'work')!r}]
        from _cli import run_mmpretrain_tool
        run_mmpretrain_tool('train.py')
    ''')
    ],
                          cwd=REPO,
                          env=environment,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        'train.py: mmengine 0.10.7 needs pkg_resources to resolve '
        '"mmpretrain::" config bases, and it is not installed (setuptools '
        ">= 82 removed it); install it with: pip install 'setuptools<82'")


def test_plugin_import_leaves_random_states_alone():
    """Upstream tests that draw from the global generators without seeding
    see the same draws with the plugin imported."""
    proc = run_python('''
        import random
        import numpy as np
        import torch
        import mmengine, mmpretrain  # noqa: F401
        np.random.seed(0), random.seed(0), torch.manual_seed(0)
        before = (np.random.get_state()[1].copy(), random.getstate(),
                  torch.get_rng_state().clone())
        import mmae_plugin.registration  # noqa: F401
        print('same:', (np.random.get_state()[1] == before[0]).all(),
              random.getstate() == before[1],
              torch.equal(torch.get_rng_state(), before[2]))
    ''')
    assert 'same: True True True' in proc.stdout
