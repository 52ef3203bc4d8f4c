"""A randomized soak of kill, damage, tampering and resume on the real Runner.

Run as a script (``tests/test_resume_soak.py`` does)::

    python tests/resume_soak_driver.py OUT.json --cycles 300 [--seed 0]

The soak trains the toy run (``conftest.ToyModel`` on ``ToyDataset``, SGD,
no shuffling, no schedule) in episodes. Each cycle launches the plugin's
runner in a forked child towards a random further epoch, with a random
checkpoint policy (epoch or iteration checkpoints, ``max_keep_ckpts``
1-3), and checks the contract of docs/reliability.md (I1-I5) afterwards.
An episode has its own dataset length (2, 6 or 8 samples: 1, 3 or 4
iterations per epoch) and, at random, its checkpoints outside the work
folder (``out_dir`` = ``<root>/ckpt/<episode>``); it ends when epoch 8 is
reached or a launch is refused.

Fault classes (``fault_counts`` of the summary counts the cycles of each,
and of each kind of episode: ``out_dir_outside_work_dir``,
``in_copied_experiment``, ``iters_per_epoch_<n>``; a cycle may have
several; ``outcomes`` counts how launches ended and what was checked):

* ``kill_timer``: the child is SIGKILLed after a random delay (mid-epoch,
  mid-save, mid-record, mid-retention: wherever it falls).
* ``damage:<kind>`` (issue 34): a recorded checkpoint truncated,
  bit-flipped, zero-filled or replaced by another run's or another
  config's checkpoint (half the time the oldest recorded one, the next
  that retention retires); NUL, garbage or a cut last line in the record;
  garbage in ``last_checkpoint``; a foreign ``epoch_99.pth``.
* ``forged_entries`` (``forged:<kind>``): ``saved`` lines naming a victim
  folder's checkpoint or sub-folder by ``../`` and absolute paths, with the
  right size, SHA-256 and file id, as the newest entry (auto-resume would
  take it) or the oldest (retention would delete it); at times a bare name
  at an impossible position (it must count nothing as "redone").
* ``copied_experiment``: the episode's work folder and checkpoint folder
  are copied (a copy of an ``out_dir`` episode gets its own ``out_dir``)
  and the copy continues; the original is never launched again.
* ``record_fault:<kind>``: the record deleted, emptied, or replaced by a
  symbolic link (dangling, or to another episode's record: the last ended
  episode's, kept until the next ends, or a copied experiment's original;
  the victim's when there is none) beside the run's checkpoints: the
  launch must refuse; the episode then ends.
* ``checkpoint_copied_new_dir``: one of the episode's checkpoints copied
  into a new work (or checkpoint) folder, auto-resumed there: refused.
* ``new_run_over_checkpoints``: ``resume=False`` into the episode's folder.
* ``concurrent_launch``: two children launched into the work folder at
  once (a barrier before ``train``; the one that takes the lock holds it
  until the other has ended).
* ``kill_mid_epoch``: an episode with several iterations per epoch, with
  iteration checkpoints in its epoch loop, SIGKILLed after a chosen
  iteration inside an epoch, before or after that iteration's save.
* ``record_garbled_first``: a new episode whose record is garbled (NUL,
  garbage, a cut ``start`` line, only a forged line) before its first
  checkpoint.
* ``record_efbig``: the child's RLIMIT_FSIZE (a per-file size limit) is
  set 0-1600 bytes above the record's size (SIGXFSZ ignored, its standard
  output and error sent to /dev/null) once its runner is built, so the
  record append crossing it (``start``, ``saved`` or ``removed``) is cut
  short and the next write fails with EFBIG, as a full disk fails with
  ENOSPC; where the record is smaller than a checkpoint plus 3000 bytes it
  is first padded with blank lines (no events, not even damaged ones), so
  that checkpoints fit under the limit and the record meets it.

Invariants checked after every cycle (``violations``, each named by the
contract's invariant):

* I1: the victim folder is byte for byte unchanged (every file, SHA-256);
  so is the original of every copied experiment until its copy's episode
  ends, and an ended episode's folders until the next episode ends; a
  resume loads the chosen entry's file of its own checkpoint
  folder; no entry of the record names a path outside its folder; a file
  whose recorded entry was damaged is never deleted; an undamaged recorded
  checkpoint stays intact; forged lines are named in the log.
* I2: a checkpoint file the continuing run did not write (by the record,
  or its own ``meta`` where the record line is lost) is unchanged after
  the launch; a launch that would save over one refuses with
  ``CheckpointsInTheWay`` naming each, before training, writing nothing
  (no checkpoint, the record and every file as they were); a symlinked
  record is refused by name.
* I3: two launches at once: at most one trains, the other stops with
  ``WorkDirLockedError``; the record gets one ``start`` per launch that
  trained (none for a refused one).
* I4: a resumed run's weights equal the unbroken run's at its iteration
  (an unbroken run with the episode's dataset length), and so does every
  checkpoint recorded (mid-epoch iteration checkpoints included) and the
  final one, at the episode's last iteration.
* I5: auto-resume continues from the newest intact entry (the run's own
  id), refuses only where the contract says (no intact entry beside
  checkpoint files), starts afresh (with a warning) from a record with no
  intact entry and no checkpoint file; an intact entry leaves the record
  only by a ``removed`` line; the record is only appended to; the
  "redone" figure counts only possible entries; a failed record append
  (EFBIG) leaves the intact entries and names the record; no launch ends
  in an exception the contract does not name. (Where every recorded
  file of the run is gone and no checkpoint file is left, the plugin
  refuses rather than starting afresh; the soak expects what the plugin
  does and counts the case as the outcome
  ``refused_no_intact_entry_and_no_checkpoint_file``.)
"""
import argparse
import collections
import json
import logging
import os
import os.path as osp
import platform
import random
import shutil
import signal
import sys
import tempfile
import time

import mmengine
import torch

torch.set_num_threads(1)  # forked children: no OpenMP pool to inherit

from mmengine.hooks import Hook

import mmae_plugin.registration  # noqa: F401

sys.path.insert(0, osp.dirname(osp.abspath(__file__)))
from conftest import ToyModel, make_toy_runner
from soak_faults import (CHECKPOINT_NAME, CODE_NAMES, EXIT_CODES,
                         RECORD_FAULTS, Before, KillAtIteration, ReportStart,
                         WaitForFile, barrier, break_record, copy_experiment,
                         count_starts, damage, events, forge_entries,
                         garble_fresh_record, is_bare, limit_file_size,
                         read_bytes, spawn, top_snapshot, tree_snapshot, wait,
                         wait_either)

from mmae_plugin.checkpoint.run_record import RECORD_NAME, read_record
from mmae_plugin.engine.runners import MMAERunner

LAST_EPOCH = 8
#: Dataset lengths of episodes (batch 2: 1, 3 or 4 iterations per epoch).
LENGTHS = (2, 2, 6, 8)
#: Chance that a cycle injects one of SPECIALS (least used first).
P_SPECIAL = 0.5
SPECIALS = ('forged_entries', 'copied_experiment', 'record_fault',
            'checkpoint_copied_new_dir', 'concurrent_launch', 'kill_mid_epoch',
            'record_efbig', 'new_run_over_checkpoints')
#: The contract's invariants, for the summary.
INVARIANTS = dict(
    I1='containment: only the run\'s own files, in its own folder',
    I2='no launch saves over checkpoints its run did not write',
    I3='one live run per work folder',
    I4='exact resume at any checkpoint',
    I5='damage costs entries, not runs')
EFBIG = 27


class OtherToyModel(ToyModel):
    """Another model config, the same parameters."""


def runner_for(work_dir,
               max_epochs,
               by_epoch=True,
               max_keep_ckpts=-1,
               resume=True,
               hooks=(),
               model=None,
               dataset_length=2,
               out_dir=None):
    torch.manual_seed(0)  # the toy model's initial weights
    checkpoint = dict(
        type='SafeCheckpointHook',
        by_epoch=by_epoch,
        interval=1,
        max_keep_ckpts=max_keep_ckpts)
    if out_dir is not None:
        checkpoint['out_dir'] = out_dir
    runner = make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=MMAERunner,
        dataset_length=dataset_length,
        log_level='ERROR',
        resume=resume,
        custom_hooks=list(hooks),
        randomness=dict(seed=0),
        default_hooks=dict(checkpoint=checkpoint))
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


def equal_states(state, expected):
    return expected is not None and set(state) == set(expected) and all(
        torch.equal(state[k], expected[k]) for k in expected)


class Launched:
    """How a child launch ended: ``ended`` (('exit', code) or ('signal',
    n)), ``error`` (its exception report), ``start`` (ReportStart's
    report: it reached training) and ``log`` (its warnings and errors)."""

    def __init__(self, ended, error, start, log):
        self.ended, self.error, self.start, self.log = \
            ended, error, start, log

    @property
    def trained(self):
        return self.start is not None

    @property
    def killed(self):
        return self.ended == ('signal', signal.SIGKILL)

    @property
    def code(self):
        return self.ended[1] if self.ended[0] == 'exit' else None

    @property
    def message(self):
        return (self.error or {}).get('message', '')

    def describe(self):
        what = list(self.ended)
        if self.error:
            what.append(f"{self.error['type']}: {self.message[:400]}")
        return what


class Soak:

    def __init__(self, root, seed, only=None):
        self.root, self.seed, self.only = root, seed, only
        self.rng = random.Random(seed)
        self.violations = []
        self.faults = collections.Counter()
        self.outcomes = collections.Counter()
        self.references = {}
        self.episode = None
        self.episodes = 0
        self.frozen = []  # originals of copied experiments
        self.bystanders = []  # the last ended episode's folders
        self.cycle = -1
        self.action = None
        self.damages = 0

    # ------------------------------------------------------------- setup
    def setup(self):
        for length in sorted(set(LENGTHS)):
            reference = CollectStates()
            runner_for(
                osp.join(self.root, f'reference{length}'),
                LAST_EPOCH,
                hooks=[reference],
                resume=False,
                dataset_length=length).train()
            self.references[length] = reference.states
        foreign_run = osp.join(self.root, 'foreign_run')
        runner_for(foreign_run, 3, resume=False).train()
        other_config = osp.join(self.root, 'other_config')
        runner_for(
            other_config, 3, resume=False, model=OtherToyModel()).train()
        self.foreign = dict(
            replace_run=osp.join(foreign_run, 'epoch_3.pth'),
            replace_config=osp.join(other_config, 'epoch_3.pth'))
        # The victim: another experiment the episodes' forged record lines
        # and symlinked records point at; never to be touched.
        self.victim = osp.join(self.root, 'victim')
        runner_for(self.victim, 2, resume=False).train()
        os.makedirs(osp.join(self.victim, 'victimdir'))
        with open(osp.join(self.victim, 'victimdir', 'keep.txt'), 'w') as f:
            f.write('mine')
        self.victim_snapshot = tree_snapshot(self.victim)
        os.makedirs(osp.join(self.root, 'io'))

    # ---------------------------------------------------------- reporting
    def violate(self, invariant, what, **details):
        self.violations.append(
            dict(
                cycle=self.cycle,
                invariant=invariant,
                fault=self.action,
                what=what,
                **details))

    # ----------------------------------------------------------- episodes
    def new_episode(self):
        self.episodes += 1
        name = f'episode{self.episodes}'
        length = self.rng.choice(LENGTHS)
        work_dir = osp.join(self.root, name)
        out_dir = osp.join(self.root, 'ckpt', name) \
            if self.rng.random() < 0.4 else None
        episode = dict(
            name=name,
            work_dir=work_dir,
            out_dir=out_dir,
            ckpt=work_dir if out_dir is None else osp.join(out_dir, name),
            length=length,
            ipe=length // 2,
            run_id=None,
            damaged=set(),
            verified=set(),
            epoch=0,
            garbled=None,
            remove=[work_dir] + ([out_dir] if out_dir else []))
        if self.rng.random() < 0.3:
            episode['garbled'] = garble_fresh_record(self.rng, episode['ckpt'],
                                                     self.victim)
        self.episode = episode
        return episode

    def end_episode(self):
        """End the episode: its folders stay, checked unchanged, until the
        next episode ends (another episode's record for a symbolic link
        to point at); the originals of its copies go."""
        self.check_frozen()
        for frozen in self.frozen + self.bystanders:
            shutil.rmtree(frozen['remove'], ignore_errors=True)
        self.bystanders = [
            dict(folder=path, snapshot=tree_snapshot(path), remove=path)
            for path in self.episode['remove'] if osp.isdir(path)
        ]
        self.frozen = []
        self.episode = None

    def plan(self, episode):
        target = min(LAST_EPOCH, episode['epoch'] + self.rng.randint(1, 3))
        return target, self.rng.random() < 0.5, self.rng.randint(1, 3)

    # ------------------------------------------------------------ launches
    def start_child(self,
                    episode,
                    target,
                    by_epoch,
                    keep,
                    tag='',
                    kill_after=None,
                    hooks=(),
                    resume=True,
                    fsize=None,
                    before_train=None):
        io = osp.join(self.root, 'io', f'c{self.cycle}{tag}')
        files = dict(
            result=io + '.start.json',
            report=io + '.error.json',
            log=io + '.log')
        reference = self.references[episode['length']]

        def train():
            runner = runner_for(
                episode['work_dir'],
                target,
                by_epoch,
                keep,
                resume=resume,
                hooks=[ReportStart(files['result'], reference)] + list(hooks),
                dataset_length=episode['length'],
                out_dir=episode['out_dir'])
            handler = logging.FileHandler(files['log'])
            handler.setLevel(logging.WARNING)
            runner.logger.addHandler(handler)
            if before_train is not None:
                before_train()
            if fsize is not None:
                limit_file_size(fsize)
            runner.train()

        return spawn(train, files['report'], kill_after), files

    def finish_child(self, pid, files):
        ended, error = wait(pid, files['report'])
        start = None
        if osp.exists(files['result']):
            with open(files['result']) as f:
                start = json.load(f)
            os.remove(files['result'])
        log = ''
        if osp.exists(files['log']):
            with open(files['log'], errors='replace') as f:
                log = f.read()
            os.remove(files['log'])
        launched = Launched(ended, error, start, log)
        if launched.killed:
            self.outcomes['killed'] += 1
        elif launched.code == 0:
            self.outcomes['exit:trained_to_target'] += 1
        else:
            self.outcomes[
                'exit:' +
                CODE_NAMES.get(launched.code, 'other_exception')] += 1
        return launched

    def launch(self, episode, target, by_epoch, keep, **kwargs):
        pid, files = self.start_child(episode, target, by_epoch, keep,
                                      **kwargs)
        return self.finish_child(pid, files)

    # -------------------------------------------------------------- cycles
    def run(self, cycles):
        started = time.monotonic()
        for cycle in range(cycles):
            self.cycle = cycle
            if self.episode is None:
                self.new_episode()
            episode = self.episode
            if episode['out_dir'] is not None:
                self.faults['out_dir_outside_work_dir'] += 1
            if episode.get('copy_of'):
                self.faults['in_copied_experiment'] += 1
            self.faults[f'iters_per_epoch_{episode["ipe"]}'] += 1
            if episode['garbled'] is not None and not episode.get('started'):
                self.action = 'record_garbled_first'
            else:
                self.action = self.choose(episode)
            self.faults[self.action] += 1
            getattr(self, 'do_' + self.action)(episode)
            self.check_victim()
            if self.episode is not None:
                self.episode['started'] = True
        seconds = time.monotonic() - started
        counted = [v['invariant'] for v in self.violations]
        return dict(
            cycles=cycles,
            seed=self.seed,
            only=list(self.only) if self.only else None,
            python=platform.python_version(),
            torch=torch.__version__,
            mmengine=mmengine.__version__,
            host_cpus=os.cpu_count(),
            seconds=round(seconds, 1),
            seconds_per_cycle=round(seconds / max(cycles, 1), 3),
            episodes=self.episodes,
            kills_armed=self.faults['kill_timer'] +
            self.faults['kill_mid_epoch:before_its_save'] +
            self.faults['kill_mid_epoch:after_its_save'],
            kills=self.outcomes['killed'],
            damages=self.damages,
            refusals=sum(self.outcomes['exit:' + k]
                         for k in ('CorruptCheckpointError',
                                   'CheckpointsInTheWay', 'UnsafeFileError',
                                   'WorkDirLockedError')),
            resumes=self.outcomes['resumes'],
            fault_counts=dict(sorted(self.faults.items())),
            outcomes=dict(sorted(self.outcomes.items())),
            invariants=INVARIANTS,
            violations_by_invariant={
                name: counted.count(name)
                for name in INVARIANTS
            },
            violations=self.violations)

    def choose(self, episode):
        if self.rng.random() >= P_SPECIAL:
            return 'normal'
        applicable = [
            s for s in self.only or SPECIALS if self.applicable(s, episode)
        ]
        if not applicable:
            return 'normal'
        least = min(self.faults[s] for s in applicable)
        return self.rng.choice(
            [s for s in applicable if self.faults[s] == least])

    def applicable(self, special, episode):
        folder = episode['ckpt']
        record = osp.join(folder, RECORD_NAME)
        regular = read_bytes(record) is not None
        files = top_snapshot(folder)
        named = [n for n in files if CHECKPOINT_NAME.match(n)]
        if special in ('forged_entries', ):
            return regular
        if special == 'copied_experiment':
            return regular and any(e.problem() is None
                                   for e in read_record(folder).checkpoints())
        if special in ('record_fault', 'checkpoint_copied_new_dir',
                       'new_run_over_checkpoints'):
            return regular and bool(named)
        if special == 'kill_mid_epoch':
            return episode['ipe'] > 1 and episode['epoch'] < LAST_EPOCH
        return special != 'record_efbig' or regular

    def do_normal(self, episode, kill_chance=0.5, damage_chance=0.4):
        if self.rng.random() < damage_chance and osp.isdir(episode['ckpt']):
            kind, path = damage(self.rng, episode['ckpt'], episode['work_dir'],
                                self.foreign)
            self.faults['damage:' + kind] += 1
            self.damages += ' (nothing to damage)' not in kind
            if path is not None:
                episode['damaged'].add(path)
        target, by_epoch, keep = self.plan(episode)
        kill_after = self.rng.uniform(0.0, 0.25) \
            if self.rng.random() < kill_chance else None
        self.faults['kill_timer'] += kill_after is not None
        before = self.before(episode, target)
        launched = self.launch(
            episode, target, by_epoch, keep, kill_after=kill_after)
        self.after(episode, before, launched, target)

    def do_forged_entries(self, episode):
        kinds, bare = forge_entries(self.rng, episode['ckpt'], self.victim)
        for kind in kinds:
            self.faults['forged:' + kind] += 1
        episode['damaged'] |= {osp.join(episode['ckpt'], n) for n in bare}
        self.do_normal(episode, kill_chance=0.3, damage_chance=0)

    def do_copied_experiment(self, episode):
        label = f'copy{self.cycle}'
        work_dir = osp.join(self.root, label,
                            osp.basename(episode['work_dir']))
        out_dir = osp.join(self.root, f'ckpt_{label}') \
            if episode['out_dir'] is not None else None
        folder = copy_experiment(episode, work_dir, out_dir)
        originals = [episode['work_dir']] + \
            ([episode['out_dir']] if episode['out_dir'] else [])
        for path in originals:
            self.frozen.append(
                dict(folder=path, snapshot=tree_snapshot(path), remove=path))
        old = episode['ckpt']
        copy = dict(
            episode,
            work_dir=work_dir,
            out_dir=out_dir,
            ckpt=folder,
            copy_of=episode['name'],
            damaged={
                osp.join(folder, osp.relpath(p, old))
                for p in episode['damaged']
            },
            verified=set(episode['verified']),
            remove=[osp.dirname(work_dir)] + ([out_dir] if out_dir else []))
        self.episode = copy
        target, by_epoch, keep = self.plan(copy)
        before = self.before(copy, target)
        launched = self.launch(copy, target, by_epoch, keep)
        resumed = (launched.start or {}).get('resumed_from')
        if launched.trained and before.expect['kind'] == 'resume':
            self.outcomes['copy_resumed_its_own_copy'] += \
                osp.dirname(str(resumed)) == folder
        self.after(copy, before, launched, target)

    def do_record_fault(self, episode):
        least = min(self.faults['record_fault:' + k] for k in RECORD_FAULTS)
        kind = self.rng.choice([
            k for k in RECORD_FAULTS
            if self.faults['record_fault:' + k] == least
        ])
        self.faults['record_fault:' + kind] += 1
        # Another episode's record (an ended one, the original of a copy),
        # else the victim's.
        others = [
            osp.join(root, RECORD_NAME) for f in self.bystanders + self.frozen
            for root, _, names in os.walk(f['folder'])
            if read_bytes(osp.join(root, RECORD_NAME)) is not None
        ] or [osp.join(self.victim, RECORD_NAME)]
        target = self.rng.choice(others)
        if kind == 'symlink_other':
            self.faults['record_fault:symlink_other:' +
                        ('victim' if target.
                         startswith(self.victim) else 'another_episode')] += 1
        break_record(kind, episode['ckpt'], target)
        target, by_epoch, keep = self.plan(episode)
        before = self.before(episode, target)
        if before.expect['kind'] not in ('in_way', 'link'):
            self.violate(
                'I2',
                'soak: the record fault left nothing in the way',
                expect=before.expect['kind'])
        launched = self.launch(episode, target, by_epoch, keep)
        self.after(episode, before, launched, target)
        if self.episode is episode:  # refused (as it must be): move on
            self.end_episode()

    def do_checkpoint_copied_new_dir(self, episode):
        own = [
            osp.basename(e.location)
            for e in read_record(episode['ckpt']).checkpoints()
            if e.problem() is None
        ]
        named = [
            n for n in top_snapshot(episode['ckpt'])
            if CHECKPOINT_NAME.match(n)
        ]
        name = self.rng.choice(own or named)
        label = f'newdir{self.cycle}'
        work_dir = osp.join(self.root, label)
        out_dir = osp.join(self.root, f'newout{self.cycle}') \
            if self.rng.random() < 0.5 else None
        folder = work_dir if out_dir is None else \
            osp.join(out_dir, label)
        os.makedirs(folder)
        shutil.copy2(osp.join(episode['ckpt'], name), osp.join(folder, name))
        side = dict(
            episode,
            work_dir=work_dir,
            out_dir=out_dir,
            ckpt=folder,
            run_id=None,
            damaged=set(),
            verified=set(),
            epoch=0)
        before = self.before(side, LAST_EPOCH)
        launched = self.launch(side, LAST_EPOCH,
                               self.rng.random() < 0.5, self.rng.randint(1, 3))
        if before.expect['in_way'] != [name]:
            self.violate(
                'I2',
                'soak: the copied-in checkpoint is not in the way',
                expect=before.expect['kind'])
        self.check_launch(side, before, launched, LAST_EPOCH)
        for folder in [work_dir] + ([out_dir] if out_dir else []):
            shutil.rmtree(folder, ignore_errors=True)

    def do_new_run_over_checkpoints(self, episode):
        target, by_epoch, keep = self.plan(episode)
        before = self.before(episode, target, resume=False)
        launched = self.launch(episode, target, by_epoch, keep, resume=False)
        self.after(episode, before, launched, target, keep_episode=True)

    def do_concurrent_launch(self, episode):
        target, by_epoch, keep = self.plan(episode)
        before = self.before(episode, target)
        go = osp.join(self.root, 'io', f'go{self.cycle}')
        sync = osp.join(self.root, 'io', f'sync{self.cycle}')
        children = [
            self.start_child(
                episode,
                target,
                by_epoch,
                keep,
                tag=f'_{i}',
                hooks=[WaitForFile(go)],
                before_train=lambda i=i: barrier(sync, i, 2)) for i in range(2)
        ]
        wait_either([pid for pid, _ in children])
        open(go, 'w').close()
        launches = [self.finish_child(pid, files) for pid, files in children]
        os.remove(go)
        shutil.rmtree(sync, ignore_errors=True)
        trained = [x for x in launches if x.trained]
        if len(trained) > 1:
            self.violate(
                'I3',
                'two concurrent launches both trained',
                ended=[x.describe() for x in launches])
        locked = [
            x for x in launches if x.code == EXIT_CODES['WorkDirLockedError']
        ]
        for x in locked:
            if 'is in use by a live run' not in x.message:
                self.violate(
                    'I3',
                    'the lock refusal does not name the run',
                    ended=x.describe())
        if trained and len(locked) != 1:
            self.violate(
                'I3', 'beside the launch that trained, the other did not '
                'stop with WorkDirLockedError',
                ended=[x.describe() for x in launches])
        self.outcomes['concurrent_one_locked_out'] += len(locked) == 1
        primary = trained[0] if trained else next(
            (x for x in launches if x not in locked), launches[0])
        self.after(episode, before, primary, target)

    def do_kill_mid_epoch(self, episode):
        target, _, keep = self.plan(episode)
        before = self.before(episode, target)
        ipe = episode['ipe']
        position = before.expect['position'][1] \
            if before.expect['kind'] == 'resume' else 0
        inside = [k for k in range(position + 1, target * ipe) if k % ipe != 0]
        hooks = []
        if before.expect['kind'] in ('resume', 'afresh') and inside:
            at = self.rng.choice(inside)
            priority = self.rng.choice(['HIGHEST', 'LOWEST'])
            hooks.append(KillAtIteration(at, priority))
            self.faults['kill_mid_epoch:' +
                        ('before_its_save' if priority ==
                         'HIGHEST' else 'after_its_save')] += 1
        launched = self.launch(episode, target, False, keep, hooks=hooks)
        self.after(episode, before, launched, target)

    def do_record_efbig(self, episode):
        record = osp.join(episode['ckpt'], RECORD_NAME)
        files = top_snapshot(episode['ckpt'])
        largest = max((os.path.getsize(osp.join(episode['ckpt'], n))
                       for n in files if n.endswith('.pth')),
                      default=6000)
        size = len(read_bytes(record))
        if size < largest + 3000:
            # The limit is per file: for the record's appends to meet it
            # before a checkpoint does, the record must be the larger.
            # Blank lines are no events (not even damaged ones).
            with open(record, 'ab') as f:
                f.write(b'\n' * (largest + 3000 - size))
            self.faults['record_efbig:padded_with_blank_lines'] += 1
            size = largest + 3000
        limit = size + self.rng.randrange(0, 1600)
        lines = {}
        for line in read_bytes(record).split(b'\n'):
            kind = events(line)
            if kind and kind[0].get('event') in ('start', 'saved'):
                lines[kind[0]['event']] = len(line) + 1
        if self.rng.random() < 0.5 and len(lines) == 2:
            # Just past this launch's "start" line and first "saved" line:
            # where the retention of its first save appends "removed".
            limit = size + lines['start'] + lines['saved'] + \
                self.rng.randrange(0, 80)
            self.faults['record_efbig:aimed_at_removed_lines'] += 1
        target, by_epoch, keep = self.plan(episode)
        before = self.before(episode, target)
        launched = self.launch(episode, target, by_epoch, keep, fsize=limit)
        if launched.code == EXIT_CODES['OSError']:
            if launched.error.get('errno') != EFBIG:
                self.violate(
                    'I5',
                    'an error other than EFBIG',
                    ended=launched.describe())
            elif record in launched.message:
                where = launched.error.get('where', '')
                line = 'removed' if 'in retire' in where else 'saved' \
                    if 'in record_saved' in where else 'start' \
                    if 'in before_train' in where else 'other'
                self.outcomes['efbig_record_append_failed:' + line] += 1
            elif 'saving checkpoint' in launched.message:
                self.outcomes['efbig_checkpoint_write_failed'] += 1
            else:
                self.violate(
                    'I5',
                    'EFBIG without naming the file',
                    ended=launched.describe(),
                    where=launched.error.get('where', '')[-1500:])
        elif launched.code == 0:
            self.outcomes['efbig_not_reached'] += 1
        self.after(episode, before, launched, target, efbig=True)

    def do_record_garbled_first(self, episode):
        target, by_epoch, keep = self.plan(episode)
        before = self.before(episode, target)
        self.faults['record_garbled_first:' + episode['garbled']] += 1
        launched = self.launch(episode, target, by_epoch, keep)
        if not (launched.trained and launched.start['start_iter'] == 0):
            self.violate(
                'I5', 'a record garbled before the first checkpoint did '
                'not start afresh',
                ended=launched.describe())
        elif before.record.damaged and 'starting afresh' not in launched.log:
            self.violate('I5', 'started afresh without a warning')
        self.after(episode, before, launched, target)

    # -------------------------------------------------------------- checks
    def before(self, episode, target, resume=True):
        if not osp.isdir(episode['ckpt']):
            os.makedirs(episode['ckpt'])
        return Before(episode['ckpt'], episode['work_dir'], target,
                      episode['ipe'], resume)

    def after(self,
              episode,
              before,
              launched,
              target,
              keep_episode=False,
              efbig=False):
        refused = self.check_launch(episode, before, launched, target, efbig)
        if refused and not keep_episode:
            self.end_episode()
            return
        record = read_record(episode['ckpt'])
        if launched.trained and launched.start['start_iter'] == 0:
            episode['run_id'] = launched.start['run_id']
        intact = [e for e in record.checkpoints() if e.problem() is None]
        if intact:
            episode['epoch'] = intact[0].epoch
        if launched.ended == ('exit', 0) and target == LAST_EPOCH:
            last = LAST_EPOCH * episode['ipe']
            final = torch.load(
                intact[0].location, weights_only=True)['state_dict'] \
                if intact else None
            if not intact or intact[0].iter != last or not equal_states(
                    final, self.references[episode['length']][last]):
                self.violate(
                    'I4',
                    'final weights differ from the unbroken run\'s',
                    final=intact[0].location if intact else None)
            self.outcomes['episodes_completed'] += 1
            self.end_episode()

    def check_launch(self, episode, before, launched, target, efbig=False):
        """Check one launch against the contract; True when it refused
        as the contract says it must (the episode cannot go on)."""
        expect = before.expect
        kind = expect['kind']
        code = launched.code
        refused = False
        if kind in ('in_way', 'corrupt', 'link'):
            invariant = dict(in_way='I2', corrupt='I5', link='I1')[kind]
            wanted = dict(
                in_way=(EXIT_CODES['CheckpointsInTheWay'], ),
                corrupt=(EXIT_CODES['CorruptCheckpointError'], ),
                link=(EXIT_CODES['CorruptCheckpointError'],
                      EXIT_CODES['UnsafeFileError']))[kind]
            if launched.trained:
                self.violate(
                    invariant, f'trained although the contract refuses '
                    f'({kind})',
                    in_way=expect['in_way'],
                    ended=launched.describe())
            elif not launched.killed and code not in wanted:
                self.violate(
                    invariant,
                    f'not refused as the contract says ({kind})',
                    ended=launched.describe())
            elif code in wanted:
                refused = True
                self.outcomes['refused_as_expected:' + kind] += 1
                if expect.get('all_files_gone'):
                    self.outcomes['refused_no_intact_entry_and_no_'
                                  'checkpoint_file'] += 1
                names = [osp.join(before.folder, n) for n in expect['in_way']
                         ] if kind == 'in_way' else [before.record_file]
                missing = [n for n in names if n not in launched.message]
                if missing:
                    self.violate(
                        invariant,
                        'the refusal does not name the file',
                        missing=missing,
                        ended=launched.describe())
            if not launched.trained:
                self.check_nothing_written(before, launched)
        elif not launched.killed and code != 0 and not (
                efbig and code == EXIT_CODES['OSError']):
            refused = code in (EXIT_CODES['CorruptCheckpointError'],
                               EXIT_CODES['CheckpointsInTheWay'],
                               EXIT_CODES['UnsafeFileError'])
            self.violate(
                'I2' if code == EXIT_CODES['CheckpointsInTheWay'] else 'I5',
                f'the launch ended although the contract says {kind}',
                expect=kind,
                in_way=expect['in_way'],
                ended=launched.describe())
        if launched.trained:
            self.check_start(episode, before, launched)
        self.check_state(episode, before, launched)
        return refused

    def check_start(self, episode, before, launched):
        expect, start = before.expect, launched.start
        if expect['kind'] == 'resume':
            chosen = expect['chosen']
            if start['start_iter'] > 0:
                self.outcomes['resumes'] += 1
                if start['start_iter'] % episode['ipe']:
                    self.outcomes['mid_epoch_resumes'] += 1
            if start['start_iter'] != chosen.iter:
                self.violate(
                    'I5',
                    'did not resume the newest intact entry',
                    start=start,
                    chosen=chosen.location)
            if start['run_id'] != episode['run_id']:
                self.violate(
                    'I1',
                    'resumed state not written by this run',
                    start=start,
                    run_id=episode['run_id'])
            if osp.dirname(osp.realpath(str(start['resumed_from']))) != \
                    osp.realpath(before.folder):
                self.violate(
                    'I1',
                    'resumed a file outside its checkpoint folder',
                    start=start,
                    folder=before.folder)
            elif str(start['resumed_from']) != chosen.location:
                self.violate(
                    'I1', 'resumed a file other than the chosen entry of '
                    'its own checkpoint folder',
                    start=start,
                    chosen=chosen.location)
            if not start['matches_reference']:
                self.violate(
                    'I4',
                    'resumed weights differ from the unbroken run\'s',
                    start=start)
            if expect['skipped']:
                iters, epochs = expect['redone']
                figure = (f'{iters} iteration{"" if iters == 1 else "s"} '
                          f'({epochs} epoch{"" if epochs == 1 else "s"}) '
                          'of training will be redone')
                if figure not in launched.log:
                    self.violate(
                        'I5', 'the "redone" figure is not the possible '
                        'entries\'',
                        expected=figure,
                        log=[
                            line[-300:] for line in launched.log.splitlines()
                            if 'redone' in line
                        ])
        elif expect['kind'] == 'afresh':
            if start['start_iter'] != 0:
                self.violate(
                    'I5',
                    'resumed where the contract starts afresh',
                    start=start)
            self.outcomes['started_afresh'] += 1
        if before.resume and before.record.uncontained and \
                'name a path outside the record\'s folder' not in \
                launched.log:
            self.violate('I1', 'forged lines not named in the log')
        if start['start_iter'] == 0 and not start['matches_reference']:
            self.violate('I4', 'initial weights differ', start=start)

    def check_nothing_written(self, before, launched):
        after = top_snapshot(before.folder)
        changed = sorted(n for n, digest in before.files.items()
                         if not n.startswith('.') and after.get(n) != digest)
        added = sorted(set(after) - set(before.files))
        last = read_bytes(osp.join(before.work_dir, 'last_checkpoint'))
        if changed or added or last != before.last_checkpoint:
            self.violate(
                'I2',
                'a refused launch changed the folder',
                changed=changed,
                added=added,
                ended=launched.describe())

    def check_state(self, episode, before, launched):
        folder = before.folder
        after_files = top_snapshot(folder)
        # I2: what the continuing run did not write is left as it was.
        continuing = launched.start['run_id'] if launched.trained \
            else before.expect['run']
        for name in before.pth:
            owner = before.owners[name]
            if owner is not None and owner == continuing:
                continue
            if after_files.get(name) != before.files[name]:
                self.violate(
                    'I2', 'a checkpoint file the continuing run did not '
                    'write changed or went',
                    path=osp.join(folder, name),
                    owner=owner,
                    continuing=continuing,
                    ended=launched.describe())
        # I1: a file whose entry no longer matches is never deleted (a
        # name the launch saved again is the run's new file).
        after_bytes = read_bytes(before.record_file)
        appended = events(after_bytes[len(before.record_bytes):]) if \
            before.record_bytes is not None and after_bytes is not None and \
            after_bytes.startswith(before.record_bytes) else \
            events(after_bytes)
        saved_again = {
            e.get('path')
            for e in appended if e.get('event') == 'saved'
        }
        for name in before.damaged_entries:
            if name in before.files and name not in after_files and \
                    name not in saved_again:
                entry = before.record.entries[name]
                self.violate(
                    'I1', 'deleted a file that was no longer the one the '
                    'run wrote',
                    path=osp.join(folder, name),
                    entry=dict(entry.fields, launch=None),
                    file=before.stats.get(name),
                    appended=[
                        e for e in appended
                        if e.get('event') != 'saved' or e.get('path') == name
                    ],
                    ended=launched.describe())
        record = read_record(folder)
        outside = [p for p in record.entries if not is_bare(p)]
        if outside:
            self.violate(
                'I1',
                'an entry names a path outside its folder',
                paths=outside)
        for entry in record.checkpoints():
            problem = entry.problem()
            if problem is not None and \
                    entry.location not in episode['damaged']:
                self.violate(
                    'I1',
                    'kept checkpoint missing or damaged',
                    path=entry.location,
                    problem=problem)
        # I5: the record is appended to; intact entries leave it only by a
        # "removed" line; one "start" per launch that trained (I3).
        if before.record_bytes is not None:
            if after_bytes is None or \
                    not after_bytes.startswith(before.record_bytes):
                self.violate('I5', 'the record was not only appended to')
            else:
                removed = {
                    e.get('path')
                    for e in appended if e.get('event') == 'removed'
                }
                resumed = [
                    e.get('resumed_iter') for e in appended
                    if e.get('event') == 'start'
                ]
                for entry in before.intact:
                    if entry.path in record.entries or \
                            entry.path in removed or any(
                                r is not None and r < entry.iter
                                for r in resumed):
                        continue
                    self.violate(
                        'I5', 'an intact entry left the record without a '
                        '"removed" line',
                        path=entry.location)
        if not before.link:
            started = count_starts(after_bytes) - before.starts
            allowed = {1} if launched.trained else \
                ({0, 1} if launched.killed else {0})
            if started not in allowed:
                self.violate(
                    'I3', 'the record\'s "start" lines do not match the '
                    'launches that trained',
                    started=started,
                    ended=launched.describe())
        # I4: every recorded checkpoint of the run is the unbroken run's.
        reference = self.references[episode['length']]
        for entry in record.checkpoints():
            if entry.sha256 in episode['verified'] or \
                    entry.problem() is not None:
                continue
            episode['verified'].add(entry.sha256)
            state = torch.load(
                entry.location, map_location='cpu',
                weights_only=True)['state_dict']
            if not equal_states(state, reference.get(entry.iter)):
                self.violate(
                    'I4', 'a recorded checkpoint differs from the unbroken '
                    'run at its iteration',
                    path=entry.location,
                    iter=entry.iter)

    def check_frozen(self):
        for what, folders in (('the original of a copied experiment',
                               self.frozen), ('an ended episode\'s folder',
                                              self.bystanders)):
            for frozen in folders:
                if tree_snapshot(frozen['folder']) != frozen['snapshot']:
                    self.violate(
                        'I1', f'{what} changed', folder=frozen['folder'])
                    frozen['snapshot'] = tree_snapshot(frozen['folder'])

    def check_victim(self):
        self.check_frozen()
        now = tree_snapshot(self.victim)
        if now != self.victim_snapshot:
            self.violate(
                'I1',
                'the victim folder changed',
                changed=sorted(
                    k for k in set(now) | set(self.victim_snapshot)
                    if now.get(k) != self.victim_snapshot.get(k)))
            self.victim_snapshot = now


def soak(root, cycles, seed, only=None):
    runner = Soak(root, seed, only)
    runner.setup()
    return runner.run(cycles)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('out')
    parser.add_argument('--cycles', type=int, default=300)
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument(
        '--only',
        nargs='+',
        choices=SPECIALS,
        help='inject only these fault classes (besides the kills and '
        'damages of ordinary cycles): to study one')
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        summary = soak(root, args.cycles, args.seed, args.only)
    with open(args.out, 'w') as f:
        json.dump(summary, f, indent=1)
    print(
        json.dumps({
            k: v
            for k, v in summary.items()
            if k not in ('violations', 'invariants', 'fault_counts')
        }), f'violations: {len(summary["violations"])}')


if __name__ == '__main__':
    main()
