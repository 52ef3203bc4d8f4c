"""Train the toy model on 2 gloo processes with the plugin's runner and
checkpoint hook (``tests/test_launch_record.py`` resumes it on one
process; ``tests/test_run_record.py`` resumes it on two)::

    python -m torch.distributed.run --nproc_per_node 2 \
        tests/launch_change_driver.py WORK_DIR [MAX_EPOCHS [--resume]]

Each rank prints the iteration it starts at.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from launch_record_runs import toy_launch  # noqa: E402
from mmengine.dist import get_rank  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402

import mmae_plugin.registration  # noqa: E402,F401
from mmae_plugin.compat.process_group_exit import \
    release_process_group  # noqa: E402


class PrintStart(Hook):
    """``rank R starts at iteration I`` on stdout."""

    priority = 'LOWEST'

    def before_train(self, runner):
        print(
            f'rank {get_rank()} starts at iteration {runner.iter}', flush=True)


if __name__ == '__main__':
    max_epochs = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    toy_launch(
        sys.argv[1],
        max_epochs=max_epochs,
        launcher='pytorch',
        resume='--resume' in sys.argv,
        custom_hooks=[PrintStart()],
        env_cfg=dict(dist_cfg=dict(backend='gloo'))).train()
    release_process_group()  # as tools/train.py ends
