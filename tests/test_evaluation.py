"""Frozen-feature evaluation: kNN, cached linear probe, statistics.

The numerics are checked against independent numpy float64 code; the kNN
model runs under the real MMEngine Runner on a real pretraining checkpoint,
in one process and in two (gloo), and must agree with numpy on the same
features.
"""
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.runner import Runner, load_checkpoint, save_checkpoint
from mmpretrain.evaluation import Accuracy
from mmpretrain.registry import MODELS
from torch.utils._python_dispatch import TorchDispatchMode

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.evaluation import (evaluate_frozen_encoder, fit_linear_probe,
                                    knn, knn_class_scores,
                                    representation_statistics)
from mmae_plugin.evaluation.linear_probe import standardize

KNN_CONFIG = 'configs/fashion_mnist/knn_fmnist.py'


def numpy_knn_scores(query, bank, labels, num_classes, k, temperature):
    """InstDisc/DINO weighted kNN, written independently in float64."""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    sim = q @ b.T
    scores = np.zeros((len(q), num_classes))
    for i, row in enumerate(sim):
        nearest = np.argsort(-row, kind='stable')[:k]
        for j in nearest:
            scores[i, labels[j]] += math.exp(row[j] / temperature)
    return scores / scores.sum(axis=1, keepdims=True)


@pytest.mark.parametrize('k,temperature', [(1, 0.07), (5, 0.5), (20, 0.07),
                                           (200, 1.0)])
def test_knn_scores_match_numpy(k, temperature):
    gen = torch.Generator().manual_seed(k)
    bank = torch.randn(150, 16, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 7, (150, ), generator=gen)
    query = torch.randn(40, 16, generator=gen, dtype=torch.float64)
    ours = knn_class_scores(query, bank, labels, 7, k, temperature)
    ref = numpy_knn_scores(query.numpy(), bank.numpy(), labels.numpy(), 7,
                           min(k, 150), temperature)
    assert ours.dtype == torch.float64
    np.testing.assert_allclose(ours.numpy(), ref, rtol=1e-12, atol=1e-14)


def test_knn_resolves_near_collinear_neighbours_in_float64():
    """Rows ``(1, t_i)`` with ``t_i`` 1e-5 apart: their cosines to a query
    ``(1, t)`` differ by about ``(t_i - t)^2 / 2 ~ 1e-10``, below float32's
    resolution (every similarity rounds to 1) and far above float64's; the
    nearest row is the one whose ``t_i`` is closest to ``t``."""
    t = torch.arange(200, dtype=torch.float64) * 1e-5
    bank = torch.stack([torch.ones_like(t), t], 1).float()
    labels = torch.arange(200) % 10
    query = torch.tensor([[1.0, 0.00123], [1.0, 0.00071]])
    _, idx = knn.top_k_neighbours(query, bank, 3)
    assert idx[:, 0].tolist() == [123, 71]
    assert sorted(idx[0].tolist()) == [122, 123, 124]
    # float32 cannot tell them apart: float64 must decide.
    sims32 = F.normalize(query, dim=1) @ F.normalize(bank, dim=1).T
    assert sims32[0, 100:150].unique().numel() < 5
    scores = knn_class_scores(query, bank, labels, 10, k=1)
    assert scores.argmax(1).tolist() == [3, 1]


def test_knn_chunked_search_equals_one_pass(monkeypatch):
    gen = torch.Generator().manual_seed(0)
    bank = torch.randn(1000, 8, generator=gen)
    query = torch.randn(30, 8, generator=gen)
    labels = torch.randint(0, 3, (1000, ), generator=gen)
    whole = knn_class_scores(query, bank, labels, 3, k=25)
    monkeypatch.setattr(knn, 'BANK_CHUNK', 64)
    chunked = knn_class_scores(query, bank, labels, 3, k=25)
    torch.testing.assert_close(chunked, whole)
    monkeypatch.setattr(knn, 'QUERY_CHUNK', 7)  # 30 queries: 5 blocks
    torch.testing.assert_close(
        knn_class_scores(query, bank, labels, 3, k=25),
        whole,
        rtol=1e-12,
        atol=1e-14)


def numpy_top_k(query, bank, k):
    """Indices of each query's k nearest rows, float64 numpy, equal
    similarities by index (a stable sort)."""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    b = bank / np.linalg.norm(bank, axis=1, keepdims=True)
    return np.argsort(-(q @ b.T), axis=1, kind='stable')[:, :k]


def crowded_bank(seed, rows=3000, dim=24):
    """Rows ``e + s_i v_i`` around one direction with ``s_i`` from 1e-6 to
    1e-3 (cosines 1 - s^2 / 2 apart by 1e-13 to 1e-7: below float32's
    resolution, far above float64's), a quarter of them random; queries
    near ``e``."""
    rng = np.random.default_rng(seed)
    direction = rng.normal(size=dim)
    direction /= np.linalg.norm(direction)
    spread = 10.0**rng.uniform(-6, -3, size=(rows, 1))
    offsets = rng.normal(size=(rows, dim))
    offsets /= np.linalg.norm(offsets, axis=1, keepdims=True)
    bank = direction + spread * offsets
    bank[::4] = rng.normal(size=(len(bank[::4]), dim))
    query = direction + 1e-4 * rng.normal(size=(40, dim))
    labels = rng.integers(0, 10, size=rows)
    return (torch.tensor(query, dtype=torch.float32),
            torch.tensor(bank, dtype=torch.float32), torch.tensor(labels))


@pytest.mark.parametrize('k', [1, 5, 20])
@pytest.mark.parametrize('data', ['crowded', 'gaussian'])
def test_float32_search_gives_float64_neighbours_and_scores(data, k):
    """The float32 search and float64 re-rank give an independent float64
    kNN's neighbours and scores, near-ties included; the crowded queries
    are the ones searched again in float64, the Gaussian ones never are."""
    if data == 'crowded':
        query, bank, labels = crowded_bank(k)
    else:
        gen = torch.Generator().manual_seed(k)
        bank = torch.randn(3000, 24, generator=gen)
        labels = torch.randint(0, 10, (3000, ), generator=gen)
        query = torch.randn(40, 24, generator=gen)
    q, b = query.double().numpy(), bank.double().numpy()
    if data == 'crowded':  # float32 cannot rank these rows
        sims32 = F.normalize(query, dim=1) @ F.normalize(bank, dim=1).T
        assert sims32[0, 1::4].unique().numel() < 1000
    prepared = knn.NeighbourBank(bank, labels)
    sim, idx = prepared.top_k(query, k)
    np.testing.assert_array_equal(idx.numpy(), numpy_top_k(q, b, k))
    scores = prepared.class_scores(query, 10, k, 0.07)
    np.testing.assert_allclose(
        scores.numpy(),
        numpy_knn_scores(q, b, labels.numpy(), 10, k, 0.07),
        rtol=1e-9,
        atol=1e-12)
    if data == 'crowded':
        assert prepared.exact_queries > 0
    else:
        assert prepared.exact_queries == 0


def test_knn_search_runs_in_ieee_float32_and_restores_the_setting():
    """A process that allowed bfloat16 float32 products (oneDNN on the
    CPU; TF32 on a GPU) still gets float64's neighbours: the search runs
    in IEEE float32, and the setting is the process's again after it."""
    backend = torch.backends.mkldnn.matmul
    if not hasattr(backend, 'fp32_precision'):
        pytest.skip('torch < 2.9: no per-backend float32 precision')
    query, bank, labels = crowded_bank(4)
    previous = backend.fp32_precision
    backend.fp32_precision = 'bf16'
    try:
        _, idx = knn.NeighbourBank(bank, labels).top_k(query, 20)
        assert backend.fp32_precision == 'bf16'
    finally:
        backend.fp32_precision = previous
    np.testing.assert_array_equal(
        idx.numpy(),
        numpy_top_k(query.double().numpy(),
                    bank.double().numpy(), 20))


@pytest.mark.parametrize('scale', [1e30, 1e100])
def test_knn_at_extreme_scales_is_float64_s(scale):
    """Rows whose float32 products could overflow (1e100 is beyond
    float32's range): the bank is searched in float64 throughout, and the
    neighbours are numpy's."""
    query, bank, labels = crowded_bank(3)
    bank = bank.double() * scale
    prepared = knn.NeighbourBank(bank, labels)
    _, idx = prepared.top_k(query.double() * scale, 5)
    assert prepared.exact_queries == query.shape[0]
    np.testing.assert_array_equal(
        idx.numpy(), numpy_top_k(query.double().numpy(), bank.numpy(), 5))


def test_knn_memory_does_not_grow_with_the_bank(monkeypatch):
    """No tensor made during the kNN is as large as a float64 copy of the
    bank (what the search made for every query chunk before): with small
    blocks, every op's output stays below a quarter of the float32 bank."""
    for name, value in (('BANK_CHUNK', 256), ('QUERY_CHUNK', 16),
                        ('EXACT_BANK_CHUNK', 256), ('RERANK_ROWS', 256)):
        monkeypatch.setattr(knn, name, value)
    query, bank, labels = crowded_bank(0, rows=8192, dim=24)
    query = torch.cat([query, torch.randn(24, 24)])
    with LargestOutput() as mode:
        prepared = knn.NeighbourBank(bank, labels)
        scores = prepared.class_scores(query, 10, 20, 0.07)
    assert prepared.exact_queries > 0  # the float64 search ran too
    bank_bytes = bank.numel() * bank.element_size()
    assert 0 < mode.largest < bank_bytes / 4, (mode.largest, bank_bytes)
    np.testing.assert_allclose(
        scores.numpy(),
        numpy_knn_scores(query.double().numpy(),
                         bank.double().numpy(), labels.numpy(), 10, 20, 0.07),
        rtol=1e-9,
        atol=1e-12)


@pytest.mark.parametrize('kwargs,error,name', [
    (dict(k=0), ValueError, 'k'),
    (dict(k=True), TypeError, 'k'),
    (dict(k=2.0), TypeError, 'k'),
    (dict(temperature=0), ValueError, 'temperature'),
    (dict(temperature=float('inf')), ValueError, 'temperature'),
    (dict(temperature=True), TypeError, 'temperature'),
])
def test_knn_rejects_bad_arguments(kwargs, error, name):
    args = dict(k=20, temperature=0.07)
    args.update(kwargs)
    with pytest.raises(error, match=name):
        knn_class_scores(
            torch.ones(2, 3), torch.ones(4, 3),
            torch.zeros(4, dtype=torch.long), 2, **args)


def test_linear_probe_reaches_the_regularised_optimum():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(600, 12, generator=gen, dtype=torch.float64) * 3 + 1
    w = torch.randn(12, 4, generator=gen, dtype=torch.float64)
    y = (x @ w +
         torch.randn(600, 4, generator=gen, dtype=torch.float64)).argmax(dim=1)
    probe = fit_linear_probe(x[:500], y[:500], 4, weight_decay=1e-2)
    xs = standardize(x[:500], probe.mean, probe.var).numpy()
    np.testing.assert_allclose(xs.mean(0), 0, atol=1e-12)
    np.testing.assert_allclose(xs.std(0), 1, atol=1e-6)
    # First-order optimality of the convex objective, computed in numpy.
    weight = probe.head.weight.detach().numpy()
    logits = xs @ weight.T + probe.head.bias.detach().numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(500), y[:500].numpy()] -= 1
    grad_w = p.T @ xs / 500 + 1e-2 * weight
    assert np.abs(grad_w).max() < 1e-5 and np.abs(p.mean(0)).max() < 1e-5
    test_acc = (probe.logits(x[500:]).argmax(1) == y[500:]).double().mean()
    assert test_acc > 0.7


class LargestOutput(TorchDispatchMode):
    """Records the largest tensor (bytes) any op produced inside it."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out, ):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel() * t.element_size())
        return out


def test_linear_probe_fits_in_chunks_the_full_batch_optimum(monkeypatch):
    """Summed over chunks of 64 rows, the loss and gradient are the full
    batch's: the same probe to L-BFGS's tolerance, the numpy optimality
    condition holds, and no op makes a tensor as large as a float64 copy
    of the features (the whole batch's standardised copy and logits)."""
    from mmae_plugin.evaluation import linear_probe
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2000, 24, generator=gen) * 3 + 1
    y = (x @ torch.randn(24, 5, generator=gen) +
         2 * torch.randn(2000, 5, generator=gen)).argmax(dim=1)
    whole = fit_linear_probe(x, y, 5, weight_decay=1e-2)
    monkeypatch.setattr(linear_probe, 'PROBE_CHUNK', 64)
    with LargestOutput() as mode:
        chunked = fit_linear_probe(x, y, 5, weight_decay=1e-2)
        top = chunked.top_k_classes(x, 2)
    assert 0 < mode.largest < x.numel() * 8 / 4, mode.largest
    torch.testing.assert_close(
        chunked.mean, whole.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked.var, whole.var, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        chunked.head.weight, whole.head.weight, rtol=1e-5, atol=1e-7)
    assert torch.equal(top, chunked.logits(x).topk(2, dim=1).indices)
    xs = standardize(x, chunked.mean, chunked.var).numpy()
    weight = chunked.head.weight.detach().numpy()
    logits = xs @ weight.T + chunked.head.bias.detach().numpy()
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(2000), y.numpy()] -= 1
    grad_w = p.T @ xs / 2000 + 1e-2 * weight
    assert np.abs(grad_w).max() < 1e-5 and np.abs(p.mean(0)).max() < 1e-5


@pytest.mark.parametrize('standardised', [True, False])
def test_kept_converted_rows_give_the_same_fit_bit_for_bit(
        monkeypatch, standardised):
    """The standardised chunks kept for the whole fit (below
    CONVERTED_BYTES) give exactly the fit of chunks converted again at each
    L-BFGS evaluation: the mosaic study's probes changed speed, not
    value, between its runs."""
    from mmae_plugin.evaluation import linear_probe
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(1000, 12, generator=gen) * 2 + 1
    y = (x @ torch.randn(12, 4, generator=gen) +
         torch.randn(1000, 4, generator=gen)).argmax(dim=1)
    monkeypatch.setattr(linear_probe, 'PROBE_CHUNK', 96)  # 10 + 1 partial

    def fit():
        if standardised:
            return fit_linear_probe(x, y, 4, weight_decay=1e-3).head
        return linear_probe.fit_logistic_regression(x, y, 4, 1e-3)

    kept = fit()
    monkeypatch.setattr(linear_probe, 'CONVERTED_BYTES', 0)
    converted_each_time = fit()
    assert torch.equal(kept.weight, converted_each_time.weight)
    assert torch.equal(kept.bias, converted_each_time.bias)
    assert kept.weight.abs().max() > 0.1  # a fit, not the zero start


def numpy_statistics(z, mu=1.0):
    """Every key of representation_statistics, from its definition: the
    uncentred Gram kernel's spectrum is that of ``zn^T zn / N``."""
    zn = z / np.linalg.norm(z, axis=1, keepdims=True)
    lam = np.linalg.eigvalsh(zn.T @ zn / len(z))
    lam = lam[lam > 1e-15]
    entropy = float(-(lam * np.log(lam)).sum())
    zb = (z - z.mean(0)) / z.std(0)  # the correlation matrix: centred
    corr = np.linalg.eigvalsh(zb.T @ zb / len(z))
    corr = corr[corr > 1e-15] / corr[corr > 1e-15].sum()
    entropy_cov = float(-(corr * np.log(corr)).sum())
    s = np.linalg.svd(z, compute_uv=False)
    p = s / s.sum() + 1e-7
    tcr = np.linalg.slogdet(np.eye(z.shape[1]) +
                            mu / z.shape[1] * zn.T @ zn)[1]
    return {
        'entropy_gram': entropy,
        'erank_gram': math.exp(entropy),
        'entropy_cov': entropy_cov,
        'erank_cov': math.exp(entropy_cov),
        'rankme_raw': float(np.exp(-(p * np.log(p)).sum())),
        f'tcr_reference_mu{mu:g}': float(tcr)
    }


def test_representation_statistics_match_numpy():
    gen = torch.Generator().manual_seed(2)
    z = torch.randn(300, 20, generator=gen, dtype=torch.float64) @ \
        torch.randn(20, 20, generator=gen, dtype=torch.float64)
    ours = representation_statistics(z, tcr_mu=3.0)
    ref = numpy_statistics(z.numpy(), mu=3.0)
    assert set(ours) == set(ref)
    for key, value in ref.items():
        assert ours[key] == pytest.approx(value, rel=1e-9), key
    assert 1 <= ours['erank_gram'] <= 20 and 1 <= ours['erank_cov'] <= 20


@pytest.fixture(scope='module')
def pretrained(tmp_path_factory):
    """A real (untrained, seeded) M-MAE checkpoint in mmengine's format."""
    torch.manual_seed(0)
    cfg = Config.fromfile('configs/fashion_mnist/mmae_fmnist.py')
    model = MODELS.build(cfg.model)
    model.init_weights()
    path = str(tmp_path_factory.mktemp('ckpt') / 'mmae.pth')
    save_checkpoint({'state_dict': model.state_dict(), 'meta': {}}, path)
    return path


def small_knn_cfg(work_dir, checkpoint, train_images=400, test_images=150):
    cfg = Config.fromfile(KNN_CONFIG)
    cfg.merge_from_dict({
        'model.prototype.dataset.indices': train_images,
        'test_dataloader.dataset.indices': test_images,
        'test_dataloader.num_workers': 0,
        'test_dataloader.persistent_workers': False,
        'model.prototype.num_workers': 0,
    })
    cfg.work_dir = str(work_dir)
    cfg.load_from = checkpoint
    return cfg


def reference_features(cfg, checkpoint, split_cfg):
    """Encoder features computed outside the KNNClassifier."""
    encoder = MODELS.build(cfg.model.backbone)
    load_checkpoint(encoder, checkpoint, revise_keys=[(r'^backbone\.', '')])
    encoder.eval()
    loader = Runner.build_dataloader(split_cfg)
    preprocess = MODELS.build(cfg.data_preprocessor)
    feats, labels = [], []
    with torch.no_grad():
        for batch in loader:
            data = preprocess(batch, False)
            feats.append(encoder(data['inputs'])[-1])
            labels += [int(s.gt_label) for s in data['data_samples']]
    return torch.cat(feats).double().numpy(), np.array(labels)


def test_knn_classifier_under_the_runner(tmp_path, pretrained):
    cfg = small_knn_cfg(tmp_path, pretrained)
    metrics = Runner.from_cfg(cfg.copy()).test()
    train_x, train_y = reference_features(cfg, pretrained, cfg.model.prototype)
    test_x, test_y = reference_features(cfg, pretrained, cfg.test_dataloader)
    scores = numpy_knn_scores(test_x, train_x, train_y, 10, 20, 0.07)
    top1 = 100 * (scores.argmax(1) == test_y).mean()
    assert metrics['accuracy/top1'] == pytest.approx(top1, abs=1e-4)
    ref = numpy_statistics(test_x)
    for key in ref:
        assert metrics[f'repr/{key}'] == pytest.approx(ref[key], rel=1e-4)
    # The one-pass evaluation of the sweep sees the same features.
    cached, probe, _ = evaluate_frozen_encoder(cfg, pretrained)
    assert cached['knn/top1'] == pytest.approx(top1, abs=1e-4)
    for key in ('erank_gram', 'erank_cov', 'rankme_raw'):
        assert cached[f'repr/{key}'] == pytest.approx(ref[key], rel=1e-4)
    probe_top1 = 100 * (probe.logits(
        torch.from_numpy(test_x)).argmax(1).numpy() == test_y).mean()
    assert cached['linear/top1'] == pytest.approx(probe_top1, abs=1e-4)


def test_knn_classifier_two_processes_match_one(tmp_path, pretrained,
                                                repo_root,
                                                cpu_dist_env_factory):
    from test_train_e2e import run
    options = [
        'model.prototype.dataset.indices=300',
        'test_dataloader.dataset.indices=101', 'test_dataloader.num_workers=0',
        'test_dataloader.persistent_workers=False',
        'model.prototype.num_workers=0'
    ]
    results = {}
    for gpus in (1, 2):
        out = tmp_path / f'knn{gpus}.json'
        run(repo_root, [
            'bash', 'tools/dist_test.sh', KNN_CONFIG, pretrained,
            str(gpus), '--work-dir',
            str(tmp_path / f'w{gpus}'), '--out',
            str(out), '--out-item', 'metrics', '--cfg-options', *options
        ], cpu_dist_env_factory())
        with open(out) as f:
            results[gpus] = json.load(f)
    assert results[1]['accuracy/top1'] == pytest.approx(
        results[2]['accuracy/top1'], abs=1e-6)
    for key in ('repr/erank_gram', 'repr/erank_cov', 'repr/rankme_raw'):
        assert results[1][key] == pytest.approx(results[2][key], rel=1e-5)


def test_imagenet_knn_config_builds(repo_root):
    cfg = Config.fromfile('configs/knn_vit-base.py')
    model = MODELS.build(cfg.model)
    assert model.k == 20 and model.num_classes == 1000
    assert cfg.model.prototype.dataset.split == 'train'
    assert cfg.test_evaluator[1]['type'] == 'RepresentationStatistics'


def test_finetune_config_trains_and_evaluates(tmp_path, pretrained):
    cfg = Config.fromfile('configs/fashion_mnist/finetune_fmnist.py')
    cfg.merge_from_dict({
        'model.backbone.init_cfg.checkpoint': pretrained,
        'train_dataloader.dataset.indices': 64,
        'train_dataloader.batch_size': 32,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'val_dataloader.dataset.indices': 64,
        'val_dataloader.num_workers': 0,
        'val_dataloader.persistent_workers': False,
        'train_cfg.max_epochs': 2,
        'param_scheduler.1.T_max': 1,
        'param_scheduler.1.end': 2,
    })
    cfg.test_dataloader = cfg.val_dataloader
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    runner.train()
    # The whole encoder trained, starting from the pretrained weights.
    pre = torch.load(pretrained, weights_only=True)['state_dict']
    key = 'layers.0.attn.qkv.weight'
    assert not torch.equal(runner.model.backbone.state_dict()[key],
                           pre[f'backbone.{key}'])
    groups = runner.optim_wrapper.optimizer.param_groups
    lrs = sorted({g['initial_lr'] for g in groups})
    assert len(lrs) > 4  # one lr per layer: layer-wise decay is on


def test_mixed_precision_features_are_float32_and_close(tmp_path, pretrained):
    """``--amp`` extracts under bfloat16 autocast (CPU) and returns float32
    features within bfloat16's rounding of the float32 ones."""
    from mmae_plugin.evaluation.frozen import build_model, extract_features
    cfg = small_knn_cfg(tmp_path, pretrained, train_images=64)
    model = build_model(cfg)
    load_checkpoint(model, pretrained, logger='silent')
    exact, labels = extract_features(model, cfg.model.prototype)
    mixed, mixed_labels = extract_features(
        model, cfg.model.prototype, amp=True)
    assert mixed.dtype == exact.dtype == torch.float32
    assert torch.equal(labels, mixed_labels)
    assert not torch.equal(mixed, exact)  # autocast was on
    error = (mixed - exact).norm(dim=1) / exact.norm(dim=1)
    assert error.max() < 0.05


def test_knn_similarities_stay_float64_under_autocast():
    """Under bfloat16 autocast (``tools/test.py --amp`` on a CPU) the
    neighbours and votes of float32 features are float64's."""
    gen = torch.Generator().manual_seed(5)
    bank = torch.randn(2000, 64, generator=gen)
    labels = torch.randint(0, 10, (2000, ), generator=gen)
    query = torch.randn(100, 64, generator=gen)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        # What the search would do without its full-precision region.
        assert (query.float() @ bank.float().T).dtype == torch.bfloat16
        sim, idx = knn.top_k_neighbours(query, bank, 20)
        mixed = knn_class_scores(query, bank, labels, 10, 20, 0.07)
    assert sim.dtype == mixed.dtype == torch.float64
    torch.testing.assert_close(
        mixed,
        knn_class_scores(query, bank, labels, 10, 20, 0.07),
        rtol=0,
        atol=0)
    q = query.double().numpy()
    b = bank.double().numpy()
    cos = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ \
        (b / np.linalg.norm(b, axis=1, keepdims=True)).T
    reference = np.argsort(-cos, axis=1, kind='stable')[:, :20]
    np.testing.assert_array_equal(
        np.sort(idx.numpy(), 1), np.sort(reference, 1))


@pytest.mark.parametrize('amp', [False, True])
def test_reported_linear_accuracy_is_the_saved_classifier_s(
        tmp_path, pretrained, amp):
    """``linear/top1`` is what the saved checkpoint gives when mmpretrain's
    linear-probe model (encoder, ClsBatchNormNeck, head) classifies the test
    images, with autocast on or off as the features were extracted."""
    from mmengine.runner.amp import autocast

    from mmae_plugin.evaluation.frozen import linear_probe_state_dict
    cfg = small_knn_cfg(tmp_path, pretrained)
    metrics, probe, encoder = evaluate_frozen_encoder(cfg, pretrained, amp=amp)
    linear_cfg = Config.fromfile('configs/fashion_mnist/linear_fmnist.py')
    linear_cfg.model.backbone.init_cfg = None
    linear_cfg.model.setdefault('data_preprocessor',
                                linear_cfg.data_preprocessor)
    classifier = MODELS.build(linear_cfg.model).eval()
    classifier.load_state_dict(linear_probe_state_dict(probe, encoder))
    scores, labels = [], []
    loader = Runner.build_dataloader(cfg.test_dataloader)
    with torch.no_grad():
        for batch in loader:
            data = classifier.data_preprocessor(batch, False)
            with autocast(enabled=amp):
                samples = classifier(**data, mode='predict')
            scores += [s.pred_score for s in samples]
            labels += [int(s.gt_label) for s in samples]
    # What tools/test.py reports: mmpretrain's Accuracy ranks pred_score
    # with topk. Half-precision logits tie; torch 2.4's argmax (pred_label)
    # breaks ties differently from topk (2 of 150 images here).
    top1 = float(
        Accuracy.calculate(torch.stack(scores), torch.tensor(labels))[0][0])
    # Accuracy.calculate counts in float32.
    assert metrics['linear/top1'] == pytest.approx(top1, abs=1e-4)
    # The float64 probe on the same features: the same up to rounding.
    assert abs(metrics['linear/probe_top1'] - top1) <= 100 * 2 / 150
