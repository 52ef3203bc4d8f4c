"""Images/s per worker core: mmpretrain's MAE pipeline against the recipe's.

Both train pipelines as mmengine builds them, in this process on one thread
(``torch``, OpenCV and the BLAS pinned to 1 thread; run it under
``taskset -c N`` to pin it to one core), over JPEGs written on the spot
(``bench_pipeline.py``'s photograph-like files at ImageNet's mean size and
file size, or all at ``--size``):

* ``mmpretrain``: ``mae/mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py``'s
  ``LoadImageFromFile`` -> ``RandomResizedCrop`` 224 (scale 0.2-1, bicubic,
  Pillow) -> ``RandomFlip`` 0.5 -> ``PackInputs``;
* ``fast``: ``configs/mae_vit-base_200e.py``'s ``LoadImageBytes`` ->
  ``DecodeRandomResizedCrop`` (the same draws; decode, crop, resize and
  flip in one step; only the box decoded where the region decoder,
  ``mmae_plugin/datasets/transforms/jpeg_region.py``, is built) ->
  ``PackInputs``;
* ``fast_restarts``: ``fast`` over copies of the same files with a restart
  marker after every MCU (``tools/dataset_converters/add_jpeg_restarts.py``,
  lossless: the same pixels), from which the region decoder reads only the
  box's MCUs.

The two run in interleaved rounds (the order swapped every round); per
pipeline the median images/s of the rounds by CPU time of this process
(what one core delivers, little affected by other processes) and by wall
time, and the ratio fast / mmpretrain (of the medians, and per round)::

    taskset -c 1 python dev/benchmarks/bench_loader.py
    python dev/benchmarks/bench_loader.py --images 8 --rounds 1  # smoke
"""
import argparse
import importlib.util
import json
import os
import os.path as osp
import statistics
import sys
import tempfile
from types import ModuleType
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

HERE = osp.dirname(osp.abspath(__file__))
REPO = osp.dirname(osp.dirname(HERE))
RECIPE = 'configs/mae_vit-base_200e.py'
PIPELINES = ('mmpretrain', 'fast', 'fast_restarts')


def sibling(name: str) -> ModuleType:
    """A script of this folder, imported by path (``bench_pipeline``)."""
    spec = importlib.util.spec_from_file_location(name,
                                                  osp.join(HERE, f'{name}.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--images', type=int, default=200, help='JPEGs written')
    parser.add_argument(
        '--rounds', type=int, default=5, help='interleaved rounds')
    parser.add_argument(
        '--size',
        default=None,
        help='WIDTHxHEIGHT of every JPEG (default: ImageNet-like sizes)')
    parser.add_argument('--out', default=None, help='JSON output')
    return parser.parse_args(argv)


# ---------------------------------------------------------------- images
def write_jpegs(bench_pipeline: ModuleType, folder: str, count: int,
                size: Optional[str]) -> Dict:
    """``bench_pipeline``'s ImageNet-like JPEGs, or all at ``size``."""
    if size is None:
        return bench_pipeline.write_jpegs(folder, count)
    width, height = (int(side) for side in size.lower().split('x'))
    paths, total = [], 0
    for index in range(count):
        path = osp.join(folder, f'img_{index:05d}.jpg')
        total += bench_pipeline.imagenet_like_jpeg(path, width, height, index)
        paths.append(path)
    return dict(
        paths=paths,
        megabytes=total / 2**20,
        mean_kilobytes=total / count / 1024,
        mean_megapixels=width * height / 1e6)


# ------------------------------------------------------------- pipelines
def pipeline_steps(config: str) -> List[dict]:
    """The train pipeline of a config file."""
    from mmengine.config import Config
    steps = Config.fromfile(config).train_dataloader.dataset.pipeline
    return [dict(step) for step in steps]


def build_pipelines(
        bench_pipeline: ModuleType,
        restarted: Optional[Dict[str, str]]) -> Dict[str, Callable]:
    """Per-image functions (``img_path`` -> packed results) of mmpretrain's
    MAE pipeline (``bench_pipeline``'s ``recipe``) and of the recipe's, the
    latter also over the restart-marked copy of each file (``restarted``:
    path -> the copy's path; None: no such pipeline)."""
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope

    import mmae_plugin.registration  # noqa: F401
    init_default_scope('mmpretrain')
    configs = dict(
        mmpretrain=bench_pipeline.recipe_path(),
        fast=osp.join(REPO, RECIPE),
        fast_restarts=osp.join(REPO, RECIPE))
    copies = dict(fast_restarts=restarted)
    built = {}
    for name in PIPELINES:
        if name == 'fast_restarts' and restarted is None:
            continue
        steps = pipeline_steps(configs[name])
        pipeline = Compose(steps)

        def run(path: str, pipeline=pipeline, copy=copies.get(name)):
            return pipeline(dict(img_path=copy[path] if copy else path))

        run.steps = [step['type'] for step in steps]
        built[name] = run
    return built


def reduced_decodes(paths: List[str], draws: int = 20) -> Dict[int, float]:
    """How often the fast path decodes at each DCT scale on these files
    (``draws`` crop boxes per file, as the recipe draws them)."""
    from mmae_plugin.datasets.transforms import fast_crop_decode as fast
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    counts: Dict[int, int] = {1: 0, 2: 0, 4: 0, 8: 0}
    for path in paths:
        with open(path, 'rb') as f:
            size = fast.jpeg_size(f.read())
        for _ in range(draws):
            scale = 1 if size is None else \
                fast.dct_scale(crop.box_for(*size), crop.scale)
            counts[scale] += 1
    total = sum(counts.values())
    return {scale: count / total for scale, count in counts.items()}


def region_decodes(paths: List[str], draws: int = 20) -> Dict:
    """Whether the fast path decodes only the box on these files, and how
    much of each file it then decodes (``draws`` recipe boxes per file):
    the share of the rows Huffman-decoded (those above the box and the
    box's) and of the pixels reconstructed (the box's)."""
    from mmae_plugin.datasets.transforms import fast_crop_decode as fast
    from mmae_plugin.datasets.transforms import jpeg_region
    crop = fast.DecodeRandomResizedCrop(224, crop_ratio_range=(0.2, 1.0))
    rows, pixels, mcus, region = [], [], [], 0
    for path in paths:
        with open(path, 'rb') as f:
            data = f.read()
        header = fast.jpeg_header(data)
        for _ in range(draws):
            if header is None:
                continue
            (height, width), marker = header[:2], header[2]
            box = crop.box_for(height, width)
            top, _, h, w = box
            whole = fast.dct_scale(box, crop.scale) == 1
            if (crop.region_decoder is not None and whole
                    and marker in fast.SEQUENTIAL_HUFFMAN_MARKERS):
                region += 1
            rows.append((top + h) / height)
            pixels.append(h * w / (height * width))
            mcus.append(mcu_share(box, height, width))
    return dict(
        available=crop.region_decoder is not None,
        unavailable_reason=jpeg_region.unavailable_reason(),
        fraction=region / (len(paths) * draws),
        mean_rows_huffman_decoded=float(np.mean(rows)),
        mean_pixels_reconstructed=float(np.mean(pixels)),
        mean_mcus_huffman_decoded_restarts=float(np.mean(mcus)))


def mcu_share(box: Tuple[int, int, int, int],
              height: int,
              width: int,
              mcu: int = 16) -> float:
    """The share of a 4:2:0 file's MCUs the region decoder reads in a
    file restarted at every MCU: those holding the box and its one-pixel
    margin."""
    top, left, h, w = box
    rows = -(-min(top + h + 1, height) // mcu) - max(top - 1, 0) // mcu
    cols = -(-min(left + w + 1, width) // mcu) - max(left - 1, 0) // mcu
    return rows * cols / (-(-height // mcu) * -(-width // mcu))


def restart_marked_copies(paths: List[str],
                          folder: str) -> Optional[Dict[str, str]]:
    """Each file converted as ``add_jpeg_restarts.py`` converts it, into
    ``folder``; path -> the copy's path (None, and why printed, without
    ``jpegtran``)."""
    from mmae_plugin.datasets.jpeg_restarts import (JpegtranNotFoundError,
                                                    add_restarts)
    os.makedirs(folder)
    copies = {}
    for path in paths:
        with open(path, 'rb') as f:
            try:
                data = add_restarts(f.read())
            except JpegtranNotFoundError as error:
                print(f'no restart-marked pipeline: {error}')
                return None
        if data is None:
            raise RuntimeError(f'jpegtran could not convert {path}')
        copies[path] = osp.join(folder, osp.basename(path))
        with open(copies[path], 'wb') as f:
            f.write(data)
    return copies


def copy_sizes(copies: Dict[str, str]) -> Dict[str, float]:
    """Bytes of the originals and of their restart-marked copies."""
    before = sum(osp.getsize(path) for path in copies)
    after = sum(osp.getsize(copy) for copy in copies.values())
    return dict(bytes=before, restart_bytes=after, change=after / before - 1)


# ---------------------------------------------------------------- timing
def rates(rounds: List[Dict], count: int, key: str) -> List[float]:
    """Images/s of each round by ``cpu_s`` or ``wall_s``."""
    return [count / r[key] for r in rounds]


def summarise(results: Dict[str, List[Dict]], count: int) -> Dict:
    """Images/s per core (CPU time and wall), spread, the ratio."""
    out: Dict = {}
    for name, rounds in results.items():
        cpu, wall = rates(rounds, count, 'cpu_s'), \
            rates(rounds, count, 'wall_s')
        out[name] = dict(
            images_per_s_cpu=statistics.median(cpu),
            cpu_spread=[min(cpu), max(cpu)],
            images_per_s_wall=statistics.median(wall),
            wall_spread=[min(wall), max(wall)],
            ms_per_image=1e3 / statistics.median(cpu))
    for name, key in (('fast', 'ratio'), ('fast_restarts', 'ratio_restarts')):
        if name not in out or 'mmpretrain' not in out:
            continue
        per_round = [
            m['cpu_s'] / f['cpu_s']
            for m, f in zip(results['mmpretrain'], results[name])
        ]
        out[key] = dict(
            of_medians=out[name]['images_per_s_cpu'] /
            out['mmpretrain']['images_per_s_cpu'],
            per_round=per_round,
            per_round_median=statistics.median(per_round))
    return out


def table(summary: Dict) -> str:
    """The pipelines side by side (Markdown) and the ratio."""
    lines = [
        '| pipeline | images/s per core (CPU time) | spread | images/s '
        '(wall) | ms/image |', '| --- | --- | --- | --- | --- |'
    ]
    for name in PIPELINES:
        if name not in summary:
            continue
        row = summary[name]
        lines.append(
            f'| {name} | {row["images_per_s_cpu"]:.0f} | '
            f'{row["cpu_spread"][0]:.0f}-{row["cpu_spread"][1]:.0f} | '
            f'{row["images_per_s_wall"]:.0f} | {row["ms_per_image"]:.2f} |')
    lines.append('')
    for name, key in (('fast', 'ratio'), ('fast_restarts', 'ratio_restarts')):
        if key in summary:
            ratio = summary[key]
            rounds = ', '.join(f'{r:.2f}' for r in ratio['per_round'])
            lines.append(f'{name} / mmpretrain: {ratio["of_medians"]:.2f} '
                         f'(per round: {rounds})')
    return '\n'.join(lines)


def run_benchmark(args: argparse.Namespace,
                  bench_pipeline: ModuleType) -> Tuple[Dict, Dict, Dict]:
    """Write the files, time both pipelines; (images, summary, extra)."""
    with tempfile.TemporaryDirectory(prefix='bench_loader_') as folder:
        written = write_jpegs(bench_pipeline, folder, args.images, args.size)
        restarted = restart_marked_copies(written['paths'],
                                          osp.join(folder, 'restarts'))
        pipelines = build_pipelines(bench_pipeline, restarted)
        np.random.seed(0)
        load_before = os.getloadavg()
        results = bench_pipeline.measure(pipelines, written['paths'],
                                         args.rounds)
        extra = dict(
            raw=results,
            load_average_before=list(load_before),
            steps={name: run.steps
                   for name, run in pipelines.items()},
            dct_scale_fractions=reduced_decodes(written['paths']),
            region_decode=region_decodes(written['paths']),
            restart_copies=copy_sizes(restarted) if restarted else None)
    written.pop('paths')
    return written, summarise(results, args.images), extra


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """Time both pipelines, print the table and the ratio."""
    args = parse_args(argv)
    bench_pipeline = sibling('bench_pipeline')
    bench_pipeline.single_thread()
    sys.path.insert(0, REPO)
    images, summary, extra = run_benchmark(args, bench_pipeline)
    env = bench_pipeline.environment()
    result = dict(
        environment=env,
        images=dict(count=args.images, size=args.size, **images),
        rounds=args.rounds,
        recipe=RECIPE,
        mmpretrain_recipe=bench_pipeline.RECIPE,
        summary=summary,
        **extra)
    print(f'{args.images} JPEGs ({images["mean_megapixels"]:.3f} MP and '
          f'{images["mean_kilobytes"]:.0f} KB mean), {args.rounds} '
          f'interleaved rounds, cores {env["affinity"]}, load average '
          f'{extra["load_average_before"][0]:.2f} before / '
          f'{env["load_average"][0]:.2f} after; fast path decodes at DCT '
          f'scale 1/2/4/8: ' +
          ' / '.join(f'{100 * v:.0f} %'
                     for v in extra['dct_scale_fractions'].values()))
    region = extra['region_decode']
    if region['available']:
        print(f'region decoding: {100 * region["fraction"]:.0f} % of the '
              'boxes; per box, on average '
              f'{100 * region["mean_rows_huffman_decoded"]:.0f} % of the '
              'rows Huffman-decoded and '
              f'{100 * region["mean_pixels_reconstructed"]:.0f} % of the '
              'pixels reconstructed; in the restart-marked copies '
              f'{100 * region["mean_mcus_huffman_decoded_restarts"]:.0f} % '
              'of the MCUs Huffman-decoded')
    else:
        print('region decoding unavailable '
              f'({region["unavailable_reason"]}): whole decodes')
    sizes = extra['restart_copies']
    if sizes is not None:
        print(f'restart-marked copies: {100 * sizes["change"]:+.1f} % bytes')
    print(table(summary))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    main()
