"""One rank of a 2-process run whose update makes the parameters infinite.

Run by ``tests/test_nonfinite_checkpoints.py`` under ``torch.distributed.run``
(gloo, CPU)::

    python -m torch.distributed.run --nproc_per_node 2 \
        tests/nonfinite_save_driver.py WORK_DIR

Epoch 1 trains normally and is saved; from epoch 2 on the SGD learning
rate is Inf, so epoch 2's update makes the parameters Inf while its loss is
finite. Each rank writes the error it
stopped with to ``WORK_DIR/rank<r>.txt``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

import mmae_plugin  # noqa: E402,F401
from checkpoint_fault_tools import (InfiniteUpdate,  # noqa: E402
                                    make_toy_runner)
from mmae_plugin.engine.runners import MMAERunner  # noqa: E402


def run(work_dir: str) -> None:
    """Train the toy model on both ranks with the plugin's hook and runner."""
    make_toy_runner(
        work_dir, 3, runner_class=MMAERunner, dataset_length=4,
        launcher='pytorch', env_cfg=dict(dist_cfg=dict(backend='gloo')),
        experiment_name='nonfinite', custom_hooks=[InfiniteUpdate(2)],
        default_hooks=dict(checkpoint=dict(type='SafeCheckpointHook',
                                           interval=1))).train()


def main() -> None:
    work_dir = sys.argv[1]
    rank = os.environ['RANK']
    try:
        run(work_dir)
        outcome = 'no error'
    except Exception as err:  # what each rank stops with
        outcome = f'{type(err).__name__}: {err}'
    with open(os.path.join(work_dir, f'rank{rank}.txt'), 'w') as file:
        file.write(outcome)


if __name__ == '__main__':
    main()
