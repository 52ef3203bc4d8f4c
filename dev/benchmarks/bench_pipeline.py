"""Images/s of the ImageNet pretraining pipeline on ONE worker core.

What one dataloader worker does per image, measured in this process on one
thread (``torch``, OpenCV and the BLAS pinned to 1 thread; run it under
``taskset -c N`` to pin it to one core), over JPEGs written on the spot
(photograph-like content at ImageNet's mean size and file size, 469 x 387
and ~110 KB):

* ``recipe``: the train pipeline of mmpretrain's MAE recipe, which
  ``configs/mae_vit-base_200e.py`` used until issue 47
  (``LoadImageFromFile`` -> ``RandomResizedCrop`` 224, bicubic, Pillow
  backend -> ``RandomFlip`` -> ``PackInputs``), built by mmengine (the
  recipes' own faster loader is timed against it by ``bench_loader.py``);
  ``LoadImageFromFile`` decodes with OpenCV, its default;
* ``recipe_pil_decode``: the same with ``imdecode_backend='pillow'``;
* ``torchvision_cpu``: ``torchvision.io.decode_jpeg`` on the CPU, then the
  same crop box resized bicubic (antialiased) by torchvision, the flip, and
  a CHW uint8 tensor;

The paths run in alternating rounds; per path the median images/s of the
rounds and their spread are reported, by CPU time of this process (what one
core delivers, little affected by other processes sharing it) and by wall
time, next to the ratio to ``recipe``. ``--gpu-images-per-s`` (default
5,000, an estimate for MAE ViT-B/16 on one H200) turns images/s per core
into cores per GPU::

    taskset -c 1 python dev/benchmarks/bench_pipeline.py
    python dev/benchmarks/bench_pipeline.py --images 64 --rounds 1  # smoke
"""
import argparse
import json
import os
import os.path as osp
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
RECIPE = 'mmpretrain::mae/mae_vit-base-p16_8xb512-amp-coslr-300e_in1k.py'
#: An estimate (not a measurement): MAE ViT-B/16 at 224 on one H200 in
#: bfloat16, ~56 GFLOP per image at ~280 TFLOP/s achieved.
GPU_IMAGES_PER_S = 5000.0
PATHS = ('recipe', 'recipe_pil_decode', 'torchvision_cpu')


def single_thread() -> None:
    """One thread for torch, OpenCV and the BLAS, as one worker core."""
    for name in ('OMP_NUM_THREADS', 'MKL_NUM_THREADS', 'OPENBLAS_NUM_THREADS'):
        os.environ.setdefault(name, '1')
    import cv2
    import torch
    torch.set_num_threads(1)
    cv2.setNumThreads(1)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command line."""
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        '--images',
        type=int,
        default=192,
        help='JPEGs written and decoded per round')
    parser.add_argument(
        '--rounds',
        type=int,
        default=3,
        help='alternating rounds over all paths')
    parser.add_argument(
        '--paths', nargs='+', default=list(PATHS), choices=PATHS)
    parser.add_argument(
        '--gpu-images-per-s',
        type=float,
        default=GPU_IMAGES_PER_S,
        help='what one GPU trains, for cores per GPU '
        '(default: the ViT-B/16 MAE estimate on an H200)')
    parser.add_argument('--out', default=None, help='JSON output')
    return parser.parse_args(argv)


# ------------------------------------------------------------------ images
def imagenet_like_jpeg(path: str, width: int, height: int, seed: int) -> int:
    """Write one photograph-like JPEG (quality 90); returns its bytes.

    Smooth colour regions, a mid-frequency texture and grain: at ImageNet's
    mean size (469 x 387) the files come out near ImageNet's mean of about
    110 KB, so the entropy decoding has a photograph's work to do.
    """
    from PIL import Image
    rng = np.random.default_rng(seed)
    smooth = Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8))
    texture = Image.fromarray(
        rng.integers(0, 256, (height // 4, width // 4, 3), dtype=np.uint8))
    pixels = (
        np.asarray(
            smooth.resize((width, height), Image.Resampling.BILINEAR),
            dtype=np.float32) * 0.6 + np.asarray(
                texture.resize((width, height), Image.Resampling.BICUBIC),
                dtype=np.float32) * 0.4)
    pixels += rng.integers(-32, 33, pixels.shape)
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(
        path, format='JPEG', quality=90)
    return os.path.getsize(path)


def write_jpegs(folder: str, count: int) -> Dict:
    """``count`` ImageNet-like JPEGs under ``folder``: widths in
    [375, 563], heights in [310, 464] (means 469 x 387, ImageNet's).

    Returns:
        Paths, megabytes, mean kilobytes and mean megapixels.
    """
    rng = np.random.default_rng(0)
    paths, pixels, size = [], 0, 0
    for index in range(count):
        width = int(rng.integers(375, 564))
        height = int(rng.integers(310, 465))
        path = osp.join(folder, f'img_{index:05d}.jpg')
        size += imagenet_like_jpeg(path, width, height, index)
        paths.append(path)
        pixels += width * height
    return dict(
        paths=paths,
        megabytes=size / 2**20,
        mean_kilobytes=size / count / 1024,
        mean_megapixels=pixels / count / 1e6)


# ------------------------------------------------------------------- paths
def recipe_path() -> str:
    """The file of ``RECIPE``, in mmpretrain's installed configs."""
    import mmpretrain
    return osp.join(
        osp.dirname(mmpretrain.__file__), '.mim', 'configs',
        RECIPE.split('::')[1])


def recipe_pipeline(decode_backend: Optional[str] = None) -> Callable:
    """The recipe's train pipeline as mmengine builds it."""
    from mmengine.config import Config
    from mmengine.dataset import Compose
    from mmengine.registry import init_default_scope

    import mmae_plugin.registration  # noqa: F401
    init_default_scope('mmpretrain')
    steps = Config.fromfile(recipe_path()).train_dataloader.dataset.pipeline
    steps = [dict(step) for step in steps]
    if decode_backend is not None:
        assert steps[0]['type'] == 'LoadImageFromFile'
        steps[0]['imdecode_backend'] = decode_backend
    pipeline = Compose(steps)

    def run(path: str):
        return pipeline(dict(img_path=path))

    run.steps = [s['type'] for s in steps]
    return run


def recipe_crop():
    """The recipe's ``RandomResizedCrop`` (for its crop-box sampling)."""
    from mmpretrain.datasets.transforms import RandomResizedCrop
    return RandomResizedCrop(
        scale=224,
        crop_ratio_range=(0.2, 1.0),
        backend='pillow',
        interpolation='bicubic')


def crop_box(crop, height: int, width: int):
    """The recipe's random crop box for an image of this size (no pixels:
    the image is a zero-strided view)."""
    shape_only = np.broadcast_to(np.uint8(0), (height, width, 3))
    return crop.rand_crop_params(shape_only)


def torchvision_cpu_path() -> Callable:
    """decode_jpeg on the CPU + the recipe's crop box, bicubic, flip."""
    import torch
    from torchvision.io import decode_jpeg, read_file
    from torchvision.transforms.v2 import InterpolationMode
    from torchvision.transforms.v2 import functional as F
    crop = recipe_crop()

    def run(path: str):
        image = decode_jpeg(read_file(path))  # (3, H, W) uint8
        top, left, height, width = crop_box(crop, *image.shape[1:])
        out = F.resized_crop(
            image,
            top,
            left,
            height,
            width, [224, 224],
            interpolation=InterpolationMode.BICUBIC,
            antialias=True)
        if torch.rand(()) < 0.5:
            out = out.flip(-1)
        return out.contiguous()

    return run


def build_paths(names: Sequence[str]) -> Dict[str, Callable]:
    """The per-image functions of the selected paths."""
    makers = dict(
        recipe=recipe_pipeline,
        recipe_pil_decode=lambda: recipe_pipeline('pillow'),
        torchvision_cpu=torchvision_cpu_path)
    return {name: makers[name]() for name in names}


# ----------------------------------------------------------------- timing
def timed_round(run: Callable, paths: List[str]) -> Dict:
    """Run over every image once; CPU and wall seconds."""
    cpu, wall = time.process_time(), time.perf_counter()
    for path in paths:
        run(path)
    return dict(
        cpu_s=time.process_time() - cpu, wall_s=time.perf_counter() - wall)


def measure(paths: Dict[str, Callable], images: List[str],
            rounds: int) -> Dict[str, List[Dict]]:
    """Alternating rounds (path order reversed every other round), after
    one untimed pass of each path over a few images."""
    for run in paths.values():
        for path in images[:8]:
            run(path)
    names = list(paths)
    results: Dict[str, List[Dict]] = {name: [] for name in names}
    for index in range(rounds):
        order = names if index % 2 == 0 else names[::-1]
        for name in order:
            results[name].append(timed_round(paths[name], images))
    return results


def summarise(results: Dict[str, List[Dict]], count: int,
              gpu_rate: float) -> Dict[str, Dict]:
    """Images/s per core (CPU time and wall), spread, ratio, cores/GPU."""
    out: Dict[str, Dict] = {}
    for name, rounds in results.items():
        cpu = [count / r['cpu_s'] for r in rounds]
        wall = [count / r['wall_s'] for r in rounds]
        rate = statistics.median(cpu)
        out[name] = dict(
            images_per_s_cpu=rate,
            cpu_spread=[min(cpu), max(cpu)],
            images_per_s_wall=statistics.median(wall),
            wall_spread=[min(wall), max(wall)],
            ms_per_image=1e3 / rate,
            cores_per_gpu=gpu_rate / rate)
    if 'recipe' in out:
        base = out['recipe']['images_per_s_cpu']
        for row in out.values():
            row['speed_over_recipe'] = row['images_per_s_cpu'] / base
    return out


def table(summary: Dict[str, Dict], gpu_rate: float) -> str:
    """The paths side by side (Markdown)."""
    lines = [
        '| path | images/s per core (CPU time) | spread | images/s '
        '(wall) | ms/image | x recipe | cores per GPU at '
        f'{gpu_rate:,.0f} img/s |',
        '| --- | --- | --- | --- | --- | --- | --- |'
    ]
    for name, row in summary.items():
        lines.append(
            f'| {name} | {row["images_per_s_cpu"]:.0f} | '
            f'{row["cpu_spread"][0]:.0f}-{row["cpu_spread"][1]:.0f} | '
            f'{row["images_per_s_wall"]:.0f} | {row["ms_per_image"]:.2f} | '
            f'{row.get("speed_over_recipe", float("nan")):.2f} | '
            f'{row["cores_per_gpu"]:.1f} |')
    return '\n'.join(lines)


def environment() -> Dict:
    """Versions, the cores this process may use and the load average."""
    import cv2
    import PIL
    import torch
    import torchvision
    return dict(
        python=sys.version.split()[0],
        torch=torch.__version__,
        torchvision=torchvision.__version__,
        pillow=PIL.__version__,
        opencv=cv2.__version__,
        affinity=sorted(os.sched_getaffinity(0)),
        load_average=list(os.getloadavg()),
        cpu_count=os.cpu_count())


def main(argv: Optional[Sequence[str]] = None) -> Dict:
    """Write the images, time the paths, print the table."""
    args = parse_args(argv)
    single_thread()
    sys.path.insert(0, REPO)
    with tempfile.TemporaryDirectory(prefix='bench_pipeline_') as folder:
        written = write_jpegs(folder, args.images)
        paths = build_paths(args.paths)
        load_before = os.getloadavg()
        results = measure(paths, written['paths'], args.rounds)
        summary = summarise(results, args.images, args.gpu_images_per_s)
    env = environment()
    env['load_average_before'] = list(load_before)
    result = dict(
        environment=env,
        images=dict(
            count=args.images,
            megabytes=written['megabytes'],
            mean_kilobytes=written['mean_kilobytes'],
            mean_megapixels=written['mean_megapixels']),
        rounds=args.rounds,
        recipe=RECIPE,
        paths=summary,
        gpu_images_per_s=args.gpu_images_per_s,
        raw=results)
    print(
        f'{args.images} JPEGs ({written["mean_megapixels"]:.3f} MP and '
        f'{written["mean_kilobytes"]:.0f} KB mean), {args.rounds} alternating '
        f'rounds, cores {env["affinity"]}, load average '
        f'{load_before[0]:.2f} before / {env["load_average"][0]:.2f} after')
    print(table(summary, args.gpu_images_per_s))
    if args.out:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == '__main__':
    main()
