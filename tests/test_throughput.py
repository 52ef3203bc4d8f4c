"""Throughput components: the batched-flip data preprocessor and the GPU
benchmark's CPU smoke run."""
import statistics

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


def test_gpu_benchmark_cpu_smoke(repo_root, tmp_path):
    """bench_gpu.py --device cpu runs both models in one process on the
    GPU code path (synthetic host batch, alternating rounds, dataloader over
    a PIL-written folder, FlopCounterMode, the regulariser on the global
    batch with stand-in rows and alone at the gathered size) and writes
    complete JSON and Markdown. The ViT-B is shrunk (ViT-tiny, 32 x 32
    images, 1 decoder layer) to keep it short."""
    import json
    import subprocess
    import sys
    out = tmp_path / 'bench.json'
    summary = tmp_path / 'bench.md'
    shrink = [
        'model.backbone.arch=deit-tiny', 'model.backbone.img_size=32',
        'model.neck.num_patches=4', 'model.neck.embed_dim=192',
        'model.neck.decoder_embed_dim=32', 'model.neck.decoder_depth=1',
        'model.neck.decoder_num_heads=2'
    ]
    proc = subprocess.run([
        sys.executable, f'{repo_root}/dev/benchmarks/bench_gpu.py', '--device',
        'cpu', '--iters', '2', '--image-size', '32', '--out',
        str(out), '--markdown',
        str(summary), '--cfg-options', *shrink
    ],
                          cwd=repo_root,
                          capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result['failed_cases'] == []
    folder = result['image_folder']
    assert (folder['images'], folder['jpeg'], folder['png']) == (8, 7, 1)
    assert result['dataloader_alone']['pipeline'] == [
        'LoadImageFromFile', 'RandomResizedCrop', 'RandomFlip', 'PackInputs'
    ]
    block = result['amp']['float32']
    cases = block['cases']
    assert set(cases) == {'MAE', 'M-MAE'}
    for case in cases.values():
        assert case['world_size'] == 1 and case['optim_wrapper'] == \
            'OptimWrapper'
        assert case['images_per_s'] > 0 and case['step_ms']['median'] > 0
        assert case['param_groups'] == 2  # merged decay / no-decay groups
        # FlopCounterMode against the closed form from the model's shapes.
        assert 0.9 < case['flops']['counted_over_analytic'] < 1.1
        assert case['flops']['vit_b_recipe'] is False
        assert case['loader_fed']['steps'] == 2
        assert case['loader_fed']['images_per_s'] > 0
        # 3 alternating rounds (the default) of 2 steps each.
        assert [r['round'] for r in case['rounds']] == [0, 1, 2]
        assert all(r['steps'] == 2 for r in case['rounds'])
        assert case['step_ms']['min'] <= case['step_ms']['median'] <= \
            case['step_ms']['max']
    mmae = cases['M-MAE']
    # Global batch 4 x 2 = 8 rows: 2 real, 6 standing in for other ranks.
    assert (mmae['regularised_rows'], mmae['stand_in_rows']) == (8, 6)
    assert mmae['regulariser']['skip_code'] == 0
    assert mmae['regulariser']['rows_per_rank'] == 8
    assert 'regulariser' not in cases['MAE']
    assert block['mmae_over_mae_step_ratio'] > 0
    assert block['regulariser_ms'] > 0 and 'goals' not in block
    assert len(block['step_ratio_per_round']) == block['rounds'] == 3
    low, high = block['step_ratio_interval_95']
    assert low <= statistics.fmean(block['step_ratio_per_round']) <= high
    # The regulariser alone at the gathered size (8 rows x ViT-tiny's 192).
    assert block['regulariser_gathered_shape'] == [8, 192]
    assert mmae['regulariser_gathered']['gather'] == 'local'
    assert block['regulariser_gathered_ms'] > 0
    text = summary.read_text()
    assert '| float32 | M-MAE |' in text and 'Dataloader alone' in text
