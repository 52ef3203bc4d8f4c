"""One rank of a 2-process run that turns non-finite in epoch 2.

Run by ``tests/test_nonfinite_checkpoints.py`` under ``torch.distributed.run``
(gloo, CPU)::

    python -m torch.distributed.run --nproc_per_node 2 \
        tests/nonfinite_save_driver.py WORK_DIR {update,batch}

Epoch 1 trains normally and is saved. ``update``: from epoch 2 on the SGD
learning rate is Inf, so epoch 2's update makes the parameters Inf while
its loss is finite. ``batch``: rank 1 alone gets a NaN batch in the last
iteration of epoch 2 (its DivergenceHook stops it; rank 0's loss was
finite, and DDP's gradient average made its parameters NaN). Each rank
writes the error it stopped with to ``WORK_DIR/rank<r>.txt``.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from checkpoint_fault_tools import InfiniteUpdate  # noqa: E402
from checkpoint_fault_tools import make_toy_runner
from mmengine.hooks import Hook  # noqa: E402

import mmae_plugin.registration  # noqa: E402,F401
from mmae_plugin.engine.hooks import DivergenceHook  # noqa: E402
from mmae_plugin.engine.runners import MMAERunner  # noqa: E402


class NaNBatchOnRank1(Hook):
    """Rank 1's last batch of epoch 2 is NaN."""

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        last = batch_idx == len(runner.train_dataloader) - 1
        if runner.epoch == 1 and last and runner.rank == 1:
            for sample in data_batch['inputs']:
                sample.fill_(float('nan'))


def run(work_dir: str, mode: str) -> None:
    """Train the toy model on both ranks with the plugin's hook and runner."""
    # One iteration an epoch for 'update' (the save follows the update
    # directly), two for 'batch' (the NaN batch is the epoch's last).
    hooks, length = ([InfiniteUpdate(2)], 4) if mode == 'update' else \
        ([NaNBatchOnRank1(), DivergenceHook()], 8)
    make_toy_runner(
        work_dir,
        3,
        runner_class=MMAERunner,
        dataset_length=length,
        launcher='pytorch',
        env_cfg=dict(dist_cfg=dict(backend='gloo')),
        experiment_name='nonfinite',
        custom_hooks=hooks,
        default_hooks=dict(
            checkpoint=dict(type='SafeCheckpointHook', interval=1))).train()


def main() -> None:
    work_dir, mode = sys.argv[1:3]
    rank = os.environ['RANK']
    try:
        run(work_dir, mode)
        outcome = 'no error'
    except Exception as err:  # what each rank stops with
        outcome = f'{type(err).__name__}: {err}'
    with open(os.path.join(work_dir, f'rank{rank}.txt'), 'w') as file:
        file.write(outcome)
    # The outcome is written; what is left is torch's teardown of gloo,
    # which under load can abort ("terminate called without an active
    # exception": a gloo thread still joinable), even after
    # destroy_process_group(). It failed this test twice, so the rank
    # leaves without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == '__main__':
    main()
