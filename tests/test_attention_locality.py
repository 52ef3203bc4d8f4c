"""Tests of the attention statistics and of AttentionLocalityHook."""
import json
import math
import os
import os.path as osp

import pytest
import torch

from mmae_plugin.theory.attention_stats import (
    attention_entropy, mean_attention_distance, patch_grid_distances,
    query_key_normalized_mutual_information)

FMNIST_ROOT = '/usr/share/datasets/fashion-mnist'


# ------------------------------------------------------- pure statistics
def test_identity_attention_has_zero_distance_full_nmi_zero_entropy():
    distances = patch_grid_distances((3, 3), patch_size=4)
    identity = torch.eye(9).expand(2, 4, 9, 9)
    assert torch.all(mean_attention_distance(identity, distances) == 0)
    torch.testing.assert_close(
        query_key_normalized_mutual_information(identity),
        torch.ones(2, 4, dtype=torch.float64))
    torch.testing.assert_close(
        attention_entropy(identity), torch.zeros(2, 4, dtype=torch.float64))


def test_uniform_attention_distance_closed_form_on_2x2_grid():
    # Unit square: from each corner, 2 neighbours at 1 and 1 at sqrt(2).
    distances = patch_grid_distances((2, 2), patch_size=4)
    uniform = torch.full((4, 4), 0.25)
    expected = 4 * (2 + math.sqrt(2)) / 4
    assert mean_attention_distance(uniform, distances).item() == \
        pytest.approx(expected)


@pytest.mark.parametrize('n', [2, 5, 9])
def test_uniform_attention_distance_closed_form_on_a_line(n):
    # Mean |i - j| over i, j uniform on {0..n-1} is (n^2 - 1) / (3 n).
    distances = patch_grid_distances((1, n), patch_size=(2, 3))
    uniform = torch.full((n, n), 1.0 / n)
    assert mean_attention_distance(uniform, distances).item() == \
        pytest.approx(3 * (n * n - 1) / (3 * n))


def test_uniform_and_single_key_attention_collapse_to_zero_nmi():
    uniform = torch.full((16, 16), 1 / 16)
    single_key = torch.zeros(16, 16)
    single_key[:, 3] = 1.0
    assert query_key_normalized_mutual_information(uniform).item() == \
        pytest.approx(0.0, abs=1e-12)
    assert query_key_normalized_mutual_information(single_key).item() == 0.0
    assert attention_entropy(uniform).item() == pytest.approx(math.log(16))


def test_block_attention_nmi_closed_form():
    # Two groups of 2 queries, each uniform over its group's 2 keys:
    # I = log 4 - log 2 = log 2, H(Q) = H(K) = log 4, NMI = 1/2.
    attn = torch.tensor([[.5, .5, 0, 0], [.5, .5, 0, 0], [0, 0, .5, .5],
                         [0, 0, .5, .5]])
    assert query_key_normalized_mutual_information(attn).item() == \
        pytest.approx(0.5)


def test_statistics_reject_mismatched_shapes():
    with pytest.raises(ValueError, match='distances'):
        mean_attention_distance(torch.eye(4), torch.zeros(3, 3))
    with pytest.raises(ValueError, match='grid_hw'):
        patch_grid_distances((0, 3))


# --------------------------------------- capture from mmpretrain modules
@pytest.mark.parametrize('qk_scale', [None, 0.1])
def test_recomputed_probabilities_reproduce_mmpretrain_attention(qk_scale):
    from mmpretrain.models.utils import MultiheadAttention

    from mmae_plugin.engine.hooks.attention_locality_hook import \
        attention_probabilities
    torch.manual_seed(0)
    module = MultiheadAttention(
        embed_dims=32, num_heads=4, qk_scale=qk_scale).eval()
    x = torch.randn(3, 10, 32)
    probs = attention_probabilities(module, x)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, 10))
    # Rebuild the module's output from the captured probabilities.
    v = module.qkv(x).reshape(3, 10, 3, 4, 8).permute(2, 0, 3, 1, 4)[2]
    mixed = (probs @ v).transpose(1, 2).reshape(3, 10, 32)
    torch.testing.assert_close(
        module.proj(mixed), module(x), atol=1e-5, rtol=1e-4)


def test_measure_on_vit_backbones_shapes_and_ranges():
    from mmpretrain.models import VisionTransformer
    from mmpretrain.models.selfsup import MAEViT

    from mmae_plugin.engine.hooks import AttentionLocalityHook
    arch = dict(
        embed_dims=32, num_layers=2, num_heads=2, feedforward_channels=64)
    hook = AttentionLocalityHook()
    images = torch.randn(4, 1, 16, 16)
    for backbone in (VisionTransformer(
            arch=arch, img_size=16, patch_size=4, in_channels=1),
                     MAEViT(
                         arch=arch,
                         img_size=16,
                         patch_size=4,
                         patch_cfg=dict(in_channels=1))):
        backbone.init_weights()
        backbone.train()
        stats = hook.measure(backbone, images)
        assert backbone.training  # mode restored
        assert set(stats) == {'distance', 'nmi', 'entropy'}
        for value in stats.values():
            assert value.shape == (2, 2)
        # 4 x 4 grid of 4-pixel patches: distances within [0, 4 * 3 * sqrt2]
        assert torch.all(stats['distance'] > 0)
        assert torch.all(stats['distance'] <= 12 * math.sqrt(2))
        assert torch.all((stats['nmi'] >= 0) & (stats['nmi'] <= 1))
        assert torch.all(stats['entropy'] <= math.log(16) + 1e-9)


def test_hook_rejects_bad_arguments():
    from mmae_plugin.engine.hooks import AttentionLocalityHook
    with pytest.raises(ValueError, match='interval'):
        AttentionLocalityHook(interval=0)
    with pytest.raises(ValueError, match='num_probe_images'):
        AttentionLocalityHook(num_probe_images=0)


# ------------------------------------------------- a real Runner run
def _shrink(cfg, work_dir):
    cfg.work_dir = work_dir
    cfg.train_dataloader.batch_size = 8
    cfg.train_dataloader.num_workers = 0
    cfg.train_dataloader.persistent_workers = False
    cfg.train_dataloader.dataset.indices = 16
    cfg.train_cfg.max_epochs = 2
    cfg.param_scheduler = []
    cfg.default_hooks.logger.interval = 1
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=100)
    cfg.default_hooks.attention_locality.num_probe_images = 8
    cfg.env_cfg = dict(dist_cfg=dict(backend='gloo'))
    cfg.log_level = 'INFO'  # the hook's summary is logged at INFO
    return cfg


def _read_scalars(work_dir):
    (run, ) = [d for d in os.listdir(work_dir) if d[0].isdigit()]
    with open(osp.join(work_dir, run, 'vis_data', 'scalars.json')) as f:
        records = [json.loads(line) for line in f]
    log_file = osp.join(work_dir, run, f'{run}.log')
    with open(log_file) as f:
        text = f.read()
    return records, text


@pytest.mark.skipif(
    not osp.isdir(FMNIST_ROOT), reason='Fashion-MNIST not installed')
@pytest.mark.parametrize('config', [
    'configs/fashion_mnist/mae_fmnist_attention.py',
    'configs/fashion_mnist/mocov3_vit_fmnist.py',
])
def test_runner_logs_attention_locality(config, repo_root, tmp_path):
    from mmengine.config import Config
    from mmengine.runner import Runner

    import mmae_plugin.registration  # noqa: F401  (upstream fixes, registries)
    cfg = _shrink(Config.fromfile(osp.join(repo_root, config)), str(tmp_path))
    runner = Runner.from_cfg(cfg)
    runner.train()

    records, text = _read_scalars(str(tmp_path))
    probes = [r for r in records if 'attn_locality/distance_l0' in r]
    # probe at start (epoch 0) and after epochs 1 and 2
    assert [r['epoch'] for r in probes] == [0, 1, 2]
    num_layers, num_heads = 4, 4
    for record in probes:
        for layer in range(num_layers):
            heads = [
                record[f'attn_locality/distance_l{layer}_h{h}']
                for h in range(num_heads)
            ]
            assert record[f'attn_locality/distance_l{layer}'] == \
                pytest.approx(sum(heads) / num_heads)
            assert 0 <= record[f'attn_locality/nmi_l{layer}'] <= 1
            assert record[f'attn_locality/entropy_l{layer}'] > 0
    # Training changes the attention, so the probes are not all equal.
    assert probes[0]['attn_locality/distance_l0_h0'] != \
        probes[-1]['attn_locality/distance_l0_h0']
    assert 'Attention locality (epoch 2' in text
    assert runner.message_hub.get_scalar(
        'attn_locality/nmi_l3').current() == probes[-1]['attn_locality/nmi_l3']

    # The plotting tool reads the same records back per layer.
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        'plot_attention_locality',
        osp.join(repo_root, 'tools/analysis/plot_attention_locality.py'))
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    layers = tool.per_layer(
        tool.select(
            tool.load_probes(tool.find_scalars(str(tmp_path))), epoch=1))
    assert layers['nmi']['mean'] == [
        probes[1][f'attn_locality/nmi_l{i}'] for i in range(num_layers)
    ]
    assert len(layers['distance']['heads'][0]) == num_heads
