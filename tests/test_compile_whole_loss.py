"""``torch.compile`` takes the loss of MAE and M-MAE as one graph (issue 47).

``torch._dynamo.explain`` of ``model.loss`` of the Fashion-MNIST MAE and
M-MAE recipes found 9 graphs and 8 breaks: mmcv's ``DropPath`` branches on
the numpy drop rate mmpretrain gives it, which Dynamo traces as a tensor.
With ``mmae_plugin.compat.drop_path_float`` the loss is one graph on one
process. ``CompileHook`` compiles it in a real Runner (single process,
``fullgraph=True``) and, run after one eager iteration, under DDP on 2 gloo
ranks with the regulariser's global gather, where nothing recompiles after
the first compiled step.
"""
import os
import types

import numpy as np
import pytest
import torch
from _helpers_gloo import run_gloo_ranks
from mmcv.cnn.bricks.drop import DropPath
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner
from mmpretrain.registry import HOOKS, MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.compat import drop_path_float

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITERS = 3


def fmnist_config(name: str) -> Config:
    return Config.fromfile(
        os.path.join(REPO, 'configs', 'fashion_mnist', f'{name}.py'))


def build_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return MODELS.build(fmnist_config(name).model).train()


def explain_loss(model: torch.nn.Module):
    torch._dynamo.reset()
    images = torch.randn(4, 1, 28, 28)
    return torch._dynamo.explain(model.loss)(images, [])


@pytest.mark.parametrize('name', ['mae_fmnist', 'mmae_fmnist'])
def test_loss_is_one_graph(name):
    explained = explain_loss(build_model(name))
    assert explained.graph_break_count == 0, [
        reason.reason for reason in explained.break_reasons
    ]
    assert explained.graph_count == 1


def test_upstream_drop_path_breaks_the_graph(monkeypatch):
    """The test above can fail: with mmcv's ``__init__`` it does."""
    monkeypatch.setattr(DropPath, '__init__', drop_path_float.upstream_init())
    explained = explain_loss(build_model('mmae_fmnist'))
    assert (explained.graph_count, explained.graph_break_count) == (9, 8)
    assert all('drop.py' in reason.user_stack[-1].filename
               for reason in explained.break_reasons)


def test_drop_path_keeps_the_rate_as_a_python_float():
    rate = np.linspace(0, 0.3, 4)[1]
    module = DropPath(rate)
    assert type(module.drop_prob) is float and module.drop_prob == rate
    assert DropPath(drop_prob=np.float32(0.5)).drop_prob == 0.5
    assert type(DropPath(0.2).drop_prob) is float
    assert DropPath().drop_prob == 0.1
    # The same draws give the same output as with the numpy rate.
    upstream = DropPath.__new__(DropPath)
    drop_path_float.upstream_init()(upstream, rate)
    assert isinstance(upstream.drop_prob, np.float64)
    x = torch.randn(8, 5, 3)
    outputs = []
    for dropper in (module.train(), upstream.train()):
        torch.manual_seed(1)
        outputs.append(dropper(x))
    assert torch.equal(*outputs)


# ------------------------------------------------------------ CompileHook
def test_compile_hook_refuses_bad_arguments():
    with pytest.raises(ValueError, match='target'):
        HOOKS.build(dict(type='CompileHook', target='train_step'))
    with pytest.raises(TypeError, match='torch.compile does not take'):
        HOOKS.build(dict(type='CompileHook', fullgraf=True))


class LossRecorder(Hook):
    """Each iteration's logged losses, and whether ``loss`` was compiled."""

    priority = 'VERY_LOW'

    def __init__(self) -> None:
        self.losses, self.compiled = [], []

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        self.compiled.append('loss' in vars(runner.model))

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        self.losses.append({k: v.item() for k, v in outputs.items()})


def train_fmnist(work_dir: str, compile_options: dict) -> tuple:
    cfg = fmnist_config('mmae_fmnist')
    cfg.merge_from_dict(compile_options)
    cfg.work_dir = work_dir
    cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=ITERS)
    cfg.param_scheduler = []
    cfg.default_hooks.checkpoint = None
    cfg.train_dataloader.update(
        batch_size=8, num_workers=0, persistent_workers=False)
    cfg.train_dataloader.dataset.indices = 8 * ITERS
    runner = Runner.from_cfg(cfg)
    recorder = LossRecorder()
    runner.register_hook(recorder)
    torch._dynamo.reset()
    runner.train()
    return runner, recorder


def test_compile_hook_compiles_the_loss_whole_in_a_runner(tmp_path):
    """Selected from the command line, with ``fullgraph=True`` (a graph
    break would raise); the same losses as eager; eager method back after.
    """
    _, eager = train_fmnist(str(tmp_path / 'eager'), {})
    runner, compiled = train_fmnist(
        str(tmp_path / 'compiled'), {
            'default_hooks.compile.type': 'CompileHook',
            'default_hooks.compile.backend': 'eager',
            'default_hooks.compile.fullgraph': True,
        })
    assert compiled.compiled == [False, True, True]
    assert eager.compiled == [False] * ITERS
    assert compiled.losses == eager.losses
    assert 'loss' not in vars(runner.model)


# ------------------------------------------------ 2 gloo ranks under DDP
def _ddp_steps(rank: int, world: int) -> dict:
    """M-MAE (global gather) under DDP: eager twin, then the hook's run."""
    from mmengine.registry import init_default_scope
    from torch._dynamo.utils import counters
    from torch.nn.parallel import DistributedDataParallel
    torch.set_num_threads(1)
    init_default_scope('mmpretrain')
    result = {}
    for label in ('eager', 'compiled'):
        model = build_model('mmae_fmnist')
        assert model.regularizer.gather == 'global'
        ddp = DistributedDataParallel(model)
        runner = types.SimpleNamespace(model=ddp)
        hook = HOOKS.build(dict(type='CompileHook', backend='aot_eager'))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        torch._dynamo.reset()
        counters.clear()
        losses, graphs, frames = [], [], []
        hook.before_train(runner)
        for step in range(5):
            torch.manual_seed(10 * step + rank)
            out = ddp(torch.randn(8, 1, 28, 28), [], mode='loss')
            loss = sum(v for k, v in out.items() if k.startswith('loss'))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if label == 'compiled':
                hook.after_train_iter(runner, step)
            losses.append(loss.item())
            graphs.append(counters['stats']['unique_graphs'])
            frames.append(counters['frames']['total'])
        hook.after_train(runner)
        result[label] = dict(
            losses=losses,
            graphs=graphs,
            frames=frames,
            breaks=sum(counters['graph_break'].values()),
            recompiles=sum(counters['recompiles'].values()))
    return result


@pytest.mark.skipif(
    os.environ.get('MMAE_TEST_LONG') != '1',
    reason='about 30 s of 2-process training: MMAE_TEST_LONG=1')
def test_ddp_compiled_loss_is_one_graph_that_never_recompiles(tmp_path):
    for rank in run_gloo_ranks(_ddp_steps, 2, tmp_path):
        compiled = rank['compiled']
        # Step 0 eager; step 1 compiles the one graph; nothing after.
        assert compiled['graphs'] == [0, 1, 1, 1, 1], compiled
        assert compiled['frames'][1:] == [compiled['frames'][1]] * 4
        assert compiled['breaks'] == 0 and compiled['recompiles'] == 0
        assert rank['eager']['graphs'] == [0] * 5
        np.testing.assert_allclose(
            compiled['losses'], rank['eager']['losses'], rtol=1e-5)
