"""The parts of :class:`~.OnlineProbeHook`: branch, probe, memory, data.

Each is a small function or class the hook puts together: which encoder
feature is probed (:func:`default_probe_branch`), the probe and its own
optimizer (:func:`build_probe`, :func:`build_probe_optimizer`), the kNN
memory of recent training features (:class:`FeatureMemory`), the labels of
a batch (:func:`batch_labels`) and the held-out split
(:func:`build_heldout_loader`).
"""
import copy
import itertools
from functools import partial
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset

from mmae_plugin.utils.validation import check_config, check_real
from .branches import default_branches
from .heldout import seeded_rng

NAME = 'OnlineProbeHook'
#: (rank, ranks) of a held-out split's share; the whole split.
Shard = Tuple[int, int]
WHOLE: Shard = (0, 1)


def default_probe_branch(model: nn.Module, pool: Optional[str]) -> dict:
    """The encoder feature the algorithm's linear probe reads.

    The first branch :class:`~.MatrixInfoHook` taps by default, moved onto
    the encoder where it is not there already: for a model with a
    regulariser (M-MAE, U-MAE) the encoder pooled as ``MMAE.feature``
    instead of the regulariser's input; for Siamese methods the
    ``backbone`` call and rows of their first projection.

    Args:
        model: The unwrapped algorithm.
        pool: The hook's ``pool`` (None: the algorithm's pooling).

    Returns:
        One branch specification (unchecked).
    """
    if pool is None and isinstance(
            getattr(model, 'regularizer', None), nn.Module):
        pool = getattr(model, 'feature', None)
    first = dict(default_branches(model, pool)[0])
    module = first['module']
    if module == 'backbone' or module.startswith('backbone.'):
        return first
    if first.get('block') is not None:
        raise ValueError(
            f'{NAME}: {type(model).__name__} stacks several crops in one '
            f'call ({first}); pass branch=dict(module=\'backbone\', ...) '
            'naming the call and rows of the first view')
    return dict(
        module='backbone',
        call=first.get('call', 0),
        rows=first.get('rows', 'all'),
        pool=pool or 'cls')


def evaluation_branch(branch: dict) -> dict:
    """The training branch as tapped on the held-out feature pass.

    The held-out pass runs the encoder once on single-view images, so the
    first call and every row are taken.
    """
    spec = dict(branch, call=0, rows='all')
    spec.pop('block', None)
    return spec


def check_submodule(model: nn.Module, branch: dict) -> None:
    """Raise naming the branch when ``model`` has no such submodule."""
    try:
        model.get_submodule(branch['module'])
    except AttributeError:
        names = [n for n, _ in model.named_children()]
        raise ValueError(
            f'{NAME}: branch module {branch["module"]!r} is not a submodule '
            f'of {type(model).__name__}; allowed: a dotted submodule name '
            f'under one of {names}') from None


def check_optimizer(cfg: Any) -> dict:
    """Validate the probe's ``optimizer`` config (a torch optimizer)."""
    from mmengine.registry import OPTIMIZERS
    check_config(cfg, 'optimizer')
    kind = cfg['type']
    if isinstance(kind, str) and OPTIMIZERS.get(kind) is None:
        raise ValueError(
            f'optimizer type must name a registered optimizer such as '
            f"'AdamW' or 'SGD', got {kind!r}")
    if 'params' in cfg:
        raise ValueError('optimizer must not set params: the probe '
                         'optimizes its own parameters only')
    if 'lr' in cfg:
        check_real(cfg['lr'], 'optimizer lr', minimum=0, strict=True)
    return dict(cfg)


def build_probe(dim: int, num_classes: int, seed: int,
                device: torch.device) -> nn.Sequential:
    """BatchNorm without affine, then linear: the linear-probe classifier.

    The weights are drawn from a generator of their own (normal, std 0.01;
    bias 0), so building the probe leaves the global random state alone.

    Args:
        dim: Feature width.
        num_classes: Number of classes.
        seed: Seed of the weights' generator.
        device: Where the probe lives (the features' device).

    Returns:
        The probe, float32, in train mode.
    """
    generator = torch.Generator().manual_seed(seed)
    linear = torch.nn.utils.skip_init(
        nn.Linear, dim, num_classes, device=device)
    with torch.no_grad():
        weight = torch.randn(num_classes, dim, generator=generator) * 0.01
        linear.weight.copy_(weight)
        linear.bias.zero_()
    norm = nn.BatchNorm1d(dim, affine=False, device=device)
    return nn.Sequential(norm, linear)


def probe_from_state(state: Dict[str, Tensor], seed: int,
                     device: torch.device) -> nn.Sequential:
    """The probe of :func:`build_probe` with the weights of ``state`` (its
    ``state_dict``), its size read from them."""
    num_classes, dim = state['1.weight'].shape
    probe = build_probe(dim, num_classes, seed, device)
    probe.load_state_dict(state)
    return probe


def build_probe_optimizer(cfg: dict,
                          probe: nn.Module) -> torch.optim.Optimizer:
    """The probe's own optimizer (``cfg`` of :func:`check_optimizer`)."""
    from mmengine.registry import OPTIMIZERS
    return OPTIMIZERS.build(dict(cfg, params=probe.parameters()))


class FeatureMemory:
    """A bounded FIFO memory of the latest training features and labels.

    Args:
        size: Rows kept (0: none, the kNN monitor is off).
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self.rows: Optional[Tensor] = None
        self.labels: Optional[Tensor] = None
        self.filled = 0
        self._next = 0

    def add(self, rows: Tensor, labels: Tensor) -> None:
        """Keep ``rows`` (N, d) and ``labels`` (N,), dropping the oldest."""
        if self.size == 0:
            return
        if self.rows is None:
            self.rows = rows.new_zeros(self.size, rows.shape[1])
            self.labels = labels.new_zeros(self.size)
        rows, labels = rows[-self.size:], labels[-self.size:]
        slots = (self._next +
                 torch.arange(rows.shape[0], device=rows.device)) % self.size
        self.rows[slots] = rows
        self.labels[slots] = labels
        self._next = (self._next + rows.shape[0]) % self.size
        self.filled = min(self.size, self.filled + rows.shape[0])

    def bank(self) -> Tuple[Tensor, Tensor]:
        """The kept rows and labels."""
        return self.rows[:self.filled], self.labels[:self.filled]

    def state_dict(self) -> dict:
        """What :meth:`load_state_dict` takes back (tensors and ints)."""
        return dict(
            rows=self.rows,
            labels=self.labels,
            filled=self.filled,
            next=self._next)

    def load_state_dict(self, state: dict, device: torch.device) -> bool:
        """Continue from :meth:`state_dict`, the tensors on ``device``.

        Returns:
            False, leaving the memory empty, where it was saved with
            another ``size``.
        """
        rows = state['rows']
        if (0 if rows is None else rows.shape[0]) != self.size:
            return False
        self.rows = None if rows is None else rows.to(device)
        self.labels = None if rows is None else state['labels'].to(device)
        self.filled, self._next = int(state['filled']), int(state['next'])
        return True


def batch_labels(data_samples: Optional[Sequence[Any]]) -> Tensor:
    """The integer labels (N,) of a batch's data samples.

    Raises:
        ValueError: A sample has no single ``gt_label``.
    """
    samples = list(data_samples or [])
    if not samples or any('gt_label' not in s for s in samples):
        raise ValueError(
            f'{NAME} trains on labelled batches, but a training batch has '
            'data samples without gt_label; keep the label in the training '
            "pipeline (end it with dict(type='PackInputs'))")
    labels = torch.cat([s.gt_label.reshape(-1) for s in samples])
    if labels.numel() != len(samples):
        raise ValueError(f'{NAME} needs one gt_label per sample (single-'
                         f'label classification), got {labels.numel()} '
                         f'labels for {len(samples)} samples')
    return labels.long()


def training_sample_has_label(dataset: Any, seed: int) -> bool:
    """Whether sample 0 of ``dataset`` keeps its ``gt_label``.

    The sample is drawn inside :func:`~.heldout.seeded_rng`,
    so the pipeline's random draws leave the training streams alone.
    """
    with seeded_rng(seed, torch.device('cpu')):
        item = dataset[0]
    samples = item.get('data_samples') if isinstance(item, dict) else None
    if isinstance(samples, (list, tuple)):
        samples = samples[0] if samples else None
    return samples is not None and 'gt_label' in samples


def check_heldout_cfg(cfg: Any) -> Any:
    """Validate ``val_dataloader``: None or a dict with ``dataset``."""
    if cfg is None or isinstance(cfg, DataLoader):
        return cfg
    if not isinstance(cfg, dict) or 'dataset' not in cfg:
        raise ValueError(
            f'val_dataloader must be None (the runner\'s val_dataloader) or '
            f'a dataloader config dict with a "dataset" key, got {cfg!r}')
    return cfg


def build_heldout_loader(cfg: Any, shard: Shard = WHOLE) -> DataLoader:
    """The held-out split in order, or one rank's share of it.

    Args:
        cfg: A dataloader config (``dataset``, ``batch_size``,
            ``num_workers``, ``collate_fn`` (default ``default_collate``);
            the sampler is ignored) or a
            built ``DataLoader`` (its dataset, batch size and collate).
        shard: (rank, ranks): this rank reads samples ``rank``, ``rank +
            ranks``, ... ((0, 1): all of them).

    Returns:
        A ``DataLoader`` without a distributed sampler.
    """
    if isinstance(cfg, DataLoader):
        return DataLoader(
            sharded(cfg.dataset, shard),
            batch_size=cfg.batch_size or 1,
            shuffle=False,
            collate_fn=cfg.collate_fn)
    import mmengine.dataset  # noqa: F401  (registers the collate functions)
    from mmengine.registry import FUNCTIONS
    from mmpretrain.registry import DATASETS
    cfg = copy.deepcopy(dict(cfg))
    dataset = cfg['dataset']
    if isinstance(dataset, dict):
        dataset = DATASETS.build(dataset)
    # default_collate (mmengine's default is pseudo_collate): the
    # self-supervised preprocessors read a list of inputs as views.
    collate = dict(cfg.get('collate_fn', dict(type='default_collate')))
    kind = collate.pop('type')
    collate_fn = partial(
        FUNCTIONS.get(kind) if isinstance(kind, str) else kind, **collate)
    workers = cfg.get('num_workers', 0)
    return DataLoader(
        sharded(dataset, shard),
        batch_size=cfg.get('batch_size', 256),
        shuffle=False,
        num_workers=workers,
        persistent_workers=bool(workers and cfg.get('persistent_workers')),
        collate_fn=collate_fn)


def sharded(dataset: Any, shard: Shard) -> Any:
    """Samples ``rank``, ``rank + ranks``, ... of ``dataset``."""
    rank, ranks = shard
    if ranks == 1:
        return dataset
    return Subset(dataset, range(rank, len(dataset), ranks))


def module_device(module: nn.Module) -> torch.device:
    """The device of ``module``'s first parameter or buffer (else CPU)."""
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        return tensor.device
    return torch.device('cpu')


def dataset_classes(loader: DataLoader) -> Optional[int]:
    """Number of classes in the loader's dataset metainfo, if it says."""
    dataset = loader.dataset
    if isinstance(dataset, Subset):
        dataset = dataset.dataset
    classes = getattr(dataset, 'metainfo', {}).get('classes')
    return len(classes) if classes else None


def top1_counts(logits: List[Tensor], labels: Tensor) -> List[Tensor]:
    """Correct top-1 predictions of each score matrix (device scalars)."""
    return [(scores.argmax(dim=1) == labels).sum() for scores in logits]
