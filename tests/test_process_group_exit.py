"""``release_process_group``: the tools' process group ends before the
interpreter does (docs/upstream_workarounds.md)."""
import torch.distributed as dist

from mmae_plugin.compat.process_group_exit import release_process_group


def test_release_destroys_the_default_group(tmp_path):
    dist.init_process_group(
        'gloo',
        init_method=f'file://{tmp_path / "store"}',
        rank=0,
        world_size=1)
    try:
        assert dist.is_initialized()
        release_process_group()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_release_without_a_group_does_nothing():
    assert not dist.is_initialized()
    release_process_group()
    assert not dist.is_initialized()


def test_the_tools_release_their_group_at_exit_not_before(tmp_path):
    """tools/_cli.py runs a stand-in for mmpretrain's script that starts a
    group; code after the tool still has it, and at exit it is gone (the
    stand-in's own exit handler, registered before the tool's, runs
    after it)."""
    import subprocess
    import sys

    from conftest import REPO_ROOT
    script = tmp_path / 'tool.py'
    script.write_text(
        'import atexit\n'
        'import torch.distributed as dist\n'
        f"dist.init_process_group('gloo', init_method="
        f"'file://{tmp_path / 'store'}', rank=0, world_size=1)\n"
        "atexit.register(lambda: print('at exit:', dist.is_initialized()))\n")
    code = ('import sys\n'
            f"sys.path.insert(0, {str(REPO_ROOT) + '/tools'!r})\n"
            'import _cli\n'
            f'_cli.mmpretrain_tool_path = lambda name: {str(script)!r}\n'
            "_cli.run_mmpretrain_tool('train.py')\n"
            'import torch.distributed as dist\n'
            "print('after the tool:', dist.is_initialized())\n")
    proc = subprocess.run([sys.executable, '-c', code],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-2:] == [
        'after the tool: True', 'at exit: False'
    ], proc.stdout
