"""Write the Fashion-MNIST model zoo from a finished comparison (repository
maintenance: it writes checkpoints/fmnist/ and the metafile in this
checkout).

Each zoo arm's seed-0 encoder of the comparison in --out-dir (the sweep of
docs/results/notes.md: arms ``mae``, ``umae_lam0.01``, ``mmae_lam0.01_mu1``)
is evaluated with the shipped kNN config on all data; its checkpoint and a
cached-feature linear probe (M-MAE) become zoo checkpoints, the metafile
lists them.

Usage: python dev/export_zoo.py --out-dir work_dirs/evidence
"""
import argparse
import os
import os.path as osp
import sys
from typing import Dict

REPO = osp.dirname(osp.dirname(osp.abspath(__file__)))
sys.path.insert(0, REPO)

from mmae_compare import spec as layout  # noqa: E402
from mmae_plugin.checkpoint.integrity import file_sha256  # noqa: E402
from mmae_plugin.model_zoo import DIGEST_FIELD  # noqa: E402

PRETRAIN_CONFIGS = {
    'mae': 'configs/fashion_mnist/mae_fmnist.py',
    'umae': 'configs/fashion_mnist/umae_fmnist.py',
    'mmae': 'configs/fashion_mnist/mmae_fmnist.py',
}
KNN_CONFIG = 'configs/fashion_mnist/knn_fmnist.py'
PROBE_CONFIG = 'configs/fashion_mnist/linear_fmnist.py'
#: Method -> the comparison arm whose seed-0 encoder is the zoo model.
ZOO_ARMS = {'mae': 'mae', 'umae': 'umae_lam0.01', 'mmae': 'mmae_lam0.01_mu1'}
COMMAND = 'python dev/export_zoo.py'

ZOO_DIR = osp.join(REPO, 'checkpoints', 'fmnist')
ZOO_METAFILE = osp.join(REPO, 'configs', 'fashion_mnist', 'metafile.yml')


def zoo_name(method: str) -> str:
    return f'{method}_vit-tiny-p4_fmnist'


def training_resources() -> str:
    """What the sweep's runs trained on: this machine's GPUs or CPU cores."""
    import torch
    if torch.cuda.is_available():
        return f'{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}'
    return f'{os.cpu_count()} CPU cores'


def model_complexity(config: str) -> Dict[str, int]:
    """Metafile ``FLOPs`` and ``Parameters`` of a Fashion-MNIST config.

    Counted as mmpretrain's ``tools/analysis_tools/get_flops.py`` does
    (``extract_feat`` on one unmasked 1 x 28 x 28 image, one multiply-add
    per FLOP, every parameter of the built model), plus the two matrix
    products inside ``scaled_dot_product_attention``, which mmengine's
    counter skips.

    Args:
        config: A config path relative to the repository.

    Returns:
        ``{'FLOPs': ..., 'Parameters': ...}``.
    """
    import torch
    from mmengine.analysis import FlopAnalyzer, parameter_count
    from mmengine.analysis.jit_handles import get_shape
    from mmengine.config import Config
    from mmpretrain.registry import MODELS

    def attention_flops(inputs, outputs) -> int:
        query, key = get_shape(inputs[0]), get_shape(inputs[1])
        heads = int(torch.tensor(query[:-2]).prod())
        return 2 * heads * query[-2] * key[-2] * query[-1]

    model_cfg = Config.fromfile(osp.join(REPO, config)).model
    model_cfg.get('backbone', {}).pop('init_cfg', None)
    model = MODELS.build(model_cfg).eval()
    model.forward = model.extract_feat
    with torch.no_grad():
        counter = FlopAnalyzer(model, torch.zeros(1, 1, 28, 28))
        counter.set_op_handle('aten::scaled_dot_product_attention',
                              attention_flops)
        counter.unsupported_ops_warnings(False)
        counter.uncalled_modules_warnings(False)
        flops = counter.total()
    return {'FLOPs': int(flops), 'Parameters': int(parameter_count(model)[''])}


def export_zoo(out_dir: str,
               zoo_dir: str = ZOO_DIR,
               metafile: str = ZOO_METAFILE) -> None:
    """Write the zoo checkpoints and the Fashion-MNIST metafile.

    Each zoo arm's seed-0 encoder is evaluated with the shipped kNN config
    (all 60,000 training images as neighbours, all 10,000 test images) and
    a linear probe fitted on the cached features of all 60,000 training
    images; the probe becomes the linear-classifier checkpoint of M-MAE.
    """
    import torch
    import yaml
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    import mmae_plugin.registration  # noqa: F401
    from mmae_plugin.datasets import GzipFashionMNIST
    from mmae_plugin.evaluation import (evaluate_frozen_encoder,
                                        linear_probe_state_dict)

    init_default_scope('mmpretrain')
    spec = layout.load(out_dir)
    os.makedirs(zoo_dir, exist_ok=True)
    seed = spec.seeds[0]
    dataset_meta = {'classes': list(GzipFashionMNIST.METAINFO['classes'])}
    models = []
    for method, arm in ZOO_ARMS.items():
        checkpoint = layout.checkpoint_path(out_dir, arm, seed, spec.epochs)
        if not osp.isfile(checkpoint):
            raise SystemExit(f'[zoo] {checkpoint} is missing: run the '
                             'comparison first')
        name = zoo_name(method)
        print(f'[zoo] exporting {name} (evaluating on all data)')
        metrics, probe, encoder = evaluate_frozen_encoder(
            Config.fromfile(osp.join(REPO, KNN_CONFIG)), checkpoint)
        provenance = dict(
            arm=arm, seed=seed, images=spec.images, epochs=spec.epochs)
        state = torch.load(
            checkpoint, map_location='cpu', weights_only=True)['state_dict']
        encoder_file = osp.join(zoo_dir, f'{name}.pth')
        torch.save({
            'state_dict': state,
            'meta': dict(mmae_zoo=provenance)
        }, encoder_file)

        def metadata(config: str, weights_file: str) -> Dict:
            return {
                'Epochs':
                spec.epochs,
                'Batch Size':
                256,
                **model_complexity(config), 'Training Resources':
                training_resources(),
                'Training Data':
                f'Fashion-MNIST (first {spec.images} '
                'training images)',
                'Seed':
                seed,
                'Results Source':
                f'measured by {COMMAND}',
                DIGEST_FIELD:
                file_sha256(weights_file)
            }

        weights = f'mmae-zoo://fmnist/{name}.pth'
        models += [{
            'Name': name,
            'In Collection': COLLECTIONS[method],
            'Metadata': metadata(PRETRAIN_CONFIGS[method], encoder_file),
            'Results': None,
            'Weights': weights,
            'Config': PRETRAIN_CONFIGS[method]
        }, {
            'Name':
            f'{name}_knn',
            'In Collection':
            COLLECTIONS[method],
            'Metadata':
            dict(
                metadata(KNN_CONFIG, encoder_file),
                **{'kNN': 'k=20, T=0.07, 60,000 neighbours'}),
            'Results': [result(metrics['knn/top1'])],
            'Weights':
            weights,
            'Config':
            KNN_CONFIG
        }]
        if method == 'mmae':
            linear = f'{name}_linear'
            torch.save(
                {
                    'state_dict': linear_probe_state_dict(probe, encoder),
                    'meta': dict(
                        mmae_zoo=provenance, dataset_meta=dataset_meta)
                }, osp.join(zoo_dir, f'{linear}.pth'))
            models.append({
                'Name':
                linear,
                'In Collection':
                COLLECTIONS[method],
                'Metadata':
                dict(
                    metadata(PROBE_CONFIG, osp.join(zoo_dir, f'{linear}.pth')),
                    **{
                        'Probe':
                        'BatchNorm + linear fitted on cached features '
                        'of all 60,000 training images'
                    }),
                'Results': [result(metrics['linear/top1'])],
                'Weights':
                f'mmae-zoo://fmnist/{linear}.pth',
                'Config':
                PROBE_CONFIG
            })
    header = ('# Fashion-MNIST models, written by\n'
              f'#   {COMMAND} --out-dir <the sweep of docs/results/notes.md>\n'
              "# from the sweep's seed-0 runs; results measured on the "
              '10,000 test images. FLOPs and Parameters as mmpretrain\'s\n'
              '# get_flops.py counts them (extract_feat on one 1 x 28 x 28 '
              'image, attention included).\n'
              '# Weights SHA256: sha256sum of the weights file; every '
              'mmae-zoo:// load and\n# python -m mmae_plugin.download refuse '
              'a file that differs.\n')
    with open(metafile, 'w') as f:
        f.write(header)
        yaml.safe_dump({'Models': models},
                       f,
                       sort_keys=False,
                       allow_unicode=True)
    add_to_model_index(metafile)
    print(f'[zoo] wrote {metafile} and {zoo_dir}')


def add_to_model_index(metafile: str) -> None:
    """List ``metafile`` in the repository's model-index.yml if inside."""
    index = osp.join(REPO, 'model-index.yml')
    relative = osp.relpath(osp.abspath(metafile), REPO)
    if relative.startswith('..'):
        return
    with open(index) as f:
        text = f.read()
    if relative not in text:
        with open(index, 'a') as f:
            f.write(f'  - {relative}\n')


COLLECTIONS = {'mae': 'MAE', 'umae': 'U-MAE', 'mmae': 'M-MAE'}


def result(top1: float) -> dict:
    return {
        'Task': 'Image Classification',
        'Dataset': 'Fashion-MNIST',
        'Metrics': {
            'Top 1 Accuracy': round(top1, 2)
        }
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument(
        '--out-dir',
        required=True,
        help='the finished comparison (tools/compare.py)')
    parser.add_argument('--zoo-dir', default=ZOO_DIR)
    parser.add_argument('--zoo-metafile', default=ZOO_METAFILE)
    args = parser.parse_args()
    export_zoo(osp.abspath(args.out_dir), args.zoo_dir, args.zoo_metafile)


if __name__ == '__main__':
    main()
