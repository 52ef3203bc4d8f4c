"""The held-out quantities of a saved checkpoint, under other estimators.

When one of the information-flow paper's statements fails on the curves a
comparison logged, the question is what decides it: the estimator (Renyi
order alpha, batch size, BatchNorm mode, kernel, which branch output) or
the training itself. This module measures a comparison's kept checkpoints
again with ``MatrixInfoHook``'s held-out pass under a variant of its
settings, through the real runner: the arm's frozen config with
``load_from`` the checkpoint and the variant hook in place of its own,
stopped before the first training iteration (the hook measures the
held-out set before training; nothing trains, nothing is saved).
"""
import copy
import os.path as osp
from typing import Dict, List, Mapping, Optional, Sequence

from mmengine.hooks import Hook

from . import spec as layout

#: Variant name -> changes to the Siamese configs' hook (``heldout`` keys
#: go to its held-out settings). ``logged`` repeats the hook as configured
#: (it must reproduce the logged curve, a check of the whole path).
VARIANTS: Dict[str, dict] = {
    'logged': {},
    'alpha2': {'alpha': 2.0},
    'gram_kernel': {'kernel': 'gram'},
    'batch128': {'heldout': {'batch_size': 128, 'num_batches': 8}},
    'batch1024': {'heldout': {'batch_size': 1024, 'num_batches': 1}},
    'eval_bn': {'heldout': {'mode': 'eval'}},
    'backbone': {'branches': 'backbone'},
}


class StopBeforeTrainingHook(Hook):
    """Ends the loop before its first iteration (after every other
    ``before_train``, so the held-out set is measured first)."""
    priority = 'LOWEST'

    def before_train(self, runner) -> None:
        runner.train_loop.stop_training = True


def backbone_branches(model_type: str) -> List[dict]:
    """The two views' encoder outputs (mean-pooled feature maps) instead of
    the projector's: SimCLR encodes both views in one call, rows
    interleaved; the others call the encoder once per view (BYOL: its
    online encoder)."""
    if model_type == 'SimCLR':
        return [dict(module='backbone', call=0, rows='even'),
                dict(module='backbone', call=0, rows='odd')]
    return [dict(module='backbone', call=0), dict(module='backbone', call=1)]


def variant_hook(hook_cfg: dict, variant: Mapping, model_type: str) -> dict:
    """The arm's MatrixInfoHook config with a variant's changes."""
    cfg = copy.deepcopy(hook_cfg)
    for key, value in variant.items():
        if key == 'heldout':
            cfg['heldout'] = {**cfg['heldout'], **value}
        elif key == 'branches' and value == 'backbone':
            cfg['branches'] = backbone_branches(model_type)
        else:
            cfg[key] = value
    cfg['heldout'] = {**cfg['heldout'], 'at_start': True}
    return cfg


def measure_checkpoint(config: str, checkpoint: str, variant: Mapping,
                       work_dir: str) -> Dict[str, float]:
    """Held-out quantities of one checkpoint under one variant.

    Args:
        config: The arm's training config (the comparison's frozen copy).
        checkpoint: A checkpoint of that arm.
        variant: Changes to its ``MatrixInfoHook`` (see :data:`VARIANTS`).
        work_dir: Where the runner writes its log.

    Returns:
        The hook's held-out values, ``<prefix>_heldout/<name>``.
    """
    from mmengine.config import Config
    from mmengine.runner import Runner

    cfg = Config.fromfile(config)
    hooks = [dict(h) for h in cfg.get('custom_hooks', [])]
    found = [h for h in hooks if h['type'] == 'MatrixInfoHook']
    if len(found) != 1 or 'heldout' not in found[0]:
        raise ValueError(f'{config}: needs one MatrixInfoHook with a '
                         'held-out set')
    hook = variant_hook(found[0], variant, cfg.model.type)
    cfg.custom_hooks = [h for h in hooks if h is not found[0]] + [hook]
    cfg.work_dir = work_dir
    cfg.load_from, cfg.resume = checkpoint, False
    cfg.experiment_name = osp.basename(osp.normpath(work_dir))
    runner = Runner.from_cfg(cfg)
    runner.register_hook(StopBeforeTrainingHook(), priority='LOWEST')
    runner.train()
    measured = [h for h in runner.hooks if type(h).__name__ ==
                'MatrixInfoHook']
    history = measured[0].heldout_history
    return {k: v for k, v in history[0].items()
            if k not in ('epoch', 'step')}


def measure_variants(out_dir: str, arms: Sequence[str], seeds: Sequence[int],
                     epochs: Sequence[int],
                     variants: Optional[Sequence[str]] = None,
                     log=print) -> List[dict]:
    """Every (arm, seed, epoch, variant) of a comparison's kept checkpoints.

    Results are cached in ``<run>/variants/epoch<e>_<variant>.json``, so a
    rerun measures only what is missing.

    Returns:
        Records ``{arm, seed, epoch, variant, <quantity>: value}``.
    """
    rows = []
    for arm in arms:
        config = layout.frozen_config_path(out_dir, arm)
        for seed in seeds:
            run = layout.run_dir(out_dir, arm, seed)
            for epoch in epochs:
                ckpt = layout.checkpoint_path(out_dir, arm, seed, epoch)
                if not osp.isfile(ckpt):
                    continue
                for name in variants or list(VARIANTS):
                    path = osp.join(run, 'variants',
                                    f'epoch{epoch}_{name}.json')
                    if not osp.isfile(path):
                        log(f'[variants] {arm} seed {seed} epoch {epoch} '
                            f'{name}')
                        values = measure_checkpoint(
                            config, ckpt, VARIANTS[name],
                            osp.join(run, 'variants', f'epoch{epoch}_'
                                     f'{name}'))
                        layout.write_json_atomic(path, values)
                    rows.append({'arm': arm, 'seed': seed, 'epoch': epoch,
                                 'variant': name,
                                 **layout.read_json(path)})
    return rows


def variant_table(rows: Sequence[dict], first: int, last: int,
                  labels: Mapping[str, str],
                  quantities: Sequence[str] = ('mutual_info', 'joint_entropy',
                                               'matrix_js'),
                  prefix: str = 'minfo_heldout') -> List[str]:
    """Markdown: per variant and arm, each quantity's change from epoch
    ``first`` to ``last`` (paired by seed, 95 % t-interval) and the
    spectrum / matrix JS ratio at ``last``."""
    from .information_flow import fraction, rise, sign_verdict

    def curves_of(variant: str) -> dict:
        curves: dict = {}
        for row in rows:
            if row['variant'] != variant:
                continue
            run = curves.setdefault((row['arm'], row['seed']), {})
            for key, value in row.items():
                if key.startswith(prefix + '/'):
                    run.setdefault(key, {})[row['epoch']] = value
        return curves

    def key_of(curves: dict, name: str) -> Optional[str]:
        keys = {k for run in curves.values() for k in run
                if k.split('/', 1)[1].startswith(name + '_')}
        return min(keys) if keys else None

    head = ' | '.join(f'{q}: epoch {last} - {first}' for q in quantities)
    lines = [f'| variant | method | {head} | spectrum JS / matrix JS at '
             f'epoch {last} |', '|---|---|' + '---|' * (len(quantities) + 1)]
    for variant in dict.fromkeys(row['variant'] for row in rows):
        curves = curves_of(variant)
        for arm in dict.fromkeys(row['arm'] for row in rows):
            cells = []
            for quantity in quantities:
                key = key_of(curves, quantity)
                iv = key and rise(curves, arm, key, first, last)
                cells.append('–' if not iv else
                             f'{iv.text(3)} ({sign_verdict(iv)})')
            num, den = key_of(curves, 'spectrum_js'), key_of(curves,
                                                             'matrix_js')
            ratio = num and den and fraction(curves, arm, num, den, last)
            cells.append('–' if not ratio else
                         ratio.text(3).replace('+', ''))
            lines.append(f'| {variant} | {labels.get(arm, arm)} | ' +
                         ' | '.join(cells) + ' |')
    return lines
