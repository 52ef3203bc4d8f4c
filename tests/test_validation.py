"""The general argument checks of :mod:`mmae_plugin.utils.validation`.

They are imported by models, hooks, datasets, the gather and the
matrix-information functions, so the module must stay framework-free and
must not import the rest of the plugin (no import cycle through it); the
matrix-information checks stay in :mod:`mmae_plugin.matrix_info.validation`.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import mmae_plugin.matrix_info.validation as matrix_validation
from mmae_plugin.utils import validation
from mmae_plugin.utils.validation import (check_bool, check_choice,
                                          check_config, check_init_cfg,
                                          check_int, check_non_negative,
                                          check_real)

REPO = Path(__file__).resolve().parents[1]
GENERAL = ('check_bool', 'check_real', 'check_int', 'check_non_negative',
           'check_choice', 'check_config', 'check_init_cfg')


def test_importing_the_checks_imports_no_framework_and_no_plugin_module():
    code = textwrap.dedent('''
        import sys
        import mmae_plugin.utils.validation
        plugin = sorted(m for m in sys.modules if m.startswith('mmae_plugin'))
        print('framework:', 'mmengine' in sys.modules,
              'mmpretrain' in sys.modules)
        print('plugin:', ','.join(plugin))
    ''')
    proc = subprocess.run([sys.executable, '-c', code],
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'framework: False False' in proc.stdout, proc.stdout
    assert ('plugin: mmae_plugin,mmae_plugin.utils,'
            'mmae_plugin.utils.validation') in proc.stdout, proc.stdout


def test_each_general_check_has_one_home():
    for name in GENERAL:
        assert getattr(validation, name).__module__ == validation.__name__
    # matrix_info's checks use check_real and nothing else of the module.
    assert matrix_validation.check_real is check_real
    assert not [
        name for name in GENERAL
        if name != 'check_real' and hasattr(matrix_validation, name)
    ]


def test_check_bool_refuses_truthy_values():
    assert check_bool(False, 'flag') is False
    for value in ('no', 1, 0, None, np.bool_(True)):
        with pytest.raises(TypeError, match='flag must be True or False'):
            check_bool(value, 'flag')


def test_check_real_bounds_types_and_overflow():
    assert check_real(np.float32(0.5), 'x', minimum=0, strict=True) == 0.5
    assert check_real(1, 'x', maximum=1) == 1.0
    with pytest.raises(ValueError, match=r'x must be a finite number > 0'):
        check_real(0, 'x', minimum=0, strict=True)
    with pytest.raises(ValueError, match=r'<= 1'):
        check_real(1.5, 'x', maximum=1)
    with pytest.raises(ValueError, match='finite'):
        check_real(float('nan'), 'x')
    with pytest.raises(ValueError, match='overflows float64'):
        check_real(10**400, 'x')
    for value in (True, '1', torch.tensor(1.0), 1j):
        with pytest.raises(TypeError, match='x must be a real number'):
            check_real(value, 'x')
    assert check_non_negative(0, 'eps') == 0.0
    with pytest.raises(ValueError, match='eps must be a finite number >= 0'):
        check_non_negative(-1e-9, 'eps')


def test_check_int_and_check_choice():
    assert check_int(np.int64(3), 'n', minimum=1) == 3
    with pytest.raises(ValueError, match='n must be an integer >= 1, got 0'):
        check_int(0, 'n', minimum=1)
    for value in (2.0, True, '2'):
        with pytest.raises(TypeError, match='n must be an integer'):
            check_int(value, 'n')
    assert check_choice('local', 'gather', ('global', 'local')) == 'local'
    with pytest.raises(ValueError, match=r'gather must be one of \('):
        check_choice('Local', 'gather', ('global', 'local'))


def test_check_config_and_check_init_cfg():
    cfg = dict(type='TCRLoss')
    assert check_config(cfg, 'loss') is cfg
    assert check_config(None, 'loss', optional=True) is None
    with pytest.raises(TypeError, match='loss must be a config dict'):
        check_config(None, 'loss')
    with pytest.raises(TypeError, match='None or a config dict'):
        check_config(dict(lr=1), 'loss', optional=True)
    assert check_init_cfg(None) is None
    assert check_init_cfg([cfg, cfg]) == [cfg, cfg]
    for bad in ([], [cfg, dict(lr=1)], 'Pretrained'):
        with pytest.raises(TypeError, match='init_cfg must be None'):
            check_init_cfg(bad)
