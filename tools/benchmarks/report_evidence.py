"""Rebuild the evidence sweep's report from its finished runs.

A thin CLI over :mod:`mmae_plugin.evidence.sweep_report`: the same as
``run_evidence.py --report-only`` with the same options (``--out-dir``,
``--report``, ``--quick``, ``--images``, ``--epochs``).

Example::

    python tools/benchmarks/report_evidence.py --out-dir work_dirs/evidence \\
        --report docs/results.md
"""
import os.path as osp
import sys

# This checkout's package first, whatever else is installed.
sys.path.insert(0, osp.dirname(osp.dirname(osp.dirname(osp.abspath(
    __file__)))))

from mmae_plugin.evidence.sweep import main  # noqa: E402

if __name__ == '__main__':
    main(['--report-only', *sys.argv[1:]])
