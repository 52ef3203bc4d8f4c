"""Tests of the feature-imbalance theory lab (mmae_plugin.theory)."""
import math

import pytest
import torch

from mmae_plugin.theory import (GLOBAL_AREA, FeatureImbalanceData,
                                ImbalanceSetting, OneLayerAttention,
                                TrainSetting, area_attention_mass, area_index,
                                evaluate, gradient_descent_step, infonce_loss,
                                mae_loss, objective_value, random_visible_mask,
                                train)


def small_setting(**kwargs) -> ImbalanceSetting:
    values = dict(
        num_patches=16, num_local_areas=2, local_exponent=0.5, feature_dim=5)
    values.update(kwargs)
    return ImbalanceSetting(**values)


# ---------------------------------------------------------------- generator
@pytest.mark.parametrize('num_patches,num_local,exponent,expected', [
    (64, 3, 0.5, [40, 8, 8, 8]),
    (64, 3, 0.2, [58, 2, 2, 2]),
    (64, 3, 0.65, [19, 15, 15, 15]),
    (100, 4, 0.5, [60, 10, 10, 10, 10]),
])
def test_area_sizes_follow_exponent(num_patches, num_local, exponent,
                                    expected):
    setting = ImbalanceSetting(
        num_patches=num_patches,
        num_local_areas=num_local,
        local_exponent=exponent)
    assert setting.area_sizes == expected
    assert sum(setting.area_sizes) == num_patches
    assert setting.imbalance_ratio == expected[0] / expected[1]
    index = area_index(setting)
    assert torch.bincount(index).tolist() == expected
    # Documented layout: contiguous ranges, global area first.
    assert torch.all(index[1:] >= index[:-1])
    assert index[0] == GLOBAL_AREA


def test_features_orthonormal_and_patches_carry_own_feature():
    setting = small_setting(feature_dim=7)
    data = FeatureImbalanceData(setting, seed=3)
    gram = data.features @ data.features.T
    torch.testing.assert_close(
        gram, torch.eye(setting.num_areas), atol=1e-6, rtol=0)
    patches, weights = data.sample(4)
    assert patches.shape == (4, 16, 7) and weights.shape == (4, 3)
    for p in range(setting.num_patches):
        k = int(data.area_index[p])
        expected = weights[:, k:k + 1] * data.features[k]
        torch.testing.assert_close(patches[:, p], expected)


def test_generator_is_seeded_and_noise_has_documented_scale():
    setting = small_setting(noise_std=0.5, feature_dim=40)
    a = FeatureImbalanceData(setting, seed=11)
    b = FeatureImbalanceData(setting, seed=11)
    c = FeatureImbalanceData(setting, seed=12)
    torch.testing.assert_close(a.features, b.features)
    assert not torch.allclose(a.features, c.features)
    patches_a, weights_a = a.sample(2000)
    patches_b, _ = b.sample(2000)
    torch.testing.assert_close(patches_a, patches_b)
    clean = weights_a[:, a.area_index].unsqueeze(-1) * a.features[a.area_index]
    noise_power = (patches_a - clean).pow(2).sum(-1).mean()
    assert abs(noise_power.item() - 0.25) < 0.01


@pytest.mark.parametrize('kwargs,name', [
    (dict(local_exponent=1.0), 'local_exponent'),
    (dict(local_exponent=0.9), 'local_exponent'),
    (dict(feature_dim=2), 'feature_dim'),
    (dict(noise_std=-1.0), 'noise_std'),
    (dict(num_local_areas=0), 'num_local_areas'),
])
def test_bad_settings_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        small_setting(**kwargs)


# -------------------------------------------------------------------- model
def test_zero_init_gives_uniform_attention_over_visible_patches():
    setting = small_setting()
    data = FeatureImbalanceData(setting, seed=0)
    model = OneLayerAttention(setting.num_patches, setting.feature_dim)
    assert torch.count_nonzero(model.qk) == 0
    patches, _ = data.sample(3)
    visible = random_visible_mask(3, 16, 0.75,
                                  torch.Generator().manual_seed(0))
    _, attention = model(patches, visible)
    expected = visible.float() / visible.sum(1, keepdim=True)
    torch.testing.assert_close(attention,
                               expected.unsqueeze(1).expand(-1, 16, -1))


def test_random_mask_counts_and_bad_ratio():
    mask = random_visible_mask(50, 16, 0.75, torch.Generator().manual_seed(1))
    assert torch.all(mask.sum(1) == 4)
    with pytest.raises(ValueError, match='mask_ratio'):
        random_visible_mask(1, 16, 1.0, torch.Generator())


# --------------------------------------------------------------- objectives
def hand_outputs(qk, patches, visible):
    """Float64 loops over the written model: scores u_p^T Q u_q."""
    batch, num_patches, dim = patches.shape
    outputs = torch.zeros(batch, num_patches, dim, dtype=torch.float64)
    for b in range(batch):
        tokens = []
        for p in range(num_patches):
            content = patches[b, p] if visible[b, p] else torch.zeros(dim)
            position = torch.zeros(num_patches)
            position[p] = 1.0
            tokens.append(torch.cat([content, position]).double())
        for p in range(num_patches):
            scores = [
                float(tokens[p] @ qk @ tokens[q]) for q in range(num_patches)
                if visible[b, q]
            ]
            keys = [q for q in range(num_patches) if visible[b, q]]
            top = max(scores)
            weights = [math.exp(s - top) for s in scores]
            total = sum(weights)
            for w, q in zip(weights, keys):
                outputs[b, p] += w / total * patches[b, q].double()
    return outputs


def random_model_and_batch(seed=0, batch=3):
    setting = small_setting()
    data = FeatureImbalanceData(setting, seed=seed)
    model = OneLayerAttention(setting.num_patches, setting.feature_dim)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        model.qk.copy_(torch.randn(model.qk.shape, generator=g) * 0.5)
    patches, _ = data.sample(batch, g)
    visible_1 = random_visible_mask(batch, 16, 0.75, g)
    visible_2 = random_visible_mask(batch, 16, 0.75, g)
    return model, patches, visible_1, visible_2


def test_mae_loss_matches_hand_float64_computation():
    model, patches, visible, _ = random_model_and_batch(seed=1)
    qk = model.qk.detach().double()
    outputs = hand_outputs(qk, patches, visible)
    expected = 0.0
    for b in range(patches.shape[0]):
        masked = [p for p in range(16) if not visible[b, p]]
        expected += sum(
            float((outputs[b, p] - patches[b, p].double()).pow(2).sum())
            for p in masked) / len(masked)
    expected /= patches.shape[0]
    assert mae_loss(model, patches, visible).item() == pytest.approx(
        expected, rel=1e-5)


def test_infonce_loss_matches_hand_float64_computation():
    model, patches, visible_1, visible_2 = random_model_and_batch(
        seed=2, batch=4)
    qk = model.qk.detach().double()
    f1 = hand_outputs(qk, patches, visible_1).mean(1)
    f2 = hand_outputs(qk, patches, visible_2).mean(1)
    tau = 0.3
    expected = 0.0
    for i in range(4):
        logits = [float(f1[i] @ f2[j]) / tau for j in range(4)]
        log_norm = math.log(sum(math.exp(v) for v in logits))
        expected += -(logits[i] - log_norm)
    expected /= 4
    loss = infonce_loss(model, patches, visible_1, visible_2, tau)
    assert loss.item() == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize('objective', ['mae', 'cl'])
def test_gradient_step_equals_theta_minus_lr_grad(objective):
    model, patches, _, _ = random_model_and_batch(seed=3, batch=4)
    setting = TrainSetting(objective=objective, temperature=0.5)
    before = model.qk.detach().clone()
    # Same mask stream twice: once for the reference gradient, once to step.
    reference = model.qk.detach().double().requires_grad_(True)
    ref_model = OneLayerAttention(16, 5).double()
    ref_model.qk = torch.nn.Parameter(reference)
    ref_loss = objective_value(ref_model, patches.double(), setting,
                               torch.Generator().manual_seed(9))
    (ref_grad, ) = torch.autograd.grad(ref_loss, [ref_model.qk])
    assert ref_grad.abs().max() > 0

    loss = objective_value(model, patches, setting,
                           torch.Generator().manual_seed(9))
    applied = gradient_descent_step(model, loss, lr=0.7)
    torch.testing.assert_close(
        applied.double(), ref_grad, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(
        model.qk.detach().double(),
        before.double() - 0.7 * ref_grad,
        atol=1e-5,
        rtol=1e-4)


# ------------------------------------------------------------------ metrics
def test_area_attention_masses_sum_to_one_and_init_closed_form():
    setting = small_setting(num_patches=25, local_exponent=0.5)  # 15/5/5
    data = FeatureImbalanceData(setting, seed=0)
    model, g = OneLayerAttention(25, 5), torch.Generator().manual_seed(0)
    with torch.no_grad():
        model.qk.copy_(torch.randn(model.qk.shape, generator=g))
    patches, _ = data.sample(64, g)
    visible = random_visible_mask(64, 25, 0.6, g)
    _, attention = model(patches, visible)
    mass = area_attention_mass(attention, visible, data.area_index, 3)
    torch.testing.assert_close(mass.sum(1), torch.ones(3))

    # At zero init a masked query of area k puts |visible in k| / |visible|
    # on its own area; check against a direct count.
    zero = OneLayerAttention(25, 5)
    _, attention = zero(patches, visible)
    own = torch.diagonal(
        area_attention_mass(attention, visible, data.area_index, 3))
    for k in range(3):
        in_area = data.area_index == k
        per_query = []
        for b in range(64):
            share = (visible[b] & in_area).sum() / visible[b].sum()
            per_query += [share.item()] * int((~visible[b] & in_area).sum())
        assert own[k].item() == pytest.approx(
            sum(per_query) / len(per_query), rel=1e-5)


def test_evaluate_feature_coefficient_is_one_for_perfect_own_area_attention():
    setting = small_setting()
    data = FeatureImbalanceData(setting, seed=0)
    model = OneLayerAttention(16, 5)
    with torch.no_grad():  # large positional score inside each area
        same = data.area_index.unsqueeze(0) == data.area_index.unsqueeze(1)
        model.qk[5:, 5:] = 50.0 * same.float()
    patches, weights = data.sample(32)
    # Keep one visible patch in every area so perfect attention is possible.
    visible = torch.zeros(32, 16, dtype=torch.bool)
    visible[:, [0, 10, 13]] = True
    metrics = evaluate(model, patches, weights, visible, data.features,
                       data.area_index)
    torch.testing.assert_close(metrics['own_area_attention'], torch.ones(3))
    torch.testing.assert_close(metrics['feature_coefficient'], torch.ones(3))
    assert metrics['reconstruction_error'].item() < 1e-8


def test_short_mae_training_raises_own_area_attention():
    data = FeatureImbalanceData(small_setting(), seed=0)
    history = train(
        data,
        TrainSetting(
            objective='mae',
            steps=60,
            lr=20.0,
            batch_size=16,
            eval_interval=30,
            eval_batch_size=64))
    assert history['step'] == [0, 30, 60]
    own_init = torch.tensor(history['own_area_attention'][0])
    own_final = torch.tensor(history['own_area_attention'][-1])
    assert torch.all(own_final > own_init)
    assert history['reconstruction_error'][-1] < \
        history['reconstruction_error'][0]


def test_train_setting_rejects_unknown_objective():
    with pytest.raises(ValueError, match='objective'):
        TrainSetting(objective='byol')


@pytest.mark.parametrize('num_patches,area_size,num_visible', [(7, 1, 3),
                                                               (7, 2, 3),
                                                               (8, 3, 2),
                                                               (9, 5, 4)])
def test_own_area_ceiling_matches_enumeration(num_patches, area_size,
                                              num_visible):
    from itertools import combinations

    from mmae_plugin.theory import own_area_attention_ceiling

    # Query is patch 0 (masked); its area is {0, ..., area_size - 1}.
    masks = [
        m for m in combinations(range(num_patches), num_visible) if 0 not in m
    ]
    hits = sum(any(q < area_size for q in m) for m in masks)
    assert own_area_attention_ceiling(area_size, num_patches,
                                      num_visible) == pytest.approx(hits /
                                                                    len(masks))


def test_perfect_own_area_attention_reaches_the_ceiling():
    from mmae_plugin.theory import own_area_attention_ceiling
    setting = small_setting()  # areas 8 / 4 / 4 of 16 patches
    data = FeatureImbalanceData(setting, seed=0)
    model = OneLayerAttention(16, 5)
    with torch.no_grad():
        same = data.area_index.unsqueeze(0) == data.area_index.unsqueeze(1)
        model.qk[5:, 5:] = 50.0 * same.float()
    g = torch.Generator().manual_seed(0)
    patches, weights = data.sample(4000, g)
    visible = random_visible_mask(4000, 16, 0.75, g)
    own = evaluate(model, patches, weights, visible, data.features,
                   data.area_index)['own_area_attention']
    for k, size in enumerate(setting.area_sizes):
        assert own[k].item() == pytest.approx(
            own_area_attention_ceiling(size, 16, 4), abs=0.02)


# ------------------------------------------------- data and CL model options
def test_default_weights_are_the_original_standard_normal_stream():
    # Defaults must reproduce the published sweep: z = the raw randn draw.
    data = FeatureImbalanceData(small_setting(), seed=5)
    g = torch.Generator().manual_seed(7)
    _, weights = data.sample(8, g)
    expected = torch.randn(8, 3, generator=torch.Generator().manual_seed(7))
    assert torch.equal(weights, expected)


def test_global_weight_std_and_weight_mean_shape_the_weights():
    setting = small_setting(global_weight_std=3.0, weight_mean=1.5)
    assert setting.weight_stds == [3.0, 1.0, 1.0]
    data = FeatureImbalanceData(setting, seed=0)
    patches, weights = data.sample(40000, torch.Generator().manual_seed(0))
    torch.testing.assert_close(
        weights.mean(0), torch.full((3, ), 1.5), atol=0.05, rtol=0)
    torch.testing.assert_close(
        weights.std(0), torch.tensor([3.0, 1.0, 1.0]), atol=0.05, rtol=0)
    # Patches still carry exactly their own area's weighted feature.
    p = int((data.area_index == 0).nonzero()[0])
    torch.testing.assert_close(patches[:, p],
                               weights[:, :1] * data.features[0])


@pytest.mark.parametrize('kwargs,name', [
    (dict(global_weight_std=0.0), 'global_weight_std'),
    (dict(global_weight_std=float('inf')), 'global_weight_std'),
    (dict(weight_mean=float('nan')), 'weight_mean'),
])
def test_bad_weight_options_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        small_setting(**kwargs)


def test_cosine_infonce_and_masked_pooling_match_float64_hand_computation():
    model, patches, visible_1, visible_2 = random_model_and_batch(
        seed=4, batch=4)
    qk = model.qk.detach().double()
    out_1 = hand_outputs(qk, patches, visible_1)
    out_2 = hand_outputs(qk, patches, visible_2)

    def pooled(outputs, visible):
        rows = []
        for b in range(4):
            masked = [p for p in range(16) if not visible[b, p]]
            rows.append(sum(outputs[b, p] for p in masked) / len(masked))
        return rows

    f1, f2 = pooled(out_1, visible_1), pooled(out_2, visible_2)
    tau, expected = 0.5, 0.0
    for i in range(4):
        logits = [
            float(f1[i] @ f2[j]) / (float(f1[i].norm() * f2[j].norm()) * tau)
            for j in range(4)
        ]
        log_norm = math.log(sum(math.exp(v) for v in logits))
        expected += -(logits[i] - log_norm) / 4
    loss = infonce_loss(
        model,
        patches,
        visible_1,
        visible_2,
        tau,
        similarity='cosine',
        pooling='masked')
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_visible_pooling_averages_the_visible_queries_only():
    from mmae_plugin.theory import view_representation
    model, patches, visible, _ = random_model_and_batch(seed=5, batch=2)
    outputs, _ = model(patches, visible)
    expected = torch.stack([outputs[b][visible[b]].mean(0) for b in range(2)])
    torch.testing.assert_close(
        view_representation(model, patches, visible, pooling='visible'),
        expected)


def test_masked_and_full_views_use_one_unmasked_view():
    model, patches, _, _ = random_model_and_batch(seed=6, batch=4)
    setting = TrainSetting(
        objective='cl', cl_views='masked_and_full', temperature=0.5)
    loss = objective_value(model, patches, setting,
                           torch.Generator().manual_seed(3))
    first = random_visible_mask(4, 16, 0.75, torch.Generator().manual_seed(3))
    expected = infonce_loss(model, patches, first, torch.ones_like(first), 0.5)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize('kwargs,name', [
    (dict(cl_similarity='l2'), 'cl_similarity'),
    (dict(cl_pooling='cls'), 'cl_pooling'),
    (dict(cl_views='crops'), 'cl_views'),
    (dict(cl_views='masked_and_full', cl_pooling='masked'), 'cl_pooling'),
    (dict(temperature=0.0), 'temperature'),
])
def test_bad_cl_options_name_the_parameter(kwargs, name):
    with pytest.raises(ValueError, match=name):
        TrainSetting(objective='cl', **kwargs)


def test_bad_pooling_and_similarity_arguments_are_refused():
    model, patches, visible_1, visible_2 = random_model_and_batch(seed=0)
    with pytest.raises(ValueError, match='pooling'):
        infonce_loss(
            model, patches, visible_1, visible_2, 0.1, pooling='first')
    with pytest.raises(ValueError, match='similarity'):
        infonce_loss(
            model, patches, visible_1, visible_2, 0.1, similarity='euclid')


def test_feature_and_position_correlations_read_the_qk_blocks():
    from mmae_plugin.theory.metrics import attention_correlations
    setting = small_setting()  # areas 8 / 4 / 4, d = 5
    data = FeatureImbalanceData(setting, seed=0)
    model = OneLayerAttention(16, 5)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        model.qk.copy_(torch.randn(model.qk.shape, generator=g))
    qk = model.qk.detach().double()
    index = data.area_index.tolist()
    correlations = attention_correlations(model, data.features,
                                          data.area_index)
    for k in range(3):
        rows = [p for p in range(16) if index[p] == k]
        for j in range(3):
            fp = sum(
                float(qk[5 + p, :5] @ data.features[j].double())
                for p in rows) / len(rows)
            pairs = [(p, q) for p in rows for q in range(16)
                     if index[q] == j and q != p]
            pp = sum(float(qk[5 + p, 5 + q]) for p, q in pairs) / len(pairs)
            assert correlations['feature_position_correlation'][
                k, j].item() == pytest.approx(
                    fp, rel=1e-5, abs=1e-6)
            assert correlations['position_correlation'][k, j].item() == \
                pytest.approx(pp, rel=1e-5, abs=1e-6)


# ------------------------------------- CL: where attention goes, and why
def short_cl_run(variant_name: str, steps: int = 200) -> dict:
    """Seed-0 CL run of a documented variant at kappa = 0.5 (areas 40/8)."""
    from studies.cl_ablation import CL_VARIANTS, curve_values, run_variant
    threads = torch.get_num_threads()
    # One thread: tiny matrices, and the suite shares the cores; subnormal
    # softmax tails are ~10x slower unless flushed.
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    base_train = TrainSetting(
        objective='cl',
        steps=steps,
        lr=20.0,
        eval_interval=steps,
        eval_batch_size=128)
    try:
        (history, ) = run_variant(
            CL_VARIANTS[variant_name],
            ImbalanceSetting(local_exponent=0.5),
            base_train,
            seeds=[0])
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)
    return {
        q: curve_values(history, q)
        for q in ('own_global', 'own_local', 'local_to_global')
    }


def test_cl_at_tau_01_moves_attention_away_from_the_global_area():
    # The lab default (dot InfoNCE, tau 0.1): about 0.62 -> 0.42 global,
    # 0.11 -> 0.2 local after 200 steps; a concentrating CL fails here.
    run = short_cl_run('default')
    assert run['own_global'][-1] < run['own_global'][0] - 0.1
    assert run['own_local'][-1] > run['own_local'][0] + 0.03
    assert run['local_to_global'][-1] < run['local_to_global'][0] - 0.1


def test_cl_at_tau_10_concentrates_on_the_global_area():
    # Near-linear InfoNCE regime (tau 10, step x10): about 0.62 -> 0.77
    # global, 0.11 -> 0.06 local, local queries' mass on the global area
    # 0.64 -> 0.8 after 200 steps: one global pattern for every query.
    run = short_cl_run('tau_10')
    assert run['own_global'][-1] > run['own_global'][0] + 0.1
    assert run['own_local'][-1] < run['own_local'][0] - 0.03
    assert run['local_to_global'][-1] > run['local_to_global'][0] + 0.1


def test_unknown_cl_variant_is_refused_with_the_known_names():
    from studies.cl_ablation import check_variant_names
    with pytest.raises(ValueError, match="variants=.*'simclr'.*tau_10"):
        check_variant_names(['default', 'simclr'])


def test_cl_ablation_tool_writes_json_and_figures(tmp_path):
    import json
    import os.path as osp
    import subprocess
    import sys
    tool = osp.join(
        osp.dirname(osp.dirname(osp.abspath(__file__))), 'tools', 'theory',
        'run_cl_ablation.py')
    out = tmp_path / 'ablation'
    proc = subprocess.run([
        sys.executable, tool, '--out-dir',
        str(out), '--variants', 'default', 'tau_10', '--seeds', '0', '1',
        '--steps', '4', '--eval-interval', '2'
    ],
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    payload = json.loads((out / 'cl_ablation.json').read_text())
    results = payload['results']
    assert list(results) == ['default', 'tau_10']
    assert results['tau_10']['train_setting']['temperature'] == 10.0
    assert results['tau_10']['train_setting']['lr'] == 200.0
    assert results['default']['train_setting']['lr'] == 20.0
    final = results['default']['summary']['own_global']['final']
    assert final['n'] == 2 and final['std'] is not None
    assert len(results['default']['histories']) == 2
    for stem in ('cl_ablation_curves', 'cl_ablation_final'):
        for ext in ('png', 'pdf'):
            assert (out / f'{stem}.{ext}').stat().st_size > 0
