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

from mmae_compare import spec as layout

#: Variant name -> changes to the Siamese configs' hook (``heldout`` keys
#: go to its held-out settings). ``logged`` repeats the hook as configured
#: (it must reproduce the logged curve, a check of the whole path).
VARIANTS: Dict[str, dict] = {
    'logged': {},
    'alpha2': {
        'alpha': 2.0
    },
    'gram_kernel': {
        'kernel': 'gram'
    },
    'batch128': {
        'heldout': {
            'batch_size': 128,
            'num_batches': 8
        }
    },
    'batch1024': {
        'heldout': {
            'batch_size': 1024,
            'num_batches': 1
        }
    },
    'eval_bn': {
        'heldout': {
            'mode': 'eval'
        }
    },
    'backbone': {
        'branches': 'backbone'
    },
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
        return [
            dict(module='backbone', call=0, rows='even'),
            dict(module='backbone', call=0, rows='odd')
        ]
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

    from mmae_plugin.engine.runners.build import build_runner

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
    runner = build_runner(cfg)
    runner.register_hook(StopBeforeTrainingHook(), priority='LOWEST')
    runner.train()
    measured = [
        h for h in runner.hooks if type(h).__name__ == 'MatrixInfoHook'
    ]
    history = measured[0].heldout_history
    return {k: v for k, v in history[0].items() if k not in ('epoch', 'step')}


def measure_variants(out_dir: str,
                     arms: Sequence[str],
                     seeds: Sequence[int],
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
                ckpt = layout.find_checkpoint(out_dir, arm, seed, epoch)
                if ckpt is None:
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
                    rows.append({
                        'arm': arm,
                        'seed': seed,
                        'epoch': epoch,
                        'variant': name,
                        **layout.read_json(path)
                    })
    return rows


#: The hook's quantities, as the statements name them.
QUANTITIES = ('mutual_info', 'joint_entropy', 'matrix_js', 'spectrum_js',
              'entropy_1', 'entropy_2')
#: The key suffix every variant's values are read under: a variant logs
#: ``mutual_info_gram`` or ``mutual_info_cov_alpha2``, and the statements
#: are decided on each variant by the same code.
VARIANT_KERNEL = 'variant'


def quantity_of(key: str, prefix: str) -> Optional[str]:
    """``mutual_info`` of ``<prefix>/mutual_info_cov_alpha2``; None for a
    key of another prefix or quantity."""
    head, _, name = key.partition('/')
    if head != prefix:
        return None
    return next((q for q in QUANTITIES if name.startswith(q + '_')), None)


def variant_curves(rows: Sequence[dict],
                   variant: str,
                   prefix: str = 'minfo_heldout') -> dict:
    """One variant's measurements as the comparison's curves.

    Returns:
        ``(arm, seed) -> {quantity key: {epoch: value}}``, the keys
        ``quantity_key(prefix, quantity, VARIANT_KERNEL)``.
    """
    from .information_flow import quantity_key
    curves: dict = {}
    for row in rows:
        if row['variant'] != variant:
            continue
        run = curves.setdefault((row['arm'], row['seed']), {})
        for key, value in row.items():
            quantity = quantity_of(key, prefix)
            if quantity:
                run.setdefault(
                    quantity_key(prefix, quantity, VARIANT_KERNEL),
                    {})[row['epoch']] = value
    return curves


def variants_of(rows: Sequence[dict]) -> List[str]:
    """The variants measured, in order."""
    return list(dict.fromkeys(row['variant'] for row in rows))


def variant_table(rows: Sequence[dict],
                  first: int,
                  last: int,
                  labels: Mapping[str, str],
                  quantities: Sequence[str] = ('mutual_info', 'joint_entropy',
                                               'matrix_js'),
                  prefix: str = 'minfo_heldout') -> List[str]:
    """Markdown: per variant and arm, each quantity's change from epoch
    ``first`` to ``last`` (paired by seed, 95 % t-interval) and the
    spectrum / matrix JS ratio at ``last``."""
    from .information_flow import fraction, quantity_key, rise, sign_verdict

    def key(name: str) -> str:
        return quantity_key(prefix, name, VARIANT_KERNEL)

    head = ' | '.join(f'{q}: epoch {last} - {first}' for q in quantities)
    lines = [
        f'| variant | method | {head} | spectrum JS / matrix JS at '
        f'epoch {last} |', '|---|---|' + '---|' * (len(quantities) + 1)
    ]
    for variant in variants_of(rows):
        curves = variant_curves(rows, variant, prefix)
        for arm in dict.fromkeys(row['arm'] for row in rows):
            cells = []
            for quantity in quantities:
                iv = rise(curves, arm, key(quantity), first, last)
                cells.append(
                    '–' if not iv else f'{iv.text(3)} ({sign_verdict(iv)})')
            ratio = fraction(curves, arm, key('spectrum_js'), key('matrix_js'),
                             last)
            cells.append('–' if not ratio else ratio.text(3).replace('+', ''))
            lines.append(f'| {variant} | {labels.get(arm, arm)} | ' +
                         ' | '.join(cells) + ' |')
    return lines


def variant_statements(rows: Sequence[dict],
                       arms: Mapping[str, str],
                       labels: Mapping[str, str],
                       first: int,
                       mid: int,
                       last: int,
                       prefix: str = 'minfo_heldout') -> dict:
    """Statements 1-5 and J decided on each variant's measurements.

    Args:
        rows: :func:`measure_variants` records at ``first``, ``mid`` and
            ``last``.
        arms: Role -> arm name
            (:func:`~studies.information_flow.resolve_roles`).
        labels: Arm name -> label.
        first, mid, last: The epochs of a rise and of "meet at the end".
        prefix: The hook's key prefix.

    Returns:
        Variant -> its statements, in order.
    """
    from .information_flow import evaluate_statements
    return {
        variant: evaluate_statements(
            variant_curves(rows, variant, prefix), arms, labels, first, mid,
            last, prefix, VARIANT_KERNEL)
        for variant in variants_of(rows)
    }


def verdict_matrix(statements: Mapping[str, Sequence]) -> List[str]:
    """Markdown: one row per variant, one verdict per statement."""
    numbers = [st.number for st in next(iter(statements.values()))]
    lines = [
        '| variant | ' + ' | '.join(numbers) + ' |',
        '|---|' + '---|' * len(numbers)
    ]
    for variant, decided in statements.items():
        lines.append(f'| {variant} | ' + ' | '.join(st.verdict
                                                    for st in decided) + ' |')
    return lines


def variant_legend(variants: Sequence[str]) -> List[str]:
    """Markdown: what each variant changes in the hook."""
    return [
        f'- **{name}**: ' + (f'`{VARIANTS[name]}`' if VARIANTS[name] else
                             'the hook as the run logged it')
        for name in variants
    ]


def variant_report(rows: Sequence[dict], arms: Mapping[str, str],
                   labels: Mapping[str, str], first: int, mid: Optional[int],
                   last: int) -> List[str]:
    """The markdown a variants run writes: with a ``mid`` epoch, each
    statement's verdict under each variant and every variant's findings;
    then each quantity's rise per variant and method."""
    from .information_flow import verdict_table
    lines = ['Estimators (changes to the arm\'s `MatrixInfoHook`):', '']
    lines += variant_legend(variants_of(rows)) + ['']
    if mid is not None:
        decided = variant_statements(rows, arms, labels, first, mid, last)
        lines += [
            f'Verdicts per estimator (rises epoch {last} - {first}; '
            f'"meet" epoch {mid} against {last}):', ''
        ]
        lines += verdict_matrix(decided) + ['']
        for variant, statements in decided.items():
            lines += [f'<details><summary>{variant}: findings</summary>', '']
            lines += verdict_table(statements) + ['', '</details>', '']
    lines += [f'Change from epoch {first} to {last} per estimator:', '']
    return lines + variant_table(rows, first, last, labels)
