"""One rank of a 2-process check of what FSDP does to forwards that write
their own parameters, and to a CLIP teacher (why ``MMAEFSDPStrategy``
refuses CAE, BEiT v2, SwAV, the momentum-network algorithms and CLIP
teachers).

Run by ``tests/test_fsdp_strategy.py`` under ``torch.distributed.run``
(gloo, CPU)::

    python -m torch.distributed.run --nproc_per_node 2 \
        tests/fsdp_param_writes_driver.py IMAGES OUT_DIR

mmpretrain's CAE, BEiT v2, SwAV, MoCo v2 and MILAN configs, shrunk (as in
``test_hook_all_ssl_algorithms.py``, MILAN with its tiny random CLIP), are
trained two steps at learning rate 0 on one batch, bare and wrapped in
torch's FSDP as mmengine wraps it (``use_orig_params=True``). CAE's
student is moved off its teacher first, so its momentum step (momentum 0:
the teacher becomes the student) shows.
Each rank writes ``OUT_DIR/rank<r>.json``: per algorithm and wrapping, the
state-dict keys that changed, or the error wrapping or the step raised.
"""
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
torch.set_num_threads(1)

from mmengine.dataset import Compose, default_collate  # noqa: E402
from mmengine.model import revert_sync_batchnorm  # noqa: E402
from mmengine.registry import init_default_scope  # noqa: E402
from mmengine.runner import set_random_seed  # noqa: E402
from mmpretrain.registry import MODELS  # noqa: E402
from test_hook_all_ssl_algorithms import save_tiny_clip  # noqa: E402
from test_hook_all_ssl_algorithms import shrunk_config  # noqa: E402
from test_hook_all_ssl_algorithms import BATCH, CASES  # noqa: E402
from torch.distributed.fsdp import FullyShardedDataParallel  # noqa: E402

import mmae_plugin.registration  # noqa: E402,F401


def built(cfg):
    """The algorithm, seeded, on CPU BatchNorm; a CAE student moved off
    its teacher."""
    set_random_seed(0)
    model = revert_sync_batchnorm(MODELS.build(cfg.model))
    model.init_weights()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith('teacher.'):
                param.add_(torch.randn_like(param), alpha=0.01)
    return model


def a_batch(cfg, model, images):
    """BATCH images through the config's pipeline, seeded."""
    set_random_seed(1)
    pipeline = Compose(cfg.train_dataloader.dataset.pipeline)
    files = sorted(os.listdir(images))[:BATCH]
    samples = [pipeline(dict(img_path=os.path.join(images, f))) for f in files]
    return model.data_preprocessor(default_collate(samples), True)


def changed_by_two_steps(cfg, images, wrap):
    """The state-dict keys two steps at lr 0 change, or the error."""
    model = built(cfg)
    data = a_batch(cfg, model, images)
    try:
        if wrap:
            model = FullyShardedDataParallel(
                model, use_orig_params=True, device_id=torch.device('cpu'))
        before = {k: v.clone() for k, v in model.state_dict().items()}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        for _ in range(2):
            losses = model(**data, mode='loss')
            sum(v for v in losses.values() if v.requires_grad).backward()
            optimizer.step()
            optimizer.zero_grad()
    except (RuntimeError, ValueError) as err:  # ValueError: FSDP's wrapping
        return dict(error=str(err))
    after = model.state_dict()
    return dict(
        changed=[k for k in before if not torch.equal(before[k], after[k])])


def main():
    images, out_dir = sys.argv[1:3]
    dist.init_process_group('gloo')
    init_default_scope('mmpretrain')
    outcome = {}
    clip = save_tiny_clip(
        os.path.join(out_dir, f'tiny_clip_rank{dist.get_rank()}.pth'))
    for name in ('cae', 'beitv2', 'swav', 'mocov2', 'milan'):
        cfg = shrunk_config(CASES[name], out_dir, images, clip)
        for wrap in (False, True):
            outcome[f'{name}/{"fsdp" if wrap else "bare"}'] = \
                changed_by_two_steps(cfg, images, wrap)
    with open(os.path.join(out_dir, f'rank{dist.get_rank()}.json'), 'w') as f:
        json.dump(outcome, f)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
