"""Throughput components: the batched-flip data preprocessor (the GPU
benchmark's CPU smoke run is the bench stage of tests/test_gpu_check.py)."""

import pytest
import torch
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

import mmae_plugin.registration  # noqa: F401

STATS = dict(mean=[72.94], std=[90.02], to_rgb=False)


def build(**kwargs):
    init_default_scope('mmpretrain')
    return MODELS.build(
        dict(type='BatchFlipDataPreprocessor', **STATS, **kwargs))


def batch(size=64):
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(
        0, 256, (size, 1, 28, 28), dtype=torch.uint8, generator=gen)
    return dict(
        inputs=images, data_samples=[DataSample() for _ in range(size)])


def reference(data):
    """mmpretrain's SelfSupDataPreprocessor on the same batch."""
    pre = MODELS.build(dict(type='SelfSupDataPreprocessor', **STATS))
    return pre(data, True)['inputs']


def test_no_flip_equals_selfsup_preprocessor():
    data = batch()
    out = build(flip_prob=0.0)(data, True)
    assert torch.equal(out['inputs'], reference(data))
    assert out['data_samples'] is data['data_samples']  # CPU: passed through


@pytest.mark.parametrize('direction,dim', [('horizontal', -1),
                                           ('vertical', -2)])
def test_always_flip(direction, dim):
    data = batch()
    out = build(flip_prob=1.0, direction=direction)(data, True)['inputs']
    assert torch.equal(out, reference(data).flip(dim))


def test_random_flips_follow_torch_generator_and_only_in_training():
    data = batch(256)
    plain = reference(data)
    pre = build(flip_prob=0.5)
    torch.manual_seed(123)
    out = pre(data, True)['inputs']
    torch.manual_seed(123)
    expected_mask = torch.rand(256) < 0.5  # the documented draw
    flipped = torch.tensor(
        [torch.equal(o, p.flip(-1)) for o, p in zip(out, plain)])
    kept = torch.tensor([torch.equal(o, p) for o, p in zip(out, plain)])
    assert bool((flipped | kept).all())
    assert torch.equal(flipped, expected_mask)
    assert 64 < int(flipped.sum()) < 192
    torch.manual_seed(123)
    assert torch.equal(pre(data, True)['inputs'], out)  # reproducible
    assert torch.equal(pre(data, False)['inputs'], plain)  # no flip in eval


def test_multi_view_inputs_flip_each_view():
    data = batch(8)
    views = dict(
        inputs=[data['inputs'], data['inputs'].clone()],
        data_samples=data['data_samples'])
    out = build(flip_prob=1.0)(views, True)['inputs']
    plain = reference(data)
    assert all(torch.equal(view, plain.flip(-1)) for view in out)


@pytest.mark.parametrize('kwargs,error,match', [
    (dict(flip_prob=1.5), ValueError,
     'flip_prob must be a finite number >= 0 and <= 1, got 1.5'),
    (dict(flip_prob='half'), TypeError, 'flip_prob'),
    (dict(direction='diagonal'), ValueError,
     "direction must be one of .*'diagonal'"),
])
def test_bad_arguments_fail_at_build(kwargs, error, match):
    with pytest.raises(error, match=match):
        build(**kwargs)
