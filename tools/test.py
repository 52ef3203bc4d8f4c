"""Evaluate a checkpoint: mmpretrain 1.2's ``tools/test.py`` with the plugin
loaded.

Same arguments as mmpretrain's (``python tools/test.py -h``), including
``--amp``, ``--tta``, ``--show-dir``; see ``tools/_cli.py``.
"""
from _cli import run_mmpretrain_tool

if __name__ == '__main__':
    run_mmpretrain_tool('test.py')
