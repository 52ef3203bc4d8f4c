"""ViT-B/16 M-MAE against MAE on GPUs: what a GPU user needs to know.

For each AMP dtype (bfloat16 and float16 by default), one fresh process
(a ``torch.distributed.run`` of W processes when W GPUs are visible) builds
both models (``configs/mae_vit-base_200e.py``,
``configs/mmae_vit-base_200e.py``) with their optimizer wrappers and
measures:

* the full ``train_step`` (uint8 images on the host -> preprocessor ->
  forward -> backward -> AdamW) at the config's per-GPU batch of 128, in
  ``--rounds`` (default 3) alternating rounds of ``--iters`` (default 100)
  steps per model: MAE, M-MAE; M-MAE, MAE; MAE, M-MAE... back to back in
  the same process, so the M-MAE/MAE step ratio is taken per round (same
  clocks, same allocator state) and reported with its spread and a 95 %
  t-interval over the rounds. Step times come from CUDA events; a round's
  figure is its median step. Peak GPU memory is per model's rounds, with
  the other model's parameters and optimizer state resident
  (``resident_gib``);
* the FLOPs of one forward + backward counted by
  ``torch.utils.flop_counter.FlopCounterMode``, next to a closed form from
  the model's shapes (about 56-58 GFLOP per image at ViT-B/16 with the
  8 x 512 decoder), and the MFU they give against the GPU's dense peak
  (the datasheet's, and a bf16/fp16 8192^3 matrix product measured in the
  same process);
* the step fed by a real mmengine dataloader (the recipe's ``train_dataloader``
  settings and pipeline over mmpretrain's ``CustomDataset``) reading a
  folder of PIL-written JPEG and PNG images made on the spot;
* for M-MAE, the regulariser alone (forward + backward, CUDA events): as in
  the step (with its gather across the W ranks), and on its own at the
  gathered size (1024 x 768 at ViT-B, no collective), with quartiles.

M-MAE regularises the global batch (8 x 128 = 1024 rows in the recipe),
gathered across ranks. With W visible GPUs the W processes gather for real
(NCCL). When W x 128 is below the global batch, each rank appends fixed
rows standing for the ranks that are not there (``--global-batch``), so
the regulariser in the step has the recipe's 1024 x 768 shape and cost even
on one GPU; only the communication of the missing ranks is absent.
``--global-batch 0`` regularises just the rows of the ranks present.

The parent process writes the folder, runs one process per dtype (the
first one also measures the dataloader alone, before it builds the models)
and writes one JSON file, after every dtype (and ``--markdown``, a summary
table).
The M-MAE/MAE step ratio, the regulariser's ms per step, MAE images/s and
the MFU are compared with the goals of the GPU work (``goals`` in the JSON).

On a CPU-only machine ``--device cpu`` runs the same code in float32 with a
model shrunk through ``--cfg-options`` (the test suite's smoke run)::

    python dev/benchmarks/bench_gpu.py --out work_dirs/bench_gpu.json
    python dev/benchmarks/bench_gpu.py --dtypes bfloat16 --iters 50
    python dev/benchmarks/bench_gpu.py --device cpu --iters 2 \\
        --image-size 32 --cfg-options model.backbone.arch=deit-tiny ...
    python dev/benchmarks/bench_gpu.py --write-folder /tmp/images \\
        --folder-images 3200   # only write a synthetic image folder
"""
import argparse
import copy
import json
import math
import os
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))
CONFIGS = {
    'MAE': 'configs/mae_vit-base_200e.py',
    'M-MAE': 'configs/mmae_vit-base_200e.py',
}
CUDA_DTYPES = ('bfloat16', 'float16', 'float32')
#: Dense bf16/fp16 tensor-core peaks (TFLOP/s, datasheets, SXM parts),
#: matched against the GPU's name; ``--peak-tflops`` overrides.
DATASHEET_PEAK_TFLOPS = (('H200', 989.4), ('H100 PCIe', 756.0),
                         ('H100', 989.4), ('A100', 312.0), ('L40S', 362.1),
                         ('A6000', 154.8), ('A10', 125.0), ('V100', 125.0))
#: The issue's estimate for ViT-B/16, mask 0.75, 8 x 512 decoder.
VIT_B_REFERENCE_GFLOP = 56.0
#: Goals of the GPU work (issue 15), checked on CUDA results.
GOALS = dict(
    mmae_over_mae_step_ratio_max=1.02,
    regulariser_ms_max=1.0,
    mae_images_per_s_min=2500.0)
#: Every image this many is written as PNG, the others as JPEG.
PNG_EVERY = 8


# ---------------------------------------------------------------- arguments
def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """Command line, with the device-dependent defaults filled in.

    Args:
        argv: Arguments (default ``sys.argv[1:]``).

    Returns:
        The namespace; ``args.cases`` and ``args.dtypes`` are lists.
    """
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description=__doc__.split('\n')[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--device', default='cuda', choices=['cuda', 'cpu'])
    parser.add_argument(
        '--dtypes',
        nargs='+',
        default=None,
        choices=CUDA_DTYPES,
        help='AMP dtypes on cuda (default bfloat16 float16; '
        'float32 = no AMP); the CPU runs float32 only')
    parser.add_argument(
        '--cases', nargs='+', default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument(
        '--batch',
        type=int,
        default=None,
        help="per-GPU batch (default: the configs' 128 on "
        'cuda, 2 on cpu)')
    parser.add_argument(
        '--global-batch',
        type=int,
        default=None,
        help='rows the M-MAE regulariser sees per step '
        '(default 1024, the recipe\'s 8 x 128, on cuda; '
        '4 x batch on cpu); ranks that are not there are '
        'stood in for by fixed rows; 0: only the rows of '
        'the ranks present')
    parser.add_argument(
        '--nproc',
        type=int,
        default=None,
        help='processes per case (default: the visible '
        'GPUs on cuda, 1 on cpu); > 1 runs each case under '
        'torch.distributed.run (NCCL, or gloo on cpu)')
    parser.add_argument(
        '--rounds',
        type=int,
        default=3,
        help='alternating rounds of --iters steps per case '
        '(default 3)')
    parser.add_argument(
        '--iters',
        type=int,
        default=None,
        help='timed steps per case and round (default 100 '
        'cuda, 2 cpu)')
    parser.add_argument(
        '--warmup',
        type=int,
        default=None,
        help='untimed steps per case first (default 10 '
        'cuda, 1 cpu)')
    parser.add_argument(
        '--loader-iters',
        type=int,
        default=None,
        help='timed dataloader-fed steps (default 20 cuda, '
        '2 cpu; 0 skips them)')
    parser.add_argument(
        '--num-workers',
        type=int,
        default=None,
        help="dataloader workers (default: the recipe's 8 "
        'on cuda, 0 on cpu)')
    parser.add_argument(
        '--folder',
        default=None,
        help='an existing folder of images (DIR/train/...) '
        'instead of a synthetic one')
    parser.add_argument(
        '--folder-images',
        type=int,
        default=None,
        help='images of the synthetic folder (default 1024 '
        'cuda, 8 cpu)')
    parser.add_argument(
        '--write-folder',
        default=None,
        metavar='DIR',
        help='only write a synthetic folder DIR/train/... '
        'of --folder-images images, and exit')
    parser.add_argument(
        '--image-size',
        type=int,
        default=224,
        help='training crop (RandomResizedCrop scale) and '
        'synthetic-batch side')
    parser.add_argument(
        '--reg-reps',
        type=int,
        default=None,
        help='timed regulariser calls (default 100 cuda, 3 '
        'cpu)')
    parser.add_argument(
        '--peak-tflops',
        type=float,
        default=None,
        help='dense peak for the MFU (default: the '
        "datasheet's for the GPU's name)")
    parser.add_argument(
        '--case-timeout',
        type=float,
        default=300,
        help="seconds per dtype's process (both cases) "
        'before it is killed')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        default={},
        help='overrides of both ViT-B configs (the smoke test shrinks the '
        'model with them)')
    parser.add_argument(
        '--out',
        default=None,
        help='JSON output (default work_dirs/bench_gpu_'
        '<device>.json)')
    parser.add_argument(
        '--markdown', default=None, help='also write a Markdown summary here')
    parser.add_argument('--worker', default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker or args.write_folder:
        args.folder_images = args.folder_images or 1024
        return args
    cuda = args.device == 'cuda'
    if cuda and not torch.cuda.is_available():
        parser.error('--device cuda: no CUDA device is visible; use '
                     '--device cpu for the smoke run')
    if not cuda and args.dtypes not in (None, ['float32']):
        parser.error(f'--dtypes {" ".join(args.dtypes)}: the CPU run has no '
                     'AMP; use --dtypes float32 or leave it out')
    args.dtypes = args.dtypes or (['bfloat16', 'float16']
                                  if cuda else ['float32'])
    args.batch = args.batch or (128 if cuda else 2)
    args.nproc = args.nproc or (max(1, torch.cuda.device_count())
                                if cuda else 1)
    if args.global_batch is None:
        args.global_batch = max(1024, args.nproc * args.batch) if cuda \
            else 4 * args.batch * args.nproc
    if args.global_batch and (args.global_batch % args.nproc
                              or args.global_batch < args.nproc * args.batch):
        parser.error(
            f'--global-batch {args.global_batch}: must be 0 or a multiple of '
            f'--nproc {args.nproc} that is at least nproc x batch = '
            f'{args.nproc * args.batch}')
    if args.rounds < 1:
        parser.error(f'--rounds {args.rounds}: at least 1')
    defaults = dict(
        iters=(100, 2),
        warmup=(10, 1),
        loader_iters=(20, 2),
        num_workers=(None, 0),
        folder_images=(1024, 8),
        reg_reps=(100, 3))
    for key, (on_cuda, on_cpu) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, on_cuda if cuda else on_cpu)
    args.out = args.out or osp.join(REPO, 'work_dirs',
                                    f'bench_gpu_{args.device}.json')
    return args


# ------------------------------------------------------- synthetic images
def _write_image(job: Tuple[str, int, int, int]) -> int:
    """Write one smooth-plus-noise RGB image; returns its size in bytes."""
    from PIL import Image
    path, width, height, seed = job
    rng = np.random.default_rng(seed)
    # Smooth content (JPEG sizes and decode times like photographs, unlike
    # pure noise) with a little grain.
    coarse = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image = Image.fromarray(coarse).resize((width, height),
                                           Image.Resampling.BILINEAR)
    pixels = np.asarray(image, dtype=np.int16)
    pixels = pixels + rng.integers(-12, 13, pixels.shape, dtype=np.int16)
    image = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    if path.endswith('.png'):
        image.save(path, format='PNG')
    else:
        image.save(path, format='JPEG', quality=90)
    return os.path.getsize(path)


def describe_image_folder(root: str) -> Dict:
    """What a given folder holds: its images under ``root/train/`` by
    format (a folder made earlier, e.g. by dev/gpu_check.sh's images
    stage).

    Args:
        root: The dataset's ``data_root``.

    Returns:
        ``root`` and the counts of images, JPEG and PNG files.
    """
    names = [
        name for _, _, files in os.walk(osp.join(root, 'train'))
        for name in files
    ]
    jpeg = sum(name.lower().endswith(('.jpg', '.jpeg')) for name in names)
    png = sum(name.lower().endswith('.png') for name in names)
    return dict(root=root, images=jpeg + png, jpeg=jpeg, png=png)


def write_image_folder(root: str, count: int, min_side: int,
                       max_side: int) -> Dict:
    """Write ``count`` images under ``root/train/`` (two sub-folders).

    Every :data:`PNG_EVERY`-th image is a PNG, the others JPEGs; sides are
    drawn uniformly in [min_side, max_side] (ImageNet-like at 256-500).

    Args:
        root: Folder to create (the dataset's ``data_root``).
        count: Number of images (>= 1).
        min_side: Smallest width/height in pixels.
        max_side: Largest width/height in pixels.

    Returns:
        What was written: counts per format, bytes, seconds.
    """
    if count < 1:
        raise ValueError(f'count={count}: the folder needs at least 1 image')
    start = time.perf_counter()
    rng = np.random.default_rng(0)
    jobs = []
    for index in range(count):
        folder = osp.join(root, 'train', f'n{index % 2:03d}')
        os.makedirs(folder, exist_ok=True)
        ext = 'png' if index % PNG_EVERY == PNG_EVERY - 1 else 'jpg'
        width, height = rng.integers(min_side, max_side + 1, 2)
        jobs.append((osp.join(folder, f'img_{index:06d}.{ext}'), int(width),
                     int(height), index))
    if count >= 256:
        workers = max(1, min(8, (os.cpu_count() or 1)))
        with ProcessPoolExecutor(workers) as pool:
            sizes = list(pool.map(_write_image, jobs, chunksize=32))
    else:
        sizes = [_write_image(job) for job in jobs]
    pngs = sum(job[0].endswith('.png') for job in jobs)
    return dict(
        root=root,
        images=count,
        jpeg=count - pngs,
        png=pngs,
        sides=[min_side, max_side],
        megabytes=sum(sizes) / 2**20,
        write_s=time.perf_counter() - start)


# ------------------------------------------------------------ config parts
def load_config(case: str, cfg_options: dict):
    """The case's config with the command line's overrides."""
    from mmengine.config import Config
    cfg = Config.fromfile(osp.join(REPO, CONFIGS[case]))
    cfg.merge_from_dict(cfg_options)
    return cfg


def dataloader_config(cfg, folder: str, batch: int, num_workers: Optional[int],
                      image_size: int, min_images: int) -> dict:
    """The recipe's ``train_dataloader`` over a folder of images.

    The dataset becomes mmpretrain's ``CustomDataset`` (no labels) with the
    recipe's pipeline, the crop at ``image_size``; it is repeated
    (mmengine's ``RepeatDataset``) so that one epoch has ``min_images``.

    Args:
        cfg: The case's config.
        folder: ``data_root`` (images under ``folder/train``).
        batch: Per-rank batch size.
        num_workers: Workers (None: the recipe's).
        image_size: Side of RandomResizedCrop's output.
        min_images: Images one epoch must hold.

    Returns:
        A dataloader config for ``Runner.build_dataloader``.
    """
    loader = copy.deepcopy(cfg.train_dataloader).to_dict()
    pipeline = loader['dataset']['pipeline']
    for step in pipeline:
        if step['type'] in ('RandomResizedCrop', 'DecodeRandomResizedCrop'):
            step['scale'] = image_size
    dataset = dict(
        type='CustomDataset',
        data_root=folder,
        data_prefix='train',
        with_label=False,
        pipeline=pipeline)
    count = sum(
        len(files) for _, _, files in os.walk(osp.join(folder, 'train')))
    times = max(1, math.ceil(min_images / max(1, count)))
    if times > 1:
        dataset = dict(type='RepeatDataset', times=times, dataset=dataset)
    loader.update(dataset=dataset, batch_size=batch)
    if num_workers is not None:
        loader['num_workers'] = num_workers
    if loader.get('num_workers', 0) == 0:
        loader['persistent_workers'] = False
    return loader


def build_loader(loader_cfg: dict):
    """mmengine's dataloader of ``loader_cfg``, in mmpretrain's scope."""
    from mmengine.registry import init_default_scope
    from mmengine.runner import Runner
    init_default_scope('mmpretrain')
    # mmengine passes every key of collate_fn to the function, the _scope_
    # of the mmpretrain:: bases too (the plugin's runners drop it).
    loader_cfg = copy.deepcopy(loader_cfg)
    if isinstance(loader_cfg.get('collate_fn'), dict):
        loader_cfg['collate_fn'].pop('_scope_', None)
    return Runner.build_dataloader(loader_cfg, seed=0)


def measure_loader(loader_cfg: dict, batches: int) -> Dict:
    """Images/s of the input pipeline alone (no model), after one batch."""
    loader = build_loader(loader_cfg)
    start = time.perf_counter()
    iterator = iter(loader)
    next(iterator)
    first = time.perf_counter() - start
    images = 0
    start = time.perf_counter()
    for _ in range(batches):
        images += len(next(iterator)['inputs'])
    seconds = time.perf_counter() - start
    return dict(
        images_per_s=images / seconds,
        batches=batches,
        batch_size=loader_cfg['batch_size'],
        num_workers=loader_cfg.get('num_workers', 0),
        first_batch_s=first,
        pipeline=[s['type'] for s in _pipeline_of(loader_cfg['dataset'])])


def _pipeline_of(dataset_cfg: dict) -> List[dict]:
    while 'pipeline' not in dataset_cfg:
        dataset_cfg = dataset_cfg['dataset']
    return dataset_cfg['pipeline']


def optim_wrapper_config(cfg, device: str, dtype: str) -> dict:
    """The config's optimizer wrapper for this device and AMP dtype.

    float16 and bfloat16 keep the recipe's ``MixedPrecisionOptimWrapper``
    (``loss_scale='auto'``: dynamic loss scaling in float16, no scaler in
    bfloat16); float32 and the CPU use ``OptimWrapper``.
    """
    optim_cfg = copy.deepcopy(cfg.optim_wrapper).to_dict()
    if device == 'cpu' or dtype == 'float32':
        optim_cfg['type'] = 'OptimWrapper'
        # The mixed-precision wrapper's own arguments; OptimWrapper
        # refuses them.
        for key in ('loss_scale', 'dtype', 'use_fsdp'):
            optim_cfg.pop(key, None)
    else:
        optim_cfg['dtype'] = dtype
    return optim_cfg


# -------------------------------------------------------------- FLOP count
def analytic_flops_per_image(model) -> Dict[str, float]:
    """Forward + backward FLOPs of one image from the model's shapes.

    Linear layers cost 2 x tokens x in x out, attention 4 x tokens^2 x width
    per layer (scores and weighted sum), the patch embedding 2 x patches x
    (C p^2) x width; the backward costs twice the forward, except the patch
    embedding's (no gradient for the images). Norms, softmax and the loss
    are left out (well under 1 %).

    Args:
        model: An mmpretrain ``MAE`` (or ``MMAE``) with ``MAEViT`` and
            ``MAEPretrainDecoder``.

    Returns:
        ``forward``, ``forward_backward`` and ``patch_embed`` FLOPs.
    """
    backbone, neck = model.backbone, model.neck
    patches = backbone.num_patches
    enc_tokens = 1 + int(patches * (1 - backbone.mask_ratio))
    dec_tokens = 1 + patches

    def linear(module, tokens: int) -> float:
        return sum(2.0 * tokens * m.in_features * m.out_features
                   for m in module.modules() if isinstance(m, torch.nn.Linear))

    def attention(blocks, tokens: int) -> float:
        return sum(4.0 * tokens**2 * block.attn.embed_dims for block in blocks)

    conv = backbone.patch_embed.projection
    patch_embed = 2.0 * patches * conv.weight[0].numel() * conv.out_channels
    forward = (
        patch_embed + linear(backbone.layers, enc_tokens) +
        attention(backbone.layers, enc_tokens) +
        linear(neck.decoder_embed, enc_tokens) +
        linear(neck.decoder_blocks, dec_tokens) +
        attention(neck.decoder_blocks, dec_tokens) +
        linear(neck.decoder_pred, dec_tokens))
    return dict(
        forward=forward,
        patch_embed=patch_embed,
        forward_backward=3 * forward - patch_embed)


def counted_flops(model, wrapper, data: dict) -> Dict:
    """FLOPs of one forward + backward, counted by ``FlopCounterMode``.

    Runs the training step's forward (preprocessor, AMP context) and the
    backward of the summed loss, without an optimizer step; the gradients
    are dropped afterwards.

    Returns:
        ``total`` FLOPs of the batch and the largest ops' shares.
    """
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        with wrapper.optim_context(model):
            batch = model.data_preprocessor(data, True)
            losses = model._run_forward(batch, mode='loss')
        loss, _ = model.parse_losses(losses)
        loss.backward()
    wrapper.zero_grad()
    per_op = counter.get_flop_counts().get('Global', {})
    total = counter.get_total_flops()
    ops = sorted(((getattr(op, '__name__', str(op)), count)
                  for op, count in per_op.items()),
                 key=lambda item: -item[1])
    return dict(
        total=total,
        ops={name: count / max(total, 1)
             for name, count in ops[:8]})


def is_vit_b_recipe(model) -> bool:
    """Whether the model has ViT-B/16's shapes at 224, 8x512 decoder."""
    backbone, neck = model.backbone, model.neck
    return (backbone.embed_dims == 768 and backbone.num_layers == 12
            and backbone.num_patches == 196
            and neck.decoder_embed.out_features == 512
            and len(neck.decoder_blocks) == 8)


def datasheet_peak(name: str) -> Optional[float]:
    """Dense bf16 peak in FLOP/s of a GPU by name, if it is in the table."""
    for key, tflops in DATASHEET_PEAK_TFLOPS:
        if key in name:
            return tflops * 1e12
    return None


def measured_matmul_peak(dtype: torch.dtype,
                         side: int = 8192,
                         reps: int = 10) -> float:
    """FLOP/s of a side^3 matrix product (random data), after 3 warm-ups."""
    a = torch.randn(side, side, device='cuda', dtype=dtype)
    b = torch.randn(side, side, device='cuda', dtype=dtype)
    for _ in range(3):
        a @ b
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    start.record()
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / reps
    del a, b
    torch.cuda.empty_cache()
    return 2.0 * side**3 / seconds


# ----------------------------------------------------------------- worker
class StepTimer:
    """Per-step times: CUDA events on a GPU (no sync between steps), the
    host clock on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = device == 'cuda'
        self.marks: List = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def seconds(self) -> List[float]:
        """Time between consecutive marks (synchronises once)."""
        if self.cuda:
            torch.cuda.synchronize()
            return [
                a.elapsed_time(b) / 1e3
                for a, b in zip(self.marks, self.marks[1:])
            ]
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def synchronize(device: str) -> None:
    if device == 'cuda':
        torch.cuda.synchronize()


def timed_steps(step: Callable[[], None], count: int,
                device: str) -> Tuple[List[float], float]:
    """Run ``step`` ``count`` times; per-step seconds and the wall total."""
    timer = StepTimer(device)
    synchronize(device)
    start = time.perf_counter()
    timer.mark()
    for _ in range(count):
        step()
        timer.mark()
    synchronize(device)
    return timer.seconds(), time.perf_counter() - start


def stand_in_rows(model, rows: int, device: str) -> None:
    """Append ``rows`` fixed features to the regulariser's input (benchmark
    only): they stand for the ranks that are not there, so the gathered
    matrix has the global batch's shape. Gradients reach the real rows only,
    as the gather's backward gives each rank its own slice."""
    if rows <= 0:
        return
    generator = torch.Generator().manual_seed(1)
    filler = torch.randn(
        rows, model.backbone.embed_dims, generator=generator).to(device)
    pool = model.pool

    def pool_with_stand_ins(latent):
        pooled = pool(latent)
        return torch.cat([pooled, filler.to(pooled.dtype)], dim=0)

    model.pool = pool_with_stand_ins


def regulariser_timing(regularizer, rows: int, dim: int, device: str,
                       reps: int) -> Dict:
    """Forward + backward of a regulariser alone on (rows, dim) features
    (float32, what the encoder's final norm gives under AMP); with its
    ``gather`` as configured, across the ranks as in the step.

    Returns:
        Median, quartiles, min and max ms over ``reps`` calls (after 3).
    """
    generator = torch.Generator().manual_seed(2)
    features = torch.randn(rows, dim, generator=generator).to(device)
    features.requires_grad_(True)

    def step():
        regularizer(features).backward()
        features.grad = None

    for _ in range(3):
        step()
    times, _ = timed_steps(step, reps, device)
    skipped = int(regularizer.skip_code)  # after timing: one read
    ms = sorted(t * 1e3 for t in times)
    return dict(
        rows_per_rank=rows,
        dim=dim,
        median_ms=statistics.median(ms),
        quartiles_ms=[ms[len(ms) // 4], ms[(3 * len(ms)) // 4]],
        min_ms=ms[0],
        max_ms=ms[-1],
        reps=reps,
        skip_code=skipped,
        gather=regularizer.gather)


def gathered_regulariser_timing(model, rows: int, device: str,
                                reps: int) -> Dict:
    """The regulariser on its own at the gathered size (rows x embed dims,
    1024 x 768 for the ViT-B recipe): a copy with ``gather='local'``, so no
    collective is timed, only the arithmetic every rank repeats."""
    local = copy.deepcopy(model.regularizer)
    local.gather = 'local'
    return regulariser_timing(local, rows, model.backbone.embed_dims, device,
                              reps)


def init_distributed(device: str) -> Tuple[int, int, int]:
    """Process group from torch.distributed.run's environment, if any.

    Returns:
        (rank, world size, local rank).
    """
    world = int(os.environ.get('WORLD_SIZE', '1'))
    if world == 1:
        return 0, 1, 0
    import torch.distributed as dist
    local_rank = int(os.environ['LOCAL_RANK'])
    if device == 'cuda':
        torch.cuda.set_device(local_rank)
    dist.init_process_group('nccl' if device == 'cuda' else 'gloo')
    return dist.get_rank(), world, local_rank


def build_case(case: str, spec: dict, data: dict, rank: int, world: int,
               local_rank: int) -> Dict:
    """One model of the comparison: built, FLOPs counted, wrapped in DDP.

    Returns:
        ``model``, ``trained`` (DDP or the model), ``wrapper``, ``cfg`` and
        ``info`` (what goes into the JSON).
    """
    from mmengine.optim import build_optim_wrapper
    from mmpretrain.registry import MODELS
    device, dtype, batch = spec['device'], spec['dtype'], spec['batch']
    cfg = load_config(case, spec['cfg_options'])
    torch.manual_seed(rank)
    model = MODELS.build(cfg.model)
    model.init_weights()
    model.to(device)
    model.train()
    wrapper = build_optim_wrapper(model,
                                  optim_wrapper_config(cfg, device, dtype))
    info = dict(
        case=case,
        dtype=dtype,
        rank=rank,
        world_size=world,
        config=CONFIGS[case],
        batch_per_rank=batch,
        optim_wrapper=type(wrapper).__name__,
        amp_dtype=str(getattr(wrapper, 'cast_dtype', None)),
        loss_scaler=type(getattr(wrapper, 'loss_scaler', None)).__name__
        if hasattr(wrapper, 'loss_scaler') else None,
        param_groups=len(wrapper.optimizer.param_groups))
    if getattr(model, 'regularizer', None) is not None:
        per_rank = spec['global_batch'] // world if spec['global_batch'] \
            else batch
        stand_in_rows(model, per_rank - batch, device)
        info['regularised_rows'] = per_rank * world
        info['stand_in_rows'] = (per_rank - batch) * world
        info['regularised_rows_per_rank'] = per_rank
    flops = counted_flops(model, wrapper, data)
    analytic = analytic_flops_per_image(model)
    info['flops'] = dict(
        counted_per_image=flops['total'] / batch,
        analytic_per_image=analytic['forward_backward'],
        counted_over_analytic=flops['total'] / batch /
        analytic['forward_backward'],
        vit_b_recipe=is_vit_b_recipe(model),
        largest_ops=flops['ops'])
    if info['flops']['vit_b_recipe']:
        info['flops']['counted_over_issue_estimate'] = \
            flops['total'] / batch / (VIT_B_REFERENCE_GFLOP * 1e9)
    trained = model
    if world > 1:
        from mmengine.model import MMDistributedDataParallel
        trained = MMDistributedDataParallel(
            module=model,
            broadcast_buffers=False,
            device_ids=[local_rank] if device == 'cuda' else None)
    return dict(
        model=model,
        trained=trained,
        wrapper=wrapper,
        cfg=cfg,
        info=info,
        rounds=[],
        peak=0.0)


def alternating_rounds(built: Dict[str, Dict], data: dict, spec: dict) -> None:
    """``spec['rounds']`` rounds of ``spec['iters']`` steps per case in one
    process, the case order reversed every other round (A B, B A, A B...),
    so drift (clocks, temperature, allocator) falls on both cases alike.
    Each case's rounds and peak memory are appended to its entry."""
    device, names = spec['device'], list(built)
    for index in range(spec['rounds']):
        for name in names if index % 2 == 0 else names[::-1]:
            case = built[name]
            if device == 'cuda':
                torch.cuda.reset_peak_memory_stats()
            times, wall = timed_steps(
                lambda: case['trained'].train_step(data, case['wrapper']),
                spec['iters'], device)
            case['rounds'].append(
                dict(
                    round=index,
                    median_ms=statistics.median(times) * 1e3,
                    mean_ms=statistics.fmean(times) * 1e3,
                    min_ms=min(times) * 1e3,
                    max_ms=max(times) * 1e3,
                    steps=len(times),
                    wall_images_per_s=spec['batch'] * len(times) / wall))
            if device == 'cuda':
                case['peak'] = max(case['peak'],
                                   torch.cuda.max_memory_allocated() / 2**30)


def case_result(case: Dict, spec: dict) -> Dict:
    """A case's JSON: its info, rounds, median step over the rounds'
    medians and their spread."""
    result = dict(case['info'])
    medians = [r['median_ms'] for r in case['rounds']]
    result.update(
        rounds=case['rounds'],
        step_ms=dict(
            median=statistics.median(medians),
            min=min(medians),
            max=max(medians),
            spread=(max(medians) - min(medians)) / statistics.median(medians)),
        steps=sum(r['steps'] for r in case['rounds']))
    if spec['device'] == 'cuda':
        result['peak_memory_gib'] = case['peak']
        result['resident_gib'] = case.get('resident', 0.0)
    return result


def loader_fed_steps(cfg, spec: dict, trained, wrapper, world: int) -> Dict:
    """Training steps on batches of the real dataloader (after one)."""
    need = spec['batch'] * world * (spec['loader_iters'] + 2)
    loader = build_loader(
        dataloader_config(cfg, spec['folder'], spec['batch'],
                          spec['num_workers'], spec['image_size'], need))
    iterator = iter(loader)
    trained.train_step(next(iterator), wrapper)  # starts the workers
    times, wall = timed_steps(
        lambda: trained.train_step(next(iterator), wrapper),
        spec['loader_iters'], spec['device'])
    return dict(
        steps=len(times),
        num_workers=loader.num_workers,
        median_step_ms=statistics.median(times) * 1e3,
        images_per_s=spec['batch'] * world * len(times) / wall)


def run_dtype(spec: dict) -> Dict:
    """Every case at one AMP dtype in this process (module docstring).

    Args:
        spec: The parent's settings: cases, dtype, device, batch, global
            batch, rounds, iters, warmup, loader settings, cfg_options...

    Returns:
        This rank's measurements: ``cases`` (one result per case) and the
        process-wide figures (GPU, matmul peak, dataloader alone).
    """
    device, dtype = spec['device'], spec['dtype']
    rank, world, local_rank = init_distributed(device)
    sys.path.insert(0, REPO)
    from mmengine.registry import init_default_scope

    import mmae_plugin.registration  # noqa: F401
    init_default_scope('mmpretrain')
    result: Dict = dict(dtype=dtype, rank=rank, world_size=world, cases={})
    if spec.get('measure_loader'):
        # The input pipeline on its own, before this process uses the GPU;
        # the sampler gives each rank 1 / world of the epoch.
        cfg = load_config(spec['cases'][0], spec['cfg_options'])
        batches = max(2, spec['loader_iters'])
        result['dataloader_alone'] = measure_loader(
            dataloader_config(cfg, spec['folder'], spec['batch'],
                              spec['num_workers'], spec['image_size'],
                              spec['batch'] * world * (batches + 2)), batches)
        result['dataloader_alone']['ranks'] = world  # images/s of one rank
    if device == 'cuda':
        result['gpu'] = torch.cuda.get_device_name()
        result['capability'] = list(torch.cuda.get_device_capability())
        if dtype == 'bfloat16' and not torch.cuda.is_bf16_supported():
            result['skipped'] = 'this GPU has no bfloat16'
            return result
        if spec.get('measure_matmul') and dtype != 'float32':
            result['matmul_flops'] = measured_matmul_peak(
                getattr(torch, dtype))
    size = spec['image_size']
    images = torch.randint(
        0, 256, (spec['batch'], 3, size, size), dtype=torch.uint8)
    if device == 'cuda':
        images = images.pin_memory()
    data = dict(inputs=images, data_samples=[])
    built = {
        case: build_case(case, spec, data, rank, world, local_rank)
        for case in spec['cases']
    }
    for case in built.values():
        for _ in range(spec['warmup']):
            case['trained'].train_step(data, case['wrapper'])
    synchronize(device)
    if device == 'cuda':
        resident = torch.cuda.memory_allocated() / 2**30
        for case in built.values():
            case['resident'] = resident
    alternating_rounds(built, data, spec)
    for name, case in built.items():
        out = case_result(case, spec)
        if spec['loader_iters'] > 0:
            out['loader_fed'] = loader_fed_steps(case['cfg'], spec,
                                                 case['trained'],
                                                 case['wrapper'], world)
        if 'regularised_rows' in out:
            out['regulariser'] = regulariser_timing(
                case['model'].regularizer, out['regularised_rows_per_rank'],
                case['model'].backbone.embed_dims, device, spec['reg_reps'])
            out['regulariser_gathered'] = gathered_regulariser_timing(
                case['model'], out['regularised_rows'], device,
                spec['reg_reps'])
        result['cases'][name] = out
    return result


def worker_main(spec_path: str) -> None:
    """Entry of a dtype's process: run it and write this rank's JSON."""
    with open(spec_path) as f:
        spec = json.load(f)
    result = run_dtype(spec)
    with open(f'{spec["out"]}.rank{result["rank"]}.json', 'w') as f:
        json.dump(result, f, indent=2)
    if result['world_size'] > 1:
        import torch.distributed as dist
        dist.destroy_process_group()


# ----------------------------------------------------------------- parent
def launch_dtype(spec: dict, nproc: int, workdir: str, timeout: float) -> Dict:
    """Run one dtype's cases in fresh process(es); merge the ranks.

    Returns:
        Rank 0's result, each case with ``peak_memory_gib`` the largest
        over ranks and ``images_per_s`` over all ranks; every case a
        ``failed`` record if the process failed.
    """
    name = f'{spec["dtype"]}'
    spec = dict(spec, out=osp.join(workdir, name))
    spec_path = osp.join(workdir, f'{name}.spec.json')
    with open(spec_path, 'w') as f:
        json.dump(spec, f)
    script = osp.abspath(__file__)
    if nproc > 1:
        command = [
            sys.executable, '-m', 'torch.distributed.run', '--standalone',
            f'--nproc_per_node={nproc}', script, '--worker', spec_path
        ]
    else:
        command = [sys.executable, script, '--worker', spec_path]
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [REPO] + [p for p in [os.environ.get('PYTHONPATH')] if p]))
    if spec['device'] == 'cpu':
        env['CUDA_VISIBLE_DEVICES'] = ''
    log_path = osp.join(workdir, f'{name}.log')
    start = time.perf_counter()
    try:
        with open(log_path, 'w') as log:
            proc = subprocess.run(
                command,
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        returncode = 'timeout'
    wall = time.perf_counter() - start
    ranks = []
    for rank in range(nproc):
        path = f'{spec["out"]}.rank{rank}.json'
        if osp.exists(path):
            with open(path) as f:
                ranks.append(json.load(f))
    if returncode != 0 or len(ranks) != nproc:
        with open(log_path, errors='replace') as f:
            tail = f.read()[-3000:]
        failed = dict(
            dtype=spec['dtype'],
            failed=True,
            returncode=returncode,
            process_s=wall,
            log_tail=tail)
        return dict(
            failed,
            cases={case: dict(failed, case=case)
                   for case in spec['cases']})
    result = ranks[0]
    result['process_s'] = wall
    if 'skipped' in result:
        result['cases'] = {
            case: dict(case=case, skipped=result['skipped'])
            for case in spec['cases']
        }
        return result
    for case, run in result['cases'].items():
        memory = [
            r['cases'][case]['peak_memory_gib'] for r in ranks
            if 'peak_memory_gib' in r['cases'][case]
        ]
        if memory:
            run['peak_memory_gib'] = max(memory)
        step_s = run['step_ms']['median'] / 1e3
        run['images_per_s'] = spec['batch'] * nproc / step_s
        run['images_per_s_per_gpu'] = spec['batch'] / step_s
        run['process_s'] = wall
    return result


def add_mfu(result: Dict, peak: Optional[float], matmul: Optional[float],
            nproc: int) -> None:
    """MFU of a case: counted FLOPs x images/s against the peak(s)."""
    if result.get('failed') or 'skipped' in result:
        return
    achieved = result['flops']['counted_per_image'] * result['images_per_s']
    result['achieved_tflops_per_gpu'] = achieved / nproc / 1e12
    result['mfu_datasheet'] = achieved / nproc / peak if peak else None
    result['mfu_measured_matmul'] = achieved / nproc / matmul \
        if matmul else None


#: Two-sided 95 % Student t quantiles by degrees of freedom (1-10).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def mean_interval(values: Sequence[float]) -> Optional[List[float]]:
    """95 % t-interval of the mean of ``values`` (>= 2 of them)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    df = len(values) - 1
    half = (T_975[df - 1] if df <= len(T_975) else 1.96) * \
        statistics.stdev(values) / math.sqrt(len(values))
    return [mean - half, mean + half]


def usable(run: Dict) -> bool:
    return not run.get('failed') and 'skipped' not in run


def compare(cases: Dict[str, Dict], device: str) -> Dict:
    """M-MAE against MAE for one dtype: the step ratio paired by round
    (both cases of a round ran back to back in one process), its median,
    spread and 95 % interval, the step delta and the goals."""
    out: Dict = {}
    mae, mmae = cases.get('MAE'), cases.get('M-MAE')
    if mae and mmae and usable(mae) and usable(mmae):
        pairs = list(zip(mae['rounds'], mmae['rounds']))
        ratios = [b['median_ms'] / a['median_ms'] for a, b in pairs]
        out['mmae_over_mae_step_ratio'] = statistics.median(ratios)
        out['step_ratio_per_round'] = ratios
        out['step_ratio_spread'] = [min(ratios), max(ratios)]
        out['step_ratio_interval_95'] = mean_interval(ratios)
        out['step_delta_ms'] = statistics.median(
            b['median_ms'] - a['median_ms'] for a, b in pairs)
        out['rounds'] = len(pairs)
        out['steps_per_round'] = pairs[0][0]['steps'] if pairs else 0
    if mmae and usable(mmae) and 'regulariser' in mmae:
        out['regulariser_ms'] = mmae['regulariser']['median_ms']
        out['regulariser_rows'] = mmae['regularised_rows']
        gathered = mmae.get('regulariser_gathered')
        if gathered:
            out['regulariser_gathered_ms'] = gathered['median_ms']
            out['regulariser_gathered_shape'] = [
                gathered['rows_per_rank'], gathered['dim']
            ]
    if mae and usable(mae):
        out['mae_images_per_s'] = mae['images_per_s']
    if device == 'cuda':
        interval = out.get('step_ratio_interval_95')
        out['goals'] = dict(
            step_ratio_ok=_at_most(
                out.get('mmae_over_mae_step_ratio'),
                GOALS['mmae_over_mae_step_ratio_max']),
            step_ratio_interval_below_goal=None if not interval else
            interval[1] <= GOALS['mmae_over_mae_step_ratio_max'],
            regulariser_ms_ok=_at_most(
                out.get('regulariser_ms'), GOALS['regulariser_ms_max']),
            mae_images_per_s_ok=None if 'mae_images_per_s' not in out else
            out['mae_images_per_s'] >= GOALS['mae_images_per_s_min'],
            **GOALS)
    return out


def _at_most(value: Optional[float], limit: float) -> Optional[bool]:
    return None if value is None else value <= limit


def environment(args) -> Dict:
    from importlib.metadata import version

    # Versions from the metadata: importing mmpretrain here would cost the
    # parent seconds it has no other use for (the cases import it).
    info = dict(
        torch=torch.__version__,
        cuda=torch.version.cuda,
        mmengine=version('mmengine'),
        mmpretrain=version('mmpretrain'),
        device=args.device,
        nproc=args.nproc,
        batch_per_rank=args.batch,
        global_batch=args.global_batch,
        dtypes=args.dtypes,
        rounds=args.rounds,
        iters=args.iters,
        warmup=args.warmup,
        loader_iters=args.loader_iters,
        image_size=args.image_size,
        cfg_options=args.cfg_options,
        cpu_count=os.cpu_count(),
        load_average=os.getloadavg()[0],
        python=sys.version.split()[0])
    if args.device == 'cuda':
        info['visible_gpus'] = torch.cuda.device_count()
    return info


def run_all(args, save: Optional[Callable[[Dict], None]] = None) -> Dict:
    """The parent's work: the folder, one process per dtype, comparisons.

    Args:
        args: :func:`parse_args`'s namespace.
        save: Called with the result so far after each dtype.

    Returns:
        The whole result (see the module docstring).
    """
    workdir = tempfile.mkdtemp(prefix='bench_gpu_')
    result: Dict = dict(environment=environment(args))
    folder = args.folder
    if folder is None:
        folder = osp.join(workdir, 'images')
        big = args.device == 'cuda'
        result['image_folder'] = write_image_folder(folder, args.folder_images,
                                                    256 if big else 40,
                                                    500 if big else 64)
    else:
        result['image_folder'] = describe_image_folder(folder)
    base_spec = dict(
        device=args.device,
        batch=args.batch,
        global_batch=args.global_batch,
        rounds=args.rounds,
        iters=args.iters,
        warmup=args.warmup,
        loader_iters=args.loader_iters,
        num_workers=args.num_workers,
        folder=folder,
        image_size=args.image_size,
        reg_reps=args.reg_reps,
        cfg_options=args.cfg_options,
        cases=args.cases)
    result['amp'] = {}
    matmul = None
    for dtype in args.dtypes:
        spec = dict(
            base_spec,
            dtype=dtype,
            measure_matmul=matmul is None,
            measure_loader='dataloader_alone' not in result)
        run = launch_dtype(spec, args.nproc, workdir, args.case_timeout)
        if 'dataloader_alone' in run:
            result['dataloader_alone'] = run.pop('dataloader_alone')
        matmul = matmul or run.get('matmul_flops')
        gpu_name = result['environment'].get('gpu') or run.get('gpu')
        result['environment']['gpu'] = gpu_name
        peak = args.peak_tflops * 1e12 if args.peak_tflops else \
            datasheet_peak(gpu_name or '')
        for case, case_run in run['cases'].items():
            add_mfu(case_run, peak, matmul, args.nproc)
            print(
                f'[bench_gpu] {dtype} {case}: {progress_line(case_run)}',
                flush=True)
        result['amp'][dtype] = dict(
            cases=run['cases'],
            process_s=run.get('process_s'),
            peak_flops_datasheet=peak,
            matmul_flops_measured=matmul,
            **compare(run['cases'], args.device))
        if save is not None:  # what is done survives a killed run
            save(dict(result, partial=True, failed_cases=failed_cases(result)))
    result['failed_cases'] = failed_cases(result)
    return result


def progress_line(run: Dict) -> str:
    """One line about a finished case, for the log."""
    if run.get('failed'):
        return f'failed (return code {run["returncode"]})'
    if 'skipped' in run:
        return f'skipped: {run["skipped"]}'
    return (f'{run["images_per_s"]:.1f} images/s, median step '
            f'{run["step_ms"]["median"]:.2f} ms over {len(run["rounds"])} '
            f'rounds (round medians {run["step_ms"]["min"]:.2f}-'
            f'{run["step_ms"]["max"]:.2f}), process {run["process_s"]:.0f} s')


def failed_cases(result: Dict) -> List[str]:
    """``dtype/case`` of every case whose process failed."""
    return [
        f'{dtype}/{case}' for dtype, block in result['amp'].items()
        for case, run in block['cases'].items() if run.get('failed')
    ]


def _fmt(value, spec: str = '.2f', unit: str = '') -> str:
    return 'n/a' if value is None else f'{value:{spec}}{unit}'


def _interval(values: Optional[Sequence[float]], spec: str = '.3f') -> str:
    return 'n/a' if not values else \
        f'[{values[0]:{spec}}, {values[1]:{spec}}]'


def markdown(result: Dict) -> str:
    """A short Markdown summary of :func:`run_all`'s result."""
    env = result['environment']
    lines = [
        f'# bench_gpu: {env.get("gpu") or env["device"]} x {env["nproc"]}', '',
        f'torch {env["torch"]} (CUDA {env["cuda"]}), mmengine '
        f'{env["mmengine"]}, mmpretrain {env["mmpretrain"]}; batch '
        f'{env["batch_per_rank"]} per GPU, M-MAE regulariser on '
        f'{env["global_batch"] or "the gathered"} rows; {env["rounds"]} '
        f'alternating rounds of {env["iters"]} timed steps per case, both '
        'cases in one process per dtype.', '',
        '| dtype | model | images/s | step ms (round medians) | peak GiB | '
        'GFLOP/img (counted / closed form) | MFU (datasheet / matmul) | '
        'loader-fed images/s |',
        '| --- | --- | --- | --- | --- | --- | --- | --- |'
    ]
    for dtype, block in result['amp'].items():
        for case, run in block['cases'].items():
            if run.get('failed') or 'skipped' in run:
                why = run.get('skipped') or f'failed ({run["returncode"]})'
                lines.append(f'| {dtype} | {case} | {why} | | | | | |')
                continue
            flops, step = run['flops'], run['step_ms']
            lines.append(
                f'| {dtype} | {case} | {run["images_per_s"]:.0f} | '
                f'{step["median"]:.1f} ({step["min"]:.1f}-{step["max"]:.1f})'
                f' | {_fmt(run.get("peak_memory_gib"))} | '
                f'{flops["counted_per_image"] / 1e9:.2f} / '
                f'{flops["analytic_per_image"] / 1e9:.2f} | '
                f'{_fmt(run.get("mfu_datasheet"), ".1%")} / '
                f'{_fmt(run.get("mfu_measured_matmul"), ".1%")} | '
                f'{_fmt(run.get("loader_fed", {}).get("images_per_s"), ".0f")}'
                ' |')
    lines += [
        '', '| dtype | M-MAE / MAE step (per round; 95 % interval) | '
        'step delta ms | regulariser ms in the step (rows) | '
        'regulariser alone at the gathered size, ms | goals met |',
        '| --- | --- | --- | --- | --- | --- |'
    ]
    for dtype, block in result['amp'].items():
        goals = block.get('goals', {})
        met = ', '.join(f'{k}={v}' for k, v in goals.items()
                        if isinstance(v, bool) or v is None) or 'n/a (cpu)'
        per_round = ', '.join(f'{r:.3f}'
                              for r in block.get('step_ratio_per_round', []))
        shape = block.get('regulariser_gathered_shape')
        lines.append(
            f'| {dtype} | {_fmt(block.get("mmae_over_mae_step_ratio"), ".3f")}'
            f' ({per_round}; {_interval(block.get("step_ratio_interval_95"))})'
            f' | {_fmt(block.get("step_delta_ms"))} | '
            f'{_fmt(block.get("regulariser_ms"), ".3f")} '
            f'({block.get("regulariser_rows", "n/a")}) | '
            f'{_fmt(block.get("regulariser_gathered_ms"), ".3f")}'
            f'{f" ({shape[0]} x {shape[1]})" if shape else ""} | {met} |')
    loader = result.get('dataloader_alone')
    folder = result['image_folder']
    if loader:
        lines += [
            '', f'Dataloader alone ({loader["num_workers"]} workers, '
            f'{" -> ".join(loader["pipeline"])}): '
            f'{loader["images_per_s"]:.0f} images/s over '
            f'{folder.get("images", "?")} images '
            f'({folder.get("jpeg", "?")} JPEG, '
            f'{folder.get("png", "?")} PNG).'
        ]
    if result['failed_cases']:
        lines += [
            '', f'Failed: {", ".join(result["failed_cases"])} (see '
            'log_tail in the JSON).'
        ]
    return '\n'.join(lines) + '\n'


def main() -> None:
    args = parse_args()
    if args.worker:
        worker_main(args.worker)
        return
    if args.write_folder:
        info = write_image_folder(args.write_folder, args.folder_images, 256,
                                  500)
        print(json.dumps(info))
        return
    os.makedirs(osp.dirname(osp.abspath(args.out)), exist_ok=True)

    def save(result: Dict) -> None:
        with open(args.out, 'w') as f:
            json.dump(result, f, indent=2)

    result = run_all(args, save)
    save(result)
    summary = markdown(result)
    if args.markdown:
        with open(args.markdown, 'w') as f:
            f.write(summary)
    print(summary)
    print(f'written {args.out}')
    if result['failed_cases']:
        sys.exit(f'bench_gpu: failed cases: {result["failed_cases"]}')


if __name__ == '__main__':
    main()
