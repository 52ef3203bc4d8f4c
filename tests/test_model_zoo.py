"""The plugin's entries in mmpretrain's model zoo; the mmae-zoo:// scheme."""
import os
import pickle

import mmpretrain
import pytest
import torch
from mmengine.config import Config
from mmengine.runner import load_checkpoint
from mmpretrain.apis import ModelHub

import mmae_plugin.registration  # noqa: F401  (registers the model index)
from mmae_plugin.checkpoint.integrity import (CorruptCheckpointError,
                                              checkpoint_problem, file_sha256,
                                              sidecar_path)
from mmae_plugin.download import download_entries, download_entry
from mmae_plugin.download import main as download_main
from mmae_plugin.evaluation import extract_features, fit_linear_probe
from mmae_plugin.evaluation.frozen import build_model, linear_probe_state_dict
from mmae_plugin.model_zoo import (DIGEST_FIELD, UNPUBLISHED, ZOO_DIR_ENV,
                                   ZOO_SCHEME, recorded_digests)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINEAR = 'mmae_vit-tiny-p4_fmnist_linear'
IMAGENET_ENTRIES = {
    'mmae_vit-base_200e_linear-90e': 62.4,
    'mmae_vit-base_200e_finetune-100e': 83.1,
    'mmae_vit-large_200e_linear-90e': 66.0,
    'mmae_vit-large_200e_finetune-100e': 84.3,
    'umae_vit-base_200e_linear-90e': 58.5,
    'mae_vit-base_200e_linear-90e': 55.4,
}


def test_list_models_finds_the_plugin_entries():
    names = set(mmpretrain.list_models('*mmae*'))
    assert {'mmae_vit-base_200e', 'mmae_vit-large_200e'} <= names
    for name, top1 in IMAGENET_ENTRIES.items():
        metainfo = ModelHub.get(name)
        assert metainfo.results[0].metrics['Top 1 Accuracy'] == top1
        assert 'paper' in metainfo.metadata.data['Results Source']
        # Weightless entries point at the refusing URL (see the next test).
        assert metainfo.weights == UNPUBLISHED + name


def test_get_model_pretrained_true_without_weights_names_entry_and_fix():
    name = 'mmae_vit-base_200e'
    with pytest.raises(ValueError) as error:
        mmpretrain.get_model(name, pretrained=True)
    message = str(error.value)
    assert f"model-zoo entry '{name}' has no published weights" in message
    assert f"get_model('{name}', pretrained=False)" in message
    assert "pretrained='path/to/checkpoint.pth'" in message
    # mmpretrain's own entries keep their URLs and mmpretrain's behaviour.
    assert ModelHub.get('resnet18_8xb16_cifar10').weights.startswith(
        'https://')


def test_get_model_builds_the_imagenet_recipe():
    model = mmpretrain.get_model('mmae_vit-base_200e')
    assert type(model).__name__ == 'MMAE'
    assert model.regularizer.loss_weight == pytest.approx(0.01 / 8)


class Payload:

    def __reduce__(self):
        return (os.system, ('touch /tmp/mmae_zoo_pwned', ))


def test_zoo_scheme_missing_checkpoint_names_the_build_command(
        tmp_path, monkeypatch):
    monkeypatch.setenv(ZOO_DIR_ENV, str(tmp_path))
    model = torch.nn.Linear(2, 2)
    with pytest.raises(FileNotFoundError, match='dev/export_zoo.py'):
        load_checkpoint(model, 'mmae-zoo://fmnist/not_built_yet.pth')
    with pytest.raises(ValueError, match='relative path'):
        load_checkpoint(model, 'mmae-zoo://../outside.pth')


def test_zoo_scheme_refuses_unrecorded_and_crafted_files(
        tmp_path, monkeypatch):
    """A file no metafile records, even a valid one, is refused; a payload
    under a recorded name is refused by its digest; nothing runs."""
    monkeypatch.setenv(ZOO_DIR_ENV, str(tmp_path))
    marker = '/tmp/mmae_zoo_pwned'
    if os.path.exists(marker):
        os.remove(marker)
    model = torch.nn.Linear(2, 2)
    torch.save({'state_dict': model.state_dict()}, tmp_path / 'good.pth')
    with pytest.raises(
            ValueError,
            match='mmae-zoo://good.pth .* is not a '
            "file of the plugin's model zoo: no metafile records"):
        load_checkpoint(model, 'mmae-zoo://good.pth')
    (tmp_path / 'fmnist').mkdir()
    with open(tmp_path / 'fmnist' / f'{LINEAR}.pth', 'wb') as f:
        pickle.dump({'state_dict': Payload()}, f)
    with pytest.raises(CorruptCheckpointError, match='is damaged'):
        load_checkpoint(model, f'mmae-zoo://fmnist/{LINEAR}.pth')
    assert not os.path.exists(marker)


@pytest.mark.parametrize('knn_config,linear_config,pooling', [
    ('knn_fmnist.py', 'linear_fmnist.py', 'cls'),
    ('knn_fmnist_clsmean.py', 'linear_fmnist_clsmean.py', 'cls+mean'),
])
def test_cached_probe_becomes_the_linear_config_exactly(
        knn_config, linear_config, pooling):
    """The exported probe predicts in the linear config what it predicted."""
    from mmengine.registry import init_default_scope
    init_default_scope('mmpretrain')
    torch.manual_seed(0)
    knn_cfg = Config.fromfile(f'configs/fashion_mnist/{knn_config}')
    assert knn_cfg.model.pooling == pooling
    knn_cfg.merge_from_dict({
        'model.prototype.dataset.indices': 300,
        'model.prototype.num_workers': 0,
        'test_dataloader.dataset.indices': 100,
        'test_dataloader.num_workers': 0,
        'test_dataloader.persistent_workers': False
    })
    encoder = build_model(knn_cfg)
    encoder.init_weights()
    train_x, train_y = extract_features(encoder, knn_cfg.model.prototype)
    test_x, _ = extract_features(encoder, knn_cfg.test_dataloader)
    probe = fit_linear_probe(train_x, train_y, 10, weight_decay=1e-2)

    linear_cfg = Config.fromfile(f'configs/fashion_mnist/{linear_config}')
    linear_cfg.model.backbone.init_cfg = None
    classifier = mmpretrain.get_model(linear_cfg)
    missing = classifier.load_state_dict(
        linear_probe_state_dict(probe, encoder.image_encoder.state_dict(),
                                pooling),
        strict=True)
    assert not missing.missing_keys and not missing.unexpected_keys
    inputs = []
    from mmengine.runner import Runner
    for batch in Runner.build_dataloader(knn_cfg.test_dataloader):
        inputs.append(classifier.data_preprocessor(batch, False)['inputs'])
    with torch.no_grad():
        logits = classifier(torch.cat(inputs), mode='tensor')
    torch.testing.assert_close(
        logits, probe.logits(test_x).float(), atol=1e-4, rtol=1e-4)


def test_shipped_fmnist_linear_entry_reproduces_its_recorded_accuracy(
        tmp_path):
    """get_model(..., pretrained=True) through mmae-zoo://, on the test set."""
    import numpy as np
    from mmengine.runner import Runner
    from PIL import Image
    name = 'mmae_vit-tiny-p4_fmnist_linear'
    recorded = ModelHub.get(name).results[0].metrics['Top 1 Accuracy']
    model = mmpretrain.get_model(name, pretrained=True)
    assert model._dataset_meta['classes'][0] == 'T-shirt/top'
    cfg = model._config
    cfg.test_dataloader.num_workers = 0
    cfg.test_dataloader.persistent_workers = False
    correct = total = 0
    with torch.no_grad():
        for batch in Runner.build_dataloader(cfg.test_dataloader):
            for sample in model.test_step(batch):
                correct += int(sample.pred_label == sample.gt_label)
                total += 1
    assert total == 10000
    assert 100 * correct / total == pytest.approx(recorded, abs=0.006)
    # The README's inferencer call on one test image (a grey PNG file).
    import mmcv
    from mmpretrain.registry import DATASETS
    sample = DATASETS.build(cfg.test_dataloader.dataset)[0]
    Image.fromarray(sample['inputs'].squeeze(0).numpy().astype(np.uint8)).save(
        tmp_path / 'image.png')
    image = mmcv.imread(str(tmp_path / 'image.png'), flag='grayscale')
    result = mmpretrain.ImageClassificationInferencer(model)(image)[0]
    with torch.no_grad():
        expected = model.test_step(
            dict(
                inputs=[sample['inputs']],
                data_samples=[sample['data_samples']]))
    assert result['pred_label'] == int(expected[0].pred_label)
    assert result['pred_class'] == \
        model._dataset_meta['classes'][result['pred_label']]


def test_download_copies_checkpoint_and_config_as_mim_download_would(tmp_path):
    """``python -m mmae_plugin.download``: the files rebuild the zoo model."""
    name = 'mmae_vit-tiny-p4_fmnist_linear'
    config_path, checkpoint_path = download_entry(name, str(tmp_path))
    assert (config_path, checkpoint_path) == (str(tmp_path / f'{name}.py'),
                                              str(tmp_path / f'{name}.pth'))
    from mmae_plugin.model_zoo import resolve_zoo_checkpoint
    with open(resolve_zoo_checkpoint(ModelHub.get(name).weights), 'rb') as f:
        assert (tmp_path / f'{name}.pth').read_bytes() == f.read()
    from_files = mmpretrain.get_model(config_path, pretrained=checkpoint_path)
    from_zoo = mmpretrain.get_model(name, pretrained=True)
    expected = from_zoo.state_dict()
    got = from_files.state_dict()
    assert got.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0)


def test_download_of_weightless_and_foreign_entries(tmp_path, capsys):
    written = download_entry('mmae_vit-base_200e', str(tmp_path / 'a'))
    assert written == [str(tmp_path / 'a' / 'mmae_vit-base_200e.py')]
    assert Config.fromfile(written[0]).model.type == 'MMAE'
    assert 'no published weights' in capsys.readouterr().out
    assert download_main(
        ['resnet18_8xb16_cifar10', '--dest',
         str(tmp_path / 'b')]) == 1
    err = capsys.readouterr().err
    assert 'not an mmae_plugin model-zoo entry' in err
    assert 'mim download mmpretrain --config resnet18_8xb16_cifar10' in err
    assert not (tmp_path / 'b').exists()


def test_feature_pass_progress_bar_is_labelled(capsys):
    """evaluate_frozen.py's bars: each after a line naming what it counts."""
    from mmengine.registry import init_default_scope
    init_default_scope('mmpretrain')
    cfg = Config.fromfile('configs/fashion_mnist/knn_fmnist.py')
    cfg.merge_from_dict({
        'test_dataloader.dataset.indices': 30,
        'test_dataloader.num_workers': 0,
        'test_dataloader.persistent_workers': False
    })
    encoder = build_model(cfg)
    features, labels = extract_features(
        encoder, cfg.test_dataloader, progress=True, label='test images')
    assert features.shape[0] == labels.shape[0] == 30
    out = capsys.readouterr().out
    assert out.startswith('features of 30 test images:\n')
    assert '30/30' in out
    extract_features(encoder, cfg.test_dataloader)
    assert capsys.readouterr().out == ''


# --------------------------------------------------------------------------
# Every entry with weights, through its documented command
# --------------------------------------------------------------------------
#: ``MMAE_TEST_ZOO=1`` runs the kNN entries' reproductions: each is
#: ``tools/test.py <config> <checkpoint>`` over all 60,000 + 10,000 images,
#: about 2.5 minutes of two CPU cores per entry, too long for every run.
ZOO_MODE = os.environ.get('MMAE_TEST_ZOO', '0') == '1'
#: The entries whose recorded number is reproduced below (a new entry with
#: results must be added here, and so gets its test).
KNN_ENTRIES = [
    'mae_vit-tiny-p4_fmnist_knn', 'umae_vit-tiny-p4_fmnist_knn',
    'mmae_vit-tiny-p4_fmnist_knn'
]
LINEAR_ENTRIES = ['mmae_vit-tiny-p4_fmnist_linear']


def plugin_entries_with_weights():
    """``{name: metainfo}`` of the plugin's entries that ship weights."""
    from mmae_plugin.model_zoo import ZOO_SCHEME
    return {
        name: info
        for name, info in ModelHub._models_dict.items()
        if (info.weights or '').startswith(ZOO_SCHEME)
        and not info.weights.startswith(UNPUBLISHED)
    }


def test_every_entry_with_weights_and_results_has_a_reproduction_test():
    with_results = sorted(
        name for name, info in plugin_entries_with_weights().items()
        if info.results)
    assert with_results == sorted(KNN_ENTRIES + LINEAR_ENTRIES)


def test_encoder_entries_load_strictly_into_their_pretraining_config():
    """The entries without a number: their weights are their config's."""
    from mmae_plugin.model_zoo import resolve_zoo_checkpoint
    encoders = sorted(name
                      for name, info in plugin_entries_with_weights().items()
                      if not info.results)
    assert encoders == [
        'mae_vit-tiny-p4_fmnist', 'mmae_vit-tiny-p4_fmnist',
        'umae_vit-tiny-p4_fmnist'
    ]
    for name in encoders:
        model = mmpretrain.get_model(name)
        state = torch.load(
            resolve_zoo_checkpoint(ModelHub.get(name).weights),
            map_location='cpu',
            weights_only=True)
        result = model.load_state_dict(state['state_dict'], strict=True)
        assert not result.missing_keys and not result.unexpected_keys


@pytest.mark.skipif(
    not ZOO_MODE,
    reason='full-dataset kNN reproduction: '
    'run with MMAE_TEST_ZOO=1 (about 2.5 min per entry)')
@pytest.mark.parametrize('name', KNN_ENTRIES)
def test_knn_entry_reproduces_its_number_through_tools_test(name, tmp_path):
    """``python tools/test.py <Config> <checkpoint>``, the command the
    README documents, gives the recorded kNN accuracy to the hundredth."""
    import json
    import subprocess
    import sys

    from mmae_plugin.model_zoo import resolve_zoo_checkpoint
    metainfo = ModelHub.get(name)
    recorded = metainfo.results[0].metrics['Top 1 Accuracy']
    # The metafile's Config and Weights, as the README spells them.
    config = 'configs/' + metainfo.config.filename.split('/configs/', 1)[1]
    checkpoint = resolve_zoo_checkpoint(metainfo.weights)
    out = tmp_path / 'metrics.json'
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = subprocess.run([
        sys.executable, 'tools/test.py', config, checkpoint, '--work-dir',
        str(tmp_path / 'work'), '--out',
        str(out), '--out-item', 'metrics'
    ],
                            cwd=repo,
                            capture_output=True,
                            text=True,
                            timeout=1800)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads(out.read_text())
    assert metrics['accuracy/top1'] == pytest.approx(recorded, abs=0.005)


# --------------------------------------------------------------------------
# The zoo's SHA-256s: recorded in the metafiles, checked on every load
# --------------------------------------------------------------------------
def test_every_shipped_metafile_digest_matches_its_shipped_file():
    """A checkpoint changed without its metafile's digest fails here."""
    digests = recorded_digests()
    entries = plugin_entries_with_weights()
    assert entries, 'no entry with weights registered'
    for name, info in entries.items():
        assert DIGEST_FIELD in info.metadata.data, name
        file = info.weights[len(ZOO_SCHEME):]
        assert name in digests[file].entries
    for file, recorded in digests.items():
        shipped = os.path.join(REPO, 'checkpoints', file)
        assert file_sha256(shipped) == recorded.sha256, (
            f'{shipped} changed: record its new SHA-256 as {DIGEST_FIELD} in '
            f'{recorded.metafile} ({", ".join(recorded.entries)})')
    assert sorted(digests) == sorted(
        f'fmnist/{name}'
        for name in os.listdir(os.path.join(REPO, 'checkpoints', 'fmnist')))


def flip_tensor_bytes(path, count=64):
    """Invert ``count`` bytes in the middle of the largest tensor record.

    The zip headers and the pickle stay intact, so ``torch.load`` reads
    the file without complaint (it does not check the CRC-32s).
    """
    import zipfile
    with zipfile.ZipFile(path) as archive:
        info = max((i for i in archive.infolist() if '/data/' in i.filename),
                   key=lambda i: i.file_size)
    with open(path, 'r+b') as f:
        f.seek(info.header_offset + 26)
        name_length, extra_length = (
            int.from_bytes(f.read(2), 'little') for _ in range(2))
        start = info.header_offset + 30 + name_length + extra_length + \
            info.file_size // 2
        f.seek(start)
        flipped = bytes(b ^ 0xFF for b in f.read(count))
        f.seek(start)
        f.write(flipped)


@pytest.fixture
def flipped_zoo(tmp_path, monkeypatch):
    """A zoo root holding a copy of the linear entry's file, bytes flipped."""
    root = tmp_path / 'zoo'
    (root / 'fmnist').mkdir(parents=True)
    path = root / 'fmnist' / f'{LINEAR}.pth'
    path.write_bytes(
        open(
            os.path.join(REPO, 'checkpoints', 'fmnist', f'{LINEAR}.pth'),
            'rb').read())
    flip_tensor_bytes(path)
    monkeypatch.setenv(ZOO_DIR_ENV, str(root))
    return path


def assert_refused_by_name(message, path):
    assert f'model-zoo checkpoint mmae-zoo://fmnist/{LINEAR}.pth ({path}) ' \
        'is damaged' in message
    assert f'records for {LINEAR}' in message
    assert 'Restore the file' in message and ZOO_DIR_ENV in message


def test_flipped_zoo_file_is_refused_by_get_model_and_zoo_scheme(flipped_zoo):
    # Control: the damage is one torch.load does not notice, and the same
    # file by local path is refused by the checkpoint verification.
    state = torch.load(flipped_zoo, map_location='cpu', weights_only=True)
    assert 'state_dict' in state
    assert 'CRC' in checkpoint_problem(str(flipped_zoo))
    with pytest.raises(CorruptCheckpointError) as error:
        mmpretrain.get_model(LINEAR, pretrained=True)
    assert_refused_by_name(str(error.value), flipped_zoo)
    with pytest.raises(CorruptCheckpointError) as error:
        load_checkpoint(
            torch.nn.Linear(2, 2), f'mmae-zoo://fmnist/{LINEAR}.pth')
    assert_refused_by_name(str(error.value), flipped_zoo)


def test_flipped_zoo_file_is_refused_by_download(flipped_zoo, tmp_path,
                                                 capsys):
    dest = tmp_path / 'dl'
    assert download_main([LINEAR, '--dest', str(dest)]) == 1
    err = capsys.readouterr().err
    assert_refused_by_name(err, flipped_zoo)
    assert len(err.strip().splitlines()) == 1
    assert not dest.exists(), 'nothing is written for a damaged source'


# --------------------------------------------------------------------------
# python -m mmae_plugin.download: what it refuses, and --force
# --------------------------------------------------------------------------
def shipped_bytes(name=LINEAR):
    with open(
            os.path.join(REPO, 'checkpoints', 'fmnist', f'{name}.pth'),
            'rb') as f:
        return f.read()


def download_refused(argv, capsys, *phrases):
    """Run the command; it answers exit 2 and one line with ``phrases``."""
    assert download_main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith('python -m mmae_plugin.download: error: ')
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def test_download_writes_a_sidecar_the_checkpoint_check_accepts(tmp_path):
    config, checkpoint = download_entry(LINEAR, str(tmp_path))
    sidecar = sidecar_path(checkpoint)
    assert open(sidecar).read() == \
        f'{file_sha256(checkpoint)}  {LINEAR}.pth\n'
    assert checkpoint_problem(checkpoint) is None


def test_download_refuses_to_overwrite_and_force_replaces_with_fresh_sidecar(
        tmp_path, capsys):
    dest = tmp_path / 'dl'
    dest.mkdir()
    # Another, intact checkpoint with its own sidecar (both names).
    old = dest / f'{LINEAR}.pth'
    torch.save({'state_dict': {'x': torch.ones(3)}}, old)
    from mmae_plugin.checkpoint.integrity import write_sidecar
    write_sidecar(str(old))
    (dest / f'{LINEAR}.pth.sha256'
     ).write_text(f'{file_sha256(str(old))}  {LINEAR}.pth\n')
    before = old.read_bytes()
    download_refused([LINEAR, '--dest', str(dest)], capsys,
                     f'{old} exists; refusing to overwrite it (pass --force)')
    assert old.read_bytes() == before
    assert not (dest / f'{LINEAR}.py').exists(), 'all checked before writing'
    assert download_main([LINEAR, '--dest', str(dest), '--force']) == 0
    assert old.read_bytes() == shipped_bytes()
    assert not (dest / f'{LINEAR}.pth.sha256').exists(), 'stale 0.2.0 sidecar'
    assert open(sidecar_path(str(old))).read().split()[0] == \
        file_sha256(str(old))
    assert checkpoint_problem(str(old)) is None
    loaded = mmpretrain.get_model(
        str(dest / f'{LINEAR}.py'), pretrained=str(old))
    assert type(loaded).__name__ == 'ImageClassifier'
    # An existing config alone is refused too.
    os.remove(old)
    download_refused([LINEAR, '--dest', str(dest)], capsys,
                     f'{LINEAR}.py exists')


@pytest.mark.parametrize('kind', ['stale', 'fifo', 'dev_zero'])
def test_download_replaces_a_stale_sidecar_of_a_missing_checkpoint(
        tmp_path, kind):
    """A sidecar left without its file would refuse the new copy; a FIFO or
    a link to /dev/zero in its place is replaced, never read."""
    hidden = tmp_path / f'.{LINEAR}.pth.sha256'
    legacy = tmp_path / f'{LINEAR}.pth.sha256'
    if kind == 'stale':
        hidden.write_text(f'{"0" * 64}  {LINEAR}.pth\n')
        legacy.write_text(f'{"0" * 64}  {LINEAR}.pth\n')
    elif kind == 'fifo':
        os.mkfifo(hidden)
        os.mkfifo(legacy)
    else:
        hidden.symlink_to('/dev/zero')
        legacy.symlink_to('/dev/zero')
    # Twice the same name: copied once, not over its own fresh copy.
    written = download_entries([LINEAR, LINEAR], str(tmp_path))
    assert len(written) == 2
    assert checkpoint_problem(written[1]) is None
    assert hidden.is_file() and not hidden.is_symlink()
    assert not os.path.lexists(legacy)


def test_download_never_writes_through_symlinks_without_force(
        tmp_path, capsys):
    victim = tmp_path / 'victim.pth'
    victim.write_bytes(b'precious')
    dest = tmp_path / 'dl'
    dest.mkdir()
    (dest / f'{LINEAR}.pth').symlink_to(victim)
    download_refused([LINEAR, '--dest', str(dest)], capsys,
                     f'{LINEAR}.pth is a symlink (to {victim}); refusing to '
                     'write through it')
    assert download_main([LINEAR, '--dest', str(dest), '--force']) == 0
    assert victim.read_bytes() == b'precious', 'the link target is untouched'
    assert not os.path.islink(dest / f'{LINEAR}.pth')
    assert (dest / f'{LINEAR}.pth').read_bytes() == shipped_bytes()
    # --dest itself a symlink to a folder.
    real = tmp_path / 'real'
    real.mkdir()
    (tmp_path / 'link').symlink_to(real)
    for spelled in (str(tmp_path / 'link'), str(tmp_path / 'link') + '/'):
        download_refused([LINEAR, '--dest', spelled], capsys,
                         f'--dest {spelled} is a symlink (to {real})')
    assert os.listdir(real) == []
    assert download_main([LINEAR, '--dest',
                          str(tmp_path / 'link'), '--force']) == 0
    assert (real / f'{LINEAR}.pth').read_bytes() == shipped_bytes()


def test_download_bad_dest_gets_one_line_and_exit_2(tmp_path, capsys,
                                                    monkeypatch):
    a_file = tmp_path / 'file'
    a_file.write_text('x')
    download_refused([LINEAR, '--dest', str(a_file)], capsys,
                     f'--dest {a_file} is a file, not a folder')
    assert a_file.read_text() == 'x'
    (tmp_path / 'dangling').symlink_to(tmp_path / 'nowhere')
    download_refused([LINEAR, '--dest',
                      str(tmp_path / 'dangling'), '--force'], capsys,
                     'is a dangling symlink')
    # The folder the checkpoints come from, with or without --force, by
    # any spelling.
    zoo = tmp_path / 'zoo'
    (zoo / 'fmnist').mkdir(parents=True)
    source = zoo / 'fmnist' / f'{LINEAR}.pth'
    source.write_bytes(shipped_bytes())
    monkeypatch.setenv(ZOO_DIR_ENV, str(zoo))
    (tmp_path / 'zoolink').symlink_to(zoo / 'fmnist')
    for spelled in (str(zoo / 'fmnist'), str(zoo / 'fmnist' / '..' / 'fmnist'),
                    str(tmp_path / 'zoolink')):
        download_refused([LINEAR, '--dest', spelled, '--force'], capsys,
                         'is the model-zoo folder the checkpoints are copied '
                         'from')
    assert sorted(os.listdir(zoo / 'fmnist')) == [f'{LINEAR}.pth']
    assert source.read_bytes() == shipped_bytes()
    # A folder where the checkpoint or its sidecar goes.
    dest = tmp_path / 'dl'
    (dest / f'.{LINEAR}.pth.sha256').mkdir(parents=True)
    download_refused([LINEAR, '--dest', str(dest), '--force'], capsys,
                     f'.{LINEAR}.pth.sha256 is a folder')
    (dest / f'.{LINEAR}.pth.sha256').rmdir()
    (dest / f'{LINEAR}.pth').mkdir()
    download_refused([LINEAR, '--dest', str(dest), '--force'], capsys,
                     f'{LINEAR}.pth is a folder')


def test_download_command_line_answers_without_traceback(tmp_path):
    """The real ``python -m`` process: one line, exit 2, as argparse."""
    import subprocess
    import sys
    a_file = tmp_path / 'file'
    a_file.write_text('x')
    proc = subprocess.run([
        sys.executable, '-m', 'mmae_plugin.download', LINEAR, '--dest',
        str(a_file)
    ],
                          cwd=REPO,
                          capture_output=True,
                          text=True,
                          timeout=300)
    assert proc.returncode == 2
    assert 'Traceback' not in proc.stderr
    assert f'python -m mmae_plugin.download: error: --dest {a_file} is a ' \
        'file, not a folder' in proc.stderr


@pytest.mark.parametrize('imported_first', ['', 'import mmae_plugin; '])
def test_download_help_suggests_a_command_that_lists_the_entries(
        imported_first, repo_root, capsys):
    """Issue 34 item 7: the suggested command prints the plugin's entries
    whatever was imported before it (it names mmae_plugin.registration)."""
    import ast
    import shlex
    import subprocess
    import sys

    from mmae_plugin.download import LIST_COMMAND, parse_args
    with pytest.raises(SystemExit):
        parse_args(['--help'])
    help_text = capsys.readouterr().out
    assert ' '.join(LIST_COMMAND.split()) in ' '.join(help_text.split())
    code = shlex.split(LIST_COMMAND)[2]
    proc = subprocess.run([sys.executable, '-c', imported_first + code],
                          capture_output=True,
                          text=True,
                          cwd=repo_root,
                          timeout=300)
    names = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    assert LINEAR in names and all('fmnist' in n for n in names)
