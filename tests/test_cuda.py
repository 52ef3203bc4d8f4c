"""CUDA checks: the regularisers, the training step and evaluation on a GPU.

Marked ``cuda``: skipped in the CPU suite, run with ``MMAE_TEST_CUDA=1
pytest -m cuda`` (as dev/gpu_check.sh does on the GPU machine). What the
CPU suite cannot see: the float64 regulariser on CUDA kernels (cuBLAS,
cuSOLVER's Cholesky) against a float64 numpy closed form, host-device
syncs in the training step as CUDA itself reports them
(``torch.cuda.set_sync_debug_mode``), AMP steps under real bfloat16/float16
autocast with the recipes' ``MixedPrecisionOptimWrapper``, and frozen
evaluation on the runner's device.
"""
import os
import os.path as osp
import warnings
from typing import Callable, List, Tuple

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmpretrain.registry import MODELS
from shrunk_vit import SHRINK

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.models.losses import TCRLoss, UniformityLoss

pytestmark = pytest.mark.cuda

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
#: The ViT-B recipes shrunk to ViT-tiny at 32 x 32 (4 patches, 1 visible),
#: as the benchmark's smoke run: the recipe's code path at a test's cost.
SYNC_MESSAGE = 'called a synchronizing CUDA operation'


# ------------------------------------------------------ float64 references
def unit_rows(z: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    norms = np.linalg.norm(z, axis=1, keepdims=True)
    return z / norms, norms


def through_normalisation(z: np.ndarray, grad_zn: np.ndarray) -> np.ndarray:
    """Gradient w.r.t. ``z`` of a function of ``z / ||z||`` (row-wise)."""
    zn, norms = unit_rows(z)
    radial = np.sum(grad_zn * zn, axis=1, keepdims=True)
    return (grad_zn - radial * zn) / norms


def tcr_reference(z: np.ndarray, mu: float, form: str, centering: bool,
                  weight: float) -> Tuple[float, np.ndarray]:
    """``-weight * logdet(a I + c Zc^T Zc)`` and its gradient, float64.

    ``form='reference'``: a = 1, c = mu / d; ``'paper'``: a = mu, c = 1;
    ``Zc = J zn`` with centering, ``zn`` otherwise. ``d logdet / d Zc =
    2 c Zc M^-1``; centering's ``J`` is symmetric and idempotent.
    """
    zn, _ = unit_rows(z)
    samples, dim = zn.shape
    zc = zn - zn.mean(axis=0, keepdims=True) if centering else zn
    ridge, scale = (1.0, mu / dim) if form == 'reference' else (mu, 1.0)
    matrix = ridge * np.eye(dim) + scale * zc.T @ zc
    sign, logdet = np.linalg.slogdet(matrix)
    assert sign > 0
    grad_zc = 2 * scale * zc @ np.linalg.inv(matrix)
    grad_zn = grad_zc - grad_zc.mean(axis=0, keepdims=True) if centering \
        else grad_zc
    return -weight * logdet, -weight * through_normalisation(z, grad_zn)


def uniformity_reference(z: np.ndarray,
                         weight: float) -> Tuple[float, np.ndarray]:
    """``weight * mean_ij (zn_i . zn_j)^2`` and its gradient, float64."""
    zn, _ = unit_rows(z)
    samples = zn.shape[0]
    gram = zn @ zn.T
    grad_zn = 4 * gram @ zn / samples**2
    return weight * np.sum(gram**2) / samples**2, \
        weight * through_normalisation(z, grad_zn)


def loss_and_grad(loss_module, z: torch.Tensor) -> Tuple[float, np.ndarray]:
    features = z.clone().requires_grad_(True)
    loss = loss_module(features)
    loss.backward()
    assert int(loss_module.skip_code) == 0
    return float(loss.detach()), features.grad.double().cpu().numpy()


def random_features(rows: int, dim: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    # Unequal row norms and a shared direction: normalisation matters.
    z = torch.randn(rows, dim, generator=generator, dtype=torch.float64)
    return z * torch.rand(
        rows, 1, generator=generator, dtype=torch.float64) * 3 + 0.5


# --------------------------------------------------------------- numerics
@pytest.mark.parametrize(
    'rows,dim,form,centering',
    [
        (1024, 768, 'reference', False),  # the ViT-B recipe's global batch
        (96, 192, 'reference', True),  # fewer rows than dims (Sylvester)
        (300, 64, 'paper', False),
        (300, 64, 'paper', True),
    ])
def test_tcr_on_cuda_equals_float64_reference(rows, dim, form, centering):
    """TCRLoss on CUDA (float32 features, float64 arithmetic inside) equals
    the numpy float64 closed form, value and gradient, and the plugin's own
    CPU float64 result."""
    z = random_features(rows, dim, seed=rows + dim)
    weight = 0.01 / 8
    loss = TCRLoss(
        mu=1.0,
        form=form,
        centering=centering,
        gather='local',
        loss_weight=weight)
    value, grad = tcr_reference(z.numpy(), 1.0, form, centering, weight)
    cuda_value, cuda_grad = loss_and_grad(loss, z.float().cuda())
    # Inputs rounded to float32, output float32: float32's precision.
    assert cuda_value == pytest.approx(value, rel=2e-6)
    np.testing.assert_allclose(
        cuda_grad, grad, rtol=1e-5, atol=1e-6 * np.abs(grad).max())
    cpu_value, cpu_grad = loss_and_grad(loss, z)
    assert cpu_value == pytest.approx(value, rel=1e-6)
    np.testing.assert_allclose(
        cpu_grad, grad, rtol=1e-9, atol=1e-12 * np.abs(grad).max())
    exact_value, exact_grad = loss_and_grad(loss, z.cuda())
    assert exact_value == pytest.approx(cpu_value, rel=1e-6)
    np.testing.assert_allclose(
        exact_grad, cpu_grad, rtol=1e-9, atol=1e-12 * np.abs(grad).max())


def test_uniformity_on_cuda_equals_float64_reference():
    z = random_features(512, 128, seed=3)
    loss = UniformityLoss(gather='local', loss_weight=0.01)
    value, grad = uniformity_reference(z.numpy(), 0.01)
    cuda_value, cuda_grad = loss_and_grad(loss, z.float().cuda())
    assert cuda_value == pytest.approx(value, rel=2e-6)
    np.testing.assert_allclose(
        cuda_grad, grad, rtol=1e-5, atol=1e-6 * np.abs(grad).max())


# ------------------------------------------------------- the training step
def shrunk_recipe(case: str) -> Config:
    """``configs/<case>_vit-base_200e.py`` shrunk to ViT-tiny at 32 x 32."""
    cfg = Config.fromfile(
        osp.join(REPO, 'configs', f'{case}_vit-base_200e.py'))
    cfg.merge_from_dict(SHRINK)
    return cfg


def build_on_cuda(case: str, amp_dtype: str = None):
    """Model and optimizer wrapper of the shrunk recipe on the GPU.

    ``amp_dtype=None``: plain ``OptimWrapper`` (no loss scaler); otherwise
    the recipe's ``MixedPrecisionOptimWrapper`` with that dtype (a dynamic
    loss scaler in float16, none in bfloat16).
    """
    cfg = shrunk_recipe(case)
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.cuda().train()
    optim_cfg = cfg.optim_wrapper.to_dict()
    if amp_dtype is None:
        optim_cfg['type'] = 'OptimWrapper'
        optim_cfg.pop('loss_scale', None)
        optim_cfg.pop('dtype', None)
    else:
        optim_cfg['dtype'] = amp_dtype
    return model, build_optim_wrapper(model, optim_cfg)


def device_batch(size: int = 16) -> dict:
    """uint8 images already on the GPU (no host-to-device copy per step)."""
    generator = torch.Generator().manual_seed(7)
    images = torch.randint(
        0, 256, (size, 3, 32, 32), dtype=torch.uint8, generator=generator)
    return dict(inputs=images.cuda(), data_samples=[])


def recorded_syncs(step: Callable[[], None]) -> List[Tuple[str, int]]:
    """(file, line) of every synchronizing CUDA call that ``step`` makes.

    ``set_sync_debug_mode('warn')`` makes CUDA report each one as a
    warning, attributed to the Python line that called into torch.
    """
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        torch.cuda.set_sync_debug_mode('warn')
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode('default')
    torch.cuda.synchronize()
    return [(w.filename, w.lineno) for w in caught
            if SYNC_MESSAGE in str(w.message)]


def from_plugin(syncs: List[Tuple[str, int]]) -> List[Tuple[str, int]]:
    return [(f, n) for f, n in syncs if f'{osp.sep}mmae_plugin{osp.sep}' in f]


@pytest.mark.parametrize('case', ['mmae', 'umae'])
def test_regulariser_makes_no_host_sync_on_cuda(case):
    """The regulariser's forward and backward on CUDA, at the recipe's
    1024 x 768 shape, under ``set_sync_debug_mode('error')``: any host sync
    (``.item()``, a blocking copy, cuSOLVER's info check...) raises."""
    model, _ = build_on_cuda(case)
    features = torch.randn(1024, 768, device='cuda', requires_grad=True)

    def step():
        model.regularizer(features).backward()

    step()  # first call: library handles and workspaces
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        step()
        step()
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert int(model.regularizer.skip_code) == 0


@pytest.mark.parametrize('amp_dtype', [None, 'bfloat16', 'float16'])
def test_regularised_step_syncs_like_mae_on_cuda(amp_dtype):
    """A full ``train_step`` (preprocessor, forward, backward, AdamW; with
    the recipe's mixed-precision wrapper under AMP) of M-MAE and U-MAE makes
    as many host syncs as MAE's, and none from plugin code."""
    counts = {}
    for case in ('mae', 'mmae', 'umae'):
        model, wrapper = build_on_cuda(case, amp_dtype)
        data = device_batch()
        for _ in range(2):  # optimizer state, library handles
            model.train_step(data, wrapper)
        syncs = recorded_syncs(
            lambda: [model.train_step(data, wrapper) for _ in range(3)])
        assert from_plugin(syncs) == [], (case, syncs)
        counts[case] = len(syncs)
    assert counts['mmae'] == counts['mae'] == counts['umae'], counts


def test_bfloat16_step_syncs_no_more_than_float32():
    """No loss scaler in bfloat16: the step makes the syncs of a float32
    step and not GradScaler's ``found_inf`` check; float16 makes more."""
    counts = {}
    for amp_dtype in (None, 'bfloat16', 'float16'):
        model, wrapper = build_on_cuda('mmae', amp_dtype)
        data = device_batch()
        for _ in range(2):
            model.train_step(data, wrapper)
        counts[amp_dtype] = len(
            recorded_syncs(
                lambda: [model.train_step(data, wrapper) for _ in range(3)]))
    assert counts['bfloat16'] == counts[None] < counts['float16'], counts


@pytest.mark.parametrize('amp_dtype', ['bfloat16', 'float16'])
def test_amp_step_is_finite_and_regulariser_is_float64_exact(amp_dtype):
    """Steps of the recipe's mixed-precision wrapper under CUDA autocast:
    finite losses and weights, the regulariser applied (``reg_skipped`` 0)
    and ``loss_tcr`` equal to the float64 closed form on the very features
    the step pooled (autocast is off inside the regulariser)."""
    model, wrapper = build_on_cuda('mmae', amp_dtype)
    pooled = []
    pool = model.pool

    def observed_pool(latent):
        feature = pool(latent)
        pooled.append(feature.detach().clone())
        return feature

    model.pool = observed_pool
    data = device_batch(32)
    for _ in range(3):
        log_vars = model.train_step(data, wrapper)
    values = {key: float(value) for key, value in log_vars.items()}
    assert all(np.isfinite(v) for v in values.values()), values
    assert values['reg_skipped'] == 0
    features = pooled[-1]
    assert features.is_cuda and features.shape == (32, 192)
    assert features.dtype in (torch.float32, getattr(torch, amp_dtype))
    reg = model.regularizer
    expected, _ = tcr_reference(features.double().cpu().numpy(), reg.mu,
                                reg.form, reg.centering, reg.loss_weight)
    assert values['loss_tcr'] == pytest.approx(expected, rel=1e-5)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert wrapper.cast_dtype == getattr(torch, amp_dtype)


# -------------------------------------------------------------- evaluation
def write_labelled_images(root: str, per_class: int) -> None:
    """Five classes of 48 x 48 RGB images, told apart by their brightness
    (enough classes for top-5)."""
    from PIL import Image
    rng = np.random.default_rng(0)
    for label, base in enumerate((20, 70, 120, 170, 220)):
        folder = osp.join(root, f'class{label}')
        os.makedirs(folder, exist_ok=True)
        for index in range(per_class):
            pixels = rng.integers(-15, 16, (48, 48, 3)) + base
            image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
            ext = 'png' if index % 4 == 0 else 'jpg'
            image.save(osp.join(folder, f'{index:03d}.{ext}'))


def knn_config_on(folder: str) -> Config:
    """configs/knn_vit-base.py shrunk to ViT-tiny, 32 x 32, over ``folder``.
    """
    cfg = Config.fromfile(osp.join(REPO, 'configs', 'knn_vit-base.py'))
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='Resize', scale=(32, 32)),
        dict(type='PackInputs')
    ]
    dataset = dict(type='CustomDataset', data_root=folder, pipeline=pipeline)
    loader = dict(
        batch_size=16,
        num_workers=0,
        persistent_workers=False,
        sampler=dict(type='DefaultSampler', shuffle=False),
        collate_fn=dict(type='default_collate'),
        dataset=dataset)
    cfg.merge_from_dict({
        'model.backbone.arch': 'deit-tiny',
        'model.backbone.img_size': 32,
        'model.num_classes': 5,
        'model.k': 5
    })
    cfg.model.prototype = loader
    cfg.test_dataloader = loader
    return cfg


@pytest.mark.parametrize('amp', [False, True])
def test_frozen_evaluation_runs_on_the_gpu(tmp_path, amp):
    """evaluate_frozen_encoder puts the encoder, kNN and probe on mmengine's
    device (the GPU here) and gives the CPU's metrics."""
    from mmengine.device import get_device
    from mmengine.runner import save_checkpoint

    from mmae_plugin.evaluation import evaluate_frozen_encoder
    assert get_device() == 'cuda'
    folder = str(tmp_path / 'images')
    write_labelled_images(folder, per_class=10)
    model, _ = build_on_cuda('mmae')
    checkpoint = str(tmp_path / 'mmae.pth')
    save_checkpoint({
        'state_dict': model.cpu().state_dict(),
        'meta': {}
    }, checkpoint)
    del model
    cfg = knn_config_on(folder)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    metrics, probe, encoder = evaluate_frozen_encoder(cfg, checkpoint, amp=amp)
    encoder_bytes = sum(v.numel() * v.element_size() for v in encoder.values())
    # The encoder's weights and the features lived on the GPU.
    assert torch.cuda.max_memory_allocated() - before > encoder_bytes
    assert all(v.device.type == 'cpu' for v in encoder.values())
    cpu_metrics, _, _ = evaluate_frozen_encoder(
        cfg, checkpoint, amp=False, device='cpu')
    assert set(metrics) == set(cpu_metrics)
    one_image = 100 / 50
    for key in ('knn/top1', 'linear/top1', 'linear/probe_top1'):
        assert abs(metrics[key] - cpu_metrics[key]) <= one_image + 1e-9, key
    assert metrics['knn/top1'] > 90  # five brightness levels
