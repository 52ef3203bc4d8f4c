"""A randomized soak of kill, damage and resume on the real Runner.

Run as a script (``tests/test_resume_soak.py`` does)::

    python tests/resume_soak_driver.py OUT.json --cycles 200 [--seed 0]

Each cycle resumes (``resume=True``) the toy run of a work dir towards a
random further epoch, with a random checkpoint policy (epoch or iteration
checkpoints, ``max_keep_ckpts`` 1-3), in a forked child that is SIGKILLed
at a random moment with probability 1/2 (mid-epoch, mid-save, mid-record,
mid-retention: wherever the timer falls). Between cycles the work dir is
damaged at random: a checkpoint truncated, bit-flipped, zero-filled or
replaced by another run's or another config's checkpoint; garbage or NUL
bytes in ``last_checkpoint`` or the run record, or its last line cut; a
foreign ``epoch_99.pth``. The toy run has one iteration per epoch, no
shuffling and no schedule, and the same batch every iteration, so the
weights after k iterations are those of an unbroken run of k iterations.
(mmengine's own epoch loop would resume an iteration checkpoint written at
the end of an epoch by running that epoch again; the plugin's runner
continues after it (``exact_resume``). An episode is compared with the
unbroken run at its own iteration count.)

Invariants checked after every cycle:

* the resumed state was written by this run: its run id is the episode's
  and its weights equal the reference at its iteration, bit for bit;
* no finalized, undamaged checkpoint the policy keeps is missing: every
  recorded entry of the run that the soak did not damage is intact, and
  the newest recorded one is resumable;
* auto-resume refuses only when every recorded checkpoint was damaged;
* at the end of an episode (the last epoch reached) the final weights equal
  the unbroken run's at that iteration, bit for bit.
"""
import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading

import torch

torch.set_num_threads(1)  # forked children: no OpenMP pool to inherit

from mmengine.hooks import Hook  # noqa: E402

import mmae_plugin.registration  # noqa: E402,F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import ToyModel, make_toy_runner  # noqa: E402

from mmae_plugin.checkpoint.run_record import RECORD_NAME  # noqa: E402
from mmae_plugin.checkpoint.run_record import read_record
from mmae_plugin.engine.runners import MMAERunner  # noqa: E402

LAST_EPOCH = 8


class OtherToyModel(ToyModel):
    """Another model config, the same parameters."""


def runner_for(work_dir,
               max_epochs,
               by_epoch=True,
               max_keep_ckpts=-1,
               resume=True,
               hooks=(),
               model=None):
    torch.manual_seed(0)  # the toy model's initial weights
    runner = make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=MMAERunner,
        dataset_length=2,
        log_level='ERROR',
        resume=resume,
        custom_hooks=list(hooks),
        randomness=dict(seed=0),
        default_hooks=dict(
            checkpoint=dict(
                type='SafeCheckpointHook',
                by_epoch=by_epoch,
                interval=1,
                max_keep_ckpts=max_keep_ckpts)))
    if model is not None:
        runner.model = model
    return runner


def weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


class CollectStates(Hook):
    """The model's weights after each iteration (the unbroken reference)."""

    priority = 'VERY_LOW'

    def __init__(self):
        self.states = {}

    def before_train(self, runner):
        self.states[runner.iter] = weights(runner.model)

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        self.states[runner.iter + 1] = weights(runner.model)


class ReportStart(Hook):
    """Write where the (resumed) run starts and whether it is the run's."""

    priority = 'LOWEST'

    def __init__(self, result_file, reference):
        self.result_file, self.reference = result_file, reference

    def before_train(self, runner):
        state = weights(runner.model)
        expected = self.reference.get(runner.iter)
        with open(self.result_file, 'w') as f:
            json.dump(
                dict(
                    start_iter=runner.iter,
                    run_id=runner.message_hub.get_info('mmae_run_id'),
                    matches_reference=expected is not None and all(
                        torch.equal(state[k], expected[k]) for k in expected)),
                f)


def in_child(function, kill_after=None):
    """Run ``function`` in a forked child, SIGKILLed after ``kill_after``
    seconds if given; return ``('exit', code)`` or ``('signal', n)``."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if kill_after is not None:
                threading.Timer(kill_after, os.kill,
                                (os.getpid(), signal.SIGKILL)).start()
            function()
            code = 0
        except BaseException as err:  # reported through the exit code
            sys.stderr.write(f'child: {type(err).__name__}: {err}\n'[:2000])
            code = 3 if 'CorruptCheckpointError' in type(err).__name__ \
                else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return ('signal', os.WTERMSIG(status))
    return ('exit', os.WEXITSTATUS(status))


def damage(rng, work_dir, foreign):
    """Damage one thing in ``work_dir`` at random.

    Returns:
        ``(what, damaged recorded path or None)``.
    """
    record = read_record(str(work_dir))
    recorded = [e.location for e in record.checkpoints()]
    existing = [path for path in recorded if os.path.isfile(path)]
    kind = rng.choice([
        'truncate', 'flip', 'zero', 'replace_run', 'replace_config',
        'last_checkpoint', 'record_nul', 'record_garbage', 'record_cut',
        'foreign_file'
    ])
    if kind in ('truncate', 'flip', 'zero', 'replace_run',
                'replace_config') and existing:
        path = rng.choice(existing)
        size = os.path.getsize(path)
        if kind == 'truncate':
            with open(path, 'r+b') as f:
                f.truncate(rng.randrange(size))
        elif kind == 'flip':
            with open(path, 'r+b') as f:
                offset = rng.randrange(size)
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 0xFF]))
        elif kind == 'zero':
            with open(path, 'r+b') as f:
                f.write(b'\0' * min(4096, size))
        else:
            shutil.copy(foreign[kind], path)
        return kind, path
    if kind == 'last_checkpoint':
        with open(os.path.join(work_dir, 'last_checkpoint'), 'wb') as f:
            f.write(
                rng.choice([
                    b'\0' * 45, b'junk://x', b'/nonexistent',
                    os.fsencode(foreign['replace_run'])
                ]))
    elif kind.startswith('record') and os.path.exists(
            os.path.join(work_dir, RECORD_NAME)):
        path = os.path.join(work_dir, RECORD_NAME)
        with open(path, 'rb') as f:
            data = f.read()
        if kind == 'record_cut':
            data = data[:-rng.randrange(1, 60)]
        else:
            data += b'\0' * 300 if kind == 'record_nul' else \
                b'{"event": "saved", "path": "epoch_99.pth"\n'
        with open(path, 'wb') as f:
            f.write(data)
        if kind == 'record_cut':
            # A cut "removed" line revives a retired entry whose file is
            # gone: damage the soak did, not a checkpoint the policy keeps.
            after = {
                e.location
                for e in read_record(str(work_dir)).checkpoints()
            }
            revived = sorted(after - set(recorded))
            return kind, revived[0] if revived else None
    elif kind == 'foreign_file':
        shutil.copy(foreign['replace_run'],
                    os.path.join(work_dir, 'epoch_99.pth'))
    return kind, None


def check_record(work_dir, damaged, violations, cycle):
    """Every recorded entry the soak did not damage is intact."""
    record = read_record(str(work_dir))
    for entry in record.checkpoints():
        problem = entry.problem()
        if problem is not None and entry.location not in damaged:
            violations.append(
                dict(
                    cycle=cycle,
                    invariant='kept checkpoint '
                    'missing or damaged',
                    path=entry.location,
                    problem=problem))


def soak(root, cycles, seed):
    rng = random.Random(seed)
    reference = CollectStates()
    # Iteration checkpoints replay an epoch (see the module): the reference
    # runs longer than any episode can.
    runner_for(
        os.path.join(root, 'reference'),
        4 * LAST_EPOCH,
        hooks=[reference],
        resume=False).train()
    foreign_run = os.path.join(root, 'foreign_run')
    runner_for(foreign_run, 3, resume=False).train()
    other_config = os.path.join(root, 'other_config')
    runner_for(other_config, 3, resume=False, model=OtherToyModel()).train()
    foreign = dict(
        replace_run=os.path.join(foreign_run, 'epoch_3.pth'),
        replace_config=os.path.join(other_config, 'epoch_3.pth'))
    violations, counts = [], dict(
        kills_armed=0, kills=0, damages=0, refusals=0, episodes=0, resumes=0)
    episode = None
    for cycle in range(cycles):
        if episode is None:
            counts['episodes'] += 1
            episode = dict(
                work_dir=os.path.join(root, f'episode{counts["episodes"]}'),
                run_id=None,
                damaged=set(),
                epoch=0)
        work_dir = episode['work_dir']
        if rng.random() < 0.4 and os.path.isdir(work_dir):
            kind, path = damage(rng, work_dir, foreign)
            counts['damages'] += 1
            if path is not None:
                episode['damaged'].add(path)
        target = min(LAST_EPOCH, episode['epoch'] + rng.randint(1, 3))
        by_epoch, keep = rng.random() < 0.5, rng.randint(1, 3)
        result = os.path.join(root, f'cycle{cycle}.json')
        kill_after = rng.uniform(0.0, 0.25) if rng.random() < 0.5 else None

        def train():
            runner_for(
                work_dir,
                target,
                by_epoch,
                keep,
                hooks=[ReportStart(result, reference.states)]).train()

        before = read_record(str(work_dir))
        intact = [e for e in before.checkpoints() if e.problem() is None]
        counts['kills_armed'] += kill_after is not None
        ended = in_child(train, kill_after)
        counts['kills'] += ended == ('signal', signal.SIGKILL)
        record = read_record(str(work_dir))
        if ended == ('exit', 3):
            counts['refusals'] += 1
            if intact:
                violations.append(
                    dict(
                        cycle=cycle,
                        invariant='refused with an intact '
                        'recorded checkpoint',
                        path=intact[0].location))
            # Every recorded checkpoint was damaged: start the run afresh.
            shutil.rmtree(work_dir)
            episode = None
            continue
        if ended[0] == 'exit' and ended[1] != 0:
            violations.append(
                dict(cycle=cycle, invariant='crashed', ended=list(ended)))
        if os.path.exists(result):
            with open(result) as f:
                start = json.load(f)
            os.remove(result)
            if start['start_iter'] > 0:
                counts['resumes'] += 1
                if not start['matches_reference'] or \
                        start['run_id'] != episode['run_id']:
                    violations.append(
                        dict(
                            cycle=cycle,
                            invariant='resumed state not written '
                            'by this run',
                            start=start,
                            run_id=episode['run_id']))
            elif episode['run_id'] is not None and intact:
                violations.append(
                    dict(
                        cycle=cycle,
                        invariant='started '
                        'afresh with an intact checkpoint'))
            if start['start_iter'] == 0:
                episode['run_id'] = start['run_id']
        check_record(work_dir, episode['damaged'], violations, cycle)
        intact = [e for e in record.checkpoints() if e.problem() is None]
        if intact:
            episode['epoch'] = intact[0].epoch
        if ended == ('exit', 0) and target == LAST_EPOCH:
            final = torch.load(
                intact[0].location, weights_only=True)['state_dict']
            expected = reference.states[intact[0].iter]
            if not all(torch.equal(final[k], expected[k]) for k in expected):
                violations.append(
                    dict(
                        cycle=cycle,
                        invariant='final '
                        'weights differ from the unbroken '
                        'run'))
            shutil.rmtree(work_dir)
            episode = None
    return dict(cycles=cycles, seed=seed, violations=violations, **counts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out')
    parser.add_argument('--cycles', type=int, default=200)
    parser.add_argument('--seed', type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        summary = soak(root, args.cycles, args.seed)
    with open(args.out, 'w') as f:
        json.dump(summary, f, indent=1)
    print(
        json.dumps({k: v
                    for k, v in summary.items() if k != 'violations'}),
        f'violations: {len(summary["violations"])}')


if __name__ == '__main__':
    main()
