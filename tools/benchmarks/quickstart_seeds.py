"""The quick start over seeds: M-MAE against MAE at its budget.

A thin CLI over :mod:`mmae_plugin.evidence.quickstart_seeds`: runs
``tools/quickstart.sh`` for MAE and M-MAE per seed (resumable), then prints
mean, std and the paired difference M-MAE - MAE with its 95 % t-interval
("n=1, no interval" for one seed).

Example::

    python tools/benchmarks/quickstart_seeds.py --seeds 0 1 2 \\
        --out work_dirs/quickstart_seeds/summary.json
"""
import os.path as osp
import sys

# This checkout's package first, whatever else is installed.
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from mmae_plugin.evidence.quickstart_seeds import main  # noqa: E402

if __name__ == '__main__':
    main()
