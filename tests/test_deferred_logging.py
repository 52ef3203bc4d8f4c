"""DeferredRuntimeInfoHook logs the same numbers as mmengine's hook.

Real Runner runs of the shipped Fashion-MNIST M-MAE config (four logged
values per step) twice, once with mmengine's ``RuntimeInfoHook`` and once
with the plugin's ``DeferredRuntimeInfoHook``: ``scalars.json``, the log
lines and the message hub saved in the checkpoints must be the same. And
each step crosses to the host once, in one exact float64 table, whose
copy's wait blocks instead of spinning (issue 47).
"""
import glob
import json
import os
import re
import types

import pytest
import torch
from _helpers_gloo import run_gloo_ranks
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import Runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.hooks import DeferredRuntimeInfoHook
from mmae_plugin.engine.hooks import deferred_runtime_info_hook as deferred

#: Wall-clock keys: never equal between two runs.
CLOCK_KEYS = ('time', 'data_time', 'eta')


def tiny_mmae_run(repo_root,
                  work_dir,
                  runtime_info,
                  iters_per_epoch=7,
                  epochs=2,
                  log_interval=3,
                  extra_hooks=()):
    """The Fashion-MNIST M-MAE config on a few batches, trained."""
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs', 'fashion_mnist', 'mmae_fmnist.py'))
    cfg.merge_from_dict({
        'train_dataloader.dataset.indices': 4 * iters_per_epoch,
        'train_dataloader.batch_size': 4,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_cfg.max_epochs': epochs,
        'default_hooks.logger.interval': log_interval,
        'default_hooks.checkpoint.interval': 1,
        'default_hooks.checkpoint.max_keep_ckpts': -1,
        'default_hooks.runtime_info': dict(type=runtime_info),
    })
    cfg.work_dir = str(work_dir)
    runner = Runner.from_cfg(cfg)
    for hook in extra_hooks:
        runner.register_hook(hook)
    runner.train()
    return runner


def scalars(work_dir):
    """``scalars.json`` without the wall-clock keys."""
    (path, ) = glob.glob(
        os.path.join(str(work_dir), '*', 'vis_data', 'scalars.json'))
    rows = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            rows.append({
                k: v
                for k, v in row.items() if k not in CLOCK_KEYS
                and not k.endswith('/time') and not k.endswith('/data_time')
            })
    return rows


def logged_losses(work_dir):
    """The ``loss...: value`` and ``reg_skipped`` fields of each log line."""
    (path, ) = glob.glob(os.path.join(str(work_dir), '*', '*.log'))
    with open(path) as f:
        return [
            re.findall(r'(?:loss\w*|reg_skipped): \S+', line) for line in f
            if 'Epoch(train)' in line
        ]


def hub_scalars(checkpoint):
    state = torch.load(checkpoint, weights_only=True)['message_hub']
    return {
        key: buffer.data[0].tolist()
        for key, buffer in state['log_scalars'].items()
        if key.startswith('train/') and not key.endswith('time')
    }


@pytest.fixture(scope='module')
def both_runs(repo_root, tmp_path_factory):
    runs = {}
    for name in ('RuntimeInfoHook', 'DeferredRuntimeInfoHook'):
        work_dir = tmp_path_factory.mktemp(name)
        runner = tiny_mmae_run(repo_root, work_dir, name)
        runs[name] = (work_dir, runner)
    return runs


def test_the_config_selects_the_deferred_hook(both_runs):
    _, runner = both_runs['DeferredRuntimeInfoHook']
    assert [
        type(h) for h in runner.hooks if 'RuntimeInfo' in type(h).__name__
    ] == [DeferredRuntimeInfoHook]


def test_scalars_json_is_the_stock_hooks(both_runs):
    stock = scalars(both_runs['RuntimeInfoHook'][0])
    deferred = scalars(both_runs['DeferredRuntimeInfoHook'][0])
    # 7 iterations per epoch, a line every 3 (the epoch's last, 7 and 14,
    # ignored: LoggerHook's ignore_last)
    assert [row['step'] for row in stock] == [3, 6, 10, 13]
    assert {'loss', 'loss_rec', 'loss_tcr', 'reg_skipped', 'lr'} <= set(
        stock[0])
    assert deferred == stock


def test_log_lines_are_the_stock_hooks(both_runs):
    stock = logged_losses(both_runs['RuntimeInfoHook'][0])
    assert len(stock) == 4 and all(len(fields) == 4 for fields in stock)
    assert logged_losses(both_runs['DeferredRuntimeInfoHook'][0]) == stock


@pytest.mark.parametrize('epoch', [1, 2])
def test_checkpointed_message_hub_is_the_stock_hooks(both_runs, epoch):
    """The hub a checkpoint saves holds every step up to the save."""
    stock, deferred = (
        hub_scalars(both_runs[name][0] / f'epoch_{epoch}.pth')
        for name in ('RuntimeInfoHook', 'DeferredRuntimeInfoHook'))
    assert len(stock['train/loss']) == 7 * epoch
    assert deferred == stock


class HubLength(Hook):
    """How many ``train/loss`` values the hub holds after each step's
    ``RuntimeInfoHook`` (recorded right after it)."""

    priority = 'VERY_HIGH'

    def __init__(self):
        self.lengths = []

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        buffer = runner.message_hub.log_scalars.get('train/loss')
        self.lengths.append(0 if buffer is None else len(buffer.data[0]))


def test_values_are_read_one_step_late_except_where_the_log_needs_them(
        repo_root, tmp_path):
    """Between two log lines the hub holds the previous step's values (the
    host never read the step just queued); at a log line and at the
    epoch's end it holds the step's own."""
    lengths = HubLength()
    tiny_mmae_run(
        repo_root,
        tmp_path,
        'DeferredRuntimeInfoHook',
        iters_per_epoch=7,
        epochs=1,
        log_interval=3,
        extra_hooks=[lengths])
    # iterations 1..7: settled at once at 3, 6 (log lines) and 7 (epoch end)
    assert lengths.lengths == [0, 1, 3, 3, 4, 6, 7]


def test_any_checkpoint_hook_saves_every_step_up_to_the_save(
        repo_root, tmp_path):
    """mmengine's own CheckpointHook, saving every 2 iterations between log
    lines (every 3): each checkpoint's message hub holds every step up to
    it (DeferredRuntimeInfoHook settles in before_save_checkpoint)."""
    cfg_checkpoint = dict(type='CheckpointHook', by_epoch=False, interval=2)
    cfg = Config.fromfile(
        os.path.join(repo_root, 'configs', 'fashion_mnist', 'mmae_fmnist.py'))
    cfg.merge_from_dict({
        'train_dataloader.dataset.indices': 4 * 5,
        'train_dataloader.batch_size': 4,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_cfg.max_epochs': 1,
        'default_hooks.logger.interval': 3,
    })
    cfg.default_hooks.checkpoint = cfg_checkpoint
    cfg.work_dir = str(tmp_path)
    Runner.from_cfg(cfg).train()
    for iteration in (2, 4):
        hub = hub_scalars(tmp_path / f'iter_{iteration}.pth')
        assert len(hub['train/loss']) == iteration
        assert len(hub['train/loss_tcr']) == iteration


# ------------------------------------------------ one copy per step (47)
class CopyCounter(Hook):
    """Calls of ``copy_to_host`` per training step (read after each)."""

    priority = 'LOWEST'

    def __init__(self, monkeypatch) -> None:
        self.calls, self.per_step = 0, []
        original = deferred.copy_to_host

        def counted(tensor):
            self.calls += 1
            return original(tensor)

        monkeypatch.setattr(deferred, 'copy_to_host', counted)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.per_step.append(self.calls)
        self.calls = 0


def test_each_step_crosses_to_the_host_once(repo_root, tmp_path, monkeypatch):
    """M-MAE's four logged values and DivergenceHook's every-rank table
    are one copy per step (they were 4 + 4: each value, then each column
    of the table); the log is the stock hook's (tests above)."""
    counter = CopyCounter(monkeypatch)
    runner = tiny_mmae_run(
        repo_root,
        tmp_path,
        'DeferredRuntimeInfoHook',
        iters_per_epoch=4,
        epochs=1,
        extra_hooks=[counter])
    assert 'DivergenceHook' in [type(h).__name__ for h in runner.hooks]
    assert counter.per_step == [1] * 4


class FakeStream:
    pass


def test_copies_done_event_blocks_instead_of_spinning(monkeypatch):
    """The wait for a step's copy sleeps (``torch.cuda.Event(blocking=
    True)``, recorded on the tensor's current stream). CPU stand-ins for
    CUDA: no GPU here."""
    made = []

    class Event:

        def __init__(self, **kwargs):
            self.kwargs, self.stream = kwargs, None
            made.append(self)

        def record(self, stream):
            self.stream = stream

    stream = FakeStream()
    monkeypatch.setattr(torch.cuda, 'Event', Event)
    monkeypatch.setattr(torch.cuda, 'current_stream', lambda device: stream)
    on_gpu = types.SimpleNamespace(device=torch.device('cuda', 0))
    event = deferred.copies_done_event([torch.zeros(1), on_gpu])
    assert made == [event] and event.kwargs == dict(blocking=True)
    assert event.stream is stream
    assert deferred.copies_done_event([torch.zeros(1)]) is None


# Exact values: the signed zero and non-finite ones a sum could change.
STEP_VALUES = {
    'loss': [float('nan'), 1.5],
    'loss_rec': [-0.0, float('inf')],
    'reg_skipped': [0.0, -0.0],
}


def _every_rank_table(rank: int, world: int) -> dict:
    outputs = {
        key: torch.tensor(values[rank], dtype=torch.float32)
        for key, values in STEP_VALUES.items()
    }
    outputs['count'] = torch.tensor(7)  # an integer: not in the table
    table = deferred.value_table(outputs, every_rank=True)
    own = table.own_values()
    return dict(
        keys=table.keys,
        columns={k: [repr(v) for v in c]
                 for k, c in table.columns().items()},
        own={k: repr(v)
             for k, v in own.items()},
        item={k: repr(v.item())
              for k, v in outputs.items() if k in own})


def test_every_rank_table_is_exact_on_two_gloo_ranks(tmp_path):
    """Each rank's row reads back its own values bit for bit (``repr``:
    signed zeros, NaN and infinities), as ``.item()`` gives them, and
    every rank sees every rank's values."""
    for rank, result in enumerate(
            run_gloo_ranks(_every_rank_table, 2, str(tmp_path))):
        assert result['keys'] == list(STEP_VALUES)
        assert result['columns'] == {
            k: [repr(v) for v in values]
            for k, values in STEP_VALUES.items()
        }
        assert result['own'] == result['item'] == {
            k: repr(values[rank])
            for k, values in STEP_VALUES.items()
        }
