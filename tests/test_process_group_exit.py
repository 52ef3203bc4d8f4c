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
