#!/usr/bin/env bash
# The prepared GPU check: one command, at most 560 s on one H200 with the
# machine's own torch (2.11, Python 3.12) and no network.
#
# Device budget (/work/.library/device/README.md): 15 minutes of device time
# per task, all calls together, counted from the machine's start (1-2 min)
# to its return (30 s warm after a call), and at most 10 minutes a command.
# 900 s - ~120 s start - ~40 s transfers and warm tail leaves ~740 s; one
# call of this script, `run` with timeout_s=600, uses 560 s of it (the
# stages' limits, 545 s, plus 15 s for the report), which leaves ~180 s for
# an immediate rerun of one stage (GPU_CHECK_STAGES, same warm machine).
#
# Usage: bash dev/gpu_check.sh [--dry-run]
#   --dry-run (or GPU_CHECK_DRY_RUN=1): the same stages on the CPU with tiny
#            settings (ViT-tiny at 32 x 32, a few images), in about a minute;
#            the test suite runs it (tests/test_gpu_check.py)
# Environment:
#   OUT               where the results go (default: a new temporary folder,
#                     printed at the end); at most 8 files, each <= 4 MiB
#                     (the device tool brings back 8 files: the environment
#                     is in gpu_check.json, not a file of its own)
#   PYTHON            interpreter (default python3, the one holding torch)
#   GPU_CHECK_WHEELS  wheel folder (default <repo>/.whl, filled on a machine
#                     with network by dev/gpu_wheels.sh)
#   GPU_CHECK_SITE    where the wheels are installed (default /tmp/site;
#                     a temporary folder in a dry run)
#   GPU_CHECK_STAGES  only these stages, e.g. 'install bench_gpu' for a rerun
#                     (default: all; later stages need install and images)
#   GPU_CHECK_BUDGET_S  seconds for everything (default 560, what the stage
#                     limits sum to plus the report's 15 s; 3x in a dry run,
#                     whose stage timeouts are 3x the device ones: no device
#                     time is at stake and a shared CPU can be slow)
#   GPU_CHECK_TEST_TIMEOUT_S  per-test limit of the CUDA tests (default 45;
#                     pytest-timeout's thread method, which also ends a hung
#                     NCCL or CUDA call; without pytest-timeout, none)
#
# Stages in this order, each with its own timeout (seconds on the device;
# cut to what is left of the budget); a stage that fails or times out is
# recorded and the next one runs:
#   environment  60: `import distutils.errors` first (mmengine's collect_env
#                needs it; Python 3.12 has it only from setuptools in the
#                interpreter's own site-packages, and the training runs would
#                fail at start), then nvidia-smi, python, torch (a fresh VM's
#                first import and CUDA init), the packages found
#   install      45: pip install --no-index --no-deps the carried wheels into
#                GPU_CHECK_SITE; the plugin from the working tree (PYTHONPATH)
#   images       30: a synthetic image folder (PIL-written JPEG and PNG)
#   cuda_tests   90: MMAE_TEST_CUDA=1 pytest -m cuda on the test files that
#                carry the marker (tests/test_cuda.py, ...), each test
#                limited to GPU_CHECK_TEST_TIMEOUT_S; in a dry run they are
#                collected and skipped
#   dist_train   150: tools/dist_train.sh configs/mmae_vit-base_200e.py 1 on the
#                synthetic images, labelled (meta/train.txt) and with every
#                default hook, as users run it: 1 epoch (25 iterations of
#                128), then a resumed run to epoch 2 (50 iterations in all);
#                checks that the second run resumed at iteration 25 and that
#                every loss is finite with the regulariser applied, and counts
#                the device waits of each steady-state step and where they
#                come from (dev/gpu_check_hooks.py, torch's sync debug mode);
#                before the benchmark, so that it always has its full limit.
#                bench_gpu.py times the model's train_step alone
#   bench_gpu    170: dev/benchmarks/bench_gpu.py: MAE and M-MAE ViT-B/16
#                in bfloat16 and float16, alternating rounds in one process
#                per dtype; last, as it saves its JSON after every case
# Results in $OUT (8 files): gpu_check.json (every stage and its figures,
# the environment stage's output), gpu_check.md (summary), bench_gpu.json,
# dist_train.json (per-iteration figures) and the logs of install,
# cuda_tests, bench_gpu and dist_train.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/dev/gpu_check.sh"

if [ "${1:-}" = --stage ]; then
  STAGE_MODE=1
  STAGE="$2"
else
  STAGE_MODE=0
  case "${1:-}" in
    --dry-run) GPU_CHECK_DRY_RUN=1 ;;
    '') ;;
    *) echo "usage: bash dev/gpu_check.sh [--dry-run] (got '$1')" >&2; exit 2 ;;
  esac
fi

# ------------------------------------------------------------- stage bodies
# Run as `gpu_check.sh --stage NAME` under `timeout`, with the settings the
# main part exported (GC_*).
stage_environment() {
  # First, before anything slow: the training runs' first call
  # (mmengine's collect_env) imports distutils.
  local distutils=0
  if "$PYTHON" -c 'import distutils.errors' 2>/dev/null; then
    echo "distutils.errors: importable"
  else
    distutils=1
    echo "distutils.errors: NOT importable: mmengine's collect_env, at the" \
      "start of every training run, will fail (Python >= 3.12 needs" \
      "setuptools in the interpreter's own site-packages)"
  fi
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -a)"
  echo "cpus: $(nproc)"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  else
    echo "nvidia-smi: not found"
  fi
  "$PYTHON" - <<'EOF'
import importlib.metadata as md
import sys
import torch
print('python', sys.version.split()[0], sys.executable)
print('torch', torch.__version__, 'cuda', torch.version.cuda,
      'available', torch.cuda.is_available())
if torch.cuda.is_available():
    print('gpu', torch.cuda.get_device_name(),
          'capability', torch.cuda.get_device_capability(),
          'bf16', torch.cuda.is_bf16_supported())
for name in ('numpy', 'torchvision', 'setuptools', 'pillow',
             'opencv-python-headless', 'pytest', 'scipy', 'tensorboard',
             'timm', 'mmengine', 'mmpretrain', 'mmcv-lite'):
    try:
        print(name, md.version(name))
    except md.PackageNotFoundError:
        print(name, 'not installed')
EOF
  return $distutils
}

stage_install() {
  shopt -s nullglob
  local wheels=("$GC_WHEELS"/*.whl)
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "no wheels in $GC_WHEELS (run dev/gpu_wheels.sh on a machine with network)"
    if [ "$GC_DRY" = 1 ]; then exit 3; fi  # 3: skipped (the suite's checkout has none)
    exit 1
  fi
  echo "installing ${#wheels[@]} wheels into $GC_SITE"
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "$GC_SITE" "${wheels[@]}" || exit 1
  PYTHONPATH="$GC_SITE:$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" - "$GC_SITE" "$ROOT" <<'EOF'
import os.path as osp
import sys

import mmcv
import mmengine
import mmpretrain
import pkg_resources

import mmae_plugin.registration

site, root = osp.realpath(sys.argv[1]), sys.argv[2]
for module in (mmengine, mmpretrain, mmcv, pkg_resources, mmae_plugin):
    print(f'{module.__name__} {getattr(module, "__version__", "")} '
          f'from {module.__file__}')
for module in (mmengine, mmpretrain, mmcv):
    if not osp.realpath(module.__file__).startswith(site):
        sys.exit(f'{module.__name__} was not imported from {site}')
# `mmpretrain::` config bases resolve (pkg_resources finds the carried
# mmpretrain's metadata and its .mim/configs).
from mmengine.config import Config
cfg = Config.fromfile(osp.join(root, 'configs', 'mmae_vit-base_200e.py'))
print('configs/mmae_vit-base_200e.py:', cfg.model.type,
      cfg.optim_wrapper.type, cfg.optim_wrapper.dtype)
EOF
}

stage_images() {
  "$PYTHON" "$ROOT/dev/benchmarks/bench_gpu.py" --write-folder "$GC_IMAGES" \
    --folder-images "$GC_IMAGE_COUNT" || return
  # Labelled, as ImageNet is: meta/train.txt (mmpretrain's ImageNet reads it
  # when present), so the step carries DataSamples with gt_label.
  "$PYTHON" - "$GC_IMAGES" <<'EOF'
import os
import sys

root = sys.argv[1]
lines = []
for folder in sorted(os.listdir(os.path.join(root, 'train'))):
    for name in sorted(os.listdir(os.path.join(root, 'train', folder))):
        lines.append(f'{folder}/{name} {int(folder[1:])}')
os.makedirs(os.path.join(root, 'meta'), exist_ok=True)
with open(os.path.join(root, 'meta', 'train.txt'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
print(f'{len(lines)} labelled images')
EOF
}

stage_cuda_tests() {
  local files
  files=$(cd "$ROOT" && grep -l -E 'pytest\.mark\.cuda|pytestmark = pytest\.mark\.cuda' tests/test_*.py)
  if [ -z "$files" ]; then echo "no test file carries the cuda marker"; exit 1; fi
  echo "files: $files"
  # shellcheck disable=SC2086
  # A per-test limit, so that one hung test (an NCCL collective, a CUDA
  # call) ends after GC_TEST_TIMEOUT s, not at the stage's limit. The thread
  # method ends the whole pytest (its JUnit file is then missing; -v names
  # the test that hung in the log).
  local limits=()
  if "$PYTHON" -c 'import pytest_timeout' 2>/dev/null; then
    limits=(--timeout "$GC_TEST_TIMEOUT" -o timeout_method=thread)
    echo "per-test timeout: ${GC_TEST_TIMEOUT} s (pytest-timeout, thread method)"
  else
    echo "per-test timeout: none (pytest-timeout is not installed)"
  fi
  # shellcheck disable=SC2086
  (cd "$ROOT" && MMAE_TEST_CUDA=1 "$PYTHON" -m pytest -m cuda -v -rfEs \
    -p no:cacheprovider "${limits[@]}" \
    --junitxml="$GC_TMP/cuda_tests.xml" $files)
}

stage_bench_gpu() {
  local args=(--folder "$GC_IMAGES" --out "$GC_TMP/bench_gpu.json"
              --markdown "$GC_TMP/bench_gpu.md")
  if [ "$GC_DRY" = 1 ]; then
    args+=(--device cpu --rounds 3 --iters 1 --warmup 1 --loader-iters 1
           --reg-reps 1 --image-size 32 --cfg-options "${GC_SHRINK[@]}")
  else
    args+=(--dtypes bfloat16 float16 --rounds 3 --iters 100 --warmup 10
           --loader-iters 15 --reg-reps 100 --case-timeout 80)
  fi
  (cd "$ROOT" && "$PYTHON" dev/benchmarks/bench_gpu.py "${args[@]}")
}

stage_dist_train() {
  # The recipe as users run it (all default hooks, labelled images), plus
  # dev/gpu_check_hooks.py counting the device waits of every step.
  local config="$GC_TMP/mmae_vit-base_check.py" options=() per_epoch
  options=(train_dataloader.dataset.data_root="$GC_IMAGES")
  cat > "$config" <<EOF
_base_ = '$ROOT/configs/mmae_vit-base_200e.py'
custom_imports = dict(
    imports=['mmae_plugin.registration', 'gpu_check_hooks'],
    allow_failed_imports=False)
custom_hooks = [
    dict(type='ReseedHook'), dict(type='DivergenceHook'),
    dict(type='SyncCountStart'), dict(type='SyncCountStop')]
EOF
  export PYTHONPATH="$ROOT/dev:$PYTHONPATH"
  if [ "$GC_DRY" = 1 ]; then
    # AmpOptimWrapper needs a GPU: the same recipe with its optimizer in an
    # OptimWrapper, shrunk as the benchmark's dry run.
    cat >> "$config" <<EOF
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor={{_base_.optim_wrapper.constructor}},
    optimizer={{_base_.optim_wrapper.optimizer}},
    paramwise_cfg={{_base_.optim_wrapper.paramwise_cfg}})
EOF
    options+=("${GC_SHRINK[@]}" train_dataloader.batch_size=2
              train_dataloader.num_workers=0
              train_dataloader.persistent_workers=False
              train_dataloader.dataset.pipeline.1.scale=32
              default_hooks.logger.interval=1)
    per_epoch=$((GC_IMAGE_COUNT / 2))
    export CUDA_VISIBLE_DEVICES=''
  else
    options+=(default_hooks.logger.interval=5)
    per_epoch=$((GC_IMAGE_COUNT / 128))
  fi
  local work="$GC_TMP/dist_train" port rc1 rc2
  port=$("$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cd "$ROOT" || exit 1
  echo "=== run 1: epoch 1 ($per_epoch iterations)"
  PORT=$port PYTHON="$PYTHON" bash tools/dist_train.sh "$config" 1 \
    --work-dir "$work" --cfg-options "${options[@]}" train_cfg.max_epochs=1
  rc1=$?
  echo "=== run 2: --resume, to epoch 2"
  PORT=$port PYTHON="$PYTHON" bash tools/dist_train.sh "$config" 1 \
    --work-dir "$work" --resume --cfg-options "${options[@]}" train_cfg.max_epochs=2
  rc2=$?
  "$PYTHON" - "$work" "$per_epoch" "$rc1" "$rc2" "$GC_TMP/dist_train.json" <<'EOF'
import glob
import json
import math
import os.path as osp
import statistics
import sys

work, per_epoch, rc1, rc2, out = sys.argv[1], int(sys.argv[2]), \
    int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
runs = []
for folder in sorted(glob.glob(osp.join(work, '2*'))):
    scalars = osp.join(folder, 'vis_data', 'scalars.json')
    lines = []
    if osp.exists(scalars):
        lines = [json.loads(l) for l in open(scalars) if l.strip()]
    logs = glob.glob(osp.join(folder, '*.log'))
    text = open(logs[0], errors='replace').read() if logs else ''
    resumed = [l.split(' - ')[-1] for l in text.splitlines()
               if 'resumed epoch' in l]
    train = [l for l in lines if 'loss' in l]
    runs.append(dict(
        folder=osp.basename(folder),
        iterations=[l['iter'] for l in train],
        losses=[l['loss'] for l in train],
        loss_tcr=[l.get('loss_tcr') for l in train],
        reg_skipped=[l.get('reg_skipped') for l in train],
        time=[l.get('time') for l in train],
        data_time=[l.get('data_time') for l in train],
        memory_mb=max([l.get('memory', 0) for l in train], default=None),
        resumed=resumed))
result = dict(returncodes=[rc1, rc2], iterations_per_epoch=per_epoch,
              runs=runs, checkpoints=sorted(
                  osp.basename(p) for p in glob.glob(osp.join(work, '*.pth'))))
try:  # dev/gpu_check_hooks.py, the resumed run's steady-state steps
    with open(osp.join(work, 'sync_counts.json')) as f:
        result['device_waits'] = json.load(f)
except (OSError, ValueError):
    result['device_waits'] = None
problems = []
if [rc1, rc2] != [0, 0]:
    problems.append(f'return codes {rc1}, {rc2}')
if len(runs) != 2:
    problems.append(f'{len(runs)} run folders in {work}, expected 2')
else:
    first, second = runs
    if not first['iterations'] or first['iterations'][-1] != per_epoch:
        problems.append(f'run 1 ended at {first["iterations"][-1:]}, '
                        f'expected iteration {per_epoch}')
    if not any(f'iter: {per_epoch}' in r for r in second['resumed']):
        problems.append(f'run 2 did not resume at iteration {per_epoch}: '
                        f'{second["resumed"]}')
    if not second['iterations'] or second['iterations'][0] <= per_epoch \
            or second['iterations'][-1] != 2 * per_epoch:
        problems.append(f'run 2 logged iterations {second["iterations"]}, '
                        f'expected ({per_epoch}, {2 * per_epoch}]')
    values = [v for r in runs for v in r['losses'] + r['loss_tcr']]
    if None in values or not all(math.isfinite(v) for v in values):
        problems.append('a loss is missing or not finite')
    if any(s != 0 for r in runs for s in r['reg_skipped']):
        problems.append('the regulariser was skipped in a step')
    steady = [t for t in second['time'][1:] if t is not None]
    if steady:
        result['median_iter_s'] = statistics.median(steady)
        result['median_data_s'] = statistics.median(
            t for t in second['data_time'][1:] if t is not None)
result['problems'] = problems
result['passed'] = not problems
with open(out, 'w') as f:
    json.dump(result, f, indent=2)
print(json.dumps({k: v for k, v in result.items() if k != 'runs'}, indent=2))
sys.exit(0 if result['passed'] else 1)
EOF
}

if [ "$STAGE_MODE" = 1 ]; then
  read -r -a GC_SHRINK <<< "$GC_SHRINK_TEXT"
  export PYTHONPATH="$GC_PYTHONPATH"
  "stage_$STAGE"
  exit $?
fi

# --------------------------------------------------------------- main part
export GC_DRY="${GPU_CHECK_DRY_RUN:-0}"
export PYTHON="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1
export GC_TMP; GC_TMP="$(mktemp -d /tmp/gpu_check.XXXXXX)"
OUT="${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}"
mkdir -p "$OUT"
export GC_WHEELS="${GPU_CHECK_WHEELS:-$ROOT/.whl}"
if [ "$GC_DRY" = 1 ]; then
  export GC_SITE="${GPU_CHECK_SITE:-$GC_TMP/site}"
  export GC_IMAGE_COUNT=8
else
  export GC_SITE="${GPU_CHECK_SITE:-/tmp/site}"
  export GC_IMAGE_COUNT=3200  # 25 iterations of 128 per epoch
fi
export GC_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT_S:-45}"
export GC_IMAGES="$GC_TMP/images"
# ViT-B/16 shrunk to ViT-tiny at 32 x 32 (4 patches), 1 decoder layer.
export GC_SHRINK_TEXT="model.backbone.arch=deit-tiny model.backbone.img_size=32 model.neck.num_patches=4 model.neck.embed_dim=192 model.neck.decoder_embed_dim=32 model.neck.decoder_depth=1 model.neck.decoder_num_heads=2"
export GC_PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# The stage limits (run_stage below, device seconds) sum to 545 s; with
# the report's 15 s that is the device budget of 560 s (see the top).
DEVICE_BUDGET=560
if [ "$GC_DRY" = 1 ]; then
  SCALE=3
else
  SCALE=1
fi
BUDGET="${GPU_CHECK_BUDGET_S:-$((DEVICE_BUDGET * SCALE))}"
START=$(date +%s)
REPORT_RESERVE=15
STAGES="$GC_TMP/stages.jsonl"
: > "$STAGES"

# run_stage NAME TIMEOUT_S: the stage body under `timeout` (its own process
# group, so torchrun's children die with it); log in $GC_TMP/NAME.log.
run_stage() {
  local name="$1" limit=$(($2 * SCALE)) now left status rc begin end
  if [ -n "${GPU_CHECK_STAGES:-}" ] && ! [[ " $GPU_CHECK_STAGES " == *" $name "* ]]; then
    echo "{\"name\": \"$name\", \"status\": \"not_selected\", \"rc\": null, \"seconds\": 0, \"timeout_s\": 0}" >> "$STAGES"
    return
  fi
  now=$(date +%s)
  left=$((START + BUDGET - REPORT_RESERVE - now))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 5 ]; then
    echo "{\"name\": \"$name\", \"status\": \"not_run\", \"rc\": null, \"seconds\": 0, \"timeout_s\": $limit}" >> "$STAGES"
    echo "[gpu_check] $name: not run (budget spent)"
    return
  fi
  echo "[gpu_check] $name (timeout ${limit}s)"
  begin=$(date +%s%N)
  timeout -k 10 "$limit" bash "$SELF" --stage "$name" > "$GC_TMP/$name.log" 2>&1
  rc=$?
  end=$(date +%s%N)
  case $rc in
    0) status=passed ;;
    3) status=skipped ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  echo "{\"name\": \"$name\", \"status\": \"$status\", \"rc\": $rc, \"seconds\": $(( (end - begin) / 1000000 ))e-3, \"timeout_s\": $limit}" >> "$STAGES"
  echo "[gpu_check] $name: $status (rc $rc)"
}

run_stage environment 60
run_stage install 45
# The carried stack first on the path, when it was installed.
if grep -q '"name": "install", "status": "passed"' "$STAGES"; then
  export GC_PYTHONPATH="$GC_SITE:$GC_PYTHONPATH"
fi
run_stage images 30
run_stage cuda_tests 90
# Training and its resume before the benchmark, which saves what it has
# measured after every case and so loses least if the budget runs out.
run_stage dist_train 150
run_stage bench_gpu 170

# ------------------------------------------------------------------ report
PYTHONPATH="$GC_PYTHONPATH" "$PYTHON" - "$GC_TMP" "$OUT" "$GC_DRY" "$BUDGET" "$START" <<'EOF'
import json
import os
import os.path as osp
import shutil
import sys
import time
import xml.etree.ElementTree as ET

tmp, out, dry, budget, start = sys.argv[1], sys.argv[2], \
    sys.argv[3] == '1', int(sys.argv[4]), int(sys.argv[5])
MAX_BYTES = 4 * 2**20


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def copy_tail(name, dest):
    """Copy a log, only its last MAX_BYTES if it is longer."""
    path = osp.join(tmp, name)
    if not osp.exists(path):
        return
    with open(path, 'rb') as f:
        f.seek(max(0, osp.getsize(path) - MAX_BYTES))
        data = f.read()
    with open(osp.join(out, dest), 'wb') as f:
        f.write(data)


stages = [json.loads(l) for l in open(osp.join(tmp, 'stages.jsonl'))]
report = dict(mode='dry-run (CPU)' if dry else 'device',
              date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
              budget_s=budget, total_s=time.time() - start, stages=stages)
env_log = osp.join(tmp, 'environment.log')
if osp.exists(env_log):
    # The environment stage's output in the JSON: the device tool brings
    # back 8 files, and dist_train.json is worth the eighth.
    text = open(env_log, errors='replace').read()[-20000:]
    report['environment'] = text.splitlines()
    report['distutils_importable'] = \
        'distutils.errors: importable' in text

junit = osp.join(tmp, 'cuda_tests.xml')
tests_log = osp.join(tmp, 'cuda_tests.log')
if not osp.exists(junit) and osp.exists(tests_log):
    # pytest-timeout's thread method ended pytest before its JUnit file:
    # the last test -v started is the one that hung.
    lines = open(tests_log, errors='replace').read().splitlines()
    started = [l.split(' ')[0] for l in lines
               if l.startswith('tests/') and '::' in l]
    report['cuda_tests'] = dict(
        junit_missing=True,
        timed_out=any('Timeout' in l for l in lines),
        last_started=started[-1] if started else None)
if osp.exists(junit):
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == 'testsuite' else suites[0]
    cases = suite.findall('testcase')
    failed = [f'{c.get("classname")}::{c.get("name")}' for c in cases
              if c.find('failure') is not None or c.find('error') is not None]
    skipped = sum(c.find('skipped') is not None for c in cases)
    report['cuda_tests'] = dict(
        total=len(cases), failed=failed, skipped=skipped,
        passed=len(cases) - len(failed) - skipped)
bench = load(osp.join(tmp, 'bench_gpu.json'))
if bench is not None:
    shutil.copy(osp.join(tmp, 'bench_gpu.json'), osp.join(out, 'bench_gpu.json'))
    report['bench_gpu'] = {
        dtype: {k: v for k, v in block.items() if k != 'cases'}
        for dtype, block in bench['amp'].items()}
    report['bench_gpu_failed_cases'] = bench['failed_cases']
dist = load(osp.join(tmp, 'dist_train.json'))
if dist is not None:
    shutil.copy(osp.join(tmp, 'dist_train.json'),
                osp.join(out, 'dist_train.json'))
    report['dist_train'] = {k: v for k, v in dist.items() if k != 'runs'}
    report['dist_train']['runs'] = [
        {k: r[k] for k in ('folder', 'iterations', 'resumed', 'memory_mb')}
        | dict(first_loss=r['losses'][:1], last_loss=r['losses'][-1:])
        for r in dist['runs']]
report['passed'] = all(s['status'] in ('passed', 'skipped', 'not_selected')
                       for s in stages)
with open(osp.join(out, 'gpu_check.json'), 'w') as f:
    json.dump(report, f, indent=2)

some = 'selected ' if any(s['status'] == 'not_selected' for s in stages) \
    else ''
verdict = f'All {some}stages passed' if report['passed'] else \
    f'NOT all {some}stages passed'
lines = [f'# GPU check ({report["mode"]}), {report["date"]}', '',
         f'{verdict}'
         f' in {report["total_s"]:.0f} s of a {budget} s budget.', '',
         '| stage | status | seconds | timeout s |', '| --- | --- | --- | --- |']
lines += [f'| {s["name"]} | {s["status"]} | {float(s["seconds"]):.0f} | '
          f'{s["timeout_s"]} |' for s in stages]
if report.get('cuda_tests', {}).get('junit_missing'):
    t = report['cuda_tests']
    lines += ['', 'CUDA tests: pytest ended without its JUnit file'
              f'{" after a per-test timeout" if t["timed_out"] else ""}; '
              f'last test started: `{t["last_started"]}` (cuda_tests.log).']
elif 'cuda_tests' in report:
    t = report['cuda_tests']
    lines += ['', f'CUDA tests: {t["passed"]} passed, {len(t["failed"])} '
              f'failed, {t["skipped"]} skipped of {t["total"]}.']
    lines += [f'- failed: `{name}`' for name in t['failed']]
if not report.get('distutils_importable', True):
    lines += ['', '**distutils.errors is not importable**: training runs '
              'fail in mmengine\'s collect_env (see the environment stage).']
if osp.exists(osp.join(tmp, 'bench_gpu.md')):
    body = open(osp.join(tmp, 'bench_gpu.md')).read().split('\n', 1)[1]
    lines += ['', '## bench_gpu.py', body.strip()]
if dist is not None:
    d = report['dist_train']
    runs = d['runs']
    lines += ['', '## dist_train.sh (1 process, resumed)', '',
              f'{"passed" if d["passed"] else "FAILED"}: '
              f'{d["iterations_per_epoch"]} iterations per epoch; logged '
              f'iterations {[r["iterations"] for r in runs]}; '
              f'resume: {[r["resumed"] for r in runs][-1:]}; median '
              f'{d.get("median_iter_s", float("nan")):.3f} s/iteration '
              f'({d.get("median_data_s", float("nan")):.3f} s of it data); '
              f'peak memory {[r["memory_mb"] for r in runs]} MB; '
              f'checkpoints {d["checkpoints"]}.']
    waits = d.get('device_waits') or {}
    if waits.get('counted'):
        lines += [f'- device waits per step (set_sync_debug_mode, '
                  f'{waits["steps"]} steady-state steps): median '
                  f'{waits["median"]}, max {waits["max"]}; sites '
                  f'{waits["sites"]}']
    lines += [f'- problem: {p}' for p in d['problems']]
with open(osp.join(out, 'gpu_check.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
for name in ('install', 'cuda_tests', 'bench_gpu', 'dist_train'):
    copy_tail(f'{name}.log', f'{name}.log')
print('\n'.join(lines))
EOF
echo "[gpu_check] results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
# Exit status: 0 when every stage passed (or was skipped).
grep -q -E '"status": "(failed|timeout|not_run)"' "$STAGES" && exit 1
exit 0
