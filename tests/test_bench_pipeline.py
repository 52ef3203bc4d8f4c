"""dev/benchmarks/bench_pipeline.py: the paths it times do what they
claim (shapes, crop boxes) and a tiny run
reports every path side by side."""
import json

import pytest
import torch
from _helpers_scripts import load_script
from PIL import Image


@pytest.fixture(scope='module')
def bench():
    return load_script('dev/benchmarks/bench_pipeline.py')


@pytest.fixture(scope='module')
def jpegs(bench, tmp_path_factory):
    return bench.write_jpegs(str(tmp_path_factory.mktemp('jpegs')), 3)


def test_written_jpegs_are_imagenet_sized(jpegs):
    assert len(jpegs['paths']) == 3
    for path in jpegs['paths']:
        with Image.open(path) as image:
            assert image.format == 'JPEG'
            width, height = image.size
        assert 375 <= width <= 563 and 310 <= height <= 464
    # Photograph-like entropy: tens of KB, not a few.
    assert 40 < jpegs['mean_kilobytes'] < 250


def test_every_cpu_path_gives_a_224_crop(bench, jpegs):
    paths = bench.build_paths(
        ['recipe', 'recipe_pil_decode', 'torchvision_cpu'])
    assert paths['recipe'].steps == [
        'LoadImageFromFile', 'RandomResizedCrop', 'RandomFlip', 'PackInputs'
    ]
    for path in jpegs['paths']:
        for name in ('recipe', 'recipe_pil_decode'):
            packed = paths[name](path)['inputs']
            assert packed.shape == (3, 224, 224) and \
                packed.dtype == torch.uint8
        out = paths['torchvision_cpu'](path)
        assert out.shape == (3, 224, 224) and out.dtype == torch.uint8


def test_tiny_run_reports_the_paths_side_by_side(bench, tmp_path, capsys):
    out = tmp_path / 'pipeline.json'
    result = bench.main(['--images', '2', '--rounds', '1', '--out', str(out)])
    assert set(result['paths']) == set(bench.PATHS)
    for row in result['paths'].values():
        assert row['images_per_s_cpu'] > 0 and row['cores_per_gpu'] > 0
    assert result['paths']['recipe']['speed_over_recipe'] == 1.0
    assert json.loads(out.read_text())['rounds'] == 1
    printed = capsys.readouterr().out
    assert '| torchvision_cpu |' in printed and 'load average' in printed
