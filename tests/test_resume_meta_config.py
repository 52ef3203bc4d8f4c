"""Resume never executes a checkpoint's ``meta.config``.

mmengine 0.10.7's ``Runner.resume`` and ``FlexibleRunner.resume`` ran
``Config.fromstring(checkpoint['meta']['config'], '.py')``. Genuine Runner
checkpoints get a ``meta.config`` text that would write a file, import a
module (``custom_imports``) or read a ``_base_`` file that does, and are
resumed by every resume path: a local ``load_from``, an ``http://`` URL
downloaded from a loopback server, an ``https://`` URL found in torch's hub
cache, automatic resume through ``last_checkpoint``, FlexibleRunner, and
``tools/train.py --resume`` in a subprocess. Each must run nothing and resume
exactly as the same checkpoint without ``meta.config``; the ``gpu_ids`` check
keeps upstream's behaviour for genuine texts.
"""
import functools
import http.server
import os
import os.path as osp
import shutil
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from conftest import make_toy_runner
from mmengine.config import Config
from mmengine.hooks import Hook
from mmengine.runner import FlexibleRunner, Runner

import mmae_plugin.registration  # noqa: F401
from mmae_plugin.compat.safe_resume_config import (MAX_CONFIG_TEXT_CHARS,
                                                   ConfigTextWarning,
                                                   LiteralConfigText,
                                                   read_resume_keys)

PAYLOAD_MODULE = 'mmae_meta_config_payload'


# --------------------------------------------------------------------------
# a tiny real training run
# --------------------------------------------------------------------------
class RecordResumedState(Hook):
    """Remembers epoch, iteration and weights when training starts."""

    def before_train(self, runner):
        self.epoch, self.iter = runner.epoch, runner.iter
        self.weights = {
            k: v.clone()
            for k, v in runner.model.state_dict().items()
        }


def toy_runner(work_dir, max_epochs, runner_class=Runner, **kwargs):
    """conftest's toy run (4 samples, SGD with momentum), recorded."""
    record = RecordResumedState()
    runner = make_toy_runner(
        work_dir,
        max_epochs,
        runner_class=runner_class,
        momentum=0.9,
        default_hooks=dict(logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[record],
        randomness=dict(seed=0),
        **kwargs)
    return runner, record


def weights(runner):
    return {k: v.clone() for k, v in runner.model.state_dict().items()}


@pytest.fixture(scope='module')
def genuine(tmp_path_factory):
    """epoch_1.pth of a real 2-epoch run, and that run's final weights."""
    work_dir = tmp_path_factory.mktemp('genuine')
    runner, _ = toy_runner(work_dir, max_epochs=2)
    runner.train()
    return work_dir / 'epoch_1.pth', weights(runner)


def with_meta_config(source, destination, text):
    """``source`` with ``meta['config'] = text``; nothing else changed."""
    checkpoint = torch.load(source, weights_only=True)
    if text is None:
        checkpoint['meta'].pop('config', None)
    else:
        checkpoint['meta']['config'] = text
    torch.save(checkpoint, destination)
    return destination


# --------------------------------------------------------------------------
# what a hostile meta.config tries
# --------------------------------------------------------------------------
@pytest.fixture
def marker(tmp_path):
    """The file a payload would create; a module that would create it too."""
    path = tmp_path / 'PWNED'
    (tmp_path / 'modules').mkdir()
    (tmp_path / 'modules' /
     f'{PAYLOAD_MODULE}.py').write_text(f'open({str(path)!r}, "w").close()\n')
    (tmp_path / 'evil_base.py'
     ).write_text(f'x = __import__("os").system("touch {path}")\n')
    sys.path.insert(0, str(tmp_path / 'modules'))
    yield path
    sys.path.remove(str(tmp_path / 'modules'))
    assert not path.exists(), 'a meta.config payload ran'
    assert PAYLOAD_MODULE not in sys.modules, 'meta.config imported a module'


def payload_texts(marker):
    """Config texts whose execution (upstream's resume) creates ``marker``."""
    base = osp.join(osp.dirname(marker), 'evil_base.py')
    touch = f"__import__('os').system('touch {marker}')"
    return {
        'os.system':
        f'x = {touch}\n',
        'open':
        f"open({str(marker)!r}, 'w').close()\n",
        'exec':
        'exec("import os; os.system(' + f"'touch {marker}'" + ')")\n',
        'custom_imports': (f'custom_imports = dict(imports=[{PAYLOAD_MODULE!r}'
                           '], allow_failed_imports=False)\n'),
        '_base_':
        f'_base_ = [{base!r}]\n',
        'gpu_ids call':
        f'gpu_ids = {touch}\n',
        'gpu_ids in range':
        f'gpu_ids = range({touch})\n',
        'gpu_ids lambda':
        f'gpu_ids = [(lambda: {touch})()]\n',
        'gpu_ids f-string':
        f'gpu_ids = [f"{{{touch}}}"]\n',
        'range rebound':
        f'range = lambda *a: {touch}\ngpu_ids = range(1)\n',
        'class body':
        f'class A:\n    {touch}\ngpu_ids = [0]\n',
        'decorator':
        f'@{touch}.__class__\ndef f(): pass\n',
        'genuine then payload':
        f'model = dict(type="X")\ngpu_ids = [0]\n'
        f'x = {touch}\n',
    }


PAYLOAD_NAMES = list(payload_texts('/x'))


def check_resumed_like_genuine(record, runner, genuine_final):
    """Resumed at epoch 1 / iteration 2 and trained on to the same weights."""
    assert (record.epoch, record.iter) == (1, 2)
    assert runner.epoch == 2
    for key, value in genuine_final.items():
        assert torch.equal(weights(runner)[key], value), key


# --------------------------------------------------------------------------
# resume paths
# --------------------------------------------------------------------------
@pytest.mark.parametrize('runner_class', [Runner, FlexibleRunner])
@pytest.mark.parametrize('payload', PAYLOAD_NAMES)
def test_local_resume_runs_no_meta_config(tmp_path, genuine, marker, payload,
                                          runner_class):
    source, final = genuine
    path = with_meta_config(source, tmp_path / 'crafted.pth',
                            payload_texts(marker)[payload])
    runner, record = toy_runner(
        tmp_path / 'work', 2, runner_class, load_from=str(path), resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)


class QuietHandler(http.server.SimpleHTTPRequestHandler):

    def log_message(self, *args):
        pass


@pytest.fixture
def http_root(tmp_path, monkeypatch):
    """A loopback HTTP server over a folder; torch's hub cache emptied."""
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    assert torch.hub._hub_dir is None, 'a test set torch.hub.set_dir'
    root = tmp_path / 'served'
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ('127.0.0.1', 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield root, f'http://127.0.0.1:{server.server_address[1]}'
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize('payload',
                         ['os.system', 'custom_imports', 'gpu_ids call'])
def test_http_resume_runs_no_meta_config(tmp_path, genuine, marker, http_root,
                                         payload):
    source, final = genuine
    root, address = http_root
    with_meta_config(source, root / f'crafted-{len(payload)}.pth',
                     payload_texts(marker)[payload])
    url = f'{address}/crafted-{len(payload)}.pth'
    runner, record = toy_runner(
        tmp_path / 'work', 2, load_from=url, resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)
    # It was downloaded, not found in a cache.
    assert (tmp_path / 'torch_home' / 'hub' / 'checkpoints' /
            f'crafted-{len(payload)}.pth').is_file()


def test_https_resume_from_hub_cache_runs_no_meta_config(
        tmp_path, genuine, marker, monkeypatch):
    """``--resume https://...`` served from torch's hub cache, no network."""
    source, final = genuine
    monkeypatch.setenv('TORCH_HOME', str(tmp_path / 'torch_home'))
    cache = tmp_path / 'torch_home' / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    with_meta_config(source, cache / 'crafted.pth',
                     payload_texts(marker)['custom_imports'])
    runner, record = toy_runner(
        tmp_path / 'work',
        2,
        load_from='https://example.invalid/ckpt/crafted.pth',
        resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)


@pytest.mark.parametrize('runner_class', [Runner, FlexibleRunner])
@pytest.mark.parametrize('payload', ['os.system', 'custom_imports', '_base_'])
def test_auto_resume_runs_no_meta_config(tmp_path, genuine, marker, payload,
                                         runner_class):
    """``resume=True`` without ``load_from``: ``last_checkpoint`` is read."""
    source, final = genuine
    work_dir = tmp_path / 'work'
    work_dir.mkdir()
    path = with_meta_config(source, work_dir / 'epoch_1.pth',
                            payload_texts(marker)[payload])
    (work_dir / 'last_checkpoint').write_text(str(path))
    runner, record = toy_runner(work_dir, 2, runner_class, resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)


def test_resume_without_meta_config_is_unchanged(tmp_path, genuine):
    """The control: mmengine's own checkpoint (no meta.config) resumes."""
    source, final = genuine
    assert 'config' not in torch.load(source, weights_only=True)['meta']
    runner, record = toy_runner(
        tmp_path / 'work', 2, load_from=str(source), resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)


def test_tools_train_py_resume_runs_no_meta_config(tmp_path, repo_root,
                                                   marker):
    """``python tools/train.py CONFIG --resume PATH``, end to end."""
    config = 'configs/fashion_mnist/mmae_fmnist.py'
    tiny = [
        'train_dataloader.dataset.indices=16', 'train_dataloader.batch_size=8',
        'train_dataloader.num_workers=0',
        'train_dataloader.persistent_workers=False',
        'default_hooks.checkpoint.interval=1'
    ]

    def train(work_dir, *extra, epochs):
        proc = subprocess.run([
            sys.executable, 'tools/train.py', config, '--work-dir',
            str(work_dir), *extra, '--cfg-options',
            f'train_cfg.max_epochs={epochs}', *tiny
        ],
                              cwd=repo_root,
                              capture_output=True,
                              text=True,
                              timeout=600,
                              env=dict(
                                  os.environ,
                                  OMP_NUM_THREADS='1',
                                  PYTHONPATH=str(marker.parent / 'modules')))
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        return proc.stdout + proc.stderr

    train(tmp_path / 'first', epochs=1)
    text = ''.join(
        payload_texts(marker)[name]
        for name in ('custom_imports', 'os.system'))
    crafted = with_meta_config(tmp_path / 'first' / 'epoch_1.pth',
                               tmp_path / 'crafted.pth', text)
    log = train(tmp_path / 'resumed', '--resume', str(crafted), epochs=2)
    assert 'resumed epoch: 1' in log
    assert (tmp_path / 'resumed' / 'epoch_2.pth').is_file()


# --------------------------------------------------------------------------
# gpu_ids: upstream's check, for genuine texts
# --------------------------------------------------------------------------
def mmcv_era_text(gpu_ids):
    """What MMCV-era scripts stored: ``cfg.pretty_text`` with gpu_ids."""
    return Config(
        dict(
            model=dict(type='ResNet', depth=18),
            gpu_ids=gpu_ids,
            seed=0,
            work_dir='./work_dirs/x',
            custom_imports=dict(imports=['os']))).pretty_text


@pytest.mark.parametrize(
    'gpu_ids',
    [range(0, 1),
     range(0, 8),
     range(2), [0], [0, 1, 2], (0, 1), []])
def test_gpu_ids_read_as_upstream_executes_them(gpu_ids):
    """Against upstream's own (executing) reading of a benign text."""
    text = mmcv_era_text(gpu_ids)
    upstream = Config.fromstring(text, '.py').get('gpu_ids')
    ours = LiteralConfigText.fromstring(text, '.py').get('gpu_ids')
    assert ours == upstream and len(ours) == len(gpu_ids)
    assert list(read_resume_keys(text)) == ['gpu_ids']


def test_gpu_count_mismatch_still_refused(tmp_path, genuine):
    source, _ = genuine
    path = with_meta_config(source, tmp_path / 'eight.pth',
                            mmcv_era_text(range(0, 8)))
    runner, _ = toy_runner(
        tmp_path / 'work', 2, load_from=str(path), resume=True)
    with pytest.raises(RuntimeError, match='Number of GPUs'):
        runner.train()
    # With auto_scale_lr enabled upstream only logs, and resume goes on.
    runner, record = toy_runner(
        tmp_path / 'work_scaled',
        2,
        load_from=str(path),
        resume=True,
        auto_scale_lr=dict(enable=True, base_batch_size=16))
    runner.train()
    assert (record.epoch, record.iter) == (1, 2)


def test_gpu_count_match_resumes(tmp_path, genuine):
    source, final = genuine
    path = with_meta_config(source, tmp_path / 'one.pth',
                            mmcv_era_text(range(0, 1)))
    runner, record = toy_runner(
        tmp_path / 'work', 2, load_from=str(path), resume=True)
    runner.train()
    check_resumed_like_genuine(record, runner, final)


@pytest.mark.parametrize('text, reason', [
    ('gpu_ids = [0, 1', 'not parseable'),
    ('(' * 300 + ')' * 300, 'not parseable'),
    ('gpu_ids = 3', 'not a literal'),
    ('gpu_ids = range(10**40)', 'not a literal'),
    ('gpu_ids = list(range(2))', 'not a literal'),
    (b'gpu_ids = [0]', 'not config text'),
])
def test_unreadable_gpu_ids_skip_the_check_with_a_warning(text, reason):
    with pytest.warns(ConfigTextWarning, match=reason):
        assert read_resume_keys(text) == {}


def test_oversized_meta_config_is_refused_unparsed_at_once():
    """4 MB of ``a=1`` lines took 2.4 GB and 42 s to parse; refused by name,
    unparsed, well within a second."""
    import time
    text = 'a=1\n' * 1_000_000 + 'gpu_ids = [0]\n'
    start = time.perf_counter()
    with pytest.warns(
            ConfigTextWarning,
            match=r"meta\['config'\] is 4,000,014 characters, over "
            r'the 262,144-character limit.*not parsed'):
        assert read_resume_keys(text) == {}
    assert time.perf_counter() - start < 1.0


def test_text_at_the_limit_is_still_read():
    text = mmcv_era_text(range(0, 2))
    padded = text + '#' * (MAX_CONFIG_TEXT_CHARS - len(text))
    assert len(padded) == MAX_CONFIG_TEXT_CHARS
    assert len(read_resume_keys(padded)['gpu_ids']) == 2


def test_payload_texts_really_run_under_upstream(tmp_path, marker):
    """The control: each payload does run when executed as upstream does.

    ``custom_imports`` imports a copy of the payload module under another
    name (the marker fixture checks the real name was never imported).
    """
    control = 'mmae_meta_config_control'
    shutil.copyfile(tmp_path / 'modules' / f'{PAYLOAD_MODULE}.py',
                    tmp_path / 'modules' / f'{control}.py')
    executed = []
    for name, text in payload_texts(marker).items():
        text = text.replace(PAYLOAD_MODULE, control)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                Config.fromstring(text, '.py')
            except Exception:  # noqa: BLE001 -- some fail after running
                pass
        if marker.exists():
            marker.unlink()
            executed.append(name)
    sys.modules.pop(control, None)
    assert sorted(set(PAYLOAD_NAMES) - set(executed)) == []
