"""Which of mmpretrain's SSL algorithms train under FSDP (one rank of 2).

Each algorithm's shipped config, shrunk as in
``tests/test_hook_all_ssl_algorithms.py``, trains two steps at learning
rate 0 on one batch, bare and wrapped in torch's FSDP
(``tests/fsdp_param_writes_driver.py``'s functions); rank 0 prints, per
algorithm, the error FSDP's step raised or whether the two runs changed the
same state-dict keys. The findings are in docs/upstream_workarounds.md
("CAE, SwAV and momentum networks refused")::

    python -m torch.distributed.run --nproc_per_node 2 \\
        dev/fsdp_algorithm_sweep.py IMAGES [NAME ...]

IMAGES: a folder of RGB images (8 of 64 x 64 are enough). Algorithms whose
targets come from CLIP get a randomly initialised tiny one
(``save_tiny_clip`` of the test).
"""
import os
import sys
import tempfile

import torch.distributed as dist

TESTS = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'tests')
sys.path.insert(0, TESTS)

from fsdp_param_writes_driver import changed_by_two_steps  # noqa: E402
from mmengine.logging import MessageHub  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from test_hook_all_ssl_algorithms import CASES  # noqa: E402
from test_hook_all_ssl_algorithms import save_tiny_clip  # noqa: E402
from test_hook_all_ssl_algorithms import shrunk_config  # noqa: E402


def verdict(bare: dict, fsdp: dict) -> str:
    """One line comparing the bare and the FSDP steps."""
    if 'error' in fsdp:
        return 'fails under FSDP: ' + fsdp['error'][:100]
    if 'error' in bare:
        return 'fails bare: ' + bare['error'][:100]
    bare_keys, fsdp_keys = set(bare['changed']), set(fsdp['changed'])
    if bare_keys == fsdp_keys:
        return f'trains alike ({len(bare_keys)} keys changed)'
    return (f'differs: changed only bare {sorted(bare_keys - fsdp_keys)}, '
            f'only under FSDP {sorted(fsdp_keys - bare_keys)}')[:300]


def main() -> None:
    images, names = sys.argv[1], sys.argv[2:] or list(CASES)
    dist.init_process_group('gloo')
    init_default_scope('mmpretrain')
    # BYOL's cosine momentum reads the schedule's length from the hub.
    MessageHub.get_current_instance().update_info('max_iters', 10)
    with tempfile.TemporaryDirectory() as scratch:
        # Each rank writes its own copy: no file is shared between ranks.
        clip = save_tiny_clip(os.path.join(scratch, 'tiny_clip.pth'))
        for name in names:
            cfg = shrunk_config(CASES[name], scratch, images, clip)
            bare = changed_by_two_steps(cfg, images, False)
            fsdp = changed_by_two_steps(cfg, images, True)
            if dist.get_rank() == 0:
                print(f'{name}: {verdict(bare, fsdp)}', flush=True)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
