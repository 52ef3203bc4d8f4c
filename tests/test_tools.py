"""tools/train.py and tools/test.py are mmpretrain 1.2's own scripts.

Each command line runs through the plugin's script for real (a subprocess
training or testing a tiny model), and through mmpretrain's ``parse_args`` /
``merge_args`` in this process; the config the runner dumped into the work
dir must equal the config mmpretrain builds from the same arguments.
"""
import json
import os
import os.path as osp
import subprocess
import sys

import pytest
from mmengine.config import Config

TOOLS_DIR = osp.join(osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools')
sys.path.insert(0, TOOLS_DIR)
from _cli import load_mmpretrain_tool, mmpretrain_tool_path  # noqa: E402
from doc_snippets import doc_config  # noqa: E402

PRETRAIN = 'configs/fashion_mnist/mmae_fmnist.py'
LINEAR = 'configs/fashion_mnist/linear_fmnist.py'
TINY_TRAIN = [
    'train_dataloader.dataset.indices=32', 'train_dataloader.batch_size=16',
    'train_dataloader.num_workers=0',
    'train_dataloader.persistent_workers=False'
]


def run_tool(repo_root, script, argv):
    proc = subprocess.run([sys.executable, f'tools/{script}', *argv],
                          cwd=repo_root,
                          capture_output=True,
                          text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def mmpretrain_config(script, argv, monkeypatch):
    """The config mmpretrain's own script builds from ``argv``."""
    tool = load_mmpretrain_tool(script)
    monkeypatch.setattr(sys, 'argv', [script, *argv])
    args = tool['parse_args']()
    return tool['merge_args'](Config.fromfile(args.config), args)


def as_dumped(cfg, tmp_path):
    """``cfg`` after the dump / load round trip of the runner's copy."""
    path = tmp_path / f'expected_{osp.basename(cfg.filename)}'
    cfg.dump(str(path))
    return Config.fromfile(str(path)).to_dict()


def dumped_config(work_dir, config):
    return Config.fromfile(osp.join(work_dir, osp.basename(config))).to_dict()


@pytest.fixture(scope='module')
def pretrained(repo_root, tmp_path_factory):
    """A 1-epoch checkpoint from the plugin's train.py, trained with the
    TensorBoard config of docs/usage.md."""
    work_dir = tmp_path_factory.mktemp('pretrain')
    config = doc_config(repo_root, 'tensorboard-config', work_dir)
    run_tool(repo_root, 'train.py', [
        config, '--work-dir',
        str(work_dir), '--cfg-options', 'train_cfg.max_epochs=1', *TINY_TRAIN
    ])
    return work_dir / 'epoch_1.pth'


def test_documented_tensorboard_config_writes_event_files(pretrained):
    events = list(pretrained.parent.glob('*/vis_data/events.out.tfevents.*'))
    assert len(events) == 1 and events[0].stat().st_size > 0


def test_scripts_run_mmpretrains_shipped_tools():
    for name in ('train.py', 'test.py'):
        path = mmpretrain_tool_path(name)
        assert osp.isfile(path) and '.mim' in path
    with pytest.raises(ValueError, match="name='dist_train.sh'"):
        mmpretrain_tool_path('dist_train.sh')


def test_train_config_equals_mmpretrains_and_cfg_options_come_last(
        repo_root, pretrained, tmp_path, monkeypatch):
    work_dir = tmp_path / 'resumed'
    # mmpretrain folds --cfg-options in after --resume: load_from survives,
    # so the run resumes from that checkpoint (epoch 1) and trains epoch 2.
    argv = [
        PRETRAIN, '--work-dir',
        str(work_dir), '--resume', '--no-pin-memory', '--auto-scale-lr',
        '--cfg-options', f'load_from={pretrained}', 'train_cfg.max_epochs=2',
        *TINY_TRAIN
    ]
    proc = run_tool(repo_root, 'train.py', argv)
    ours = dumped_config(work_dir, PRETRAIN)
    theirs = as_dumped(
        mmpretrain_config('train.py', argv, monkeypatch), tmp_path)
    assert ours == theirs
    assert (ours['resume'], ours['load_from']) == (True, str(pretrained))
    loader = ours['train_dataloader']
    assert (loader['pin_memory'], loader['persistent_workers']) == (False,
                                                                    False)
    assert ours['auto_scale_lr'] == dict(base_batch_size=256, enable=True)
    assert 'resumed epoch: 1' in proc.stdout + proc.stderr
    assert sorted(p for p in os.listdir(work_dir)
                  if p.endswith('.pth')) == ['epoch_2.pth']


def test_test_config_equals_mmpretrains_with_tta(repo_root, pretrained,
                                                 tmp_path, monkeypatch):
    out = tmp_path / 'metrics.json'
    argv = [
        LINEAR,
        str(pretrained), '--work-dir',
        str(tmp_path), '--tta', '--out',
        str(out), '--out-item', 'metrics', '--cfg-options',
        'test_dataloader.dataset.indices=32', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False'
    ]
    run_tool(repo_root, 'test.py', argv)
    ours = dumped_config(tmp_path, LINEAR)
    theirs = as_dumped(
        mmpretrain_config('test.py', argv, monkeypatch), tmp_path)
    assert ours == theirs
    # mmpretrain's flip TTA wraps the classifier and its test pipeline.
    assert ours['model']['type'] == 'mmpretrain.AverageClsScoreTTA'
    assert ours['test_dataloader']['dataset']['pipeline'][-1]['type'] == (
        'TestTimeAug')
    assert ours['test_dataloader']['collate_fn'] == dict(
        type='default_collate')
    metrics = json.loads(out.read_text())
    assert 0 <= metrics['accuracy/top1'] <= 100
