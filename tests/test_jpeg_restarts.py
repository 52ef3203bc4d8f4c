"""Restart markers added to a dataset's JPEGs: lossless, resumable, safe.

``jpegtran`` really runs (``libjpeg-turbo-progs``) on small JPEGs written
with Pillow; the outputs are checked against OpenCV's decode of the
sources, and the region decoder's crops of the outputs against OpenCV's
crops of the sources.
"""
import io
import json
import os
import os.path as osp
import shutil
import subprocess
import sys
from typing import Dict, List, Tuple

import cv2
import numpy as np
import pytest
from _helpers_scripts import REPO, load_script
from PIL import Image

from mmae_plugin.datasets.jpeg_restarts import (JPEGTRAN_ARGS, RECORD_NAME,
                                                ForeignFileError,
                                                JpegtranNotFoundError,
                                                add_restarts, convert_tree)
from mmae_plugin.datasets.transforms import jpeg_region

pytestmark = pytest.mark.skipif(
    shutil.which('jpegtran') is None,
    reason='no jpegtran (apt-get install libjpeg-turbo-progs)')

CLI = osp.join('tools', 'dataset_converters', 'add_jpeg_restarts.py')
DRI_1 = b'\xff\xdd\x00\x04\x00\x01'
EXIF_MAKE = 'mmae restart test'
# Photograph-like JPEGs: (relative path, height, width, Pillow options).
JPEGS = [
    ('photo.jpg', 375, 500, dict(subsampling=2, exif=True)),
    ('progressive.jpg', 120, 90, dict(subsampling=2, progressive=True)),
    ('gray.jpg', 64, 48, dict(mode='L')),
    ('n01440764/n01440764_10026.JPEG', 100, 80, dict(subsampling=0)),
    ('odd/tiny.jpg', 29, 37, dict(subsampling=2)),
    ('odd/thin.jpg', 3, 70, dict(subsampling=2)),
]
# Random boxes decoded per converted JPEG: 4:2:0, odd sizes, 4:4:4.
REGION_BOXES = [('photo.jpg', 50), ('odd/tiny.jpg', 10), ('odd/thin.jpg', 10),
                ('n01440764/n01440764_10026.JPEG', 10)]
# Files to copy byte for byte: not JPEGs, or JPEGs jpegtran refuses.
COPIED = [
    'mask.png', 'meta/train.txt', 'meta/empty.txt', 'png_named.jpg',
    'truncated.jpg', 'garbage.jpg'
]


def photograph(height: int, width: int, seed: int) -> np.ndarray:
    """RGB smooth gradients plus noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    image = np.stack([
        255 * x / width, 255 * y / height, 128 + 100 * np.sin((x + 2 * y) / 17)
    ], -1)
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8)


def encode_jpeg(height: int,
                width: int,
                seed: int,
                mode: str = 'RGB',
                exif: bool = False,
                **options) -> bytes:
    """A quality-90 JPEG written with Pillow."""
    image = Image.fromarray(photograph(height, width, seed)).convert(mode)
    if exif:
        tags = Image.Exif()
        tags[0x010F] = EXIF_MAKE  # Make
        options['exif'] = tags.tobytes()
    buffer = io.BytesIO()
    image.save(buffer, 'JPEG', quality=90, **options)
    return buffer.getvalue()


def encode_png(height: int, width: int, seed: int) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(photograph(height, width, seed)).save(buffer, 'PNG')
    return buffer.getvalue()


def write(path: str, data: bytes) -> None:
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open(path, 'wb') as file:
        file.write(data)


def read(path: str) -> bytes:
    with open(path, 'rb') as file:
        return file.read()


def make_tree(root: str) -> str:
    """A small dataset: the JPEGs of :data:`JPEGS` and the files of
    :data:`COPIED`."""
    for seed, (path, height, width, options) in enumerate(JPEGS):
        write(
            osp.join(root, path), encode_jpeg(height, width, seed, **options))
    whole = encode_jpeg(40, 40, 99)
    files = {
        'mask.png': encode_png(20, 30, 7),
        'meta/train.txt': b'n01440764/n01440764_10026.JPEG 0\n',
        'meta/empty.txt': b'',
        'png_named.jpg': encode_png(8, 8, 8),
        'truncated.jpg': whole[:len(whole) // 2],
        'garbage.jpg': b'\xff\xd8 not a JPEG after all',
    }
    for path, data in files.items():
        write(osp.join(root, path), data)
    return root


def tree_files(root: str) -> List[str]:
    """Relative paths of the files under ``root``, the record left out."""
    return sorted(
        osp.relpath(osp.join(folder, name), root)
        for folder, _, names in os.walk(root) for name in names
        if name != RECORD_NAME)


def segments(data: bytes) -> List[Tuple[int, bytes]]:
    """The (marker, payload) segments of a JPEG's header, up to SOS."""
    assert data[:2] == b'\xff\xd8'
    found, offset = [], 2
    while True:
        assert data[offset] == 0xFF, offset
        marker = data[offset + 1]
        length = int.from_bytes(data[offset + 2:offset + 4], 'big')
        found.append((marker, data[offset + 4:offset + 2 + length]))
        if marker == 0xDA:
            return found
        offset += 2 + length


def decode(data: bytes) -> np.ndarray:
    image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    assert image is not None
    return image


def records(dst: str) -> Tuple[Dict, Dict[str, Dict]]:
    """The record's header and its entries by path (all lines valid)."""
    with open(osp.join(dst, RECORD_NAME)) as file:
        lines = [json.loads(line) for line in file.read().splitlines()]
    return lines[0], {entry['path']: entry for entry in lines[1:]}


def check_outputs(src: str, dst: str) -> None:
    """Every output is its source converted (same pixels, DRI = 1) or
    copied byte for byte, as the record says."""
    assert tree_files(dst) == tree_files(src)
    header, entries = records(dst)
    assert header == {'src': osp.abspath(src), 'args': list(JPEGTRAN_ARGS)}
    assert sorted(entries) == tree_files(src)
    for path in tree_files(src):
        source, output = read(osp.join(src, path)), read(osp.join(dst, path))
        entry = entries[path]
        stat = os.stat(osp.join(src, path))
        assert (entry['size'], entry['mtime_ns'],
                entry['out_size']) == (stat.st_size, stat.st_mtime_ns,
                                       len(output)), path
        # Files a test added: converted if they are JPEGs.
        if path in COPIED or not source.startswith(b'\xff\xd8'):
            assert entry['mode'] == 'copied'
            assert output == source, path
        else:
            assert entry['mode'] == 'converted'
            assert DRI_1 in output, path
            np.testing.assert_array_equal(decode(output), decode(source))


@pytest.fixture(scope='module')
def source(tmp_path_factory) -> str:
    return make_tree(str(tmp_path_factory.mktemp('source')))


@pytest.fixture(scope='module')
def converted(source, tmp_path_factory) -> Tuple[str, Dict[str, int]]:
    dst = osp.join(str(tmp_path_factory.mktemp('converted')), 'out')
    return dst, convert_tree(source, dst)


@pytest.fixture
def src(source, tmp_path) -> str:
    """A copy of the source tree that a test may change."""
    return shutil.copytree(source, str(tmp_path / 'src'))


def test_add_restarts_converts_jpegs_only():
    data = encode_jpeg(48, 64, 0, subsampling=2)
    output = add_restarts(data)
    assert DRI_1 in output and DRI_1 not in data
    np.testing.assert_array_equal(decode(output), decode(data))
    assert add_restarts(encode_png(8, 8, 0)) is None
    assert add_restarts(b'') is None
    assert add_restarts(b'\xff\xd8 not a JPEG') is None
    assert add_restarts(data[:len(data) // 2]) is None  # jpegtran warns


def test_a_missing_jpegtran_says_how_to_install_it(tmp_path):
    missing = str(tmp_path / 'no' / 'jpegtran')
    with pytest.raises(JpegtranNotFoundError) as error:
        add_restarts(encode_jpeg(16, 16, 0), jpegtran=missing)
    assert isinstance(error.value, FileNotFoundError)
    assert missing in str(error.value)
    assert 'apt-get install libjpeg-turbo-progs' in str(error.value)
    src = make_tree(str(tmp_path / 'src'))
    with pytest.raises(JpegtranNotFoundError, match='libjpeg-turbo-progs'):
        convert_tree(src, str(tmp_path / 'dst'), jpegtran=missing)
    assert not osp.exists(tmp_path / 'dst')  # checked before writing


def test_the_conversion_is_lossless_and_restarts_every_mcu(source, converted):
    dst, _ = converted
    check_outputs(source, dst)
    for path, *_ in JPEGS:
        before = segments(read(osp.join(source, path)))
        after = segments(read(osp.join(dst, path)))
        assert (0xDD, b'\x00\x01') in after, path
        frames = {marker for marker, _ in after} & {0xC0, 0xC1, 0xC2}
        assert frames and frames <= {0xC0, 0xC1}, path
        if path == 'progressive.jpg':
            assert 0xC2 in {marker for marker, _ in before}
        if path == 'photo.jpg':
            exif = [payload for marker, payload in after if marker == 0xE1]
            assert exif == [
                payload for marker, payload in before if marker == 0xE1
            ]
            assert exif[0].startswith(b'Exif\x00\x00')
            assert EXIF_MAKE.encode() in exif[0]


def test_counts_and_sizes(source, converted):
    dst, counts = converted
    sizes_in = sum(
        osp.getsize(osp.join(source, p)) for p in tree_files(source))
    sizes_out = sum(osp.getsize(osp.join(dst, p)) for p in tree_files(dst))
    assert counts == {
        'converted': len(JPEGS),
        'copied': len(COPIED),
        'skipped': 0,
        'bytes_in': sizes_in,
        'bytes_out': sizes_out
    }
    # -optimize more than pays for the markers on a photograph.
    photo = [
        osp.getsize(osp.join(root, 'photo.jpg')) for root in (source, dst)
    ]
    assert photo[1] < photo[0]


def test_a_rerun_skips_everything(source, converted):
    dst, counts = converted
    again = convert_tree(source, dst)
    assert again == dict(
        counts, converted=0, copied=0, skipped=len(JPEGS) + len(COPIED))
    check_outputs(source, dst)


def test_a_rerun_redoes_exactly_what_is_not_recorded_as_done(src, tmp_path):
    dst = str(tmp_path / 'dst')
    convert_tree(src, dst)
    record = osp.join(dst, RECORD_NAME)
    with open(record) as file:
        lines = file.read().splitlines()
    # The last line cut by a kill; another line garbled.
    last = json.loads(lines[-1])['path']
    garbled = 'n01440764/n01440764_10026.JPEG'
    lines = [
        line[:-3] + 'xx' if json.loads(line).get('path') == garbled else line
        for line in lines[:-1]
    ]
    with open(record, 'w') as file:
        file.write('\n'.join(lines) + '\n' + lines[-1][:10])
    os.unlink(osp.join(dst, 'photo.jpg'))
    # A source touched (same bytes), another rewritten.
    touched, rewritten = 'meta/train.txt', 'gray.jpg'
    stat = os.stat(osp.join(src, touched))
    os.utime(
        osp.join(src, touched),
        ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    write(osp.join(src, rewritten), encode_jpeg(64, 48, 123, mode='L'))
    before = {p: read(osp.join(dst, p)) for p in tree_files(dst)}
    inodes = {p: os.stat(osp.join(dst, p)).st_ino for p in tree_files(dst)}

    counts = convert_tree(src, dst)

    redone = {last, garbled, 'photo.jpg', touched, rewritten}
    assert len(redone) == 5
    assert counts['skipped'] == len(JPEGS) + len(COPIED) - 5
    assert counts['converted'] + counts['copied'] == 5
    assert counts['copied'] == len(redone & set(COPIED))
    check_outputs(src, dst)
    assert read(osp.join(dst, rewritten)) != before[rewritten]
    # The files skipped were not written again (a replace: a new inode).
    for path in set(tree_files(dst)) - redone:
        assert os.stat(osp.join(dst, path)).st_ino == inodes[path], path
    assert convert_tree(src, dst)['skipped'] == len(JPEGS) + len(COPIED)


def test_the_rerun_after_a_crash_between_write_and_record(src, tmp_path):
    dst = str(tmp_path / 'dst')
    convert_tree(src, dst)
    header, entries = records(dst)
    inodes = {p: os.stat(osp.join(dst, p)).st_ino for p in entries}
    # As if killed after every replace and before every record line.
    with open(osp.join(dst, RECORD_NAME), 'w') as file:
        file.write(json.dumps(header) + '\n')
    counts = convert_tree(src, dst)
    assert counts['skipped'] == 0
    assert counts['converted'] == len(JPEGS)
    check_outputs(src, dst)
    # Identical outputs are recorded, not written again.
    assert {p: os.stat(osp.join(dst, p)).st_ino for p in entries} == inodes


def test_a_non_empty_dst_without_record_is_refused(src, tmp_path):
    dst = tmp_path / 'dst'
    write(str(dst / 'notes.txt'), b'mine')
    with pytest.raises(ValueError, match='no record') as error:
        convert_tree(src, str(dst))
    assert str(dst) in str(error.value)
    assert os.listdir(dst) == ['notes.txt']
    assert read(str(dst / 'notes.txt')) == b'mine'
    file = tmp_path / 'file'
    write(str(file), b'x')
    with pytest.raises(ValueError, match='not a folder'):
        convert_tree(src, str(file))


@pytest.mark.parametrize('path,data', [
    ('new/notes.txt', b'text'),
    ('new/photo.jpg', encode_jpeg(16, 24, 5)),
])
def test_a_file_the_record_does_not_list_is_never_overwritten(
        src, tmp_path, path, data):
    dst = str(tmp_path / 'dst')
    convert_tree(src, dst)
    write(osp.join(src, path), data)
    user = b'the user put this here'
    write(osp.join(dst, path), user)
    with pytest.raises(ForeignFileError) as error:
        convert_tree(src, dst)
    assert isinstance(error.value, ValueError)
    assert osp.join(dst, path) in str(error.value)
    assert read(osp.join(dst, path)) == user
    # Nothing beside it either (no temporary left).
    assert os.listdir(osp.dirname(osp.join(dst, path))) == [osp.basename(path)]
    os.unlink(osp.join(dst, path))
    assert convert_tree(src, dst)['skipped'] == len(JPEGS) + len(COPIED)
    check_outputs(src, dst)


def test_nested_folders_are_refused(src, tmp_path):
    inner = osp.join(src, 'out')
    with pytest.raises(ValueError, match='nested') as error:
        convert_tree(src, inner)
    assert inner in str(error.value) and src in str(error.value)
    assert not osp.exists(inner)
    with pytest.raises(ValueError, match='nested'):
        convert_tree(src, src)
    outer = str(tmp_path)
    with pytest.raises(ValueError, match='nested') as error:
        convert_tree(src, outer)
    assert outer in str(error.value)


def test_bad_workers_and_missing_src_are_refused(src, tmp_path):
    for workers in (0, -1):
        with pytest.raises(ValueError, match=f'workers={workers}'):
            convert_tree(src, str(tmp_path / 'dst'), workers=workers)
    missing = str(tmp_path / 'missing')
    with pytest.raises(ValueError, match='no such folder') as error:
        convert_tree(missing, str(tmp_path / 'dst'))
    assert missing in str(error.value)
    assert not osp.exists(tmp_path / 'dst')


def test_the_record_of_another_src_is_refused(src, tmp_path):
    dst = str(tmp_path / 'dst')
    convert_tree(src, dst)
    other = shutil.copytree(src, str(tmp_path / 'other'))
    with pytest.raises(ValueError) as error:
        convert_tree(other, dst)
    assert other in str(error.value) and src in str(error.value)


def test_two_workers_write_what_one_writes(source, converted, tmp_path):
    dst, counts = converted
    parallel = str(tmp_path / 'parallel')
    calls = []
    assert convert_tree(
        source,
        parallel,
        workers=2,
        verify=True,
        progress=lambda *call: calls.append(call)) == counts
    for path in tree_files(source):
        assert read(osp.join(parallel, path)) == read(osp.join(dst, path))
    assert records(parallel) == records(dst)
    total = len(JPEGS) + len(COPIED)
    assert calls == [(done, total) for done in range(total + 1)]


def test_verify_catches_a_lossy_jpegtran(src, tmp_path):
    lossy = tmp_path / 'lossy_jpegtran'
    lossy.write_text('#!/bin/sh\nexec jpegtran -grayscale "$@"\n')
    lossy.chmod(0o755)
    dst = str(tmp_path / 'dst')
    assert convert_tree(src, dst, jpegtran=str(lossy))['converted']
    with pytest.raises(RuntimeError, match='other pixels') as error:
        convert_tree(
            src, str(tmp_path / 'dst2'), jpegtran=str(lossy), verify=True)
    assert str(error.value).startswith(src + os.sep)


def test_the_command_line(source, tmp_path, capsys):
    dst = str(tmp_path / 'dst')
    done = subprocess.run(
        [sys.executable, CLI, source, dst, '--workers', '2', '--verify'],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120)
    assert done.returncode == 0, done.stderr
    summary = done.stdout.strip().splitlines()
    assert len(summary) == 1
    assert summary[0].startswith(
        f'converted {len(JPEGS)} JPEGs, copied {len(COPIED)} files, '
        'skipped 0')
    assert '%)' in summary[0]
    check_outputs(source, dst)

    cli = load_script(CLI)
    assert cli.main([source, str(tmp_path / 'x'), '--workers', '0']) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'workers=0' in err
    assert cli.main([str(tmp_path / 'missing'), str(tmp_path / 'x')]) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'missing' in err
    assert cli.main([source, dst]) == 0
    assert f'skipped {len(JPEGS) + len(COPIED)}' in capsys.readouterr().out


def test_the_region_decoder_crops_converted_files_like_opencv(
        source, converted):
    library = jpeg_region.load()
    if library is None:
        pytest.skip(f'no region decoder: {jpeg_region.unavailable_reason()}')
    dst, _ = converted
    rng = np.random.default_rng(0)
    for path, boxes in REGION_BOXES:
        data = read(osp.join(dst, path))
        whole = cv2.imdecode(
            np.frombuffer(read(osp.join(source, path)), np.uint8),
            cv2.IMREAD_COLOR)
        height, width = whole.shape[:2]
        for _ in range(boxes):
            top, left = rng.integers(height), rng.integers(width)
            box = (int(top), int(left), int(rng.integers(1, height - top + 1)),
                   int(rng.integers(1, width - left + 1)))
            crop = jpeg_region.decode_region(library, data, (height, width),
                                             box)
            assert crop is not None, (path, box)
            np.testing.assert_array_equal(
                crop, whole[box[0]:box[0] + box[2], box[1]:box[1] + box[3]])


def test_the_region_decoder_reads_only_the_boxs_mcus_of_converted_files(
        source, converted):
    """Zeroed data in the first MCU of the converted photo leaves a box
    below it exact: its MCUs are decoded alone. The same damage in the
    source (no restart markers) reaches the box."""
    library = jpeg_region.load()
    if library is None:
        pytest.skip(f'no region decoder: {jpeg_region.unavailable_reason()}')
    dst, _ = converted
    original = read(osp.join(source, 'photo.jpg'))
    whole = decode(original)
    box = (200, 300, 100, 150)
    expected = whole[200:300, 300:450]
    restarted = read(osp.join(dst, 'photo.jpg'))
    for data, exact in [(restarted, True), (original, False)]:
        scan = data.index(b'\xff\xda')
        scan += 2 + int.from_bytes(data[scan + 2:scan + 4], 'big')
        end = data.index(b'\xff\xd0', scan) if exact else scan + 64
        damaged = data[:scan] + bytes(end - scan) + data[end:]
        crop = jpeg_region.decode_region(library, damaged, (375, 500), box)
        assert (crop is not None and np.array_equal(crop, expected)) == exact
