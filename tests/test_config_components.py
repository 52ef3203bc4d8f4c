"""Every shipped training config selects the plugin's safety components:
its runner, its checkpoint hook and DivergenceHook, and the logging that
never waits for the step just queued (DeferredRuntimeInfoHook)."""
import glob
import os

import pytest
from mmengine.config import Config

import mmae_plugin.registration  # noqa: F401

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def training_configs():
    """Every config a user trains (not bases, test-only kNN configs or
    hook snippets)."""
    paths = glob.glob(f'{REPO}/configs/**/*.py', recursive=True)
    return sorted(
        os.path.relpath(p, REPO) for p in paths if
        '/_' not in p.replace(REPO, '') and 'knn' not in os.path.basename(p))


@pytest.mark.parametrize('config', training_configs())
def test_training_config_selects_the_safe_runner_and_hooks(config):
    cfg = Config.fromfile(os.path.join(REPO, config))
    expected_runner = ('MMAEFlexibleRunner'
                       if 'strategy' in cfg else 'MMAERunner')
    assert cfg.runner_type == expected_runner
    assert cfg.default_hooks.checkpoint.type == 'SafeCheckpointHook'
    assert dict(type='DivergenceHook') in cfg.custom_hooks
    assert cfg.default_hooks.runtime_info.type == 'DeferredRuntimeInfoHook'


@pytest.mark.parametrize('config', training_configs())
def test_regularised_config_selects_the_skip_report(config):
    """Every config whose model has a regulariser (M-MAE, U-MAE) selects
    RegularizerSkipHook, which reports the steps its term was skipped."""
    cfg = Config.fromfile(os.path.join(REPO, config))
    hooks = [h.get('type') for h in cfg.get('custom_hooks', [])] + [
        h.get('type') for h in cfg.get('default_hooks', {}).values() if h
    ]
    has_regularizer = cfg.model.get('regularizer') is not None
    assert ('RegularizerSkipHook' in hooks) == has_regularizer, hooks
