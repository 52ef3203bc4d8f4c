"""A linear probe and a kNN monitor trained online on detached features.

As solo-learn's online classifier and stable-pretraining's ``OnlineProbe``
/ ``OnlineKNN`` callbacks: while a self-supervised algorithm pretrains, a
classifier of its own learns from the encoder features of the labelled
training batches, and is scored on a held-out split every few epochs. The
features come from :class:`~.MatrixInfoHook`'s taps (forward hooks keeping
a detached copy of the training forward's own output: no second training
forward), so pretraining runs exactly as it would without the hook.
"""
import contextlib
import functools
import logging
from typing import Any, Callable, Dict, Iterator, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from mmengine.dist import all_reduce, get_rank, get_world_size
from mmengine.hooks import Hook
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from torch import Tensor, nn

from mmae_plugin.evaluation.knn import (NeighbourBank, check_knn_args,
                                        full_precision_region)
from mmae_plugin.matrix_info.pooling import check_pooling_name
from mmae_plugin.models.utils.gather import gather_rows
from mmae_plugin.utils.validation import check_choice, check_int
from ..monitoring import online_probe as parts
from ..monitoring.heldout import (is_fsdp, seeded_rng, training_autocast,
                                  training_state_kept)
from ..monitoring.taps import BranchTaps, checked_branch

#: What the probe trains on (see ``train_features``).
TRAIN_FEATURES = ('tapped', 'eval')
#: The probe's optimizer unless ``optimizer=`` says otherwise.
DEFAULT_OPTIMIZER = dict(type='AdamW', lr=1e-2, weight_decay=1e-4)
#: The checkpoint entry holding each hook's probe, by ``prefix``.
CHECKPOINT_KEY = 'online_probes'


@HOOKS.register_module()
class OnlineProbeHook(Hook):
    """Train a linear probe and a kNN monitor on the encoder while pretraining.

    Every training iteration the hook takes the tapped encoder features of
    the batch (``branch``; by default the feature the algorithm's linear
    probe reads, see ``monitoring.online_probe.default_probe_branch``),
    detached and cast to float32, gathers them and their ``gt_label`` over
    ranks, takes one step of its own optimizer on a BatchNorm (no affine) +
    linear classifier, and keeps them in a bounded kNN memory. Every
    ``interval`` epochs (and after the last) it extracts the held-out
    features (``model(inputs, mode='tensor')`` in eval mode, under
    ``torch.no_grad()`` and the run's autocast, random states restored) and
    logs ``<prefix>/linear_top1`` and ``<prefix>/knn_top1`` (percent; kNN:
    cosine, ``exp(cos / temperature)`` votes of the ``k`` nearest memory
    rows); ``<prefix>/train_loss`` is logged every iteration.

    Every rank trains the same probe on the same gathered batch and
    scores its share of the held-out split (every rank the whole split
    under FSDP, whose forward is collective); the counts are summed over
    ranks, so every rank logs the same numbers. The
    training data must carry labels (checked in ``before_train``).
    Checkpoints keep the probe, its optimizer and the kNN memory (under
    ``'online_probes'``, by ``prefix``): a resumed run continues them, a run
    that only loads weights (``load_from``) starts a new probe.

    Example::

        custom_hooks = [dict(type='OnlineProbeHook', val_dataloader=dict(
            batch_size=500, dataset=dict(type='GzipFashionMNIST', ...,
            split='test', pipeline=[dict(type='PackInputs')])))]

    Args:
        interval: Evaluate every ``interval`` epochs, an integer >= 1.
        branch: The tapped feature, a branch dict as
            :class:`~.MatrixInfoHook`'s ``branches`` entries (None: the
            encoder feature of the algorithm).
        pool: Pooling of the default branch's tokens (``'cls'``, ``'mean'``,
            ``'cls+mean'``; None: the algorithm's).
        val_dataloader: Dataloader config of the labelled held-out split
            (its sampler is ignored); None: the runner's ``val_dataloader``.
        num_classes: Number of classes; None: from the held-out dataset's
            ``metainfo['classes']``.
        optimizer: Config of the probe's optimizer (a registered torch
            optimizer; ``params`` are the probe's); None:
            :data:`DEFAULT_OPTIMIZER`.
        k: Neighbours voting in the kNN monitor.
        temperature: Vote temperature of the kNN monitor.
        memory_size: Recent training rows the kNN memory keeps (0: no kNN).
        seed: Seed of the probe's weights and of the held-out pass.
        prefix: Prefix of the logged keys.
        train_features: What the probe trains on: ``'tapped'`` (the
            training forward's own features: masked images for MAE,
            augmented views; free) or ``'eval'`` (one more forward of the
            training batch's images, unmasked and unflipped, in eval mode
            as the held-out pass: the features the offline probe sees;
            costs an encoder forward per step).
    """

    priority = 'NORMAL'  # before LoggerHook (BELOW_NORMAL) writes the logs

    def __init__(self,
                 interval: int = 1,
                 branch: Optional[dict] = None,
                 pool: Optional[str] = None,
                 val_dataloader: Optional[dict] = None,
                 num_classes: Optional[int] = None,
                 optimizer: Optional[dict] = None,
                 k: int = 20,
                 temperature: float = 0.07,
                 memory_size: int = 8192,
                 seed: int = 0,
                 prefix: str = 'online_probe',
                 train_features: str = 'tapped') -> None:
        self.interval = check_int(interval, 'interval', minimum=1)
        self.branch = None if branch is None else self._checked(branch)
        self.pool = None if pool is None else check_pooling_name(pool, 'pool')
        self.val_dataloader = parts.check_heldout_cfg(val_dataloader)
        self.num_classes = None if num_classes is None else check_int(
            num_classes, 'num_classes', minimum=2)
        self.optimizer_cfg = parts.check_optimizer(
            DEFAULT_OPTIMIZER if optimizer is None else optimizer)
        check_knn_args(k, temperature, 1)
        self.k, self.temperature = int(k), float(temperature)
        self.memory = parts.FeatureMemory(
            check_int(memory_size, 'memory_size', minimum=0))
        self.seed = check_int(seed, 'seed', minimum=0)
        if not isinstance(prefix, str) or not prefix.strip('/'):
            raise TypeError(f'prefix must be a non-empty string, got '
                            f'{type(prefix).__name__} {prefix!r}')
        self.prefix = prefix.strip('/')
        self.train_features = check_choice(train_features, 'train_features',
                                           TRAIN_FEATURES)
        self.taps: Optional[BranchTaps] = None
        self.probe: Optional[nn.Module] = None
        self.probe_optimizer: Optional[torch.optim.Optimizer] = None
        self.history: list = []
        self._loader = None
        self._autocast = None
        self._loaded: Optional[dict] = None
        self._shard = (0, 1)
        #: Held-out rows this rank encoded in the last evaluation.
        self.last_heldout_rows = 0

    @staticmethod
    def _checked(branch: Any) -> dict:
        """A checked branch whose rows stay paired with their labels."""
        if not isinstance(branch, dict):
            raise ValueError(f'branch must be None or a branch dict, got '
                             f'{branch!r}')
        spec = checked_branch(branch)
        if spec['rows'] == 'shuffled':
            raise ValueError("branch rows='shuffled' is not allowed: the "
                             'rows must stay paired with their labels; use '
                             "'all', 'even' or 'odd'")
        return spec

    @staticmethod
    def _model(runner) -> nn.Module:
        """The runner's algorithm, unwrapped from DDP / FSDP wrappers."""
        return OnlineProbeHook._unwrap(runner.model)

    def before_run(self, runner) -> None:
        """Resolve the branch and register the training tap."""
        self.after_run(runner)  # never tap a module twice
        model = self._model(runner)
        if self.branch is None:
            self.branch = self._checked(
                parts.default_probe_branch(model, self.pool))
        parts.check_submodule(model, self.branch)
        self.taps = BranchTaps([self.branch])
        self.taps.attach(model)

    def before_train(self, runner) -> None:
        """Refuse unlabelled training data; build the held-out split."""
        dataset = runner.train_dataloader.dataset
        if not parts.training_sample_has_label(dataset, self.seed):
            raise ValueError(
                f'OnlineProbeHook needs labelled training batches, but '
                f'sample 0 of the training dataset ({type(dataset).__name__})'
                f' has no gt_label after its pipeline (a pretraining '
                f"pipeline such as Collect(keys=['img']) drops it). Keep the "
                f"label (end the pipeline with dict(type='PackInputs'), as "
                f'configs/fashion_mnist/mmae_fmnist_online_probe.py does) or '
                f'remove the hook')
        if get_world_size() > 1 and not is_fsdp(runner.model):
            self._shard = (get_rank(), get_world_size())
        self._loader = self._build_loader(runner)
        self.num_classes = self.num_classes or parts.dataset_classes(
            self._loader)
        if self.num_classes is None:
            raise ValueError(
                'OnlineProbeHook: num_classes=None, and the held-out '
                "dataset's metainfo has no 'classes'; pass num_classes (an "
                'integer >= 2)')
        self._autocast = training_autocast(runner.optim_wrapper)
        if self._loaded is not None and runner.iter > 0:  # resumed
            self._restore(self._loaded,
                          parts.module_device(self._model(runner)))
        self._loaded = None

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        """Save the probe, its optimizer and the kNN memory."""
        if self.probe is not None:
            checkpoint.setdefault(CHECKPOINT_KEY, {})[self.prefix] = dict(
                probe=self.probe.state_dict(),
                optimizer=self.probe_optimizer.state_dict(),
                memory=self.memory.state_dict())

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        """Keep the saved probe for ``before_train``, which continues it
        if the run resumes (its iteration is then past 0)."""
        self._loaded = (checkpoint.get(CHECKPOINT_KEY) or {}).get(self.prefix)

    def _restore(self, saved: dict, device: torch.device) -> None:
        """Continue the probe, optimizer and memory of a checkpoint."""
        self.probe = parts.probe_from_state(saved['probe'], self.seed, device)
        self.probe_optimizer = parts.build_probe_optimizer(
            self.optimizer_cfg, self.probe)
        self.probe_optimizer.load_state_dict(saved['optimizer'])
        if not self.memory.load_state_dict(saved['memory'], device):
            print_log(
                f'OnlineProbeHook: the checkpoint\'s kNN memory has another '
                f'size than memory_size={self.memory.size}; it starts empty',
                logger='current',
                level=logging.WARNING)

    def _build_loader(self, runner):
        """The held-out split: ours, else the runner's val_dataloader."""
        cfg = self.val_dataloader
        if cfg is None:
            cfg = getattr(runner, '_val_dataloader', None)
        if cfg is None:
            raise ValueError(
                'OnlineProbeHook: val_dataloader=None and the runner has no '
                'val_dataloader; pass val_dataloader=dict(dataset=..., '
                'batch_size=...) naming a labelled held-out split')
        device = torch.device('cpu')
        with seeded_rng(self.seed, device):
            return parts.build_heldout_loader(cfg, self._shard)

    def before_train_iter(
            self,
            runner,
            batch_idx: int,
            data_batch: Optional[Union[dict, tuple, list]] = None) -> None:
        """Arm the tap: every training step feeds the probe."""
        self.taps.clear()
        self.taps.armed = self.train_features == 'tapped'

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch: Optional[Union[dict, tuple, list]] = None,
                         outputs: Optional[dict] = None) -> None:
        """One probe step on the batch's gathered features and labels."""
        rows, labels = self._training_rows(runner.model, data_batch)
        with torch.no_grad():
            rows = gather_rows(rows)
            labels = gather_rows(labels.to(rows.device))
        loss = self._probe_step(rows, labels)
        self.memory.add(rows, labels)
        if loss is not None:
            runner.message_hub.update_scalar(f'train/{self.prefix}/train_loss',
                                             float(loss))

    def _training_rows(self, model: nn.Module,
                       data_batch: dict) -> Tuple[Tensor, Tensor]:
        """This rank's float32 features and labels of a training batch."""
        if self.train_features == 'eval':
            with self._feature_pass(model) as encode:
                return encode(data_batch)
        self.taps.armed = False
        (rows, ) = self.taps.embeddings()
        self.taps.clear()
        labels = parts.batch_labels(data_batch.get('data_samples'))
        if rows.shape[0] != labels.shape[0]:
            raise ValueError(
                f'OnlineProbeHook: branch {self.branch} gave {rows.shape[0]} '
                f'rows for {labels.shape[0]} labelled samples; set branch '
                "rows ('even' for interleaved views) to one row per sample")
        return rows.float(), labels

    def _probe_step(self, rows: Tensor, labels: Tensor) -> Optional[Tensor]:
        """One optimizer step of the probe in float32; its loss."""
        if rows.shape[0] < 2:  # BatchNorm needs two rows
            return None
        if self.probe is None:
            self.probe = parts.build_probe(rows.shape[1], self.num_classes,
                                           self.seed, rows.device)
            self.probe_optimizer = parts.build_probe_optimizer(
                self.optimizer_cfg, self.probe)
        with torch.enable_grad(), full_precision_region(rows.device):
            loss = F.cross_entropy(self.probe(rows), labels)
            self.probe_optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.probe_optimizer.step()
        return loss.detach()

    def after_train_epoch(self, runner) -> None:
        """Score the probe every ``interval`` epochs and after the last."""
        if (self.every_n_epochs(runner, self.interval)
                or self.is_last_train_epoch(runner)):
            self._log(runner, self.evaluate(runner.model), runner.epoch + 1)

    def after_run(self, runner) -> None:
        """Remove the training tap."""
        if self.taps is not None:
            self.taps.detach()

    def evaluate(self, model: nn.Module) -> Dict[str, float]:
        """Top-1 accuracies (percent) of the probe and the kNN monitor.

        Args:
            model: The runner's model (wrapped or not). Its modes, buffers
                and attributes, and every random state, are as before.

        Returns:
            ``linear_top1`` (once the probe has trained) and ``knn_top1``
            (once the memory has rows).
        """
        bank = NeighbourBank(*self.memory.bank()) if self.memory.filled \
            else None
        counts: Dict[str, Any] = dict(total=0, linear=0, knn=0)
        if self.probe is not None:
            self.probe.eval()
        try:
            with self._feature_pass(model) as encode:
                for batch in self._loader:
                    rows, labels = encode(batch)
                    counts['total'] += labels.shape[0]
                    self._count_batch(counts, rows, labels.to(rows.device),
                                      bank)
        finally:
            if self.probe is not None:
                self.probe.train()
        self.last_heldout_rows = counts['total']
        if self._shard[1] > 1:
            counts = summed_over_ranks(
                counts, parts.module_device(self._unwrap(model)))
        return self._accuracies(counts)

    @staticmethod
    def _unwrap(model: nn.Module) -> nn.Module:
        """The algorithm inside a DDP / FSDP wrapper (or ``model``)."""
        return model.module if is_model_wrapper(model) else model

    @contextlib.contextmanager
    def _feature_pass(self, model: nn.Module) -> Iterator[Callable]:
        """Encode batches in eval mode, leaving the model as it was.

        Inside, the model is in eval mode under ``torch.no_grad()``, the
        run's autocast and seeded random streams; on exit its modes,
        buffers and attributes and every random state are restored.

        Args:
            model: The runner's model (wrapped or not).

        Yields:
            ``encode(batch) -> (rows, labels)``: float32 features of the
            branch on the batch's (first view's) images, and their labels.
        """
        algorithm = self._unwrap(model)
        forward_model = model if is_fsdp(model) else algorithm
        taps = BranchTaps([parts.evaluation_branch(self.branch)])
        taps.attach(algorithm)
        try:
            # mode='tensor' runs the encoder alone, which writes no
            # parameter (the loss forward does: SwAV, CAE), and runs every
            # training step with train_features='eval'.
            with training_state_kept(forward_model, keep_parameters=False), \
                    torch.no_grad(), \
                    seeded_rng(self.seed, parts.module_device(algorithm)):
                forward_model.eval()
                yield functools.partial(self._encode, algorithm, forward_model,
                                        taps)
        finally:
            taps.detach()

    def _encode(self, algorithm: nn.Module, forward_model: nn.Module,
                taps: BranchTaps, batch: dict) -> Tuple[Tensor, Tensor]:
        """Features and labels of one batch (inside :meth:`_feature_pass`).
        """
        data = algorithm.data_preprocessor(batch, False)
        inputs = data['inputs']
        if isinstance(inputs, (list, tuple)):  # multi-view: the first view
            inputs = inputs[0]
        with taps.recording(), self._autocast():
            forward_model(inputs, data['data_samples'], mode='tensor')
        (rows, ) = taps.embeddings()
        taps.clear()
        return rows.float(), parts.batch_labels(data['data_samples'])

    def _count_batch(self, counts: Dict[str, Any], rows: Tensor,
                     labels: Tensor, bank: Optional[NeighbourBank]) -> None:
        """Add one held-out batch's correct predictions to ``counts``."""
        with full_precision_region(rows.device):
            if self.probe is not None:
                (right, ) = parts.top1_counts([self.probe(rows)], labels)
                counts['linear'] = counts['linear'] + right
            if bank is not None:
                scores = bank.class_scores(rows, self.num_classes, self.k,
                                           self.temperature)
                (right, ) = parts.top1_counts([scores], labels)
                counts['knn'] = counts['knn'] + right

    def _accuracies(self, counts: Dict[str, Any]) -> Dict[str, float]:
        """Percent accuracies of the counted predictions."""
        total = max(counts['total'], 1)
        values = {}
        if self.probe is not None:
            values['linear_top1'] = 100.0 * float(counts['linear']) / total
        if self.memory.filled:
            values['knn_top1'] = 100.0 * float(counts['knn']) / total
        return values

    def _log(self, runner, values: Dict[str, float], epoch: int) -> None:
        """Write the accuracies to the message hub, scalars.json and log."""
        scalars = {f'{self.prefix}/{k}': v for k, v in values.items()}
        runner.message_hub.update_scalars(scalars)
        self.history.append(dict(epoch=epoch, step=runner.iter, **scalars))
        runner.visualizer.add_scalars(
            dict(scalars, epoch=epoch),
            step=runner.iter,
            file_path=f'{runner.timestamp}.json')
        listing = ', '.join(f'{k}: {v:.2f}' for k, v in scalars.items())
        print_log(
            f'OnlineProbeHook, epoch {epoch}: {listing}',
            logger='current',
            level=logging.INFO)


def summed_over_ranks(counts: Dict[str, Any],
                      device: torch.device) -> Dict[str, float]:
    """``counts`` (numbers or device scalars) summed over every rank."""
    keys = sorted(counts)
    values = torch.tensor([float(counts[key]) for key in keys],
                          dtype=torch.float64,
                          device=device)
    all_reduce(values)
    return dict(zip(keys, values.tolist()))
