"""Faults, children and oracles of the resume soak (``resume_soak_driver.py``).

Nothing here trains: the driver builds the runs. This module

* runs a launch in a forked child whose exit status says how it ended
  (:data:`EXIT_CODES`, one per exception class the contract names) and
  whose exception is written to a report file;
* takes what a folder holds before a launch (:class:`Before`): the record
  as read, its bytes, the top-level files with their SHA-256, whose each
  checkpoint file is (the record's writer, else the file's own ``meta``),
  and what the contract says the launch must do (:func:`expectation`);
* injects the faults: the damages of issue 34 (:func:`damage`), forged
  record entries naming a victim folder (:func:`forge_entries`), missing,
  empty and symbolically linked records (:func:`break_record`), garbled
  records before the first checkpoint (:func:`garble_fresh_record`) and
  copied experiments (:func:`copy_experiment`).
"""
import hashlib
import json
import os
import os.path as osp
import re
import resource
import shutil
import signal
import sys
import threading
import time
import traceback

import torch
from mmengine.hooks import Hook

from mmae_plugin.checkpoint.run_record import RECORD_NAME, read_record

#: Names mmengine's checkpoint hook saves, with their kind and step.
CHECKPOINT_NAME = re.compile(r'^(?:best_.+_)?(epoch|iter)_(\d+)\.pth$')
#: The work folder's lock file (rewritten by every launch).
LOCK_NAME = '.mmae_run.lock'
#: The config mmengine's Runner dumps into the work folder when built.
DUMPED_CONFIG = re.compile(r'^\d{8}_\d{6}\.py$')
#: A child's exit status per exception class (the first of its MRO listed);
#: 0 trained to the end, 1 any other exception, a signal: killed.
EXIT_CODES = dict(
    CorruptCheckpointError=3,
    CheckpointsInTheWay=4,
    WorkDirLockedError=5,
    UnsafeFileError=6,
    ForeignCheckpointError=7,
    OSError=8)
CODE_NAMES = {code: name for name, code in EXIT_CODES.items()}


# ------------------------------------------------------------- children
def exit_code(err):
    """The exit status of a child that raised ``err``."""
    for cls in type(err).__mro__:
        if cls.__name__ in EXIT_CODES:
            return EXIT_CODES[cls.__name__]
    return 1


def spawn(function, report, kill_after=None):
    """Run ``function`` in a forked child; return its pid.

    The child is SIGKILLed after ``kill_after`` seconds if given; an
    exception is written to ``report`` (JSON: type, code, errno, message)
    and sets the exit status (:func:`exit_code`).
    """
    pid = os.fork()
    if pid == 0:
        code = 1
        timer = None
        try:
            if kill_after is not None:
                timer = threading.Timer(kill_after, os.kill,
                                        (os.getpid(), signal.SIGKILL))
                timer.start()
            function()
            code = 0
        except BaseException as err:  # reported through the exit code
            code = exit_code(err)
            if timer is not None:  # the kill was meant for the training
                timer.cancel()
            try:  # a file size limit of the launch must not stop the report
                hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
                resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
                partial = report + '.partial'
                with open(partial, 'w') as f:
                    json.dump(
                        dict(
                            type=type(err).__name__,
                            code=code,
                            errno=getattr(err, 'errno', None),
                            message=str(err)[:20000],
                            where=traceback.format_exc()[-3000:]), f)
                os.replace(partial, report)  # a kill leaves no half report
                sys.stderr.write(f'child: {type(err).__name__}: {err}\n'[:600])
            except BaseException:
                pass
        finally:
            os._exit(code)
    return pid


def wait(pid, report):
    """``(('exit', code) or ('signal', n), error report or None)``."""
    _, status = os.waitpid(pid, 0)
    ended = ('signal', os.WTERMSIG(status)) if os.WIFSIGNALED(status) \
        else ('exit', os.WEXITSTATUS(status))
    error = None
    if osp.exists(report):
        with open(report) as f:
            error = json.load(f)
        os.remove(report)
    return ended, error


def wait_either(pids):
    """Block until one of ``pids`` has ended; return it (not reaped)."""
    while True:
        for pid in pids:
            if os.waitid(os.P_PID, pid,
                         os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return pid
        time.sleep(0.01)


def limit_file_size(limit):
    """From now on, this process writes no file beyond ``limit`` bytes: a
    write crossing it is cut short and the next one fails with EFBIG
    (SIGXFSZ ignored), as a write to a full disk fails with ENOSPC.

    The limit holds for every regular file the process writes: its
    standard output and error (the soak's log, maybe large) go to
    /dev/null first, so only the run's own files can meet it."""
    sys.stdout.flush()
    sys.stderr.flush()
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))


class ReportStart(Hook):
    """Write where the (resumed) run starts, from what and whether its
    weights are the unbroken run's at that iteration."""

    priority = 'LOWEST'

    def __init__(self, result_file, reference):
        self.result_file, self.reference = result_file, reference

    def before_train(self, runner):
        state = {k: v.detach() for k, v in runner.model.state_dict().items()}
        expected = self.reference.get(runner.iter)
        partial = self.result_file + '.partial'
        with open(partial, 'w') as f:
            json.dump(
                dict(
                    start_iter=runner.iter,
                    start_epoch=runner.epoch,
                    run_id=runner.message_hub.get_info('mmae_run_id'),
                    resumed_from=getattr(runner, '_load_from', None),
                    matches_reference=expected is not None
                    and set(expected) == set(state) and all(
                        torch.equal(state[k], expected[k]) for k in expected)),
                f)
        os.replace(partial, self.result_file)  # whole, or not at all


class KillAtIteration(Hook):
    """SIGKILL the process when iteration ``at`` (1-based) has trained:
    before its iteration checkpoint (priority ``'HIGHEST'``) or after it
    (``'LOWEST'``)."""

    def __init__(self, at, priority):
        self.at, self.priority = at, priority

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        if runner.iter + 1 == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


class WaitForFile(Hook):
    """Hold ``before_train`` (the work folder's lock taken) until ``path``
    exists: a concurrent launch into the folder meets a live run."""

    priority = 'LOWEST'

    def __init__(self, path, timeout=15.0):
        self.path, self.timeout = path, timeout

    def before_train(self, runner):
        deadline = time.monotonic() + self.timeout
        while not osp.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.01)


def barrier(folder, me, parties, timeout=60.0):
    """Wait until ``parties`` processes have called this with ``folder``."""
    os.makedirs(folder, exist_ok=True)
    open(osp.join(folder, f'ready{me}'), 'w').close()
    deadline = time.monotonic() + timeout
    while len(os.listdir(folder)) < parties and \
            time.monotonic() < deadline:
        time.sleep(0.005)


# ----------------------------------------------------------- snapshots
def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_state(path):
    if osp.islink(path):
        return 'link:' + os.readlink(path)
    return sha256_file(path)


def tree_snapshot(folder):
    """Every file and link under ``folder`` (relative) with its SHA-256 (a
    link: its target)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        names = files + [d for d in dirs if osp.islink(osp.join(root, d))]
        for name in names:
            path = osp.join(root, name)
            found[osp.relpath(path, folder)] = _entry_state(path)
    return found


def top_snapshot(folder):
    """The files and links directly in ``folder`` with their SHA-256 (a
    link: its target), less the lock file and the configs mmengine
    dumps when a runner is built."""
    try:
        names = os.listdir(folder)
    except FileNotFoundError:
        return {}
    found = {}
    for name in names:
        path = osp.join(folder, name)
        if name == LOCK_NAME or DUMPED_CONFIG.match(name) or (
                osp.isdir(path) and not osp.islink(path)):
            continue
        found[name] = _entry_state(path)
    return found


def read_bytes(path):
    """A regular file's bytes; None when missing or a link."""
    if osp.islink(path) or not osp.isfile(path):
        return None
    with open(path, 'rb') as f:
        return f.read()


def events(data):
    """The well-formed JSON events of record bytes, in order."""
    found = []
    for line in (data or b'').split(b'\n'):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            found.append(event)
    return found


def count_starts(data):
    return sum(1 for e in events(data) if e.get('event') == 'start')


def meta_run_id(path):
    """The run id a checkpoint file's own ``meta`` names, or None."""
    try:
        checkpoint = torch.load(path, map_location='cpu', weights_only=True)
    except Exception:  # noqa: BLE001 (damaged or not a checkpoint)
        return None
    meta = checkpoint.get('meta') if isinstance(checkpoint, dict) else None
    run_id = meta.get('run_id') if isinstance(meta, dict) else None
    return run_id if isinstance(run_id, str) and run_id else None


def is_bare(path):
    return isinstance(path, str) and path not in ('', '.', '..') and \
        '/' not in path and '\\' not in path and '\0' not in path and \
        not osp.isabs(path)


# ------------------------------------------------------------- oracle
class Before:
    """What a checkpoint folder holds before a launch, and what the
    contract says the launch must do (:func:`expectation`).

    Args:
        folder: The checkpoint folder.
        work_dir: The work folder.
        max_epochs: The launch's ``max_epochs``.
        iters_per_epoch: Iterations per epoch of the launch.
        resume: Auto-resume (True) or a new run (False).
    """

    def __init__(self,
                 folder,
                 work_dir,
                 max_epochs,
                 iters_per_epoch,
                 resume=True):
        self.folder, self.work_dir = folder, work_dir
        self.record_file = osp.join(folder, RECORD_NAME)
        self.link = osp.islink(self.record_file)
        self.link_target = os.readlink(self.record_file) if self.link \
            else None
        self.record_bytes = read_bytes(self.record_file)
        self.record = read_record(folder)
        self.own = [] if self.link else self.record.checkpoints()
        self.intact = [e for e in self.own if e.problem() is None]
        self.files = top_snapshot(folder)
        self.pth = sorted(
            n for n in self.files
            if n.endswith('.pth') and not n.startswith('.'))
        self.owners = {
            n: self.record.written[n]
            if n in self.record.written else meta_run_id(osp.join(folder, n))
            for n in self.pth
        }
        self.stats = {}
        for name in self.pth:
            info = os.lstat(osp.join(folder, name))
            self.stats[name] = [
                info.st_dev, info.st_ino, info.st_mtime_ns, info.st_size
            ]
        self.damaged_entries = {
            e.path
            for e in self.record.entries.values() if e.problem() is not None
        }
        self.starts = count_starts(self.record_bytes)
        self.last_checkpoint = read_bytes(
            osp.join(work_dir, 'last_checkpoint'))
        self.limits = (max_epochs * iters_per_epoch, max_epochs)
        self.resume = resume
        self.expect = expectation(self)


def in_the_way_names(before, run, position):
    """Checkpoint files a run continuing at ``position`` (epoch, iter)
    would save over although ``run`` (None: a new run) did not write them:
    I2's definition, from the names, the record's writers and the files'
    own ``meta``."""
    epoch, iteration = position
    max_iters, max_epochs = before.limits
    found = []
    for name in before.pth:
        match = CHECKPOINT_NAME.match(name)
        if match is None:
            continue
        step = int(match.group(2))
        by_epoch = match.group(1) == 'epoch'
        if not (epoch if by_epoch else iteration) < step <= \
                (max_epochs if by_epoch else max_iters):
            continue
        if run is None or before.owners[name] != run:
            found.append(name)
    return found


def expectation(before):
    """What the launch must do, by the contract (I2, I5).

    Returns:
        dict(kind, run, position, chosen, skipped, in_way, redone): kind is
        ``'resume'`` (from ``chosen``, the newest intact entry of the
        record's run), ``'afresh'``, ``'in_way'`` (refuse with
        CheckpointsInTheWay naming ``in_way``), ``'corrupt'`` (refuse with
        CorruptCheckpointError: entries, none intact, or damaged lines
        beside checkpoint files) or ``'link'`` (a record that is a
        symbolic link: refused naming it).
    """
    record = before.record
    found = dict(
        kind=None,
        run=None,
        position=(0, 0),
        chosen=None,
        skipped=[],
        in_way=[],
        redone=(0, 0))
    if not before.resume:
        found['kind'] = 'afresh'  # a new run
    elif before.link:
        found['kind'] = 'link'
        return found
    elif before.intact:
        chosen = before.intact[0]
        found.update(
            kind='resume',
            run=record.run_id,
            chosen=chosen,
            position=(chosen.epoch, chosen.iter),
            skipped=before.own[:before.own.index(chosen)])
        max_iters, max_epochs = before.limits
        possible = [
            e for e in found['skipped'] if chosen.iter <= e.iter <= max_iters
            and chosen.epoch <= e.epoch <= max_epochs
        ]
        found['redone'] = (max((e.iter - chosen.iter for e in possible),
                               default=0),
                           max((e.epoch - chosen.epoch for e in possible),
                               default=0))
    elif before.own:
        # The plugin refuses even when no checkpoint file is left in the
        # folder (every entry's file gone), which I5's wording ("a record
        # with no intact entry starts afresh ... where no checkpoint file is
        # in the folder") does not say; counted apart.
        found['kind'] = 'corrupt'
        found['all_files_gone'] = not before.pth
    elif not record.entries and not record.damaged and \
            not record.unreadable:
        found['kind'] = 'afresh'  # no record (or an empty one): migration
    elif before.pth:
        found['kind'] = 'corrupt'
    else:
        found['kind'] = 'afresh'  # damage costs entries, not runs
    if found['kind'] in ('resume', 'afresh'):
        found['in_way'] = in_the_way_names(before, found['run'],
                                           found['position'])
        if found['in_way']:
            found['kind'] = 'in_way'
    return found


# -------------------------------------------------------------- faults
DAMAGES = ('truncate', 'flip', 'zero', 'replace_run', 'replace_config',
           'last_checkpoint', 'record_nul', 'record_garbage', 'record_cut',
           'foreign_file')


def damage(rng, folder, work_dir, foreign):
    """Damage one thing of a run at random (issue 34's faults).

    Args:
        rng: The soak's random generator.
        folder: The checkpoint folder (record and checkpoints).
        work_dir: The work folder (``last_checkpoint``).
        foreign: Paths of another run's and another config's checkpoint.

    Returns:
        ``(what, damaged recorded path or None)``.
    """
    record = read_record(str(folder))
    recorded = [e.location for e in record.checkpoints()]
    existing = [path for path in recorded if osp.isfile(path)]
    kind = rng.choice(DAMAGES)
    record_file = osp.join(folder, RECORD_NAME)
    if kind in ('truncate', 'flip', 'zero', 'replace_run',
                'replace_config') and existing:
        # Half the time the oldest: the next entry retention retires, which
        # must then leave the file (it is no longer the one the run wrote).
        path = existing[-1] if rng.random() < 0.5 else rng.choice(existing)
        size = osp.getsize(path)
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
    if kind == 'last_checkpoint' and osp.isdir(work_dir):
        with open(osp.join(work_dir, 'last_checkpoint'), 'wb') as f:
            f.write(
                rng.choice([
                    b'\0' * 45, b'junk://x', b'/nonexistent',
                    os.fsencode(foreign['replace_run'])
                ]))
        return kind, None
    if kind.startswith('record') and read_bytes(record_file) is not None:
        data = read_bytes(record_file)
        if kind == 'record_cut':
            data = data[:-rng.randrange(1, 60)]
        else:
            data += b'\0' * 300 if kind == 'record_nul' else \
                b'{"event": "saved", "path": "epoch_99.pth"\n'
        with open(record_file, 'wb') as f:
            f.write(data)
        if kind == 'record_cut':
            # A cut "removed" line revives a retired entry whose file is
            # gone: damage the soak did, not a checkpoint the policy keeps.
            after = {
                e.location
                for e in read_record(str(folder)).checkpoints()
            }
            revived = sorted(after - set(recorded))
            return kind, revived[0] if revived else None
        return kind, None
    if kind == 'foreign_file' and osp.isdir(folder):
        shutil.copy(foreign['replace_run'], osp.join(folder, 'epoch_99.pth'))
        return kind, None
    return kind + ' (nothing to damage)', None


def append_raw(record_file, lines):
    """Append JSON lines to a record as a person editing it would."""
    data = read_bytes(record_file) or b''
    with open(record_file, 'ab') as f:
        if data and not data.endswith(b'\n'):
            f.write(b'\n')
        for line in lines:
            f.write(json.dumps(line).encode() + b'\n')


def forge_entries(rng, folder, victim):
    """Append ``saved`` lines naming the victim's checkpoint or folder by
    ``../`` and absolute paths, with its size, SHA-256 and even its file
    id, as the run's newest checkpoint (auto-resume would take it) or its
    oldest (retention would delete it); at times also a bare name at an
    impossible position (its file missing: it must cost nothing in the
    "redone" figure).

    Returns:
        ``(kinds, bare names forged)``.
    """
    record = read_record(folder)
    run_id = record.run_id or 'f' * 32
    newest = max((e.iter for e in record.checkpoints()), default=0)
    source = osp.join(victim, 'epoch_2.pth')
    info = os.lstat(source)
    targets = dict(
        relative_file=osp.relpath(source, folder),
        absolute_file=source,
        relative_folder=osp.relpath(osp.join(victim, 'victimdir'), folder),
        absolute_folder=osp.join(victim, 'victimdir'))
    kinds = rng.sample(sorted(targets), rng.randint(1, 3))
    lines, bare = [], []
    for kind in kinds:
        iteration = newest + rng.randint(1, 3) if rng.random() < 0.6 else 0
        lines.append(
            dict(
                event='saved',
                path=targets[kind],
                epoch=iteration,
                iter=iteration,
                size=info.st_size,
                sha256=sha256_file(source),
                file_id=[info.st_dev, info.st_ino, info.st_mtime_ns],
                best=False,
                run_id=run_id,
                config_digest='forged'))
    if rng.random() < 0.5:
        kinds.append('impossible_position')
        name = 'iter_999999.pth'
        bare.append(name)
        lines.append(
            dict(
                event='saved',
                path=name,
                epoch=rng.choice([7, 10**6]),
                iter=10**18,
                size=info.st_size,
                sha256=sha256_file(source),
                best=False,
                run_id=run_id,
                config_digest='forged'))
    append_raw(osp.join(folder, RECORD_NAME), lines)
    return kinds, bare


RECORD_FAULTS = ('missing', 'empty', 'symlink_dangling', 'symlink_other')


def break_record(kind, folder, other_record):
    """Delete, empty or replace the record by a symbolic link (dangling,
    or to ``other_record``, another run's)."""
    path = osp.join(folder, RECORD_NAME)
    os.remove(path)
    if kind == 'empty':
        open(path, 'wb').close()
    elif kind == 'symlink_dangling':
        os.symlink(osp.join(folder, 'gone', RECORD_NAME), path)
    elif kind == 'symlink_other':
        os.symlink(other_record, path)


GARBLES = ('nul', 'garbage', 'cut_start', 'forged_only')


def garble_fresh_record(rng, folder, victim):
    """A record with no intact entry in a folder without checkpoints: NUL
    bytes, garbage, a cut ``start`` line, or only a forged line naming the
    victim's checkpoint. Returns the kind."""
    kind = rng.choice(GARBLES)
    os.makedirs(folder, exist_ok=True)
    source = osp.join(victim, 'epoch_2.pth')
    data = {
        'nul':
        b'\0' * rng.randint(1, 500),
        'garbage':
        b'#' +
        bytes(rng.randrange(1, 256) for _ in range(rng.randint(1, 300))),
        'cut_start':
        b'{"config_digest":"c8d895c111e95b07","event":"start","launch":{"it',
        'forged_only':
        json.dumps(
            dict(
                event='saved',
                path=osp.relpath(source, folder),
                epoch=2,
                iter=2,
                size=osp.getsize(source),
                sha256=sha256_file(source),
                best=False,
                run_id='f' * 32,
                config_digest='forged')).encode() + b'\n',
    }[kind]
    with open(osp.join(folder, RECORD_NAME), 'wb') as f:
        f.write(data)
    return kind


def copy_experiment(episode, work_dir, out_dir):
    """Copy an episode's work folder and checkpoint folder as a person
    copies an experiment: the work folder to ``work_dir`` and, where the
    checkpoints are outside it, the checkpoint folder to
    ``<out_dir>/<work folder name>``. Returns the copy's checkpoint
    folder."""
    shutil.copytree(episode['work_dir'], work_dir, symlinks=True)
    if episode['out_dir'] is None:
        return work_dir
    folder = osp.join(out_dir, osp.basename(work_dir))
    shutil.copytree(episode['ckpt'], folder, symlinks=True)
    return folder
