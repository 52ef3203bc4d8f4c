"""What the regulariser buys: MAE, U-MAE and M-MAE at equal budget, with seeds.

A thin CLI over :mod:`mmae_plugin.evidence.sweep` (see its docstring for
the sweep, its resumability and its outputs). The report goes to
``<out-dir>/report/results.md`` unless ``--report`` names another path.

Examples::

    python tools/benchmarks/run_evidence.py                  # the full sweep
    python tools/benchmarks/run_evidence.py --quick --out-dir /tmp/ev
    python tools/benchmarks/run_evidence.py --report-only \\
        --report docs/results.md                             # re-analyse
    python tools/benchmarks/run_evidence.py --export-zoo     # model zoo
"""
import os.path as osp
import sys

# This checkout's package first, whatever else is installed.
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from mmae_plugin.evidence.sweep import main  # noqa: E402

if __name__ == '__main__':
    main()
