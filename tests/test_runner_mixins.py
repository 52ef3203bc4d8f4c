"""The runner mixins that replaced compat's cpu_distributed / collate_scope.

Each test builds a real runner in a real (1-process gloo) group; mmengine's
own ``Runner`` / ``DDPStrategy`` are shown to keep upstream's behaviour.
"""
import pytest
import torch
from conftest import ToyModel, make_toy_runner
from mmengine.config import Config
from mmengine.model import MMDistributedDataParallel
from mmengine.runner import Runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.runners import (CpuDistributedRunnerMixin,
                                        MMAEFlexibleRunner, MMAERunner)
from mmae_plugin.engine.runners.cpu_distributed import (cpu_ddp_wrapper_cfg,
                                                        has_dist_accelerator)

# Torch's own refusal of device_ids for a CPU module, naming both arguments.
TORCH_REFUSES_CPU_DEVICE_IDS = (r'device_ids and output_device arguments only '
                                r'work with single-device.*device_ids \[0\]')

cpu_only = pytest.mark.skipif(
    torch.cuda.is_available(), reason='CPU-only behaviour')


@pytest.fixture
def dist_env(monkeypatch, free_port):
    """Environment of a 1-process ``torchrun`` on a free local port."""
    for key, value in dict(
            RANK='0',
            LOCAL_RANK='0',
            WORLD_SIZE='1',
            MASTER_ADDR='127.0.0.1',
            MASTER_PORT=str(free_port)).items():
        monkeypatch.setenv(key, value)
    assert not torch.distributed.is_initialized()
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def ddp_runner(tmp_path,
               model_wrapper_cfg=None,
               runner_class=MMAERunner,
               dist_cfg=None):
    """A distributed toy runner; ``model_wrapper_cfg`` read from its cfg."""
    cfg = None if model_wrapper_cfg is None else dict(
        model_wrapper_cfg=model_wrapper_cfg)
    return make_toy_runner(
        tmp_path,
        runner_class=runner_class,
        launcher='pytorch',
        cfg=cfg,
        env_cfg=dict(dist_cfg=dist_cfg or dict(backend='nccl')))


def assert_trains_with_gloo(runner):
    """One epoch on the gloo group: gradients are all-reduced by DDP."""
    assert torch.distributed.get_backend() == 'gloo'
    runner.train()
    assert runner.iter == 2
    assert isinstance(runner.model, MMDistributedDataParallel)
    assert runner.model.device_ids is None  # torch's CPU-module setting


# --------------------------------------------------------------------------
# process group
# --------------------------------------------------------------------------
@cpu_only
@pytest.mark.parametrize('backend', ['nccl', 'gloo'])
def test_runner_initialises_gloo_for_nccl_and_gloo(tmp_path, dist_env,
                                                   backend):
    runner = ddp_runner(tmp_path, dist_cfg=dict(backend=backend, timeout=60))
    assert_trains_with_gloo(runner)


@cpu_only
def test_upstream_runner_is_unchanged(tmp_path, dist_env):
    """mmengine's Runner still calls torch.cuda.set_device (the plugin
    changes nothing outside its runners)."""
    with pytest.raises((RuntimeError, AssertionError),
                       match='NVIDIA|CUDA|cuda'):
        ddp_runner(tmp_path, runner_class=Runner)
    assert not torch.distributed.is_initialized()


@cpu_only
def test_runner_honours_an_explicit_backend(tmp_path, dist_env):
    if torch.distributed.is_mpi_available():
        pytest.skip('this torch has MPI: mpi would start')
    # Upstream fails in torch.cuda.set_device before looking at the backend;
    # the plugin's runner asks torch for MPI, as requested.
    with pytest.raises(RuntimeError, match='MPI'):
        ddp_runner(tmp_path, dist_cfg=dict(backend='mpi'))


@pytest.mark.parametrize('probe,package',
                         [('is_npu_available', 'torch_npu'),
                          ('is_mlu_available', 'torch_mlu'),
                          ('is_musa_available', 'torch_musa')])
def test_accelerator_hosts_get_mmengine_branches(tmp_path, dist_env,
                                                 monkeypatch, probe, package):
    """With an NPU/MLU/MUSA present, mmengine's own branch runs.

    No such device exists here, so mmengine's device probe is made to report
    one (the only stand-in in this file); mmengine's branch then imports the
    vendor package, which is what shows that the branch ran.
    """
    import mmengine.dist.utils as dist_utils
    monkeypatch.setattr(dist_utils, probe, lambda: True)
    assert has_dist_accelerator()
    with pytest.raises(ImportError, match=package):
        ddp_runner(tmp_path)


# --------------------------------------------------------------------------
# DDP wrapping: only the device_ids mmengine injects are dropped
# --------------------------------------------------------------------------
@cpu_only
@pytest.mark.parametrize('model_wrapper_cfg', [
    None,
    dict(type='MMDistributedDataParallel'),
    dict(type='MMDistributedDataParallel', broadcast_buffers=False)
])
def test_runner_drops_device_ids_mmengine_injects(tmp_path, dist_env,
                                                  model_wrapper_cfg):
    runner = ddp_runner(tmp_path, model_wrapper_cfg)
    assert_trains_with_gloo(runner)
    # mmengine's own default without a config is broadcast_buffers=False.
    expected = (model_wrapper_cfg or {}).get('broadcast_buffers',
                                             model_wrapper_cfg is not None)
    assert runner.model.broadcast_buffers is expected


@cpu_only
@pytest.mark.parametrize(
    'given', [dict(device_ids=[0]),
              dict(device_ids=[0], output_device=0)])
def test_runner_keeps_device_ids_the_config_gives(tmp_path, dist_env, given):
    with pytest.raises(ValueError, match=TORCH_REFUSES_CPU_DEVICE_IDS):
        ddp_runner(tmp_path, dict(type='MMDistributedDataParallel', **given))


def test_wrapper_cfg_is_copied_not_changed():
    given = Config(dict(w=dict(type='MMDistributedDataParallel'))).w
    assert cpu_ddp_wrapper_cfg(given) == dict(
        type='MMDistributedDataParallel', device_ids=None)
    assert 'device_ids' not in given
    # Not a DistributedDataParallel: mmengine adds no device_ids either.
    other = dict(type='MMFullyShardedDataParallel')
    assert cpu_ddp_wrapper_cfg(other) is other


@cpu_only
@pytest.mark.parametrize('strategy', [None, dict(type='DDPStrategy')])
def test_flexible_runner_trains_ddp_on_gloo(tmp_path, dist_env, strategy):
    kwargs = {} if strategy is None else dict(strategy=strategy)
    runner = make_toy_runner(
        tmp_path,
        runner_class=MMAEFlexibleRunner,
        launcher='pytorch',
        env_cfg=dict(dist_cfg=dict(backend='nccl')),
        **kwargs)
    assert runner.strategy.model_wrapper['device_ids'] is None
    assert_trains_with_gloo(runner)


@cpu_only
def test_config_alone_runs_ddp_on_cpu_without_the_plugin_runner(
        tmp_path, dist_env):
    """What the mixins do is a config choice for mmengine's own runners: a
    group initialised first, and device_ids=None in the wrapper config
    (config keys override mmengine's default_args)."""
    torch.distributed.init_process_group('gloo')
    runner = ddp_runner(
        tmp_path,
        dict(type='MMDistributedDataParallel', device_ids=None),
        runner_class=Runner)
    assert_trains_with_gloo(runner)
    from mmengine._strategy import DDPStrategy
    wrapped = DDPStrategy(
        work_dir=str(tmp_path / 'strategy'),
        model_wrapper=dict(type='MMDistributedDataParallel',
                           device_ids=None))._wrap_model(ToyModel())
    assert wrapped.device_ids is None


@cpu_only
def test_ddp_built_by_hand_reaches_torch_as_given(dist_env):
    torch.distributed.init_process_group('gloo')
    with pytest.raises(ValueError, match=TORCH_REFUSES_CPU_DEVICE_IDS):
        MMDistributedDataParallel(module=ToyModel(), device_ids=[0])
    assert MMDistributedDataParallel(module=ToyModel()).device_ids is None


@pytest.mark.cuda
def test_cuda_host_keeps_mmengine_device_ids(tmp_path, dist_env):
    """On a CUDA host nothing changes: NCCL, set_device, device_ids=[0]."""
    assert has_dist_accelerator()
    runner = make_toy_runner(
        tmp_path, runner_class=MMAERunner, launcher='pytorch')
    assert torch.distributed.get_backend() == 'nccl'
    assert runner.model.device_ids == [0]
    assert runner.model.module.linear.weight.device.type == 'cuda'


def test_mixin_goes_before_mmengine_runner():
    mro = MMAERunner.__mro__
    assert mro.index(CpuDistributedRunnerMixin) < mro.index(Runner)


# --------------------------------------------------------------------------
# collate_fn without _scope_
# --------------------------------------------------------------------------
def scoped_loader_cfg(repo_root):
    """The ViT-B recipe's train loader on 4 Fashion-MNIST test images."""
    cfg = Config.fromfile(f'{repo_root}/configs/mmae_vit-base_200e.py')
    loader_cfg = cfg.train_dataloader
    assert loader_cfg.collate_fn.get('_scope_') == 'mmpretrain'
    loader_cfg.dataset = dict(
        _scope_='mmpretrain',
        type='GzipFashionMNIST',
        split='test',
        indices=4,
        pipeline=[dict(type='PackInputs')])
    loader_cfg.update(batch_size=2, num_workers=0, persistent_workers=False)
    return loader_cfg


@pytest.mark.parametrize('runner_class', [MMAERunner, MMAEFlexibleRunner])
def test_plugin_runners_build_scoped_collate_fn(repo_root, runner_class):
    loader_cfg = scoped_loader_cfg(repo_root)
    loader = runner_class.build_dataloader(loader_cfg, seed=0)
    assert next(iter(loader))['inputs'].shape == (2, 1, 28, 28)
    assert loader_cfg.collate_fn['_scope_'] == 'mmpretrain'  # not changed


def test_mmengine_build_dataloader_is_unchanged(repo_root):
    """mmengine itself still fails on it (delete the mixin when this fails)."""
    with pytest.raises(TypeError, match='_scope_'):
        next(iter(Runner.build_dataloader(scoped_loader_cfg(repo_root))))
