"""What a comparison is: arms, seeds, budget, evaluation protocol, layout.

A comparison trains every arm (a config with its ``--cfg-options``) under
every seed for the same number of epochs, evaluates the checkpoints of the
evaluation epochs with one protocol, and compares each arm with a
reference arm paired by seed. It is recorded in ``<out-dir>/comparison.json``
at its first start (configs frozen into ``<out-dir>/configs/``), so a
resumed or requeued job computes exactly what the first one started.

Layout under ``<out-dir>``::

    comparison.json              the spec (this module's Comparison)
    configs/<arm>.py, eval.py    the frozen configs
    runs/<arm>/seed<k>/          work dir of one job: checkpoints, logs
    runs/<arm>/seed<k>/eval/epoch<e>.json   one evaluation record
    runs.json                    every record and the spec (the report's
                                 only input, see records.py)
"""
import dataclasses
import json
import os
import os.path as osp
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The plugin's poolings a frozen evaluation can report (the CLS token,
#: the mean patch token and both concatenated, as ``pool_tokens`` makes
#: them); kept here as text so the spec imports no framework.
POOLINGS = ('cls', 'mean', 'cls+mean')
#: Frozen evaluations: ``'frozen'`` (kNN, linear and low-shot probes of one
#: label per image, :func:`.protocol.evaluate_checkpoint`) or ``'mosaic'``
#: (per-cell, principal-subspace and presence probes of mosaics,
#: :func:`.protocol.evaluate_mosaic_checkpoint`).
EVALUATIONS = ('frozen', 'mosaic')
#: The config value of an arm that trains nothing: the evaluation
#: encoder's own initialisation under the seed (a random-init control).
RANDOM_INIT = 'random'
SPEC_FILE = 'comparison.json'
NAME_PATTERN = r'[A-Za-z0-9_.+-]+'


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: a training config and its options.

    Attributes:
        name: Directory-safe name, e.g. ``'mmae_lam0.01'``.
        config: Training config path, or :data:`RANDOM_INIT`.
        options: ``--cfg-options`` of this arm, as ``(key, value)`` pairs.
        label: Name in tables and figures (default: ``name``).
    """
    name: str
    config: str
    options: Tuple[Tuple[str, Any], ...] = ()
    label: str = ''

    def __post_init__(self):
        if not re.fullmatch(NAME_PATTERN, self.name):
            raise ValueError(f'arm name must be a plain directory name, got '
                             f'{self.name!r}')
        if not self.label:
            object.__setattr__(self, 'label', self.name)
        # JSON-normal values (tuples as lists): the recorded spec read back
        # equals the one asked for.
        object.__setattr__(
            self, 'options',
            tuple((str(key), json.loads(json.dumps(value)))
                  for key, value in self.options))

    @property
    def trains(self) -> bool:
        return self.config != RANDOM_INIT


@dataclasses.dataclass(frozen=True)
class Protocol:
    """How each kept checkpoint is evaluated.

    Attributes:
        eval_config: A ``KNNClassifier`` config (its prototype is the
            training set, its test dataloader the test set) for the frozen
            evaluation, or ``None`` for none.
        poolings: Poolings the frozen evaluation reports.
        shots: Labels per class of the low-shot probes.
        bank_images: Training images of the kNN bank and the probes (the
            first N; ``None``: all).
        test_images: Test images classified (the first M; ``None``: all).
        weight_decay: L2 coefficient of every linear probe.
        test_configs: ``(name, config)`` pairs run as ``tools/test.py``
            runs on the checkpoint; their metrics are ``<name>/<metric>``.
        evaluation: What the frozen evaluation computes, one of
            :data:`EVALUATIONS`.
    """
    eval_config: Optional[str] = None
    poolings: Tuple[str, ...] = ('cls', 'cls+mean')
    shots: Tuple[int, ...] = (10, 100)
    bank_images: Optional[int] = None
    test_images: Optional[int] = None
    weight_decay: float = 1e-4
    test_configs: Tuple[Tuple[str, str], ...] = ()
    evaluation: str = 'frozen'

    def __post_init__(self):
        object.__setattr__(self, 'poolings', tuple(self.poolings))
        object.__setattr__(self, 'shots', tuple(self.shots))
        object.__setattr__(
            self, 'test_configs',
            tuple((name, config) for name, config in self.test_configs))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """Every arm under every seed, at equal budget.

    Attributes:
        arms: The arms, in report order.
        reference: Name of the arm every other is paired with.
        seeds: Seeds (each fixes initialisation, data order, masks, the
            low-shot subsets).
        epochs: Training epochs of every trained arm (the schedule ends
            there).
        eval_epochs: Epochs whose checkpoints are kept and evaluated.
        protocol: The evaluation.
        images: Training images (the first N; ``None``: the config's).
        cfg_options: ``--cfg-options`` applied to every trained arm before
            its own (execution settings such as dataloader workers).
    """
    arms: Tuple[Arm, ...]
    reference: str
    seeds: Tuple[int, ...]
    epochs: int
    eval_epochs: Tuple[int, ...]
    protocol: Protocol
    images: Optional[int] = None
    cfg_options: Tuple[Tuple[str, Any], ...] = ()

    def __post_init__(self):
        for name in ('arms', 'seeds', 'eval_epochs'):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        object.__setattr__(
            self, 'cfg_options',
            tuple((str(key), json.loads(json.dumps(value)))
                  for key, value in self.cfg_options))
        check_comparison(self)

    def arm(self, name: str) -> Arm:
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ValueError(f'unknown arm {name!r}; the comparison has '
                         f'{[a.name for a in self.arms]}')

    def arm_eval_epochs(self, arm: Arm) -> Tuple[int, ...]:
        """A random-init arm is evaluated once, at "epoch 0"."""
        return self.eval_epochs if arm.trains else (0, )

    def runs(self) -> List[Tuple[str, int]]:
        """``(arm, seed)`` of every job, seed-major (each finished seed adds
        one pair to every interval)."""
        return [(arm.name, seed) for seed in self.seeds for arm in self.arms]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> 'Comparison':
        data = dict(data)
        data['arms'] = tuple(Arm(**arm) for arm in data['arms'])
        data['protocol'] = Protocol(**data['protocol'])
        return cls(**data)


def check_comparison(spec: Comparison) -> None:
    """Raise ``ValueError`` naming the first inconsistent field."""
    names = [arm.name for arm in spec.arms]
    if len(names) < 2 or len(set(names)) != len(names):
        raise ValueError(f'arms must be at least two, with distinct names; '
                         f'got {names}')
    if spec.reference not in names:
        raise ValueError(f'reference {spec.reference!r} is not an arm; '
                         f'arms: {names}')
    if not spec.seeds or len(set(spec.seeds)) != len(spec.seeds) or \
            min(spec.seeds) < 0:
        raise ValueError(f'seeds must be distinct integers >= 0, got '
                         f'{list(spec.seeds)}')
    if spec.epochs < 1:
        raise ValueError(f'epochs must be >= 1, got {spec.epochs}')
    epochs = list(spec.eval_epochs)
    if not epochs or epochs != sorted(set(epochs)) or epochs[0] < 1 or \
            epochs[-1] != spec.epochs:
        raise ValueError(f'eval_epochs must be increasing, >= 1 and end at '
                         f'epochs={spec.epochs}, got {epochs}')
    check_protocol(spec.protocol, spec.arms)


def check_protocol(protocol: Protocol, arms: Sequence[Arm]) -> None:
    """Raise ``ValueError`` for a protocol that evaluates nothing or asks
    for what it cannot give."""
    if protocol.evaluation not in EVALUATIONS:
        raise ValueError(f'evaluation must be one of {EVALUATIONS}, got '
                         f'{protocol.evaluation!r}')
    if protocol.evaluation == 'mosaic' and protocol.eval_config is None:
        raise ValueError("evaluation 'mosaic' needs an evaluation config "
                         '(configs/fashion_mnist_mosaic/features_mosaic.py)')
    if protocol.eval_config is None and not protocol.test_configs:
        raise ValueError('the protocol evaluates nothing: give an '
                         'evaluation config or test configs')
    bad = [p for p in protocol.poolings if p not in POOLINGS]
    if bad or (protocol.eval_config is not None and not protocol.poolings):
        raise ValueError(f'poolings must be a non-empty subset of '
                         f'{POOLINGS}, got {list(protocol.poolings)}')
    if any(shot < 1 for shot in protocol.shots):
        raise ValueError(f'shots must be labels per class >= 1, got '
                         f'{list(protocol.shots)}')
    names = [name for name, _ in protocol.test_configs]
    if len(set(names)) != len(names) or not all(
            re.fullmatch(NAME_PATTERN, name) for name in names):
        raise ValueError(f'test config names must be distinct plain names, '
                         f'got {names}')
    if protocol.eval_config is None and any(not a.trains for a in arms):
        raise ValueError('a random-init arm is initialised from the '
                         'evaluation config: give one')


# ----------------------------------------------------------------------------
# Arms from the command line
# ----------------------------------------------------------------------------
def parse_options(items: Sequence[str]) -> Tuple[Tuple[str, Any], ...]:
    """``KEY=VALUE`` items as mmengine's ``--cfg-options`` parses them
    (``DictAction``: numbers, booleans, lists, tuples)."""
    from mmengine.config import DictAction
    options = []
    for item in items:
        key, sep, value = item.partition('=')
        if not sep or not key:
            raise ValueError(f'option {item!r} is not KEY=VALUE')
        options.append((key, DictAction._parse_iterable(value)))
    return tuple(options)


def parse_arm(text: str, label: str = '') -> Arm:
    """An arm from ``'NAME=CONFIG [KEY=VALUE ...]'``.

    Args:
        text: E.g. ``'mmae=configs/fashion_mnist/mmae_fmnist.py
            model.regularizer.loss_weight=0.01'``, or ``'init=random'``.
        label: Its name in the report (default: NAME).

    Returns:
        The :class:`Arm`.
    """
    head, *rest = text.split()
    name, sep, config = head.partition('=')
    if not sep or not name or not config:
        raise ValueError(f'an arm is NAME=CONFIG [KEY=VALUE ...], got '
                         f'{text!r}')
    return Arm(name, config, parse_options(rest), label)


# ----------------------------------------------------------------------------
# Layout on disk
# ----------------------------------------------------------------------------
def run_dir(out_dir: str, arm: str, seed: int) -> str:
    return osp.join(out_dir, 'runs', arm, f'seed{seed}')


def eval_path(out_dir: str, arm: str, seed: int, epoch: int) -> str:
    return osp.join(run_dir(out_dir, arm, seed), 'eval', f'epoch{epoch}.json')


def checkpoint_path(out_dir: str, arm: str, seed: int, epoch: int) -> str:
    return osp.join(run_dir(out_dir, arm, seed), f'epoch_{epoch}.pth')


def frozen_config_path(out_dir: str, name: str) -> str:
    """``configs/<arm>.py``, ``configs/eval.py`` or
    ``configs/test_<name>.py``."""
    return osp.join(out_dir, 'configs', f'{name}.py')


def recorded_checkpoints(directory: str) -> Dict[int, str]:
    """Epoch -> path of a run's finalized checkpoints that are still there.

    Read from the run record the plugin's checkpoint hook keeps
    (:mod:`mmae_plugin.checkpoint.run_record`): what the run wrote, never
    what a name suggests. A run folder without a record (written before
    records existed, or the random-init arm's ``epoch_0.pth``, which the
    comparison writes itself) is read by its ``epoch_<e>.pth`` names.

    Args:
        directory: A run folder.

    Returns:
        The checkpoints by epoch, oldest first.
    """
    from mmae_plugin.checkpoint.run_record import read_record
    record = read_record(directory)
    if not record.exists:
        return _named_checkpoints(directory)
    entries = sorted(record.checkpoints(), key=lambda e: (e.iter, e.epoch))
    return {e.epoch: e.location for e in entries if osp.exists(e.location)}


def _named_checkpoints(directory: str) -> Dict[int, str]:
    if not osp.isdir(directory):
        return {}
    found = (
        re.fullmatch(r'epoch_(\d+)\.pth', name)
        for name in os.listdir(directory))
    return {
        int(m.group(1)): osp.join(directory, m.group(0))
        for m in sorted(found, key=lambda m: int(m.group(1)) if m else -1) if m
    }


def checkpoint_epochs(directory: str) -> List[int]:
    """Epochs of a run's finalized checkpoints (:func:`recorded_checkpoints`).
    """
    return sorted(recorded_checkpoints(directory))


def last_checkpoint_epoch(directory: str) -> Optional[int]:
    """Epoch of the run's newest finalized checkpoint, if any."""
    epochs = checkpoint_epochs(directory)
    return epochs[-1] if epochs else None


def find_checkpoint(out_dir: str, arm: str, seed: int,
                    epoch: int) -> Optional[str]:
    """The run's checkpoint of ``epoch`` (:func:`recorded_checkpoints`), or
    None."""
    return recorded_checkpoints(run_dir(out_dir, arm, seed)).get(epoch)


def write_json_atomic(path: str, data: Any) -> None:
    """Write JSON so that a kill leaves either the old or the new file."""
    os.makedirs(osp.dirname(osp.abspath(path)), exist_ok=True)
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=1, ensure_ascii=False)
    os.replace(tmp, path)


def read_json(path: str) -> Any:
    with open(path) as f:
        return json.load(f)


# ----------------------------------------------------------------------------
# Recording a comparison and its configs
# ----------------------------------------------------------------------------
def resolve_config(path: str) -> str:
    """An existing config file: ``path`` as given (relative to the current
    folder), else relative to the installed package's ``.mim`` folder (so
    ``configs/fashion_mnist/mae_fmnist.py`` works from a wheel)."""
    if osp.isfile(path):
        return osp.abspath(path)
    import mmae_plugin
    packaged = osp.join(osp.dirname(mmae_plugin.__file__), '.mim', path)
    if osp.isfile(packaged):
        return packaged
    raise FileNotFoundError(f'config {path!r} not found (neither from '
                            f'{os.getcwd()} nor in {osp.dirname(packaged)})')


def configs_to_freeze(spec: Comparison) -> Dict[str, str]:
    """Frozen name -> config of every config the comparison runs."""
    wanted = {arm.name: arm.config for arm in spec.arms if arm.trains}
    if spec.protocol.eval_config is not None:
        wanted['eval'] = spec.protocol.eval_config
    wanted.update({
        f'test_{name}': config
        for name, config in spec.protocol.test_configs
    })
    return wanted


def freeze(out_dir: str, spec: Comparison) -> Comparison:
    """Record ``spec`` and dump its configs at the first start; later
    starts must ask for the same comparison.

    Raises:
        ValueError: If ``out_dir`` holds a different comparison (a new
            budget needs a new ``--out-dir``).
    """
    path = osp.join(out_dir, SPEC_FILE)
    if osp.isfile(path):
        recorded = Comparison.from_dict(read_json(path))
        if recorded != spec:
            raise ValueError(
                f'--out-dir {out_dir} holds a different comparison: '
                f'recorded {recorded.as_dict()}, asked {spec.as_dict()}; '
                'rerun with the recorded settings or use a new --out-dir')
        return recorded
    from mmengine.config import Config

    import mmae_plugin.registration  # noqa: F401  (the plugin's modules)
    for name, config in configs_to_freeze(spec).items():
        target = frozen_config_path(out_dir, name)
        os.makedirs(osp.dirname(target), exist_ok=True)
        Config.fromfile(resolve_config(config)).dump(target)
    # Written last: a spec on disk means its configs are there too.
    write_json_atomic(path, spec.as_dict())
    return spec


def load(out_dir: str) -> Comparison:
    path = osp.join(out_dir, SPEC_FILE)
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} does not exist: no comparison was '
                                f'started in --out-dir {out_dir}')
    return Comparison.from_dict(read_json(path))
