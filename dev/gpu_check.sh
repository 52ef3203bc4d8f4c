#!/usr/bin/env bash
# The prepared GPU check: one command, at most 540 s on one H100 or H200
# with the machine's own torch (2.11, Python 3.12) and no network.
#
# On the device (/work/.library/device/README.md), once dev/gpu_wheels.sh
# has filled .whl/ here (a machine with network; .whl is ignored by git, so
# it travels only when carried), the one call is
#   run(command='bash dev/gpu_check.sh', carry=['.whl'], timeout_s=600)
# `carry` needs .whl alone: the working tree travels by itself, the images
# are written there, torch is the machine's, and .venv must not travel.
# Rerun one stage on the same warm machine (within its 30 s warm period)
# with the same carry, e.g.
#   run(command="GPU_CHECK_STAGES='bench_gpu' bash dev/gpu_check.sh",
#       carry=['.whl'], timeout_s=300)
# it reuses what the earlier call left in the work folder (images) and in
# GPU_CHECK_SITE (the installed wheels), and makes whatever is missing.
#
# Device budget: 15 minutes of device time per task, all calls together,
# counted from the machine's start (1-2 min) to its return (30 s warm after
# a call), and at most 10 minutes a command. 900 s - ~120 s start - ~40 s
# transfers and warm tail leaves ~740 s; one call of this script uses at
# most 540 s of it (the stages' limits, 525 s, plus 15 s for the report),
# which leaves ~200 s for an immediate rerun of one stage.
#
# Usage: bash dev/gpu_check.sh [--dry-run] [--plan]
#   --dry-run (or GPU_CHECK_DRY_RUN=1): the same stages on the CPU with tiny
#            settings (ViT-tiny at 32 x 32, a few images), in 2 to 4
#            minutes on a shared CPU; the test suite runs it, whole and
#            stage by stage (tests/test_gpu_check.py)
#   --plan   print the plan (which stages would run, and why, with their
#            timeouts) and stop
# Environment:
#   OUT               where the results go (default: a new temporary folder,
#                     printed at the end); at most 8 files, each <= 4 MiB
#                     (the device tool brings back 8 files: the environment
#                     and the two_ranks figures are in gpu_check.json)
#   PYTHON            interpreter (default python3, the one holding torch)
#   GPU_CHECK_DIR     the work folder, kept between calls: images, the
#                     training runs, each stage's log and figures (default
#                     <repo>/work_dirs/gpu_check, or work_dirs/gpu_check_dry
#                     in a dry run; work_dirs/ is ignored by git, and the
#                     device keeps ignored files between calls on one
#                     machine). Each stage creates it if missing
#   GPU_CHECK_WHEELS  wheel folder (default <repo>/.whl, filled on a machine
#                     with network by dev/gpu_wheels.sh)
#   GPU_CHECK_SITE    where the wheels are installed (default /tmp/site;
#                     <work folder>/site in a dry run); put first on the
#                     path whenever it holds mmengine, from this call or an
#                     earlier one
#   GPU_CHECK_STAGES  only these stages, e.g. 'bench_gpu' or 'install
#                     bench_gpu' (default: all). A stage that needs what
#                     another makes runs that one first when its product is
#                     missing, as a prerequisite: install when mmengine,
#                     mmpretrain or mmcv cannot be imported, images when the
#                     work folder has no labelled image folder of the
#                     right size. So every stage passes on its own, also on
#                     a fresh machine or checkout
#   GPU_CHECK_BUDGET_S  seconds for everything (default 540, what the stage
#                     limits sum to plus the report's 15 s; 3x in a dry run,
#                     whose stage timeouts and minimums are 3x the device
#                     ones: no device time is at stake and a shared CPU can
#                     be slow)
#   GPU_CHECK_TEST_TIMEOUT_S  per-test limit of the CUDA tests (default 45;
#                     pytest-timeout's thread method, which also ends a hung
#                     NCCL or CUDA call; without pytest-timeout, none)
#
# Stages in this order (STAGE_TABLE below), each with its own timeout and
# the minimum it needs (seconds on the device): the timeout is cut to what
# is left of the budget, and a stage with less than its minimum left is
# not started (not_run). The plan (what runs, why, its limit) is printed
# first; a stage that fails or times out is recorded and the next one runs:
#   environment  45: `import distutils.errors` first (mmengine's collect_env
#                needs it; Python 3.12 has it only from setuptools in the
#                interpreter's own site-packages, and the training runs would
#                fail at start), then nvidia-smi, python, torch (a fresh VM's
#                first import and CUDA init), the packages found
#   install      40: pip install --no-index --no-deps the carried wheels into
#                GPU_CHECK_SITE; the plugin from the working tree (PYTHONPATH)
#   images       25: a synthetic image folder (PIL-written JPEG and PNG) in
#                the work folder, labelled (meta/train.txt)
#   cuda_tests   90: MMAE_TEST_CUDA=1 pytest -m cuda on the test files that
#                carry the marker (tests/test_cuda.py, ...), each test
#                limited to GPU_CHECK_TEST_TIMEOUT_S; in a dry run they are
#                collected and skipped
#   dist_train   120: tools/dist_train.sh configs/mmae_vit-base_200e.py 1 on
#                the synthetic images, labelled and with every default hook,
#                as users run it: 1 epoch (25 iterations of 128), then a
#                resumed run to epoch 2 (50 iterations in all); checks that
#                the second run resumed at iteration 25 and that every loss
#                is finite with the regulariser applied, and counts the
#                device waits of each steady-state step two ways
#                (dev/gpu_check_hooks.py): torch's sync debug mode, and the
#                host waits it does not see (event, stream and device
#                synchronisations: DeferredRuntimeInfoHook's wait on the
#                previous step's copy), both per step; the first 2 counted
#                steps also under torch.profiler (cudaEventSynchronize,
#                cudaStreamSynchronize, cudaDeviceSynchronize and scalar
#                reads per step); bench_gpu.py times the model's train_step
#                alone
#   two_ranks    60: 2 processes on the one GPU (torchrun --nproc_per_node 2,
#                both ranks on cuda:0 over gloo, which takes CUDA tensors
#                through host memory; NCCL refuses two ranks on one GPU):
#                the recipe shrunk to ViT-tiny at 32 x 32, 8 iterations of 32
#                per rank, dev/gpu_check_two_ranks.py; records the device of
#                every collective (the regulariser's gather, its backward,
#                the DivergenceHook's all-reduce; mmengine's collectives kept
#                on the GPU under gloo, as under NCCL) and checks that both
#                ranks agree (the regulariser's loss on the gathered batch,
#                the all-reduced table of every rank's values, the
#                parameters), then the gather backward's reduce_scatter
#                (NCCL's branch) against its all_reduce (gloo's). In a dry
#                run: 2 gloo ranks on the CPU
#   bench_gpu    145: dev/benchmarks/bench_gpu.py: MAE and M-MAE ViT-B/16
#                in bfloat16 and float16, alternating rounds in one process
#                per dtype; last, as it saves its JSON after every case
# Results in $OUT (8 files): gpu_check.json (every stage and its figures,
# the environment stage's output, the two_ranks figures), gpu_check.md
# (summary), bench_gpu.json, dist_train.json (per-iteration figures), the
# logs of cuda_tests, bench_gpu and dist_train, and stages.log (the logs of
# install, images and two_ranks). Only the stages run in this call report.
# No `set -e`: a stage's failure is recorded and the next stage runs.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SELF="$ROOT/dev/gpu_check.sh"

if [ "${1:-}" = --stage ]; then
  STAGE_MODE=1
  STAGE="$2"
else
  STAGE_MODE=0
  PLAN_ONLY=0
  for arg in "$@"; do
    case "$arg" in
      --dry-run) GPU_CHECK_DRY_RUN=1 ;;
      --plan) PLAN_ONLY=1 ;;
      *) echo "usage: bash dev/gpu_check.sh [--dry-run] [--plan] (got '$arg')" >&2; exit 2 ;;
    esac
  done
fi

# ------------------------------------------------------------- stage bodies
# Run as `gpu_check.sh --stage NAME` under `timeout`, with the settings the
# main part exported (GC_*). Each writes into the work folder GC_WORK.

free_port() {
  "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# AmpOptimWrapper needs a GPU: in a dry run the recipe's optimizer in an
# OptimWrapper (appended to a derived config).
cpu_optim_wrapper() {
  cat <<'EOF'
optim_wrapper = dict(
    _delete_=True,
    type='OptimWrapper',
    constructor={{_base_.optim_wrapper.constructor}},
    optimizer={{_base_.optim_wrapper.optimizer}},
    paramwise_cfg={{_base_.optim_wrapper.paramwise_cfg}})
EOF
}
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
  # Afresh: a folder left by an interrupted call would hold a mix.
  rm -rf "$GC_IMAGES"
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
  rm -f "$GC_WORK/cuda_tests.xml"
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
    --junitxml="$GC_WORK/cuda_tests.xml" $files)
}

stage_bench_gpu() {
  local args=(--folder "$GC_IMAGES" --out "$GC_WORK/bench_gpu.json"
              --markdown "$GC_WORK/bench_gpu.md")
  if [ "$GC_DRY" = 1 ]; then
    args+=(--device cpu --rounds 3 --iters 1 --warmup 1 --loader-iters 1
           --reg-reps 1 --image-size 32 --cfg-options "${GC_SHRINK[@]}")
  else
    # Two dtype processes of at most 65 s each inside the stage's 145 s:
    # 3 alternating rounds of 50 timed steps per model and dtype.
    args+=(--dtypes bfloat16 float16 --rounds 3 --iters 50 --warmup 10
           --loader-iters 10 --reg-reps 50 --case-timeout 65)
  fi
  (cd "$ROOT" && "$PYTHON" dev/benchmarks/bench_gpu.py "${args[@]}")
}

stage_dist_train() {
  # The recipe as users run it (all default hooks, labelled images), plus
  # dev/gpu_check_hooks.py counting the device waits of every step.
  local config="$GC_WORK/mmae_vit-base_check.py" options=() per_epoch
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
    cpu_optim_wrapper >> "$config"
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
  local work="$GC_WORK/dist_train" port rc1 rc2
  # Afresh: the check reads exactly two runs (train, resume) from it.
  rm -rf "$work"
  port=$(free_port)
  cd "$ROOT" || exit 1
  echo "=== run 1: epoch 1 ($per_epoch iterations)"
  PORT=$port PYTHON="$PYTHON" bash tools/dist_train.sh "$config" 1 \
    --work-dir "$work" --cfg-options "${options[@]}" train_cfg.max_epochs=1
  rc1=$?
  echo "=== run 2: --resume, to epoch 2"
  PORT=$port PYTHON="$PYTHON" bash tools/dist_train.sh "$config" 1 \
    --work-dir "$work" --resume --cfg-options "${options[@]}" train_cfg.max_epochs=2
  rc2=$?
  "$PYTHON" - "$work" "$per_epoch" "$rc1" "$rc2" "$GC_WORK/dist_train.json" <<'EOF'
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

stage_two_ranks() {
  # Two ranks on the one device over gloo (dev/gpu_check_two_ranks.py):
  # the recipe shrunk to ViT-tiny at 32 x 32 (the point is the collectives,
  # not the speed), with every default hook plus TwoRankRecord.
  local config="$GC_WORK/mmae_vit-tiny_two_ranks.py" work="$GC_WORK/two_ranks"
  local options=() batch iters workers port rc
  rm -rf "$work"
  mkdir -p "$work"
  cat > "$config" <<EOF
_base_ = '$ROOT/configs/mmae_vit-base_200e.py'
custom_imports = dict(
    imports=['mmae_plugin.registration', 'gpu_check_hooks'],
    allow_failed_imports=False)
custom_hooks = [
    dict(type='ReseedHook'), dict(type='DivergenceHook'),
    dict(type='TwoRankRecord')]
env_cfg = dict(dist_cfg=dict(backend='gloo'))
EOF
  if [ "$GC_DRY" = 1 ]; then
    cpu_optim_wrapper >> "$config"
    batch=2 iters=2 workers=0
    export CUDA_VISIBLE_DEVICES=''
  else
    batch=32 iters=8 workers=4
  fi
  # Both ranks read the same first images (each its half, the sampler's
  # split), 1 epoch of `iters` iterations.
  options=("${GC_SHRINK[@]}" train_dataloader.dataset.data_root="$GC_IMAGES"
           train_dataloader.dataset.indices=$((2 * batch * iters))
           train_dataloader.batch_size=$batch
           train_dataloader.num_workers=$workers
           train_dataloader.persistent_workers=False
           train_dataloader.dataset.pipeline.1.scale=32
           default_hooks.logger.interval=1 train_cfg.max_epochs=1)
  port=$(free_port)
  cd "$ROOT" || exit 1
  echo "=== 2 ranks over gloo, $iters iterations of $batch per rank"
  PYTHONPATH="$ROOT/dev:$ROOT:$PYTHONPATH" "$PYTHON" -m torch.distributed.run \
    --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 \
    --master_port "$port" "$ROOT/dev/gpu_check_two_ranks.py" \
    "$work/rank" "$config" --launcher pytorch --work-dir "$work" \
    --cfg-options "${options[@]}"
  rc=$?
  "$PYTHON" - "$work" "$rc" "$iters" "$GC_DRY" "$GC_WORK/two_ranks.json" <<'EOF'
import json
import math
import os.path as osp
import sys

work, rc, iters, dry, out = sys.argv[1], int(sys.argv[2]), \
    int(sys.argv[3]), sys.argv[4] == '1', sys.argv[5]
device_type = 'cpu' if dry else 'cuda'
ranks, problems = [], []
for rank in (0, 1):
    try:
        with open(osp.join(work, f'rank{rank}.json')) as f:
            ranks.append(json.load(f))
    except (OSError, ValueError) as error:
        problems.append(f'rank {rank} wrote no record: {error}')
if rc != 0:
    problems.append(f'torchrun returned {rc}')
for record in ranks:
    if record.get('error'):
        problems.append(f'rank {record["rank"]}: {record["error"]}')

result = dict(returncode=rc, iterations=iters, expected_device=device_type,
              backend=None, devices=[], collectives=[], steps_compared=0)
if len(ranks) == 2 and not any(r.get('error') for r in ranks):
    first, second = ranks
    result['backend'] = first.get('backend')
    result['devices'] = [r.get('device') for r in ranks]
    result['torchrun_local_ranks'] = [r.get('torchrun_local_rank')
                                      for r in ranks]
    result['comm_device_patched'] = [r.get('comm_device_patched')
                                     for r in ranks]
    if result['backend'] != 'gloo':
        problems.append(f'backend {result["backend"]}, expected gloo')
    for record in ranks:
        if not str(record.get('device', '')).startswith(device_type):
            problems.append(f'rank {record["rank"]} ran on '
                            f'{record.get("device")}, expected {device_type}')
    if not dry and not all(result['comm_device_patched']):
        problems.append("mmengine's collectives were not kept on the GPU")
    # The collectives of the training (rank 0's and rank 1's calls agree).
    calls = first['collectives']
    result['collectives'] = calls
    result['setup_collectives'] = first.get('setup_collectives')
    result['collectives_rank1'] = second['collectives']

    def count(op, site_part):
        return sum(c['count'] for c in calls
                   if c['op'] == op and site_part in c['site'])

    # (op, where, what it is): each must run once per iteration at least.
    expected = [
        ('all_gather_into_tensor', 'gather.py', 'forward',
         "the regulariser's gather"),
        ('all_reduce', 'gather.py', 'backward',
         "the gather's backward (gloo: all_reduce; NCCL: reduce_scatter)"),
        ('all_reduce', 'deferred_runtime_info_hook.py', 'value_table',
         "DivergenceHook's table of every rank's values"),
    ]
    result['expected_collectives'] = []
    for op, where, function, what in expected:
        found = [c for c in calls if c['op'] == op and where in c['site']
                 and c['site'].endswith(f' {function}')]
        total = sum(c['count'] for c in found)
        devices = sorted({c['device'] for c in found})
        result['expected_collectives'].append(
            dict(op=op, site=f'{where} {function}', what=what, count=total,
                 devices=devices))
        if total < iters:
            problems.append(f'{what}: {op} in {where} {function} ran '
                            f'{total} times, expected >= {iters}')
        if devices and devices != [device_type]:
            problems.append(f'{what} ran on {devices}, expected '
                            f'{device_type} tensors')
    # Every collective the plugin ran in the training, on the device.
    off_device = [c for c in calls if c['site'].startswith('mmae_plugin/')
                  and c['device'] != device_type]
    if off_device:
        problems.append(f'plugin collectives off {device_type}: {off_device}')
    # Both ranks' values, step by step.
    steps = [{s['iteration']: s for s in r['steps']} for r in ranks]
    common = sorted(set(steps[0]) & set(steps[1]))
    result['steps_compared'] = len(common)
    if len(common) != iters:
        problems.append(f'steps settled on both ranks: {common}, expected '
                        f'1..{iters}')
    tcr_diff, table_equal, own_rows = 0.0, True, True
    losses = {0: [], 1: [], 'loss_tcr': []}
    for it in common:
        a, b = steps[0][it], steps[1][it]
        for rank, step in ((0, a), (1, b)):
            losses[rank].append(step['values'].get('loss'))
            for key, column in step['every_rank'].items():
                value = step['values'].get(key)
                if value is not None and not (
                        column[rank] == value or
                        (math.isnan(column[rank]) and math.isnan(value))):
                    own_rows = False
        losses['loss_tcr'].append(
            [a['values'].get('loss_tcr'), b['values'].get('loss_tcr')])
        if a['every_rank'] != b['every_rank']:
            table_equal = False
        ta, tb = a['values'].get('loss_tcr'), b['values'].get('loss_tcr')
        if ta is None or tb is None:
            problems.append(f'iteration {it}: loss_tcr not logged')
            continue
        tcr_diff = max(tcr_diff, abs(ta - tb) / max(1.0, abs(ta)))
        values = list(a['values'].values()) + list(b['values'].values())
        if not all(math.isfinite(v) for v in values):
            problems.append(f'iteration {it}: a value is not finite')
        if a['values'].get('reg_skipped', 0) or \
                b['values'].get('reg_skipped', 0):
            problems.append(f'iteration {it}: the regulariser was skipped')
    result.update(
        losses=losses,
        loss_tcr_max_rel_diff=tcr_diff,
        every_rank_tables_equal=table_equal,
        own_values_in_table=own_rows)
    # The regulariser sees the gathered (global) batch on both ranks.
    if tcr_diff > 1e-5:
        problems.append(f'loss_tcr differs across ranks (max relative '
                        f'{tcr_diff:.3g})')
    if not table_equal:
        problems.append('the all-reduced tables of every rank differ '
                        'between the ranks')
    if not own_rows:
        problems.append("a rank's own values differ from its row of the "
                        'all-reduced table')
    digests = [r.get('params', {}).get('sha256') for r in ranks]
    result['parameters_equal'] = digests[0] is not None and \
        digests[0] == digests[1]
    result['parameter_devices'] = [r.get('params', {}).get('devices')
                                   for r in ranks]
    if not result['parameters_equal']:
        problems.append('the ranks ended with different parameters')
    # The gather backward both ways (after training).
    probes = [r.get('probe', {}) for r in ranks]
    result['reduce_scatter_probe'] = probes
    for rank, probe in enumerate(probes):
        reduce_branch = probe.get('all_reduce', {})
        if not reduce_branch.get('equals_expected'):
            problems.append(f'rank {rank}: the all_reduce backward gave a '
                            f'wrong gradient: {reduce_branch}')
        scatter = probe.get('reduce_scatter_tensor', {})
        # gloo may lack reduce_scatter (on CUDA tensors): reported, not a
        # failure; a wrong gradient is.
        if scatter.get('ran') and not scatter.get('equals_expected'):
            problems.append(f'rank {rank}: the reduce_scatter backward '
                            'gave a wrong gradient')
result['problems'] = problems
result['passed'] = not problems
with open(out, 'w') as f:
    json.dump(result, f, indent=2)
print(json.dumps({k: v for k, v in result.items()
                  if k not in ('collectives', 'collectives_rank1',
                               'setup_collectives')},
                 indent=2))
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

# name, timeout and minimum in device seconds (3x in a dry run). The
# timeouts sum to 525 s; with the report's 15 s that is the device budget
# of 540 s (see the top). A stage is not started with less than its minimum
# left: dist_train needs both of its runs, two_ranks its start-up and
# steps, bench_gpu one dtype's process (it saves after every case).
STAGE_TABLE=(
  "environment   45  15"
  "install       40  15"
  "images        25  10"
  "cuda_tests    90  30"
  "dist_train   120  80"
  "two_ranks     60  40"
  "bench_gpu    145  70"
)
DEVICE_BUDGET=540
REPORT_RESERVE=15
if [ "$GC_DRY" = 1 ]; then
  SCALE=3
else
  SCALE=1
fi
BUDGET="${GPU_CHECK_BUDGET_S:-$((DEVICE_BUDGET * SCALE))}"
START=$(date +%s)

STAGE_NAMES=()
for row in "${STAGE_TABLE[@]}"; do
  read -r name _ <<< "$row"
  STAGE_NAMES+=("$name")
done
for name in ${GPU_CHECK_STAGES:-}; do
  if ! [[ " ${STAGE_NAMES[*]} " == *" $name "* ]]; then
    echo "GPU_CHECK_STAGES: unknown stage '$name' (stages: ${STAGE_NAMES[*]})" >&2
    exit 2
  fi
done

# The work folder, kept between calls (stages reuse what earlier ones made).
if [ "$GC_DRY" = 1 ]; then
  GC_WORK="${GPU_CHECK_DIR:-$ROOT/work_dirs/gpu_check_dry}"
else
  GC_WORK="${GPU_CHECK_DIR:-$ROOT/work_dirs/gpu_check}"
fi
mkdir -p "$GC_WORK" || exit 1
export GC_WORK; GC_WORK="$(cd "$GC_WORK" && pwd)"
export GC_WHEELS="${GPU_CHECK_WHEELS:-$ROOT/.whl}"
if [ "$GC_DRY" = 1 ]; then
  export GC_SITE="${GPU_CHECK_SITE:-$GC_WORK/site}"
  export GC_IMAGE_COUNT=8
else
  export GC_SITE="${GPU_CHECK_SITE:-/tmp/site}"
  export GC_IMAGE_COUNT=3200  # 25 iterations of 128 per epoch
fi
export GC_TEST_TIMEOUT="${GPU_CHECK_TEST_TIMEOUT_S:-45}"
export GC_IMAGES="$GC_WORK/images"
# ViT-B/16 shrunk to ViT-tiny at 32 x 32 (4 patches), 1 decoder layer.
GC_SHRINK_TEXT="$("$PYTHON" "$ROOT/tests/shrunk_vit.py")"
export GC_SHRINK_TEXT
export GC_PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"

selected() {
  [ -z "${GPU_CHECK_STAGES:-}" ] || [[ " $GPU_CHECK_STAGES " == *" $1 "* ]]
}

# What a stage needs from earlier ones (their products, checked below).
needs_of() {
  case $1 in
    cuda_tests) echo install ;;
    dist_train|two_ranks|bench_gpu) echo install images ;;
  esac
}

# The carried stack first on the path when GPU_CHECK_SITE holds it (from
# this call's install stage or an earlier call's on this machine).
use_site() {
  if [ -d "$GC_SITE/mmengine" ] && [[ ":$GC_PYTHONPATH:" != *":$GC_SITE:"* ]]; then
    export GC_PYTHONPATH="$GC_SITE:$GC_PYTHONPATH"
  fi
}

# product_ready STAGE: what the stage makes is there already.
product_ready() {
  case $1 in
    install)
      PYTHONPATH="$GC_PYTHONPATH" "$PYTHON" -c 'import importlib.util as u, sys
sys.exit(0 if all(u.find_spec(m) for m in ("mmengine", "mmpretrain", "mmcv")) else 1)' 2>/dev/null ;;
    images)
      [ -f "$GC_IMAGES/meta/train.txt" ] &&
        [ "$(wc -l < "$GC_IMAGES/meta/train.txt")" -eq "$GC_IMAGE_COUNT" ] ;;
    *) return 1 ;;
  esac
}

# The plan: each stage runs because it was selected, or as a prerequisite
# of a selected stage whose input is missing, or not at all.
use_site
declare -A ROLE WHY
for name in "${STAGE_NAMES[@]}"; do
  if selected "$name"; then
    ROLE[$name]=selected; WHY[$name]=''
    continue
  fi
  ROLE[$name]=not_selected; WHY[$name]=''
  users=()
  for other in "${STAGE_NAMES[@]}"; do
    if selected "$other" && [[ " $(needs_of "$other") " == *" $name "* ]]; then
      users+=("$other")
    fi
  done
  if [ ${#users[@]} -gt 0 ]; then
    if product_ready "$name"; then
      WHY[$name]="reused by ${users[*]}"
    else
      ROLE[$name]=prerequisite; WHY[$name]="needed by ${users[*]}"
    fi
  fi
done

echo "[gpu_check] $([ "$GC_DRY" = 1 ] && echo 'dry run (CPU)' || echo device run), work folder $GC_WORK"
echo "[gpu_check] budget ${BUDGET}s: stage timeout / minimum (s), the report ${REPORT_RESERVE}s"
PLANNED=0
for row in "${STAGE_TABLE[@]}"; do
  read -r name limit minimum <<< "$row"
  if [ "${ROLE[$name]}" = not_selected ]; then
    printf '[gpu_check]   %-12s    -     -  not selected%s\n' "$name" "${WHY[$name]:+ (${WHY[$name]})}"
  else
    PLANNED=$((PLANNED + limit * SCALE))
    printf '[gpu_check]   %-12s %4d / %3d  %s\n' "$name" $((limit * SCALE)) \
      $((minimum * SCALE)) "${ROLE[$name]}${WHY[$name]:+ (${WHY[$name]})}"
  fi
done
if [ $((PLANNED + REPORT_RESERVE)) -gt "$BUDGET" ]; then
  echo "[gpu_check] the planned timeouts (${PLANNED}s + ${REPORT_RESERVE}s) exceed the budget: later stages get what is left, and none starts below its minimum"
fi

[ "$PLAN_ONLY" = 1 ] && exit 0

OUT="${OUT:-$(mktemp -d /tmp/gpu_check_out.XXXXXX)}"
mkdir -p "$OUT"
STAGES="$GC_WORK/stages.jsonl"
: > "$STAGES"

# What a stage leaves in the work folder for the report (removed before
# it runs, so that no call reports an earlier call's figures).
stage_outputs() {
  case $1 in
    cuda_tests) echo cuda_tests.xml ;;
    dist_train) echo dist_train.json ;;
    two_ranks) echo two_ranks.json ;;
    bench_gpu) echo bench_gpu.json bench_gpu.md ;;
  esac
}

# stage_record NAME STATUS RC SECONDS TIMEOUT_S MINIMUM_S
stage_record() {
  echo "{\"name\": \"$1\", \"status\": \"$2\", \"role\": \"${ROLE[$1]}\", \"why\": \"${WHY[$1]}\", \"rc\": $3, \"seconds\": $4, \"timeout_s\": $5, \"minimum_s\": $6}" >> "$STAGES"
}

# run_stage NAME TIMEOUT_S MINIMUM_S: the stage body under `timeout` (its
# own process group, so torchrun's children die with it); log in
# $GC_WORK/NAME.log.
run_stage() {
  local name="$1" limit=$(($2 * SCALE)) minimum=$(($3 * SCALE)) now left
  local status rc begin end output
  if [ "${ROLE[$name]}" = not_selected ]; then
    stage_record "$name" not_selected null 0 0 "$minimum"
    return
  fi
  now=$(date +%s)
  left=$((START + BUDGET - REPORT_RESERVE - now))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt "$minimum" ] || [ "$limit" -lt 5 ]; then
    stage_record "$name" not_run null 0 "$limit" "$minimum"
    echo "[gpu_check] $name: not run (${left}s left of the budget, it needs at least ${minimum}s)"
    return
  fi
  for output in $(stage_outputs "$name"); do rm -f "$GC_WORK/$output"; done
  echo "[gpu_check] $name (timeout ${limit}s, ${ROLE[$name]})"
  begin=$(date +%s%N)
  timeout -k 10 "$limit" bash "$SELF" --stage "$name" > "$GC_WORK/$name.log" 2>&1 < /dev/null
  rc=$?
  end=$(date +%s%N)
  case $rc in
    0) status=passed ;;
    3) status=skipped ;;
    124|137) status=timeout ;;
    *) status=failed ;;
  esac
  stage_record "$name" "$status" "$rc" "$(( (end - begin) / 1000000 ))e-3" "$limit" "$minimum"
  echo "[gpu_check] $name: $status (rc $rc, $(( (end - begin) / 1000000000 ))s)"
}

# In STAGE_TABLE's order: training and its resume before the two ranks and
# the benchmark, which saves what it has measured after every case and so
# loses least if the budget runs out.
for row in "${STAGE_TABLE[@]}"; do
  read -r name limit minimum <<< "$row"
  run_stage "$name" "$limit" "$minimum"
  # The carried stack first on the path, once installed.
  [ "$name" = install ] && use_site
done

# ------------------------------------------------------------------ report
PYTHONPATH="$GC_PYTHONPATH" "$PYTHON" - "$GC_WORK" "$OUT" "$GC_DRY" "$BUDGET" "$START" <<'EOF'
import json
import os
import os.path as osp
import shutil
import sys
import time
import xml.etree.ElementTree as ET

work, out, dry, budget, start = sys.argv[1], sys.argv[2], \
    sys.argv[3] == '1', int(sys.argv[4]), int(sys.argv[5])
MAX_BYTES = 4 * 2**20


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def tail(name, limit=MAX_BYTES):
    """The last ``limit`` bytes of a log in the work folder (b'' if none)."""
    path = osp.join(work, name)
    if not osp.exists(path):
        return b''
    with open(path, 'rb') as f:
        f.seek(max(0, osp.getsize(path) - limit))
        return f.read()


stages = [json.loads(l) for l in open(osp.join(work, 'stages.jsonl'))]
# Only what this call ran reports: the work folder keeps earlier calls'.
ran = {s['name'] for s in stages
       if s['status'] not in ('not_selected', 'not_run')}
report = dict(mode='dry-run (CPU)' if dry else 'device',
              date=time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime()),
              work_dir=work, budget_s=budget, total_s=time.time() - start,
              stages=stages)
env_log = osp.join(work, 'environment.log')
if 'environment' in ran and osp.exists(env_log):
    # The environment stage's output in the JSON: the device tool brings
    # back 8 files, and dist_train.json is worth the eighth.
    text = open(env_log, errors='replace').read()[-20000:]
    report['environment'] = text.splitlines()
    report['distutils_importable'] = \
        'distutils.errors: importable' in text

junit = osp.join(work, 'cuda_tests.xml')
tests_log = osp.join(work, 'cuda_tests.log')
if 'cuda_tests' in ran and not osp.exists(junit) and osp.exists(tests_log):
    # pytest-timeout's thread method ended pytest before its JUnit file:
    # the last test -v started is the one that hung.
    lines = open(tests_log, errors='replace').read().splitlines()
    started = [l.split(' ')[0] for l in lines
               if l.startswith('tests/') and '::' in l]
    report['cuda_tests'] = dict(
        junit_missing=True,
        timed_out=any('Timeout' in l for l in lines),
        last_started=started[-1] if started else None)
if 'cuda_tests' in ran and osp.exists(junit):
    suites = ET.parse(junit).getroot()
    suite = suites if suites.tag == 'testsuite' else suites[0]
    cases = suite.findall('testcase')
    failed = [f'{c.get("classname")}::{c.get("name")}' for c in cases
              if c.find('failure') is not None or c.find('error') is not None]
    skipped = sum(c.find('skipped') is not None for c in cases)
    report['cuda_tests'] = dict(
        total=len(cases), failed=failed, skipped=skipped,
        passed=len(cases) - len(failed) - skipped)
bench = load(osp.join(work, 'bench_gpu.json')) if 'bench_gpu' in ran \
    else None
if bench is not None:
    shutil.copy(osp.join(work, 'bench_gpu.json'), osp.join(out, 'bench_gpu.json'))
    report['bench_gpu'] = {
        dtype: {k: v for k, v in block.items() if k != 'cases'}
        for dtype, block in bench['amp'].items()}
    report['bench_gpu_failed_cases'] = bench['failed_cases']
dist = load(osp.join(work, 'dist_train.json')) if 'dist_train' in ran \
    else None
if dist is not None:
    shutil.copy(osp.join(work, 'dist_train.json'),
                osp.join(out, 'dist_train.json'))
    report['dist_train'] = {k: v for k, v in dist.items() if k != 'runs'}
    report['dist_train']['runs'] = [
        {k: r[k] for k in ('folder', 'iterations', 'resumed', 'memory_mb')}
        | dict(first_loss=r['losses'][:1], last_loss=r['losses'][-1:])
        for r in dist['runs']]
two = load(osp.join(work, 'two_ranks.json')) if 'two_ranks' in ran \
    else None
if two is not None:
    report['two_ranks'] = two  # small: no file of its own (8 come back)
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
         '| stage | status | seconds | timeout s | why |',
         '| --- | --- | --- | --- | --- |']
lines += [f'| {s["name"]} | {s["status"]} | {float(s["seconds"]):.0f} | '
          f'{s["timeout_s"]} | {s["role"]}'
          f'{" (" + s["why"] + ")" if s["why"] else ""} |' for s in stages]
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
if bench is not None and osp.exists(osp.join(work, 'bench_gpu.md')):
    body = open(osp.join(work, 'bench_gpu.md')).read().split('\n', 1)[1]
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
    if 'total_median' in waits:
        prof = waits.get('profiler') or {}
        per_step = '; '.join(
            f'iteration {it}: ' + ', '.join(f'{k} {v}' for k, v in c.items())
            for it, c in (prof.get('per_iter') or {}).items())
        lines += [
            f'- device waits per step ({waits["steps"]} steady-state steps'
            f'{"" if waits["counted"] else ", CPU: no device to wait for"})'
            f': sync debug mode median {waits["median"]} (max '
            f'{waits["max"]}); event / stream / device synchronisations '
            f'median {waits["host_waits_median"]} (max '
            f'{waits["host_waits_max"]}; {waits["pending_waits"]} found the '
            f'work pending; median {waits["wait_ms_median"]} ms a step); '
            f'both together median {waits["total_median"]} (max '
            f'{waits["total_max"]})',
            f'- sync debug sites {waits["sites"]}; synchronisation sites '
            f'{waits["wait_sites"]}',
            f'- profiler: {per_step or "no step profiled"}; CUDA runtime '
            f'calls seen {prof.get("runtime_calls_seen")}'
            f'{"; error " + prof["error"] if prof.get("error") else ""}']
    lines += [f'- problem: {p}' for p in d['problems']]
if two is not None:
    lines += ['', '## Two ranks on one device (torchrun, gloo)', '',
              f'{"passed" if two["passed"] else "FAILED"}: backend '
              f'{two.get("backend")}, ranks on {two.get("devices")}; '
              f'{two.get("steps_compared")} of {two["iterations"]} steps '
              'compared; loss_tcr max relative difference across ranks '
              f'{two.get("loss_tcr_max_rel_diff")}; every-rank tables equal '
              f'{two.get("every_rank_tables_equal")}; parameters equal '
              f'{two.get("parameters_equal")}.']
    lines += [f'- {c["what"]}: {c["op"]} ({c["site"]}) x{c["count"]} on '
              f'{c["devices"]}' for c in two.get('expected_collectives', [])]
    for rank, probe in enumerate(two.get('reduce_scatter_probe') or []):
        lines += [f'- gather backward probe, rank {rank} on '
                  f'{probe.get("device")}: ' + '; '.join(
                      f'{b}: ' + ('gradient right' if r.get('equals_expected')
                                  else f'ran={r.get("ran")} {r.get("error")}')
                      for b, r in probe.items()
                      if isinstance(r, dict) and 'ran' in r)]
    lines += [f'- problem: {p}' for p in two['problems']]
with open(osp.join(out, 'gpu_check.md'), 'w') as f:
    f.write('\n'.join(lines) + '\n')
for name in ('cuda_tests', 'bench_gpu', 'dist_train'):
    if name in ran:
        with open(osp.join(out, f'{name}.log'), 'wb') as f:
            f.write(tail(f'{name}.log'))
# The short logs in one file (the device tool brings back 8).
short = [name for name in ('install', 'images', 'two_ranks') if name in ran]
if short:
    with open(osp.join(out, 'stages.log'), 'wb') as f:
        for name in short:
            f.write(f'===== {name}.log\n'.encode())
            f.write(tail(f'{name}.log', MAX_BYTES // 4))
print('\n'.join(lines))
EOF
echo "[gpu_check] results in $OUT: $(ls "$OUT" | tr '\n' ' ')"
echo "[gpu_check] work folder (kept for reruns): $GC_WORK"
# Exit status: 0 when every stage passed (or was skipped).
grep -q -E '"status": "(failed|timeout|not_run)"' "$STAGES" && exit 1
exit 0
