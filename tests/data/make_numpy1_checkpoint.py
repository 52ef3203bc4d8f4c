"""Write ``numpy1_runner_epoch_2.pth``: a genuine mmengine checkpoint, numpy 1.x.

Run it in an environment with numpy 1.x (the repository's
``.venv-compat-2.4-numpy__1.26._``, made by ``dev/compat_check.sh``)::

    .venv-compat-2.4-numpy__1.26._/bin/python tests/data/make_numpy1_checkpoint.py

mmengine's own Runner trains mmengine's own ``ToyModel`` (from
``mmengine.testing``, the same class in every mmengine 0.10.7) for two
epochs, validating with a metric that returns a numpy scalar and keeping the
best checkpoint, as clusters with numpy 1.x wrote them: the message hub holds
``HistoryBuffer`` objects with numpy arrays and the best score as a numpy
scalar, all pickled as ``numpy.core.multiarray`` (numpy 2 writes
``numpy._core.multiarray``). The plugin is not imported: the writer is
upstream's. ``tests/test_compat.py`` loads the result under
numpy 2.x on every load path.
"""
import os.path as osp
import shutil
import sys
import tempfile

import numpy as np
import torch
from mmengine.config import Config
from mmengine.evaluator import BaseMetric
from mmengine.registry import DATASETS, METRICS, MODELS
from mmengine.runner import Runner
from mmengine.testing.runner_test_case import ToyDataset, ToyModel

OUT = osp.join(osp.dirname(osp.abspath(__file__)),
               'numpy1_runner_epoch_2.pth')


class NumpyScoreMetric(BaseMetric):
    """A validation metric returning a numpy scalar, as many metrics do."""

    default_prefix = 'toy'

    def process(self, data_batch, data_samples):
        outputs = torch.cat([torch.as_tensor(o) for o in data_samples])
        self.results.append(outputs.detach().numpy().astype(np.float64))

    def compute_metrics(self, results):
        return dict(score=np.float64(-np.abs(np.concatenate(results)).mean()))


def runner_config(work_dir: str) -> Config:
    """The training config: 2 epochs of 3 iterations, validated each epoch.

    Args:
        work_dir: Where the Runner writes.

    Returns:
        The config (registered names only, so ``meta.cfg`` is plain text).
    """
    loader = dict(dataset=dict(type='ToyDataset'), batch_size=4,
                  sampler=dict(type='DefaultSampler', shuffle=False),
                  num_workers=0)
    return Config(dict(
        model=dict(type='ToyModel'), work_dir=work_dir,
        experiment_name='numpy1_fixture', default_scope='mmengine',
        train_dataloader=loader, val_dataloader=loader,
        val_evaluator=dict(type='NumpyScoreMetric'),
        train_cfg=dict(by_epoch=True, max_epochs=2, val_interval=1),
        val_cfg=dict(),
        optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.01,
                                          momentum=0.9)),
        param_scheduler=dict(type='MultiStepLR', milestones=[1], gamma=0.5),
        default_hooks=dict(
            logger=dict(type='LoggerHook', interval=1),
            checkpoint=dict(type='CheckpointHook', interval=1,
                            save_best='toy/score', rule='greater')),
        randomness=dict(seed=0), log_level='WARNING'))


def main() -> None:
    if not np.__version__.startswith('1.'):
        sys.exit(f'numpy {np.__version__}: run this with numpy 1.x, see the '
                 'module docstring')
    MODELS.register_module(module=ToyModel, force=True)
    DATASETS.register_module(module=ToyDataset, force=True)
    METRICS.register_module(module=NumpyScoreMetric, force=True)
    work_dir = tempfile.mkdtemp(prefix='numpy1_fixture_')
    try:
        Runner.from_cfg(runner_config(work_dir)).train()
        shutil.copyfile(osp.join(work_dir, 'epoch_2.pth'), OUT)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(f'wrote {OUT} ({osp.getsize(OUT)} bytes) with numpy '
          f'{np.__version__}, torch {torch.__version__}')


if __name__ == '__main__':
    main()
