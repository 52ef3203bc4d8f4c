"""float32 against float64 regularisers on the ViT-B recipe's shapes.

Not a timing benchmark: for ``TCRLoss`` (reference form as in
``configs/mmae_vit-base_200e.py``, and the paper form) and
``UniformityLoss`` at ``compute_dtype='float32'`` and ``'float64'``, prints
the relative error of the unweighted value and of the gradient with
respect to the features (Frobenius norm), and whether float32's Cholesky
factorisation provably cannot fail (``cholesky_cannot_fail``). Features
(1024 x 768 by default, the gathered batch of the recipe): isotropic
Gaussian, crowded rows (mean cosine 0.99) and, with ``--vit``, the CLS
tokens of the recipe's randomly initialised ViT-B on noise images, built
with the recipe's own model config (about a minute on 2 CPU cores)::

    python dev/benchmarks/regulariser_dtype_error.py --vit
"""
import argparse
import os.path as osp
from typing import Dict

import torch
import torch.nn.functional as F

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RECIPE = osp.join(REPO, 'configs', 'mmae_vit-base_200e.py')


def vit_cls_features(rows: int, chunk: int = 64) -> torch.Tensor:
    """CLS tokens of the recipe's masked pass, random init, noise images."""
    from mmengine.config import Config
    from mmpretrain.registry import MODELS
    model = MODELS.build(Config.fromfile(RECIPE).model)
    model.init_weights()
    parts = []
    with torch.no_grad():
        for _ in range(0, rows, chunk):
            latent, _, _ = model.backbone(torch.randn(chunk, 3, 224, 224))
            parts.append(model.pool(latent))
    return torch.cat(parts)[:rows]


def feature_sets(rows: int, dim: int, vit: bool) -> Dict[str, torch.Tensor]:
    """The features compared, by name."""
    sets = {
        'gaussian': torch.randn(rows, dim),
        'crowded': torch.randn(1, dim) + 0.1 * torch.randn(rows, dim)
    }
    if vit:
        sets['vit-b cls'] = vit_cls_features(rows)
    return sets


def value_and_grad(loss_cfg: dict, z: torch.Tensor, dtype: str) -> tuple:
    """Unweighted value (float64 copy) and feature gradient of one loss."""
    from mmpretrain.registry import MODELS
    loss = MODELS.build(
        dict(loss_cfg, gather='local', loss_weight=1.0, compute_dtype=dtype))
    rows = z.detach().clone().requires_grad_(True)
    loss(rows).backward()
    if int(loss.skip_code) != 0:
        raise RuntimeError(f'{loss_cfg} skipped: {int(loss.skip_code)}')
    with torch.no_grad():
        unit = F.normalize(z.to(loss.compute_dtype), dim=1)
        value = loss.value(unit).double()
    return value, rows.grad.double()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--rows', type=int, default=1024)
    parser.add_argument('--dim', type=int, default=768)
    parser.add_argument(
        '--vit',
        action='store_true',
        help='add the recipe ViT-B CLS tokens (d = 768)')
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    import mmae_plugin  # noqa: F401  (registers the losses)
    from mmae_plugin.matrix_info.gram_logdet import cholesky_cannot_fail
    torch.manual_seed(args.seed)
    losses = {
        'TCR reference mu 1': dict(type='TCRLoss', form='reference'),
        'TCR paper mu 1': dict(type='TCRLoss', form='paper'),
        'uniformity': dict(type='UniformityLoss')
    }
    print('| features | loss | value (float64) | value rel. err. | '
          'gradient rel. err. |')
    print('|---|---|---|---|---|')
    for name, z in feature_sets(args.rows, args.dim, args.vit).items():
        for loss_name, cfg in losses.items():
            v64, g64 = value_and_grad(cfg, z, 'float64')
            v32, g32 = value_and_grad(cfg, z, 'float32')
            print(f'| {name} | {loss_name} | {v64.item():.6g} | '
                  f'{(abs(v32 - v64) / abs(v64)).item():.1e} | '
                  f'{((g32 - g64).norm() / g64.norm()).item():.1e} |')
    for form, frobenius_sq in (('reference', args.rows / args.dim),
                               ('paper', float(args.rows))):
        for dtype in (torch.float32, torch.float64):
            safe = cholesky_cannot_fail(args.rows, args.dim, frobenius_sq, 1.0,
                                        dtype)
            print(f'{form} form, mu 1, {dtype}: Cholesky cannot fail: '
                  f'{safe}')


if __name__ == '__main__':
    main()
