"""Attention locality and collapse of mmpretrain ViT backbones.

mmpretrain's ``MultiheadAttention`` never materialises its attention
matrix, so a forward pre-hook on every layer's ``attn`` keeps its input and
the hook recomputes ``softmax(q k^T * s)`` with the module's own ``qkv``
and the scale it really applies (:func:`effective_logit_scale`); the ViT
runs unmodified. Statistics (:mod:`mmae_plugin.theory.attention_stats`) are
on the patch-to-patch block renormalised over patch keys, averaged over the
probe images. See docs/theory.md#attentionlocalityhook.
"""
import copy
import functools
import random
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.dataset import Compose
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmpretrain.models.backbones import VisionTransformer
from mmpretrain.models.selfsup import MAEViT
from mmpretrain.models.utils import MultiheadAttention
from mmpretrain.registry import TRANSFORMS

from mmae_plugin.theory.attention_stats import (
    attention_entropy, mean_attention_distance, patch_grid_distances,
    query_key_normalized_mutual_information)
from mmae_plugin.utils.validation import check_bool, check_config, check_int

STATISTICS = ('distance', 'nmi', 'entropy')
KEY_PREFIX = 'attn_locality'


def effective_logit_scale(module: MultiheadAttention) -> float:
    """Scale that ``module`` multiplies ``q k^T`` by before the softmax.

    mmpretrain 1.2.0 uses ``F.scaled_dot_product_attention`` (scale
    ``head_dims ** -0.5``) unless ``qk_scale`` is given; then it binds
    ``scaled_dot_product_attention_pyimpl(scale=head_dims ** -0.5)``, which
    *divides* the logits by ``scale``. We reproduce what runs, not the
    intent.

    Args:
        module (MultiheadAttention): An mmpretrain attention module.

    Returns:
        float: The multiplier applied to ``q k^T``.
    """
    function = module.scaled_dot_product_attention
    if isinstance(
            function,
            functools.partial) and function.keywords.get('scale') is not None:
        return 1.0 / function.keywords['scale']
    return module.head_dims**-0.5


def attention_probabilities(module: MultiheadAttention,
                            inputs: torch.Tensor) -> torch.Tensor:
    """Recompute the attention probabilities of ``module`` on its input.

    Args:
        module (MultiheadAttention): The attention module (unchanged).
        inputs (torch.Tensor): ``(B, N, C)`` tensor the module received.

    Returns:
        torch.Tensor: ``(B, heads, N, N)`` attention probabilities (no
        dropout, as in eval mode).
    """
    batch, tokens, _ = inputs.shape
    qkv = module.qkv(inputs).reshape(batch, tokens, 3, module.num_heads,
                                     module.head_dims).permute(2, 0, 3, 1, 4)
    query, key = qkv[0], qkv[1]
    logits = query @ key.transpose(-2, -1) * effective_logit_scale(module)
    return logits.float().softmax(dim=-1)


def patch_attention(attn: torch.Tensor, num_extra_tokens: int) -> torch.Tensor:
    """Patch-to-patch block of an attention map, renormalised over patches.

    Args:
        attn (torch.Tensor): ``(..., N, N)`` attention including extra
            (CLS) tokens first.
        num_extra_tokens (int): Number of leading non-patch tokens.

    Returns:
        torch.Tensor: ``(..., N - e, N - e)`` rows summing to 1.
    """
    block = attn[..., num_extra_tokens:, num_extra_tokens:]
    return block / block.sum(-1, keepdim=True).clamp_min(1e-12)


def attention_statistics(attn: torch.Tensor,
                         distances: torch.Tensor) -> Dict[str, torch.Tensor]:
    """Per-head statistics averaged over images.

    Args:
        attn (torch.Tensor): ``(B, heads, N, N)`` patch attention.
        distances (torch.Tensor): ``(N, N)`` pixel distances of patches.

    Returns:
        dict[str, torch.Tensor]: ``distance``, ``nmi`` and ``entropy``, each
        of shape ``(heads,)``.
    """
    return dict(
        distance=mean_attention_distance(attn, distances).mean(0),
        nmi=query_key_normalized_mutual_information(attn).mean(0),
        entropy=attention_entropy(attn).mean(0))


@HOOKS.register_module()
class AttentionLocalityHook(Hook):
    """Log attention distance, collapse (NMI) and entropy of a ViT backbone.

    On a fixed, cached probe batch, every ``interval`` epochs (or iterations),
    runs the backbone in eval mode on the unmasked path and logs
    ``attn_locality/{stat}_l{i}_h{h}`` and the head average
    ``attn_locality/{stat}_l{i}`` for ``stat`` in ``distance`` (pixels),
    ``nmi`` and ``entropy``. Use::

        custom_hooks = [dict(type='AttentionLocalityHook', interval=1,
                             probe_pipeline=[dict(type='PackInputs')])]

    Args:
        interval (int): Probe every ``interval`` epochs (iterations if
            ``by_epoch=False``). The last epoch is always probed.
        by_epoch (bool): Count ``interval`` in epochs. Defaults to True.
        num_probe_images (int): Size of the probe batch (the first training
            samples). Defaults to 64.
        probe_at_start (bool): Also probe before training (epoch 0).
            Defaults to True.
        probe_seed (int): Seed of the pipeline's random transforms while the
            probe batch is built (global RNG states are restored after).
        probe_view (int): Which view to probe when the pipeline produces
            several (contrastive methods). Defaults to 0.
        probe_pipeline (list[dict], optional): Transforms applied to the raw
            samples instead of the training pipeline, e.g.
            ``[dict(type='PackInputs')]`` to probe MAE and contrastive runs on
            the same un-augmented images. Defaults to None (training pipeline).
    """

    priority = 'LOW'

    def __init__(self,
                 interval: int = 1,
                 by_epoch: bool = True,
                 num_probe_images: int = 64,
                 probe_at_start: bool = True,
                 probe_seed: int = 0,
                 probe_view: int = 0,
                 probe_pipeline: Optional[List[dict]] = None) -> None:
        self.interval = check_int(interval, 'interval', minimum=1)
        self.by_epoch = check_bool(by_epoch, 'by_epoch')
        self.num_probe_images = check_int(
            num_probe_images, 'num_probe_images', minimum=1)
        self.probe_at_start = check_bool(probe_at_start, 'probe_at_start')
        # numpy seeds are 32-bit unsigned.
        self.probe_seed = check_int(probe_seed, 'probe_seed', minimum=0)
        if self.probe_seed >= 2**32:
            raise ValueError(f'probe_seed must be < 2**32, got {probe_seed!r}')
        self.probe_view = check_int(probe_view, 'probe_view', minimum=0)
        if probe_pipeline is not None:
            if not isinstance(probe_pipeline, list):
                raise TypeError('probe_pipeline must be None or a list of '
                                'transform configs, got '
                                f'{type(probe_pipeline).__name__} '
                                f'{probe_pipeline!r}')
            for position, transform in enumerate(probe_pipeline):
                check_config(transform, f'probe_pipeline[{position}]')
        # Built from mmpretrain's registry so that the transforms resolve
        # even outside a runner's default scope.
        self.probe_pipeline = (None if probe_pipeline is None else Compose(
            [TRANSFORMS.build(t) for t in probe_pipeline]))
        self._probe: Optional[torch.Tensor] = None
        self.history: List[Dict[str, float]] = []

    # ------------------------------------------------------------ runner API
    def before_train(self, runner) -> None:
        """Build the probe batch and optionally probe the initial model."""
        self._probe = self._build_probe(runner)
        if self.probe_at_start:
            self._probe_and_log(runner, epoch=0, step=runner.iter)

    def after_train_epoch(self, runner) -> None:
        """Probe every ``interval`` epochs and after the last epoch."""
        if not self.by_epoch:
            return
        if (self.every_n_epochs(runner, self.interval)
                or self.is_last_train_epoch(runner)):
            self._probe_and_log(
                runner, epoch=runner.epoch + 1, step=runner.iter)

    def after_train_iter(self,
                         runner,
                         batch_idx: int,
                         data_batch=None,
                         outputs=None) -> None:
        """Probe every ``interval`` iterations when ``by_epoch=False``."""
        if self.by_epoch:
            return
        if (self.every_n_train_iters(runner, self.interval)
                or self.is_last_train_iter(runner)):
            self._probe_and_log(
                runner, epoch=runner.epoch, step=runner.iter + 1)

    # -------------------------------------------------------------- helpers
    @staticmethod
    def _unwrap(runner) -> torch.nn.Module:
        model = runner.model
        return model.module if is_model_wrapper(model) else model

    def _backbone(self, runner) -> VisionTransformer:
        backbone = getattr(self._unwrap(runner), 'backbone', None)
        if not isinstance(backbone, VisionTransformer):
            raise TypeError(
                'AttentionLocalityHook needs model.backbone to be an '
                'mmpretrain VisionTransformer (e.g. VisionTransformer, '
                f'MAEViT, MoCoV3ViT); got {type(backbone).__name__}.')
        return backbone

    def _build_probe(self, runner) -> torch.Tensor:
        """Run the first images through pipeline and preprocessor once."""
        dataloader = runner.train_dataloader
        dataset = dataloader.dataset
        if len(dataset) < self.num_probe_images:
            raise ValueError(
                f'num_probe_images={self.num_probe_images} is invalid: the '
                f'training set has only {len(dataset)} samples.')
        states = (random.getstate(), np.random.get_state(),
                  torch.get_rng_state())
        try:
            # Fixed seed: the probe is identical across runs and configs,
            # and the training RNG streams are left untouched.
            random.seed(self.probe_seed)
            np.random.seed(self.probe_seed)
            torch.manual_seed(self.probe_seed)
            items = [
                self._probe_item(dataset, i)
                for i in range(self.num_probe_images)
            ]
        finally:
            random.setstate(states[0])
            np.random.set_state(states[1])
            torch.set_rng_state(states[2])
        batch = dataloader.collate_fn(items)
        model = self._unwrap(runner)
        with torch.no_grad():
            inputs = model.data_preprocessor(batch, False)['inputs']
        if isinstance(inputs, (list, tuple)):
            if self.probe_view >= len(inputs):
                raise ValueError(
                    f'probe_view={self.probe_view} is invalid: the pipeline '
                    f'produces {len(inputs)} views.')
            inputs = inputs[self.probe_view]
        return inputs.detach()

    def _probe_item(self, dataset, index: int) -> dict:
        """One sample through the probe pipeline (or the dataset's own)."""
        if self.probe_pipeline is None:
            return dataset[index]
        return self.probe_pipeline(copy.deepcopy(dataset.get_data_info(index)))

    @torch.no_grad()
    def measure(self, backbone: VisionTransformer,
                images: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Statistics of every layer and head of ``backbone`` on ``images``.

        Args:
            backbone (VisionTransformer): mmpretrain ViT (used as is).
            images (torch.Tensor): ``(B, C, H, W)`` preprocessed images.

        Returns:
            dict[str, torch.Tensor]: ``distance``, ``nmi``, ``entropy`` of
            shape ``(layers, heads)``.
        """
        captured = {}
        handles = []
        for index, layer in enumerate(backbone.layers):
            attn = getattr(layer, 'attn', None)
            if not isinstance(attn, MultiheadAttention):
                raise TypeError(
                    f'layer {index} of {type(backbone).__name__} has no '
                    'mmpretrain MultiheadAttention `attn`; got '
                    f'{type(attn).__name__}.')
            handles.append(
                attn.register_forward_pre_hook(
                    functools.partial(_store_input, captured, index)))
        was_training = backbone.training
        backbone.eval()
        try:
            if isinstance(backbone, MAEViT):
                backbone(images, mask=None)  # unmasked path (REFERENCE §4)
            else:
                backbone(images)
        finally:
            backbone.train(was_training)
            for handle in handles:
                handle.remove()

        distances = patch_grid_distances(backbone.patch_resolution,
                                         _patch_stride(backbone))
        per_layer = []
        for index, layer in enumerate(backbone.layers):
            attn = attention_probabilities(layer.attn, captured[index])
            attn = patch_attention(attn, backbone.num_extra_tokens)
            per_layer.append(attention_statistics(attn, distances))
        return {
            stat: torch.stack([layer[stat] for layer in per_layer]).cpu()
            for stat in STATISTICS
        }

    def _probe_and_log(self, runner, epoch: int, step: int) -> None:
        stats = self.measure(
            self._backbone(runner), self._probe.to(_device_of(runner)))
        scalars = scalar_dict(stats)
        runner.message_hub.update_scalars(scalars)
        self.history.append(dict(epoch=epoch, step=step, **scalars))
        record = {key: value for key, value in scalars.items()}
        record['epoch'] = epoch
        runner.visualizer.add_scalars(
            record, step=step, file_path=f'{runner.timestamp}.json')
        runner.logger.info(summary_text(stats, epoch))


def _store_input(storage: Dict[int, torch.Tensor], index: int,
                 module: torch.nn.Module, args: Sequence) -> None:
    """Forward pre-hook: keep the attention module's input tensor."""
    storage[index] = args[0].detach()


def _patch_stride(backbone: VisionTransformer) -> Sequence[float]:
    """Pixel stride of the patch embedding (kernel stride of the conv)."""
    stride = backbone.patch_embed.projection.stride
    return tuple(float(s) for s in stride)


def _device_of(runner) -> torch.device:
    return next(AttentionLocalityHook._unwrap(runner).parameters()).device


def scalar_dict(stats: Dict[str, torch.Tensor]) -> Dict[str, float]:
    """Flatten ``(layers, heads)`` statistics into named scalars.

    Args:
        stats (dict[str, torch.Tensor]): Output of
            :meth:`AttentionLocalityHook.measure`.

    Returns:
        dict[str, float]: ``attn_locality/{stat}_l{i}`` (head mean) and
        ``attn_locality/{stat}_l{i}_h{h}``.
    """
    scalars = {}
    for stat, values in stats.items():
        for layer, heads in enumerate(values):
            scalars[f'{KEY_PREFIX}/{stat}_l{layer}'] = float(heads.mean())
            for head, value in enumerate(heads):
                scalars[f'{KEY_PREFIX}/{stat}_l{layer}_h{head}'] = float(value)
    return scalars


def summary_text(stats: Dict[str, torch.Tensor], epoch: int) -> str:
    """One log line per layer with head-averaged statistics."""
    lines = [f'Attention locality (epoch {epoch}, head means):']
    for layer in range(stats['distance'].shape[0]):
        lines.append(f'  layer {layer}: distance '
                     f"{float(stats['distance'][layer].mean()):.3f} px, "
                     f"nmi {float(stats['nmi'][layer].mean()):.4f}, "
                     f"entropy {float(stats['entropy'][layer].mean()):.4f}")
    return '\n'.join(lines)
