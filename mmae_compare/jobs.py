"""One submitit job per (arm, seed): train segments and evaluations.

A job reads the recorded comparison from ``<out-dir>`` and, for each
evaluation epoch whose record is missing, trains the run to that epoch
(resuming from the newest checkpoint, see :mod:`.training`) and evaluates
the checkpoint (:mod:`.protocol`), writing the record atomically. Whatever
is on disk is not redone, so a job that is requeued (Slurm preemption, a
time limit, ``scontrol requeue``) or submitted again continues where it
stopped. :class:`RunJob` is a ``submitit.helpers.Checkpointable``: on
preemption or timeout submitit requeues it with the same arguments.

Executors: submitit's local executor (one process per job on this
machine) or its Slurm executor (partition, GPUs, CPUs per task, time
limit); a job with several GPUs runs one task per GPU and MMEngine's
runner with ``launcher='slurm'``; rank 0 evaluates.
"""
import dataclasses
import json
import os
import os.path as osp
import re
import resource
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

import submitit

from . import spec as layout
from .spec import Comparison


@dataclasses.dataclass(frozen=True)
class Resources:
    """Where and how the jobs run.

    Attributes:
        cluster: ``'local'`` or ``'slurm'``.
        cpus_per_task: CPU cores per task (also torch's threads).
        gpus: GPUs per job (one task each; 0: CPU).
        partition: Slurm partition (``None``: the cluster's default).
        time_min: Time limit of a job, in minutes (a job that reaches it is
            requeued and continues).
        parallel: Local executor: jobs running at once.
    """
    cluster: str = 'local'
    cpus_per_task: int = 1
    gpus: int = 0
    partition: Optional[str] = None
    time_min: int = 60 * 24
    parallel: int = 1

    def __post_init__(self):
        if self.cluster not in ('local', 'slurm'):
            raise ValueError(f"cluster must be 'local' or 'slurm', got "
                             f'{self.cluster!r}')
        for name in ('cpus_per_task', 'time_min', 'parallel'):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got '
                                 f'{getattr(self, name)}')
        if self.gpus < 0:
            raise ValueError(f'gpus must be >= 0, got {self.gpus}')

    @property
    def launcher(self) -> str:
        """MMEngine's launcher of the training processes."""
        return 'slurm' if self.cluster == 'slurm' and self.gpus > 1 else \
            'none'


# ----------------------------------------------------------------------------
# Inside the job
# ----------------------------------------------------------------------------
def rank() -> int:
    """This task's rank in a multi-task Slurm job (0 otherwise)."""
    return int(os.environ.get('SLURM_PROCID', '0')) \
        if os.environ.get('SLURM_NTASKS', '1') != '1' else 0


def log_event(directory: str, **event) -> None:
    """Append one line to the run's ``history.jsonl`` (what each start of
    the job found and did: the evidence of a resume)."""
    os.makedirs(directory, exist_ok=True)
    event = {'time': round(time.time(), 1), **event}
    with open(osp.join(directory, 'history.jsonl'), 'a') as f:
        f.write(json.dumps(event) + '\n')


def cpu_seconds() -> float:
    """User and system CPU time of this process and of its children that
    have ended (data loader workers), in seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    ended = resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(own.ru_utime + own.ru_stime + ended.ru_utime + ended.ru_stime,
                 1)


def pending_epochs(out_dir: str, spec: Comparison, arm: str,
                   seed: int) -> List[int]:
    """Evaluation epochs of a run that have no record yet."""
    return [
        epoch for epoch in spec.arm_eval_epochs(spec.arm(arm))
        if not osp.isfile(layout.eval_path(out_dir, arm, seed, epoch))
    ]


def make_checkpoint(out_dir: str, spec: Comparison, arm: str, seed: int,
                    epoch: int, launcher: str) -> str:
    """The checkpoint of ``epoch``: trained to (or, for a random-init arm,
    initialised) unless the run already has it."""
    found = layout.find_checkpoint(out_dir, arm, seed, epoch)
    if found:
        return found
    config = spec.arm(arm)
    directory = layout.run_dir(out_dir, arm, seed)
    if not config.trains:
        path = layout.checkpoint_path(out_dir, arm, seed, epoch)
        if rank() == 0:
            save_random_init(out_dir, arm, seed, path)
        return path
    from .training import train_segment
    trained = layout.last_checkpoint_epoch(directory) or 0
    if trained >= epoch:
        raise FileNotFoundError(
            f'the run in {directory} is at epoch {trained} but has no '
            f'checkpoint of epoch {epoch} in its record; delete the folder '
            'to retrain it')
    train_segment(
        layout.frozen_config_path(out_dir, arm), spec, config, seed, directory,
        epoch, launcher)
    found = layout.find_checkpoint(out_dir, arm, seed, epoch)
    if found is None:
        raise FileNotFoundError(
            f'training {directory} to epoch {epoch} recorded no checkpoint '
            'of that epoch')
    return found


def save_random_init(out_dir: str, arm: str, seed: int, path: str) -> None:
    """The random-init arm's ``epoch_0.pth``."""
    import torch

    from mmae_plugin.checkpoint.atomic_write import open_atomically
    from .protocol import random_init_state
    state = random_init_state(layout.frozen_config_path(out_dir, 'eval'), seed)
    os.makedirs(osp.dirname(path), exist_ok=True)
    with open_atomically(path) as f:
        torch.save(
            {
                'state_dict': state,
                'meta': {
                    'comparison': {
                        'arm': arm,
                        'seed': seed
                    }
                }
            }, f)


def evaluate(out_dir: str, spec: Comparison, arm: str, seed: int,
             epoch: int) -> dict:
    """Evaluate one kept checkpoint and write its record."""
    from .protocol import evaluate_checkpoint, test_config_metrics
    start = time.time()
    checkpoint = layout.find_checkpoint(out_dir, arm, seed, epoch)
    protocol = spec.protocol
    record = {
        'arm': arm,
        'seed': seed,
        'epoch': epoch,
        'checkpoint': osp.relpath(checkpoint, out_dir)
    }
    eval_file = layout.eval_path(out_dir, arm, seed, epoch)
    if protocol.evaluation == 'mosaic':
        from .protocol import evaluate_mosaic_checkpoint
        record.update(
            evaluate_mosaic_checkpoint(
                layout.frozen_config_path(out_dir, 'eval'), checkpoint, seed,
                protocol.poolings, protocol.shots, protocol.weight_decay,
                protocol.bank_images, protocol.test_images))
    elif protocol.eval_config is not None:
        record.update(
            evaluate_checkpoint(
                layout.frozen_config_path(out_dir, 'eval'),
                checkpoint,
                seed,
                protocol.poolings,
                protocol.shots,
                protocol.bank_images,
                protocol.test_images,
                protocol.weight_decay,
                features_out=eval_file[:-5] + '_test_features.pt'))
    for name, _ in protocol.test_configs:
        metrics = test_config_metrics(
            layout.frozen_config_path(out_dir, f'test_{name}'), checkpoint,
            osp.join(
                layout.run_dir(out_dir, arm, seed), 'test',
                f'{name}_epoch{epoch}'))
        record.update(
            {f'{name}/{key}': value
             for key, value in metrics.items()})
    # Timings under time/: they differ from run to run, the numbers don't.
    record['time/eval_s'] = round(time.time() - start, 1)
    layout.write_json_atomic(eval_file, record)
    return record


def barrier() -> None:
    """Wait for every rank of a multi-GPU job (no-op otherwise)."""
    from mmengine.dist import barrier as dist_barrier
    from mmengine.dist import is_distributed
    if is_distributed():
        dist_barrier()


def run(out_dir: str,
        arm: str,
        seed: int,
        launcher: str = 'none',
        threads: Optional[int] = None) -> Dict[str, object]:
    """Everything one (arm, seed) still needs, in order.

    Args:
        out_dir: The comparison's folder (its spec recorded there).
        arm: The arm's name.
        seed: The seed.
        launcher: MMEngine's launcher of the training (``'slurm'``: this
            is one task of a multi-GPU Slurm job).
        threads: torch threads (default: torch's).

    Returns:
        ``{'arm', 'seed', 'evaluated': [epochs evaluated by this call]}``.
    """
    import torch
    if threads:
        torch.set_num_threads(threads)
    import mmae_plugin.registration  # noqa: F401
    spec = layout.load(out_dir)
    directory = layout.run_dir(out_dir, arm, seed)
    todo = pending_epochs(out_dir, spec, arm, seed)
    if rank() == 0:
        log_event(
            directory,
            event='start',
            pending=todo,
            trained_epoch=layout.last_checkpoint_epoch(directory),
            job=os.environ.get('SLURM_JOB_ID', 'local'),
            restarts=int(os.environ.get('SLURM_RESTART_COUNT', '0')),
            cpu_s=cpu_seconds())
    done = []
    for epoch in todo:
        make_checkpoint(out_dir, spec, arm, seed, epoch, launcher)
        if rank() == 0:
            log_event(
                directory, event='trained', epoch=epoch, cpu_s=cpu_seconds())
            evaluate(out_dir, spec, arm, seed, epoch)
            log_event(
                directory, event='evaluated', epoch=epoch, cpu_s=cpu_seconds())
            done.append(epoch)
        barrier()  # the next segment starts from the same disk on all ranks
    return {'arm': arm, 'seed': seed, 'evaluated': done}


class RunJob(submitit.helpers.Checkpointable):
    """The submitit job of one (arm, seed): :func:`run`, requeued with the
    same arguments on preemption or timeout (``Checkpointable``)."""

    def __call__(self,
                 out_dir: str,
                 arm: str,
                 seed: int,
                 launcher: str = 'none',
                 threads: Optional[int] = None) -> Dict[str, object]:
        return run(out_dir, arm, seed, launcher, threads)


# ----------------------------------------------------------------------------
# Submitting and waiting
# ----------------------------------------------------------------------------
def make_executor(out_dir: str, resources: Resources) -> submitit.AutoExecutor:
    """submitit's executor for ``resources``; its files go to
    ``<out-dir>/jobs/``, named by job id.

    The folder has no ``%j`` part: submitit's local executor would create
    it literally (a ``jobs/%j`` folder beside the jobs' own).
    """
    executor = submitit.AutoExecutor(
        folder=osp.join(out_dir, 'jobs'), cluster=resources.cluster)
    # One task per GPU only where MMEngine's slurm launcher joins them;
    # a local job is one process (on the first of its GPUs).
    tasks = resources.gpus if resources.launcher == 'slurm' else 1
    executor.update_parameters(
        name='mmae-compare',
        timeout_min=resources.time_min,
        nodes=1,
        tasks_per_node=tasks,
        cpus_per_task=resources.cpus_per_task,
        gpus_per_node=resources.gpus)
    if resources.cluster == 'slurm':
        executor.update_parameters(slurm_partition=resources.partition)
    return executor


def slurm_job_gone(job_id: str) -> bool:
    """Whether Slurm no longer lists the job (finished, failed or
    cancelled). The state comes from squeue: a cluster without an
    accounting database has no sacct, which submitit's own check uses."""
    proc = subprocess.run(['squeue', '-h', '-j', job_id, '-o', '%T'],
                          capture_output=True,
                          text=True)
    return proc.returncode != 0 or not proc.stdout.strip()


def job_finished(job: submitit.Job) -> bool:
    """Whether a job has a result, or is gone without one (Slurm: from
    squeue, not submitit's sacct check)."""
    if job.paths.result_pickle.exists():
        return True
    if isinstance(job, submitit.SlurmJob):
        return slurm_job_gone(job.job_id)
    return job.done()


def job_failure(job: submitit.Job, name: str) -> Optional[str]:
    """``None`` for a job that returned, else what went wrong."""
    if job.paths.result_pickle.exists():
        try:
            job.result()
            return None
        except Exception as error:  # the job's own exception, re-raised
            raised = [
                line.strip() for line in str(error).splitlines()
                if re.match(r'\s*[\w.]+(Error|Exception)\b', line)
            ]
            detail = raised[-1] if raised else type(error).__name__
    else:
        detail = 'ended without a result (killed or cancelled)'
    return f'{name} (job {job.job_id}): {detail}; see {job.paths.stderr}'


def wait(jobs: Sequence[Tuple[str, submitit.Job]],
         poll_s: float = 2.0,
         log=print) -> List[str]:
    """Wait for every job.

    Returns:
        What went wrong, one line per failed job (empty: all finished).
    """
    pending = list(jobs)
    failures = []
    while pending:
        still = []
        for name, job in pending:
            if not job_finished(job):
                still.append((name, job))
                continue
            failure = job_failure(job, name)
            log(f'[compare] {name}: ' +
                ('done' if failure is None else 'FAILED'))
            if failure:
                failures.append(failure)
        pending = still
        if pending:
            time.sleep(poll_s)
    return failures


def submit(out_dir: str,
           spec: Comparison,
           resources: Resources,
           runs: Sequence[Tuple[str, int]],
           log=print) -> List[Tuple[str, submitit.Job]]:
    """Submit one :class:`RunJob` per run.

    Slurm takes them all at once (its scheduler decides); the local
    executor starts a process per job at once, so this submits at most
    ``resources.parallel`` and waits for one to end before the next.

    Returns:
        ``('<arm> seed <k>', job)`` of every submitted job.
    """
    executor = make_executor(out_dir, resources)
    threads = resources.cpus_per_task
    submitted, running = [], []
    for arm, seed in runs:
        if resources.cluster == 'local':
            while len(running) >= resources.parallel:
                running = [(n, j) for n, j in running if not j.done()]
                time.sleep(0 if len(running) < resources.parallel else 1)
        name = f'{arm} seed {seed}'
        job = executor.submit(RunJob(), out_dir, arm, seed, resources.launcher,
                              threads)
        log(f'[compare] {name}: submitted as job {job.job_id}')
        submitted.append((name, job))
        running.append((name, job))
    return submitted


def unfinished_runs(out_dir: str, spec: Comparison) -> List[Tuple[str, int]]:
    """Runs with an evaluation record missing, seed-major."""
    return [(arm, seed) for arm, seed in spec.runs()
            if pending_epochs(out_dir, spec, arm, seed)]
