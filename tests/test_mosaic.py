"""The mosaic study's pieces: FashionMNISTMosaic on the real files, its
probes against numpy references, CellClsHead, the configs through their
own pipelines, and the comparison tool's mosaic protocol."""
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mmengine.config import Config
from mmengine.runner import Runner
from mmpretrain.registry import DATASETS, MODELS
from mmpretrain.structures import DataSample

import mmae_plugin.registration  # noqa: F401
from mmae_compare.spec import Arm, Comparison, Protocol
from mmae_plugin.datasets.fashion_mnist import read_split
from mmae_plugin.evaluation import mosaic
from mmae_plugin.evaluation.linear_probe import fit_linear_probe

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOSAIC_CONFIGS = os.path.join(REPO, 'configs', 'fashion_mnist_mosaic')


def build(**kwargs):
    return DATASETS.build(dict(type='FashionMNISTMosaic', **kwargs))


# ----------------------------------------------------------------------------
# The dataset
# ----------------------------------------------------------------------------
@pytest.fixture(scope='module')
def test_split():
    return read_split('/usr/share/datasets/fashion-mnist', 'test')


def test_cells_hold_the_named_items_and_their_labels(test_split):
    images, labels = test_split
    data = build(split='test', grid=2, num_mosaics=50)
    assert len(data) == 50
    for i in range(50):
        info = data.get_data_info(i)
        assert info['img'].shape == (56, 56) and info['img'].dtype == np.uint8
        items = info['cell_items']
        assert info['gt_label'].tolist() == labels[items].tolist()
        for cell, item in enumerate(items):
            row, col = divmod(cell, 2)
            tile = info['img'][28 * row:28 * (row + 1),
                               28 * col:28 * (col + 1)]
            assert np.array_equal(tile, images[item])


def test_mosaics_are_fixed_per_index_and_seed():
    first, again = build(num_mosaics=200), build(num_mosaics=200)
    longer = build(num_mosaics=1000)
    other_seed = build(num_mosaics=200, seed=1)
    for i in (0, 17, 199):
        a = first.get_data_info(i)
        assert np.array_equal(a['img'], again.get_data_info(i)['img'])
        # Row i does not depend on how many mosaics the table has.
        assert np.array_equal(a['cell_items'],
                              longer.get_data_info(i)['cell_items'])
    items = np.stack(
        [first.get_data_info(i)['cell_items'] for i in range(200)])
    others = np.stack(
        [other_seed.get_data_info(i)['cell_items'] for i in range(200)])
    assert (items != others).mean() > 0.99


def test_training_mosaics_come_from_the_training_items():
    train, test = build(split='train'), build(split='test')
    assert (len(train), len(test)) == (60000, 10000)
    train_items = np.stack(
        [train.get_data_info(i)['cell_items'] for i in range(2000)])
    test_items = np.stack(
        [test.get_data_info(i)['cell_items'] for i in range(2000)])
    assert train_items.max() >= 10000  # only the training split has these
    assert test_items.max() < 10000
    # Independent tables: the two splits do not share a pattern of draws.
    assert not np.array_equal(train_items % 10000, test_items)
    # The items are drawn uniformly: every class fills every cell.
    cells = test.get_gt_labels()
    assert cells.shape == (10000, 4)
    counts = np.stack(
        [np.bincount(cells[:, c], minlength=10) for c in range(4)])
    assert counts.min() > 850 and counts.max() < 1150


def test_grid_and_indices_shape_the_dataset():
    data = build(split='test', grid=3, num_mosaics=20, indices=5)
    assert len(data) == 5 and data.image_shape == (84, 84)
    assert data.get_data_info(4)['img'].shape == (84, 84)
    assert data.get_gt_labels().shape == (5, 9)
    assert data.get_cat_ids(0) == sorted(set(data.get_gt_labels()[0]))


def test_a_sample_goes_through_packinputs_with_its_cell_labels():
    data = build(
        split='test', num_mosaics=3, pipeline=[dict(type='PackInputs')])
    sample = data[1]
    assert sample['inputs'].shape == (1, 56, 56)
    assert sample['data_samples'].gt_label.tolist() == \
        data.get_data_info(1)['gt_label'].tolist()


@pytest.mark.parametrize('kwargs,error,words', [
    (dict(grid=0), ValueError, 'grid'),
    (dict(grid=2.0), TypeError, 'grid'),
    (dict(num_mosaics=0), ValueError, 'num_mosaics'),
    (dict(seed=-1), ValueError, 'seed'),
    (dict(split='val'), ValueError, 'split'),
    (dict(data_root=3), TypeError, 'data_root'),
    (dict(data_prefix='x'), TypeError, 'data_prefix'),
    (dict(indices=0), ValueError, 'indices=0'),
    (dict(num_mosaics=10, indices=[3, 12]), ValueError, 'out of range'),
])
def test_bad_arguments_are_refused_by_name(kwargs, error, words):
    with pytest.raises(error, match=words):
        build(**kwargs)


def test_a_missing_folder_says_how_to_get_the_data(tmp_path):
    with pytest.raises(FileNotFoundError, match='apt-get install'):
        build(data_root=str(tmp_path))


# ----------------------------------------------------------------------------
# The probes
# ----------------------------------------------------------------------------
def test_presence_and_balanced_accuracy_match_their_definitions():
    rng = np.random.default_rng(0)
    cells = rng.integers(0, 10, size=(300, 4))
    found = mosaic.presence(torch.as_tensor(cells), 10).numpy()
    expected = np.array([[c in row for c in range(10)] for row in cells])
    assert np.array_equal(found, expected)
    truth = torch.as_tensor(rng.random(500) < 0.3)
    predicted = torch.as_tensor(rng.random(500) < 0.4)
    t, p = truth.numpy(), predicted.numpy()
    tpr = (p & t).sum() / t.sum()
    tnr = (~p & ~t).sum() / (~t).sum()
    assert mosaic.balanced_accuracy(predicted,
                                    truth) == pytest.approx(50 * (tpr + tnr))


def test_principal_components_match_numpy_svd():
    x = torch.randn(
        400, 6, dtype=torch.float64) @ torch.diag(
            torch.tensor([5., 3., 2., 1., .5, .1], dtype=torch.float64))
    mean, components, variances = mosaic.principal_components(x)
    centred = (x - x.mean(0)).numpy()
    _, singular, vt = np.linalg.svd(centred, full_matrices=False)
    np.testing.assert_allclose(
        variances.numpy(), singular**2 / 400, rtol=1e-10)
    coords = mosaic.project(x, mean, components, 3).numpy()
    reference = centred @ vt[:3].T
    # Components are defined up to sign.
    np.testing.assert_allclose(np.abs(coords), np.abs(reference), atol=1e-9)


def synthetic_cells(n, seed):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 10, (n, 4), generator=generator)


def one_hot_features(cells, noise, seed):
    """Each cell's class one-hot in its own 10 coordinates, plus noise."""
    generator = torch.Generator().manual_seed(seed)
    code = F.one_hot(cells, 10).reshape(len(cells), 40).double()
    return code + noise * torch.randn(
        len(cells), 40, generator=generator, dtype=torch.float64)


def test_cell_probes_are_the_linear_probe_of_each_cell():
    train_cells, test_cells = synthetic_cells(600, 0), synthetic_cells(300, 1)
    train_x = one_hot_features(train_cells, 1.0, 2)
    test_x = one_hot_features(test_cells, 1.0, 3)
    per_cell = mosaic.cell_probe_top1(train_x, train_cells, test_x, test_cells,
                                      10, 1e-4)
    for c in range(4):
        probe = fit_linear_probe(train_x, train_cells[:, c], 10, 1e-4)
        expected = (probe.logits(test_x).argmax(1)
                    == test_cells[:, c]).double().mean().item() * 100
        assert per_cell[c] == pytest.approx(expected)


def test_whitened_probe_equals_the_probe_of_numpy_whitened_features():
    train_cells, test_cells = synthetic_cells(500, 4), synthetic_cells(200, 5)
    train_x = one_hot_features(train_cells, 0.8, 6)
    test_x = one_hot_features(test_cells, 0.8, 7)
    mean, components, _ = mosaic.principal_components(train_x)
    ours = mosaic.cell_probe_top1(
        mosaic.project(train_x, mean, components, 40), train_cells,
        mosaic.project(test_x, mean, components, 40), test_cells, 10, 1e-4)
    # numpy's whitening: rotate onto the covariance eigenvectors.
    x = train_x.numpy()
    _, vectors = np.linalg.eigh(np.cov(x, rowvar=False, bias=True))
    rotate = (lambda z: torch.as_tensor((z - x.mean(0)) @ vectors))
    reference = mosaic.cell_probe_top1(
        rotate(x), train_cells, rotate(test_x.numpy()), test_cells, 10, 1e-4)
    np.testing.assert_allclose(ours, reference, atol=0.51)  # <= 1 image


def test_lowshot_draws_are_fixed_by_the_seed_and_differ_between_draws():
    cells = synthetic_cells(400, 8)
    x = one_hot_features(cells, 2.0, 9)
    first = mosaic.lowshot_cell_top1(x, cells, x, cells, 10, 2, 3, 4, 1e-4)
    again = mosaic.lowshot_cell_top1(x, cells, x, cells, 10, 2, 3, 4, 1e-4)
    one_draw = mosaic.lowshot_cell_top1(x, cells, x, cells, 10, 2, 3, 1, 1e-4)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, one_draw)


def test_readings_tell_local_from_global_information():
    """Features that keep each cell's class (local) read well per cell;
    features that keep only which classes occur (the sum of the cells'
    one-hots, the same wherever the items sit) read well globally and
    poorly per cell."""
    train_cells, test_cells = synthetic_cells(2000,
                                              10), synthetic_cells(1000, 11)
    local = [
        one_hot_features(cells, 0.3, seed)
        for cells, seed in ((train_cells, 12), (test_cells, 13))
    ]
    global_only = [
        F.one_hot(cells, 10).sum(1).double() +
        0.3 * torch.randn(len(cells), 10, dtype=torch.float64)
        for cells in (train_cells, test_cells)
    ]
    read_local = mosaic.mosaic_metrics(
        local[0],
        train_cells,
        local[1],
        test_cells,
        seed=0,
        draws=2,
        pca_dims=(2, 40))
    read_global = mosaic.mosaic_metrics(
        global_only[0],
        train_cells,
        global_only[1],
        test_cells,
        seed=0,
        draws=2,
        pca_dims=(2, 10))
    assert read_local['cell_linear_top1'] > 85
    assert read_local['pca40_cell_linear_top1'] > \
        read_local['pca2_cell_linear_top1'] + 50
    # Knowing which classes occur, a cell's class is a guess among them.
    assert read_global['cell_linear_top1'] < 45
    assert read_global['presence_balanced_top1'] > 95
    assert read_local['presence_balanced_top1'] > 70
    assert {'cell0_linear_top1', 'cell_lowshot10_top1', 'repr/erank_cov'
            } <= set(read_local)


# ----------------------------------------------------------------------------
# CellClsHead
# ----------------------------------------------------------------------------
def test_cell_head_loss_is_the_mean_cross_entropy_of_the_cells():
    torch.manual_seed(0)
    head = MODELS.build(
        dict(type='CellClsHead', num_cells=4, num_classes=10, in_channels=8))
    feats = torch.randn(3, 8)
    cells = torch.randint(0, 10, (3, 4))
    samples = [DataSample().set_gt_label(row) for row in cells]
    loss = head.loss((feats, ), samples)['loss']
    scores = head.fc(feats).view(3, 4, 10)
    expected = F.cross_entropy(scores.reshape(12, 10), cells.reshape(12))
    assert torch.allclose(loss, expected)
    predictions = head.predict((feats, ))
    assert predictions[0].pred_label.tolist() == \
        scores[0].argmax(-1).tolist()
    with pytest.raises(ValueError, match=r'one class per cell'):
        head.loss((feats, ), [DataSample().set_gt_label(2)] * 3)


@pytest.mark.parametrize('kwargs,name', [
    (dict(num_cells=0, num_classes=10, in_channels=8), 'num_cells'),
    (dict(num_cells=4, num_classes=1, in_channels=8), 'num_classes'),
    (dict(num_cells=4, num_classes=10, in_channels=0), 'in_channels'),
])
def test_cell_head_refuses_bad_sizes_by_name(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MODELS.build(dict(type='CellClsHead', **kwargs))


# ----------------------------------------------------------------------------
# Configs through their own pipelines, and the comparison protocol
# ----------------------------------------------------------------------------
@pytest.mark.parametrize('name', [
    'mae_mosaic.py', 'umae_mosaic.py', 'mmae_mosaic.py', 'simclr_mosaic.py',
    'supervised_mosaic.py'
])
def test_mosaic_config_trains_through_its_pipeline(name, tmp_path):
    cfg = Config.fromfile(os.path.join(MOSAIC_CONFIGS, name))
    cfg.merge_from_dict({
        'train_dataloader.batch_size': 8,
        'train_dataloader.num_workers': 0,
        'train_dataloader.persistent_workers': False,
        'train_dataloader.dataset.indices': 16,
        'train_cfg.max_epochs': 1,
        'default_hooks.checkpoint.interval': 100,
        'default_hooks.logger.interval': 1,
    })
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    # The cells stay whole: 28-pixel cells, patches that divide them.
    assert 28 % cfg.patch_size == 0 and cfg.img_size == 28 * cfg.grid
    runner.train()
    assert runner.iter == 2
    loss = runner.message_hub.get_scalar('train/loss').current()
    assert np.isfinite(loss)


def mosaic_comparison(protocol):
    arms = (Arm('mae', 'configs/fashion_mnist_mosaic/mae_mosaic.py'),
            Arm('init', 'random'))
    return Comparison(arms, 'mae', (0, ), 1, (1, ), protocol)


def test_the_mosaic_protocol_is_recorded_and_old_specs_read_as_frozen():
    spec = mosaic_comparison(
        Protocol(
            'configs/fashion_mnist_mosaic/features_mosaic.py',
            poolings=('cls', 'mean'),
            shots=(10, ),
            evaluation='mosaic'))
    data = json.loads(json.dumps(spec.as_dict()))
    assert Comparison.from_dict(data) == spec
    del data['protocol']['evaluation']  # recorded before the field existed
    assert Comparison.from_dict(data).protocol.evaluation == 'frozen'


@pytest.mark.parametrize('protocol,words', [
    (Protocol('x.py', evaluation='nope'), 'evaluation must be one of'),
    (Protocol(None, test_configs=(('t', 'x.py'), ),
              evaluation='mosaic'), 'needs an evaluation config'),
])
def test_a_bad_mosaic_protocol_is_refused(protocol, words):
    with pytest.raises(ValueError, match=words):
        mosaic_comparison(protocol)
