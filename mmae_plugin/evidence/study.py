"""The long-budget study: which arms, which budget, where each run lives.

MAE against M-MAE (TCR weight lambda 0.01 and the published 8-GPU
effective weight 0.00125, mu 1) on all 60,000 Fashion-MNIST training
images, with two controls of the same architecture through the same
evaluation: a random-init encoder (what the evaluation gets from the
architecture alone) and a supervised ViT trained with labels at the same
budget (what labels buy). Each run lives in ``<out-dir>/<arm>/seed<k>/``;
its checkpoints at the evaluation epochs are kept, and each evaluation is
``<run>/eval/epoch<e>.json``.
"""
import dataclasses
import json
import os
import os.path as osp
import re
from typing import Dict, List, Optional, Sequence, Tuple

#: The repository root (configs are read from here when a study starts).
REPO = osp.dirname(osp.dirname(osp.dirname(osp.abspath(__file__))))

#: Arm kinds: self-supervised pretraining, supervised training, no training.
KINDS = ('pretrain', 'supervised', 'random')


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm of the study.

    Attributes:
        name: Directory name, e.g. ``'mmae_lam0.01_mu1'``.
        label: Name in tables and figures.
        kind: One of :data:`KINDS`.
        config: Training config relative to the repository (``None`` for
            the random-init control).
        options: ``--cfg-options`` of the arm (the regulariser's weights).
    """
    name: str
    label: str
    kind: str
    config: Optional[str] = None
    options: Tuple[Tuple[str, float], ...] = ()

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f'kind must be one of {KINDS}, got '
                             f'{self.kind!r}')
        if not re.fullmatch(r'[A-Za-z0-9_.+-]+', self.name):
            raise ValueError(f'arm name must be a plain directory name, got '
                             f'{self.name!r}')

    @property
    def trains(self) -> bool:
        return self.kind != 'random'


def mmae_arm(lam: float, mu: float = 1.0) -> Arm:
    """M-MAE with TCR weight ``lam`` and coding-rate parameter ``mu``."""
    return Arm(f'mmae_lam{lam:g}_mu{mu:g}', f'M-MAE λ={lam:g} μ={mu:g}',
               'pretrain', 'configs/fashion_mnist/mmae_fmnist.py',
               (('model.regularizer.loss_weight', lam),
                ('model.regularizer.mu', mu)))


MAE = Arm('mae', 'MAE', 'pretrain', 'configs/fashion_mnist/mae_fmnist.py')
RANDOM_INIT = Arm('random_init', 'random init (control)', 'random')
SUPERVISED = Arm('supervised', 'supervised (control)', 'supervised',
                 'configs/fashion_mnist/supervised_fmnist.py')
#: The baseline every paired difference is taken against.
BASELINE = MAE.name
#: Seed-major order within a seed: the cheap control first, then MAE and
#: the M-MAE arms (the comparison the study is for), the supervised
#: control (the most expensive run) last.
STUDY_ARMS = (RANDOM_INIT, MAE, mmae_arm(0.01), mmae_arm(0.00125),
              SUPERVISED)
#: The evaluation (kNN config whose backbone returns every token, pooled
#: to CLS + mean patch token; the CLS token is the first half).
EVAL_CONFIG = 'configs/fashion_mnist/knn_fmnist_clsmean.py'
#: The poolings evaluated, in the plugin's pooling vocabulary.
POOLINGS = ('cls', 'cls+mean')


@dataclasses.dataclass(frozen=True)
class Study:
    """Size of every run and of its evaluation (equal for all arms).

    Attributes:
        arms: Arm names, in the order a seed runs them.
        seeds: Seeds, run seed-major (every arm of a seed before the next).
        images: Training images (the first N; 60000 = all).
        epochs: Training epochs of every trained arm.
        eval_epochs: Epochs whose checkpoints are kept and evaluated.
        bank_images: Training images the kNN and probes use (``None``: all).
        test_images: Test images classified (``None``: all 10,000).
        shots: Labels per class of the low-shot probes.
        weight_decay: L2 coefficient of every linear probe.
    """
    arms: Tuple[str, ...]
    seeds: Tuple[int, ...]
    images: int
    epochs: int
    eval_epochs: Tuple[int, ...]
    bank_images: Optional[int]
    test_images: Optional[int]
    shots: Tuple[int, ...] = (10, 100)
    weight_decay: float = 1e-4

    def __post_init__(self):
        check_study(self)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> 'Study':
        tuples = ('arms', 'seeds', 'eval_epochs', 'shots')
        return cls(**{key: tuple(value) if key in tuples else value
                      for key, value in data.items()})


def check_study(study: Study) -> None:
    """Raise ``ValueError`` naming the first inconsistent field."""
    known = {arm.name for arm in STUDY_ARMS}
    for name in study.arms:
        if name not in known:
            raise ValueError(f'arms: unknown arm {name!r}; known: '
                             f'{sorted(known)}')
    if not study.seeds or any(s < 0 for s in study.seeds):
        raise ValueError(f'seeds must be non-empty and >= 0, got '
                         f'{study.seeds}')
    if len(set(study.seeds)) != len(study.seeds):
        raise ValueError(f'seeds must be distinct, got {study.seeds}')
    if not 256 <= study.images <= 60000:
        raise ValueError(f'images must be in [256, 60000] (one batch .. '
                         f'all of Fashion-MNIST), got {study.images}')
    if study.epochs < 2:
        raise ValueError(f'epochs must be >= 2 (warm-up, then cosine), got '
                         f'{study.epochs}')
    if not study.eval_epochs or sorted(set(study.eval_epochs)) != \
            list(study.eval_epochs) or study.eval_epochs[0] < 1 or \
            study.eval_epochs[-1] != study.epochs:
        raise ValueError(
            f'eval_epochs must be increasing, >= 1 and end at epochs='
            f'{study.epochs}, got {study.eval_epochs}')
    if not study.shots or min(study.shots) < 1:
        raise ValueError(f'shots must be labels per class >= 1, got '
                         f'{study.shots}')


def full_study(seeds: Sequence[int] = (0, 1, 2, 3, 4), epochs: int = 20,
               eval_epochs: Optional[Sequence[int]] = None) -> Study:
    """All 60,000 images, ``epochs`` epochs, every arm, whole test set."""
    if eval_epochs is None:
        eval_epochs = sorted({e for e in (5, 10, 15, 20, epochs)
                              if e <= epochs})
    return Study(arms=tuple(arm.name for arm in STUDY_ARMS),
                 seeds=tuple(seeds), images=60000, epochs=epochs,
                 eval_epochs=tuple(eval_epochs), bank_images=None,
                 test_images=None)


def quick_study(seeds: Sequence[int] = (0, 1)) -> Study:
    """About a minute on 2 CPU cores: 512 images, 2 epochs, small sets."""
    return Study(arms=tuple(arm.name for arm in STUDY_ARMS),
                 seeds=tuple(seeds), images=512, epochs=2,
                 eval_epochs=(1, 2), bank_images=600, test_images=300,
                 shots=(2, 10))


def arm_by_name(name: str) -> Arm:
    for arm in STUDY_ARMS:
        if arm.name == name:
            return arm
    raise ValueError(f'unknown arm {name!r}; known: '
                     f'{[a.name for a in STUDY_ARMS]}')


def arm_eval_epochs(study: Study, arm: Arm) -> Tuple[int, ...]:
    """The random-init control is evaluated once, at "epoch 0"."""
    return study.eval_epochs if arm.trains else (0, )


# ----------------------------------------------------------------------------
# Layout on disk
# ----------------------------------------------------------------------------
def run_dir(out_dir: str, arm: str, seed: int) -> str:
    return osp.join(out_dir, arm, f'seed{seed}')


def checkpoint_path(out_dir: str, arm: str, seed: int, epoch: int) -> str:
    return osp.join(run_dir(out_dir, arm, seed), f'epoch_{epoch}.pth')


def eval_path(out_dir: str, arm: str, seed: int, epoch: int) -> str:
    return osp.join(run_dir(out_dir, arm, seed), 'eval', f'epoch{epoch}.json')


def checkpoint_epochs(directory: str) -> List[int]:
    """Epochs of the ``epoch_<e>.pth`` files in a run directory."""
    if not osp.isdir(directory):
        return []
    found = (re.fullmatch(r'epoch_(\d+)\.pth', name)
             for name in os.listdir(directory))
    return sorted(int(m.group(1)) for m in found if m)


def last_checkpoint_epoch(directory: str) -> Optional[int]:
    """Epoch of the checkpoint mmengine resumes from, if any.

    mmengine writes ``last_checkpoint`` only after a checkpoint is saved
    completely, so it never names a file cut short by a kill.
    """
    pointer = osp.join(directory, 'last_checkpoint')
    if not osp.isfile(pointer):
        return None
    with open(pointer) as f:
        match = re.search(r'epoch_(\d+)\.pth\s*$', f.read())
    return int(match.group(1)) if match else None


def write_json_atomic(path: str, data) -> None:
    """Write JSON so that a kill leaves either the old or the new file."""
    os.makedirs(osp.dirname(path), exist_ok=True)
    tmp = f'{path}.tmp{os.getpid()}'
    with open(tmp, 'w') as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


STUDY_FILE = 'study.json'


def freeze_study(out_dir: str, study: Study) -> Study:
    """Record the study at its first start; later starts must match it.

    Raises:
        ValueError: If ``out_dir`` holds a different study (a new budget
            needs a new ``--out-dir``).
    """
    path = osp.join(out_dir, STUDY_FILE)
    if osp.isfile(path):
        recorded = Study.from_dict(read_json(path))
        if recorded != study:
            raise ValueError(
                f'--out-dir {out_dir} holds a different study: recorded '
                f'{recorded.as_dict()}, asked {study.as_dict()}; rerun with '
                'the recorded settings or use a new --out-dir')
        return recorded
    write_json_atomic(path, study.as_dict())
    return study


def load_study(out_dir: str) -> Study:
    path = osp.join(out_dir, STUDY_FILE)
    if not osp.isfile(path):
        raise FileNotFoundError(f'{path} does not exist: no study was '
                                f'started in --out-dir {out_dir}')
    return Study.from_dict(read_json(path))


def frozen_config_path(out_dir: str, name: str) -> str:
    return osp.join(out_dir, 'configs', f'{name}.py')


def freeze_configs(out_dir: str, study: Study) -> Dict[str, str]:
    """Dump the arms' and the evaluation's configs once (resume-stable).

    A resumed study trains and evaluates exactly what it started with, even
    if the repository's configs changed in between.

    Returns:
        Arm name (and ``'eval'``) -> frozen config path.
    """
    from mmengine.config import Config
    import mmae_plugin.registration  # noqa: F401  (the plugin's modules)
    wanted = {arm.name: arm.config for arm in map(arm_by_name, study.arms)
              if arm.config is not None}
    wanted['eval'] = EVAL_CONFIG
    paths = {}
    for name, config in wanted.items():
        path = frozen_config_path(out_dir, name)
        if not osp.isfile(path):
            os.makedirs(osp.dirname(path), exist_ok=True)
            Config.fromfile(osp.join(REPO, config)).dump(path)
        paths[name] = path
    return paths
