"""Run mmpretrain 1.2's own ``tools/train.py`` / ``tools/test.py``.

mmpretrain ships its command-line tools inside its package
(``mmpretrain/.mim/tools``). The plugin's scripts import ``mmae_plugin``
(registering its components and applying the upstream workarounds before
any runner exists) and then execute mmpretrain's script unchanged, so the
arguments, the order in which they are folded into the config
(``--cfg-options`` last), the dataloader defaults and ``runner_type``
(``FlexibleRunner`` for FSDP / DeepSpeed) are mmpretrain's by construction.
"""
import atexit
import os.path as osp
import runpy
import sys
from typing import Any, Dict

MMPRETRAIN_TOOLS = ('train.py', 'test.py')


def mmpretrain_tool_path(name: str) -> str:
    """Path of one of mmpretrain's shipped tools.

    Args:
        name: ``'train.py'`` or ``'test.py'``.

    Returns:
        The absolute path of the script inside the installed mmpretrain.
    """
    if name not in MMPRETRAIN_TOOLS:
        raise ValueError(f'name={name!r}: expected one of {MMPRETRAIN_TOOLS}')
    import mmpretrain
    path = osp.join(osp.dirname(mmpretrain.__file__), '.mim', 'tools', name)
    if not osp.isfile(path):
        raise FileNotFoundError(
            f'mmpretrain {mmpretrain.__version__} has no {path}: its tools '
            'are shipped in the package (mmpretrain/.mim/tools); reinstall '
            "mmpretrain with 'pip install --force-reinstall mmpretrain'.")
    return path


def load_mmpretrain_tool(name: str) -> Dict[str, Any]:
    """mmpretrain's script as a module namespace, without running it.

    Args:
        name: ``'train.py'`` or ``'test.py'``.

    Returns:
        The script's globals (``parse_args``, ``merge_args``, ``main``).
    """
    import mmae_plugin.registration  # noqa: F401  (registers components)
    return runpy.run_path(
        mmpretrain_tool_path(name), run_name='mmpretrain_tool')


def run_mmpretrain_tool(name: str) -> None:
    """Execute mmpretrain's script as ``__main__`` with this ``sys.argv``.

    Args:
        name: ``'train.py'`` or ``'test.py'``.
    """
    # Entered before anything of mmpretrain is imported: mmcv-lite's
    # MultiScaleDeformableAttention warning (on import of mmpretrain.models)
    # and the pkg_resources warning of mmengine's lookup of the configs'
    # mmpretrain:: bases, both harmless (mmae_plugin/compat/cli_warnings.py).
    # Imported while mmengine is not, so nothing is registered before it.
    from mmae_plugin.compat.cli_warnings import quiet_known_upstream_warnings
    from mmae_plugin.compat.pkg_resources_check import pkg_resources_problem
    from mmae_plugin.compat.process_group_exit import release_process_group
    try:
        with quiet_known_upstream_warnings():
            import mmae_plugin.registration  # noqa: F401  (registers)
            path = mmpretrain_tool_path(name)
            sys.argv[0] = path
            runpy.run_path(path, run_name='__main__')
        # At exit, not now: code running this tool may go on using the group.
        atexit.register(release_process_group)
    except ModuleNotFoundError as error:
        problem = pkg_resources_problem()
        if error.name != 'pkg_resources' or problem is None:
            raise
        # One clear line instead of mmengine's traceback.
        sys.exit(f'{name}: {problem}')
