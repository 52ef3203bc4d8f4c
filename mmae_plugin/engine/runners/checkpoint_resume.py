"""Resume and load that verify checkpoints and choose the run's own.

:class:`VerifiedCheckpointMixin` goes before mmengine's ``Runner`` or
``FlexibleRunner`` (see :mod:`.runners`). It changes three things, only in
runs whose config sets ``runner_type`` to one of the plugin's runners:

* auto-resume (``resume=True`` without ``load_from``) continues from the
  newest intact own checkpoint
  (:func:`~mmae_plugin.checkpoint.discovery.choose_resume_checkpoint`),
  and a fallback is written to the run's log with what it costs;
* every local checkpoint the runner resumes or loads (``--resume``,
  ``load_from``, and the ``Pretrained`` ``init_cfg`` of any module, as the
  linear-probe and fine-tuning configs use), file or FSDP folder, is
  verified first; a damaged one raises ``CorruptCheckpointError`` naming
  it and the newest intact checkpoint beside it.
"""
from typing import Any, Iterator

import torch

from mmae_plugin.checkpoint.discovery import choose_resume_checkpoint
from mmae_plugin.checkpoint.loading import verify_before_loading


def pretrained_checkpoints(model: torch.nn.Module) -> Iterator[str]:
    """Checkpoints the ``Pretrained`` ``init_cfg``s of ``model`` will load.

    Args:
        model: The runner's model (wrapped or not).

    Yields:
        Each non-empty ``checkpoint`` of an ``init_cfg`` of type
        ``'Pretrained'``, in module order.
    """
    for module in model.modules():
        init_cfg = getattr(module, 'init_cfg', None)
        for cfg in init_cfg if isinstance(init_cfg, list) else [init_cfg]:
            if isinstance(cfg, dict) and cfg.get('type') == 'Pretrained' \
                    and cfg.get('checkpoint'):
                yield cfg['checkpoint']


class VerifiedCheckpointMixin:
    """Runner behaviour for verified, own-checkpoint resume (see module)."""

    def load_or_resume(self) -> None:
        """Choose the auto-resume checkpoint, then load or resume as mmengine.
        """
        if not self._has_loaded and self._resume is True and \
                self._load_from is None:
            choice = choose_resume_checkpoint(self.work_dir)
            if choice.skipped:
                self.logger.warning(choice.fallback_message())
            if choice.path is not None:
                self.logger.info(f'Auto-resuming from {choice.path}')
                self._load_from = choice.path
            else:
                self._resume = False  # nothing to resume: a fresh start
        super().load_or_resume()

    def _init_model_weights(self) -> None:
        """Verify the ``Pretrained`` checkpoints, then initialise as mmengine.
        """
        for checkpoint in pretrained_checkpoints(self.model):
            verify_before_loading(checkpoint)
        super()._init_model_weights()

    def load_checkpoint(self, filename: str, *args, **kwargs) -> Any:
        """Verify a local checkpoint, then load it as mmengine does.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``load_checkpoint``.
            **kwargs: As for mmengine's ``load_checkpoint``.

        Returns:
            What mmengine returns.
        """
        verify_before_loading(filename)
        return super().load_checkpoint(filename, *args, **kwargs)

    def resume(self, filename: str, *args, **kwargs) -> Any:
        """Verify a local checkpoint, then resume from it as mmengine does.

        Args:
            filename: Checkpoint path or URL.
            *args: As for mmengine's ``resume``.
            **kwargs: As for mmengine's ``resume``.

        Returns:
            What mmengine returns.
        """
        verify_before_loading(filename)
        return super().resume(filename, *args, **kwargs)
