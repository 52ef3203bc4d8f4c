"""The README's guide to adding a regulariser, run as written."""
import os.path as osp
import sys

import numpy as np
import torch
from mmengine.config import Config
from mmpretrain.registry import MODELS
from mmpretrain.structures import DataSample

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from test_tools import readme_block, readme_config  # noqa: E402


def test_readme_regularizer_trains_in_mmae(repo_root, tmp_path, monkeypatch):
    (tmp_path / 'my_regularizers.py').write_text(
        readme_block(repo_root, 'regularizer-module'))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = Config.fromfile(
        readme_config(repo_root, 'regularizer-config', tmp_path))
    model = MODELS.build(cfg.model)
    reg = model.regularizer
    assert type(reg).__name__ == 'SpectralSpreadLoss'
    # The term against float64 numpy: loss_weight * top eigenvalue of the
    # unit rows' second moment.
    z = torch.randn(8, 16, generator=torch.Generator().manual_seed(0))
    zn = z.double().numpy()
    zn /= np.linalg.norm(zn, axis=1, keepdims=True)
    expected = 0.01 * np.linalg.eigvalsh(zn.T @ zn / 8)[-1]
    assert abs(reg(z).item() - expected) < 1e-6
    # One real MMAE loss: the term is logged under its own name, with a
    # gradient reaching the encoder.
    images = torch.randn(4, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    losses = model.loss(images, [DataSample() for _ in range(4)])
    assert {'loss_rec', 'loss_spread'} <= set(losses)
    assert torch.isfinite(losses['loss_spread'])
    losses['loss_spread'].backward()
    assert model.backbone.cls_token.grad.abs().sum() > 0
