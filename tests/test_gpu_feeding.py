"""The ImageNet recipes are sized to feed a GPU: every loader pins its
batches and fits the launch scripts' CPUs, the training loaders keep their
workers, and the preprocessors copy without blocking and swap BGR/RGB on
the device while giving mmpretrain's output bit for bit."""
import glob
import os.path as osp
import re
from typing import Dict, Iterator, List, Tuple

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmpretrain.models.utils import (ClsDataPreprocessor,
                                     SelfSupDataPreprocessor)
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample
from torch.utils._python_dispatch import TorchDispatchMode

from mmae_plugin.models.data_preprocessors import (
    BatchFlipDataPreprocessor, NonBlockingClsDataPreprocessor,
    NonBlockingSelfSupDataPreprocessor, bgr_rgb_swap)

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: The ImageNet recipes: every configs/*vit*.py (their bases are mmpretrain's
#: or one of these).
VIT_CONFIGS = sorted(
    osp.basename(p) for p in glob.glob(osp.join(REPO, 'configs', '*vit*.py')))
NON_BLOCKING = {
    'NonBlockingSelfSupDataPreprocessor', 'NonBlockingClsDataPreprocessor'
}
MEAN, STD = [123.675, 116.28, 103.53], [58.395, 57.12, 57.375]


def default_cpus_per_task(script: str) -> int:
    """``CPUS_PER_TASK``'s default in a launch script of tools/."""
    text = open(osp.join(REPO, 'tools', script)).read()
    found = re.findall(
        r'^CPUS_PER_TASK=\$\{CPUS_PER_TASK:-(\d+)\}$', text, flags=re.M)
    assert len(found) == 1, f'{script}: no single CPUS_PER_TASK default'
    return int(found[0])


def loaders_of(cfg: Config) -> Iterator[Tuple[str, dict]]:
    """Every dataloader config a recipe builds (kNN's prototype one too)."""
    for name in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        if cfg.get(name) is not None:
            yield name, cfg.get(name)
    prototype = cfg.model.get('prototype')
    if isinstance(prototype, dict) and 'dataset' in prototype:
        yield 'model.prototype', prototype


def preprocessor_of(cfg: Config) -> dict:
    """The preprocessor config the Runner gives the model."""
    return cfg.model.get('data_preprocessor') or cfg.get('data_preprocessor')


def test_the_imagenet_recipes_are_found():
    assert {'mae_vit-base_200e.py', 'mmae_vit-base_200e.py',
            'mmae_vit-large_200e_fsdp.py', 'linear_vit-base_90e.py',
            'finetune_vit-large_100e.py', 'knn_vit-base.py'} <= \
        set(VIT_CONFIGS)


def test_launch_scripts_give_each_task_the_recipes_workers_plus_one():
    assert default_cpus_per_task('slurm_train.sh') == 9
    assert default_cpus_per_task('slurm_test.sh') == 9


@pytest.mark.parametrize('name', VIT_CONFIGS)
def test_recipe_loaders_pin_memory_and_fit_the_launch_script(name):
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    cpus = default_cpus_per_task('slurm_train.sh')
    loaders = dict(loaders_of(cfg))
    assert loaders, name
    for loader_name, loader in loaders.items():
        where = f'{name}: {loader_name}'
        assert loader.get('pin_memory') is True, where
        assert 1 <= loader['num_workers'] <= cpus - 1, where
        if loader_name == 'train_dataloader':
            assert loader.get('persistent_workers') is True, where


@pytest.mark.parametrize('name', VIT_CONFIGS)
def test_recipe_preprocessor_copies_without_blocking(name):
    cfg = Config.fromfile(osp.join(REPO, 'configs', name))
    spec = preprocessor_of(cfg)
    assert spec['type'] in NON_BLOCKING, (name, spec)
    # mmpretrain's own settings are kept (normalisation, BGR -> RGB).
    assert list(spec['mean']) == MEAN and list(spec['std']) == STD
    assert spec['to_rgb'] is True
    preprocessor = MODELS.build(spec)
    assert preprocessor._non_blocking is True


# ------------------------------------------------------- bit-for-bit output
def random_batch(batch: int = 4,
                 channels: int = 3,
                 height: int = 12,
                 width: int = 10,
                 seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(
        0,
        256, (batch, channels, height, width),
        generator=generator,
        dtype=torch.uint8)


def labelled_samples(count: int, num_classes: int = 5) -> List[DataSample]:
    return [
        DataSample().set_gt_label(index % num_classes)
        for index in range(count)
    ]


def assert_same_tensor(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize('settings', [
    dict(mean=MEAN, std=STD, to_rgb=True),
    dict(mean=MEAN, std=STD, bgr_to_rgb=True),
    dict(mean=MEAN, std=STD),
    dict(to_rgb=True),
    dict(),
])
@pytest.mark.parametrize('training', [False, True])
def test_selfsup_preprocessor_equals_mmpretrains_bit_for_bit(
        settings, training):
    images = random_batch()
    ours = NonBlockingSelfSupDataPreprocessor(**settings)
    theirs = SelfSupDataPreprocessor(**settings)
    got = ours(dict(inputs=images, data_samples=[]), training)
    want = theirs(dict(inputs=images.clone(), data_samples=[]), training)
    assert_same_tensor(got['inputs'], want['inputs'])
    assert got['data_samples'] == want['data_samples'] == []


def test_selfsup_preprocessor_equals_mmpretrains_on_views():
    """A list of views (B, C, H, W) each, as SimCLR-style pipelines give."""
    views = [random_batch(seed=1), random_batch(seed=2)]
    samples = [DataSample() for _ in range(4)]
    settings = dict(mean=MEAN, std=STD, to_rgb=True)
    got = NonBlockingSelfSupDataPreprocessor(**settings)(
        dict(inputs=views, data_samples=samples))
    want = SelfSupDataPreprocessor(**settings)(
        dict(inputs=[v.clone() for v in views], data_samples=samples))
    assert len(got['inputs']) == 2
    for ours, theirs in zip(got['inputs'], want['inputs']):
        assert_same_tensor(ours, theirs)
    assert len(got['data_samples']) == 4


@pytest.mark.parametrize('settings', [
    dict(mean=MEAN, std=STD, to_rgb=True, num_classes=5),
    dict(mean=MEAN, std=STD, to_rgb=True, pad_size_divisor=8),
    dict(to_rgb=False),
])
def test_cls_preprocessor_equals_mmpretrains_bit_for_bit(settings):
    images = random_batch(batch=6)
    got = NonBlockingClsDataPreprocessor(**settings)(dict(
        inputs=images, data_samples=labelled_samples(6)), True)
    want = ClsDataPreprocessor(**settings)(dict(
        inputs=images.clone(), data_samples=labelled_samples(6)), True)
    assert_same_tensor(got['inputs'], want['inputs'])
    for ours, theirs in zip(got['data_samples'], want['data_samples']):
        assert torch.equal(ours.gt_label, theirs.gt_label)


def test_cls_preprocessor_with_mixup_cutmix_equals_mmpretrains():
    """The fine-tuning recipe's batch augmentations, same random draws."""
    settings = dict(
        mean=MEAN,
        std=STD,
        to_rgb=True,
        num_classes=5,
        batch_augments=dict(augments=[
            dict(type='Mixup', alpha=0.8),
            dict(type='CutMix', alpha=1.0)
        ]))
    images = random_batch(batch=6, height=16, width=16)
    outputs = []
    for cls in (NonBlockingClsDataPreprocessor, ClsDataPreprocessor):
        torch.manual_seed(3)
        np.random.seed(3)
        outputs.append(
            cls(**settings)(dict(
                inputs=images.clone(), data_samples=labelled_samples(6)),
                            True))
    got, want = outputs
    assert_same_tensor(got['inputs'], want['inputs'])
    for ours, theirs in zip(got['data_samples'], want['data_samples']):
        assert torch.equal(ours.gt_score, theirs.gt_score)


def test_batch_flip_preprocessor_still_equals_mmpretrains():
    """BatchFlipDataPreprocessor normalises through the same class."""
    images = random_batch()
    settings = dict(mean=MEAN, std=STD, to_rgb=True)
    got = BatchFlipDataPreprocessor(
        flip_prob=0.0, **settings)(dict(inputs=images, data_samples=[]), True)
    want = SelfSupDataPreprocessor(**settings)(dict(
        inputs=images.clone(), data_samples=[]), True)
    assert_same_tensor(got['inputs'], want['inputs'])
    assert BatchFlipDataPreprocessor()._non_blocking is True


def test_non_blocking_is_the_default_and_can_be_turned_off():
    assert NonBlockingSelfSupDataPreprocessor()._non_blocking is True
    assert NonBlockingClsDataPreprocessor()._non_blocking is True
    assert NonBlockingSelfSupDataPreprocessor(
        non_blocking=False)._non_blocking is False
    assert NonBlockingClsDataPreprocessor(
        non_blocking=False)._non_blocking is False


def test_pretraining_leaves_the_data_samples_where_they_are():
    """MAE-family and siamese losses never read the data samples: by
    default none is moved (the same objects come back); on request each
    is moved as mmpretrain moves it (a new one, labels kept)."""
    samples = [DataSample().set_gt_label(i) for i in range(4)]
    for cls in (NonBlockingSelfSupDataPreprocessor, BatchFlipDataPreprocessor):
        got = cls()(dict(inputs=random_batch(), data_samples=samples), True)
        assert all(a is b for a, b in zip(got['data_samples'], samples))
    moved = NonBlockingSelfSupDataPreprocessor(move_data_samples=True)(dict(
        inputs=random_batch(), data_samples=samples))['data_samples']
    assert all(a is not b for a, b in zip(moved, samples))
    assert [int(s.gt_label) for s in moved] == [0, 1, 2, 3]


def test_channel_swap_needs_three_channels():
    with pytest.raises(ValueError, match='3-channel'):
        bgr_rgb_swap(random_batch(channels=1))
    with pytest.raises(ValueError, match='to_rgb=False'):
        NonBlockingSelfSupDataPreprocessor(to_rgb=True)(
            dict(inputs=random_batch(channels=4), data_samples=[]))


def test_pseudo_collate_is_refused_as_mmpretrain_refuses_it():
    with pytest.raises(TypeError, match='default_collate'):
        NonBlockingSelfSupDataPreprocessor()([random_batch()])


# --------------------------------------------------- what reaches the device
class OpLog(TorchDispatchMode):
    """Every aten op dispatched, with its arguments' devices and kwargs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: List[Tuple[str, Dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops.append(
            (str(func.overloadpacket.__name__),
             dict(kwargs, devices=[str(a.device) for a in _tensors(args)])))
        return func(*args, **kwargs)


def _tensors(values) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from _tensors(value)


def test_channel_swap_is_a_flip_not_a_host_index():
    """mmpretrain indexes with a list (an index tensor built on the host,
    copied to the GPU every step); the plugin flips on the device."""
    images = random_batch()
    settings = dict(mean=MEAN, std=STD, to_rgb=True)
    ours, theirs = OpLog(), OpLog()
    with ours:
        NonBlockingSelfSupDataPreprocessor(**settings)(
            dict(inputs=images, data_samples=[]))
    with theirs:
        SelfSupDataPreprocessor(**settings)(
            dict(inputs=images, data_samples=[]))
    names = [name for name, _ in ours.ops]
    assert 'index' in [name for name, _ in theirs.ops]
    assert 'index' not in names and names.count('flip') == 1


class BlockingCopies(TorchDispatchMode):
    """Counts the copies that make the host wait for the device.

    An explicit copy between devices with ``non_blocking=False``
    (``Tensor.to``), and an op given a host tensor (more than a scalar)
    with device tensors, which torch copies to the device first with a
    blocking copy (indexing a GPU batch with a CPU permutation). The
    preprocessors run on the ``meta`` device as the accelerator: on a CPU
    every ``.to('cpu')`` is free and invisible, on ``meta`` every copy
    from the host is dispatched and seen.
    """

    def __init__(self) -> None:
        super().__init__()
        self.copies: List[Tuple[str, Tuple[int, ...]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        tensors = list(_tensors(args))
        if name == '_to_copy':
            target = kwargs.get('device', tensors[0].device)
            if tensors[0].device != target and not kwargs.get(
                    'non_blocking', False):
                self.copies.append((name, tuple(tensors[0].shape)))
        elif any(t.device.type != 'cpu' for t in tensors):
            self.copies.extend((name, tuple(t.shape)) for t in tensors
                               if t.device.type == 'cpu' and t.dim() > 0)
        return func(*args, **kwargs)


MIXUP_CUTMIX = dict(
    augments=[dict(type='Mixup', alpha=0.8),
              dict(type='CutMix', alpha=1.0)])


def blocking_copies(preprocessor, data: dict, training: bool) -> list:
    """The blocking copies of one batch through ``preprocessor`` on the
    ``meta`` device."""
    preprocessor.to('meta')
    counter = BlockingCopies()
    torch.manual_seed(0)
    np.random.seed(0)
    with counter:
        out = preprocessor(data, training)
    assert out['inputs'].device.type == 'meta'
    return counter.copies


def test_blocking_copy_counter_sees_mmpretrain_s_label_and_index_copies():
    """The counter can fail: mmpretrain's path (the image copy made
    non-blocking, as this plugin's class did before) copies the labels
    with a blocking ``.to`` and indexes the batch with a CPU permutation
    under Mixup (0 then 1 of them per batch: which augment is drawn)."""
    settings = dict(
        mean=MEAN,
        std=STD,
        to_rgb=True,
        num_classes=5,
        batch_augments=MIXUP_CUTMIX)
    found = set()
    for seed in range(4):
        old = ClsDataPreprocessor(**settings)
        old._non_blocking = True
        np.random.seed(seed)
        copies = blocking_copies(
            old,
            dict(
                inputs=random_batch(batch=6, height=16, width=16),
                data_samples=labelled_samples(6)), True)
        assert ('_to_copy', (6, )) in copies, copies
        found.update(name for name, _ in copies)
    assert found - {'_to_copy'}, found  # the permutation's implicit copy


@pytest.mark.parametrize('training', [False, True])
@pytest.mark.parametrize('augments', [None, MIXUP_CUTMIX])
def test_cls_preprocessor_makes_no_blocking_copy(training, augments):
    """Labels, one-hots and Mixup / CutMix permutations reach the device
    without a blocking copy, on every draw of the augments."""
    settings = dict(
        mean=MEAN,
        std=STD,
        to_rgb=True,
        num_classes=5,
        batch_augments=augments)
    for seed in range(4):
        np.random.seed(seed)
        copies = blocking_copies(
            NonBlockingClsDataPreprocessor(**settings),
            dict(
                inputs=random_batch(batch=6, height=16, width=16),
                data_samples=labelled_samples(6)), training)
        assert copies == [], copies


def test_batch_flip_preprocessor_makes_no_blocking_copy():
    data = dict(inputs=random_batch(), data_samples=[])
    copies = blocking_copies(
        BatchFlipDataPreprocessor(flip_prob=0.5), data, True)
    assert copies == [], copies
    # non_blocking=False is the user's choice for the batch alone; the
    # flip draw stays non-blocking.
    copies = blocking_copies(
        BatchFlipDataPreprocessor(flip_prob=0.5, non_blocking=False),
        dict(inputs=random_batch(), data_samples=[]), True)
    assert copies == [('_to_copy', (4, 3, 12, 10))], copies


@pytest.mark.parametrize('direction', ['horizontal', 'vertical'])
def test_batch_flip_draws_the_same_flips_from_the_same_stream(direction):
    """Bit for bit mmpretrain's normalisation flipped where ``torch.rand``
    (one draw of B numbers from the global generator, as before) says so:
    the generator ends where it did, so resumed runs stay exact."""
    images = random_batch(batch=16)
    settings = dict(mean=MEAN, std=STD, to_rgb=True)
    torch.manual_seed(5)
    got = BatchFlipDataPreprocessor(
        flip_prob=0.5, direction=direction,
        **settings)(dict(inputs=images, data_samples=[]), True)['inputs']
    after = torch.get_rng_state()
    torch.manual_seed(5)
    chosen = torch.rand(16) < 0.5
    assert torch.equal(after, torch.get_rng_state())
    plain = SelfSupDataPreprocessor(**settings)(dict(
        inputs=images.clone(), data_samples=[]), True)['inputs']
    axis = -1 if direction == 'horizontal' else -2
    want = torch.where(chosen.view(-1, 1, 1, 1), plain.flip(axis), plain)
    assert 0 < int(chosen.sum()) < 16
    assert_same_tensor(got, want)


@pytest.mark.cuda
def test_on_cuda_the_copy_is_non_blocking_and_the_output_mmpretrains():
    """A pinned batch: one non-blocking host-to-device copy, no host-side
    index, and mmpretrain's values bit for bit."""
    images = random_batch(batch=8, height=32, width=32).pin_memory()
    samples = [DataSample() for _ in range(8)]
    settings = dict(mean=MEAN, std=STD, to_rgb=True)
    ours = NonBlockingSelfSupDataPreprocessor(**settings).cuda()
    theirs = SelfSupDataPreprocessor(**settings).cuda()
    log = OpLog()
    with log:
        got = ours(dict(inputs=images, data_samples=samples))
    want = theirs(dict(inputs=images, data_samples=samples))
    torch.cuda.synchronize()
    assert got['inputs'].is_cuda
    assert_same_tensor(got['inputs'], want['inputs'])
    copies = [
        kw for name, kw in log.ops
        if name == '_to_copy' and kw['devices'] == ['cpu']
    ]
    assert copies and all(kw.get('non_blocking') is True for kw in copies)
    # Every op after the copy runs on the GPU alone.
    later = [kw['devices'] for name, kw in log.ops if name != '_to_copy']
    assert all(set(devices) <= {'cuda:0'} for devices in later), log.ops


@pytest.mark.cuda
def test_on_cuda_labels_and_mixup_cutmix_copy_without_blocking():
    """Pinned images, labels from the data samples, Mixup / CutMix: no
    blocking copy and no host tensor fed to a GPU op, and mmpretrain's
    values bit for bit."""
    settings = dict(
        mean=MEAN,
        std=STD,
        to_rgb=True,
        num_classes=5,
        batch_augments=MIXUP_CUTMIX)
    images = random_batch(batch=8, height=32, width=32).pin_memory()
    for seed in range(4):
        outputs = []
        for cls in (NonBlockingClsDataPreprocessor, ClsDataPreprocessor):
            torch.manual_seed(seed)
            np.random.seed(seed)
            counter = BlockingCopies()
            with counter:
                outputs.append(
                    cls(**settings).cuda()(dict(
                        inputs=images, data_samples=labelled_samples(8)),
                                           True))
            if cls is NonBlockingClsDataPreprocessor:
                assert counter.copies == [], counter.copies
        torch.cuda.synchronize()
        got, want = outputs
        assert got['inputs'].is_cuda
        assert_same_tensor(got['inputs'], want['inputs'])
        for ours, theirs in zip(got['data_samples'], want['data_samples']):
            assert ours.gt_score.is_cuda and ours.gt_label.is_cuda
            assert torch.equal(ours.gt_score, theirs.gt_score)
