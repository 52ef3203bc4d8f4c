"""MergedGroups*OptimWrapperConstructor: merging identical parameter groups
changes nothing in the trajectory, under plain decay rules and layer-wise lr
decay, with LinearLR warm-up followed by cosine annealing."""
import copy

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.optim.scheduler import CosineAnnealingLR, LinearLR
from mmengine.registry import init_default_scope
from mmpretrain.registry import MODELS

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.engine.optimizers import merge_param_groups

STEPS = 6


def schedulers(optim_wrapper):
    return [
        LinearLR(optim_wrapper, start_factor=0.01, begin=0, end=3),
        CosineAnnealingLR(
            optim_wrapper, T_max=3, begin=3, end=6, eta_min=1e-6),
    ]


def train(model, optim_wrapper, batch_fn):
    """STEPS scheduled steps; returns the lr history of the first group."""
    scheds = schedulers(optim_wrapper)
    lrs = []
    for step in range(STEPS):
        torch.manual_seed(step)  # same MAE masks / inputs for both runs
        inputs, samples = batch_fn(step)
        losses = model.loss(inputs, samples)
        optim_wrapper.update_params(sum(losses.values()))
        lrs.append(sorted({g['lr'] for g in optim_wrapper.param_groups}))
        for sched in scheds:
            sched.step()
    return lrs


def assert_same_parameters(model_a, model_b):
    for (name, a), (_, b) in zip(model_a.named_parameters(),
                                 model_b.named_parameters()):
        assert torch.equal(a, b), f'{name} differs'


def build_pair(model_cfg, optim_cfg, merged_constructor, plain_constructor):
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    model = MODELS.build(model_cfg)
    model.init_weights()
    twin = copy.deepcopy(model)
    merged = build_optim_wrapper(
        model, dict(copy.deepcopy(optim_cfg), constructor=merged_constructor))
    plain = build_optim_wrapper(
        twin, dict(copy.deepcopy(optim_cfg), constructor=plain_constructor))
    return model, merged, twin, plain


@pytest.mark.parametrize('foreach', [False, True])
def test_mae_decay_rules_bit_identical(repo_root, foreach):
    cfg = Config.fromfile(f'{repo_root}/configs/fashion_mnist/mmae_fmnist.py')
    optim_cfg = copy.deepcopy(cfg.optim_wrapper)
    optim_cfg.optimizer.foreach = foreach
    assert optim_cfg.pop('constructor') == \
        'MergedGroupsOptimWrapperConstructor'  # the shipped config uses it
    model, merged, twin, plain = build_pair(
        cfg.model, optim_cfg, 'MergedGroupsOptimWrapperConstructor',
        'DefaultOptimWrapperConstructor')
    assert len(plain.optimizer.param_groups) == 84
    assert len(merged.optimizer.param_groups) == 2
    decays = sorted(g['weight_decay'] for g in merged.optimizer.param_groups)
    assert decays == [0.0, 0.05]
    images = torch.randn(STEPS, 8, 1, 28, 28)

    def batch(step):
        return images[step], []

    lrs_merged = train(model, merged, batch)
    lrs_plain = train(twin, plain, batch)
    assert lrs_merged == lrs_plain
    assert lrs_merged[0] != lrs_merged[-1]  # the schedule did change the lr
    assert_same_parameters(model, twin)
    # the optimizer state covers every parameter exactly once
    assert len(merged.optimizer.state) == len(plain.optimizer.state) == 84


def test_layer_decay_bit_identical():
    model_cfg = dict(
        type='ImageClassifier',
        backbone=dict(
            type='VisionTransformer',
            arch=dict(
                embed_dims=32,
                num_layers=3,
                num_heads=2,
                feedforward_channels=64),
            img_size=28,
            patch_size=7,
            in_channels=1,
            out_type='avg_featmap',
            final_norm=False),
        neck=None,
        head=dict(
            type='LinearClsHead',
            num_classes=10,
            in_channels=32,
            loss=dict(type='CrossEntropyLoss')))
    optim_cfg = dict(
        type='OptimWrapper',
        optimizer=dict(
            type='AdamW', lr=1e-2, betas=(0.9, 0.999), weight_decay=0.05),
        paramwise_cfg=dict(
            layer_decay_rate=0.65,
            custom_keys={
                '.ln': dict(decay_mult=0.0),
                '.bias': dict(decay_mult=0.0),
                '.cls_token': dict(decay_mult=0.0),
                '.pos_embed': dict(decay_mult=0.0)
            }))
    model, merged, twin, plain = build_pair(
        model_cfg, optim_cfg,
        'MergedGroupsLearningRateDecayOptimWrapperConstructor',
        'LearningRateDecayOptimWrapperConstructor')
    groups = merged.optimizer.param_groups
    assert len(groups) < len(plain.optimizer.param_groups)
    # one group per (layer, weight decay); every group keeps its lr scale
    keys = [(g['layer_id'], g['weight_decay']) for g in groups]
    assert len(keys) == len(set(keys))
    assert len({g['lr'] for g in groups}) == 3 + 2  # layers + embed + head
    names = [n for g in groups for n in g['param_names']]
    assert sorted(names) == sorted(g['param_name']
                                   for g in plain.optimizer.param_groups)
    from mmpretrain.structures import DataSample
    images = torch.randn(STEPS, 8, 1, 28, 28)
    labels = torch.randint(0, 10, (STEPS, 8))

    def batch(step):
        return images[step], [
            DataSample().set_gt_label(int(y)) for y in labels[step]
        ]

    assert train(model, merged, batch) == train(twin, plain, batch)
    assert_same_parameters(model, twin)


def test_only_identical_settings_merge():
    params = [torch.nn.Parameter(torch.ones(2)) for _ in range(5)]
    optimizer = torch.optim.SGD(
        [
            dict(params=[params[0]], lr=0.1),
            dict(params=[params[1]], lr=0.1, lr_mult=1.0),  # metadata differs
            dict(params=[params[2]], lr=0.1),
            dict(params=[params[3]], lr=1),  # int lr: other scheduler rounding
            dict(params=[params[4]], lr=0.2),
        ],
        lr=0.5,
        momentum=0.9)  # momentum: the step leaves state
    assert merge_param_groups(optimizer) == 5
    groups = optimizer.param_groups
    assert [len(g['params']) for g in groups] == [2, 1, 1, 1]
    assert groups[0]['params'][0] is params[0]
    assert groups[0]['params'][1] is params[2]
    sum(p.sum() for p in params).backward()
    optimizer.step()
    with pytest.raises(RuntimeError, match='not stepped yet'):
        merge_param_groups(optimizer)
