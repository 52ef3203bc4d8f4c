"""Train a model: mmpretrain 1.2's ``tools/train.py`` with the plugin loaded.

Same arguments as mmpretrain's (``python tools/train.py -h``); see
``tools/_cli.py`` for how the script is run.
"""
from _cli import run_mmpretrain_tool

if __name__ == '__main__':
    run_mmpretrain_tool('train.py')
