"""Train the toy model one epoch on 2 gloo processes with the plugin's
runner and checkpoint hook (``tests/test_launch_record.py`` resumes it on
one process)::

    python -m torch.distributed.run --nproc_per_node 2 \
        tests/launch_change_driver.py WORK_DIR
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

import mmae_plugin  # noqa: E402,F401
from launch_record_runs import toy_launch  # noqa: E402

if __name__ == '__main__':
    toy_launch(sys.argv[1], max_epochs=1, launcher='pytorch',
               env_cfg=dict(dist_cfg=dict(backend='gloo'))).train()
