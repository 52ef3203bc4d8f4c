#!/usr/bin/env bash
# The main job on the embedded default, CPU only (under 10 minutes on 2 cores
# from a fresh machine): set up, pretrain M-MAE on Fashion-MNIST for 4 epochs,
# evaluate the frozen encoder (a linear probe fitted on the cached CLS + mean
# patch-token features of all 60,000 training images, and weighted kNN),
# print the top-1 accuracy on the 10,000 test images.
# Usage: bash tools/quickstart.sh [WORK_DIR]
# Environment: CONFIG picks the pretraining config (default
# configs/fashion_mnist/mmae_fmnist.py, e.g. mae_fmnist.py for the baseline);
# PRETRAIN_IMAGES, PRETRAIN_EPOCHS, EVAL_IMAGES (training images the probe
# and kNN use) and TEST_IMAGES (the first test images scored) change the
# sizes; SEED the random seed (0); EVAL_CONFIG the evaluation
# (configs/fashion_mnist/knn_fmnist.py for the CLS token alone);
# EVAL_AMP=0 extracts the features in float32 instead of bfloat16 (twice as
# slow on CPUs, the same accuracy to 0.1 point); FMNIST_ROOT points at other
# IDX files.
# The fitted probe is saved as WORK_DIR/linear_probe.pth, a checkpoint of
# configs/fashion_mnist/linear_fmnist_clsmean.py (tools/test.py evaluates it);
# the same config trains the probe by the full protocol (LARS, BatchNorm +
# linear on the frozen encoder), linear_fmnist.py on the CLS token alone.
# Every variable is checked before anything runs (a message names the
# variable and its allowed range); DRY_RUN=1 checks them and prints the
# commands without running them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK_DIR="${1:-$ROOT/work_dirs/quickstart}"
PRETRAIN_IMAGES="${PRETRAIN_IMAGES:-60000}"
PRETRAIN_EPOCHS="${PRETRAIN_EPOCHS:-4}"
EVAL_IMAGES="${EVAL_IMAGES:-60000}"
TEST_IMAGES="${TEST_IMAGES:-10000}"
CONFIG="${CONFIG:-configs/fashion_mnist/mmae_fmnist.py}"
EVAL_CONFIG="${EVAL_CONFIG:-configs/fashion_mnist/knn_fmnist_clsmean.py}"
SEED="${SEED:-0}"
EVAL_AMP="${EVAL_AMP:-1}"
DRY_RUN="${DRY_RUN:-0}"

fail() {
  echo "[quickstart] error: $*" >&2
  exit 2
}

# check_int NAME MIN MAX WHY: NAME's value must be a decimal integer in
# [MIN, MAX] (MAX empty: no upper bound); normalised (leading zeros dropped).
check_int() {
  local name=$1 min=$2 max=$3 why=$4 value=${!1} range
  if [ -n "$max" ]; then range="an integer from $min to $max"
  else range="an integer >= $min"; fi
  if ! [[ $value =~ ^[0-9]{1,10}$ ]] || (( 10#$value < min )) \
      || { [ -n "$max" ] && (( 10#$value > max )); }; then
    fail "$name='$value' is not allowed: $name must be $range ($why)"
  fi
  printf -v "$name" '%d' "$((10#$value))"
}

check_int PRETRAIN_EPOCHS 2 "" \
  "one warm-up epoch, then at least one epoch of the cosine schedule"
check_int PRETRAIN_IMAGES 256 60000 \
  "at least one batch of 256; Fashion-MNIST has 60,000 training images"
check_int EVAL_IMAGES 20 60000 \
  "at least the kNN's k = 20 neighbours; 60,000 training images"
check_int TEST_IMAGES 1 10000 "Fashion-MNIST has 10,000 test images"
check_int SEED 0 4294967295 "numpy's seed range"
case "$EVAL_AMP" in 0|1) ;;
  *) fail "EVAL_AMP='$EVAL_AMP' is not allowed: EVAL_AMP must be 1 (bfloat16 feature pass, the default) or 0 (float32)" ;;
esac
case "$DRY_RUN" in 0|1) ;;
  *) fail "DRY_RUN='$DRY_RUN' is not allowed: DRY_RUN must be 0 or 1" ;;
esac
for var in CONFIG EVAL_CONFIG; do
  path=${!var}
  case "$path" in /*) ;; *) path="$ROOT/$path" ;; esac
  if [ ! -f "$path" ] || [[ $path != *.py ]]; then
    fail "$var='${!var}' is not allowed: $var must be a config file (.py) that exists, absolute or relative to $ROOT, e.g. configs/fashion_mnist/mae_fmnist.py"
  fi
done

AMP=()
if [ "$EVAL_AMP" = 1 ]; then AMP=(--amp); fi
NAME="$(basename "$CONFIG" .py)"

# run CMD...: runs it, or under DRY_RUN=1 prints it, shell-quoted.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    printf '%q ' "$@"
    echo
  else
    "$@"
  fi
}

run bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY=.venv/bin/python
PRETRAIN_DATA=()
EVAL_DATA=()
if [ -n "${FMNIST_ROOT:-}" ]; then
  PRETRAIN_DATA=("train_dataloader.dataset.data_root=$FMNIST_ROOT")
  EVAL_DATA=("model.prototype.dataset.data_root=$FMNIST_ROOT"
             "test_dataloader.dataset.data_root=$FMNIST_ROOT")
fi

echo "[quickstart] 1/2 pretraining $NAME on $PRETRAIN_IMAGES Fashion-MNIST images, $PRETRAIN_EPOCHS epochs"
run "$PY" tools/train.py "$CONFIG" \
  --work-dir "$WORK_DIR/$NAME" \
  --cfg-options \
    "train_dataloader.dataset.indices=$PRETRAIN_IMAGES" \
    "train_cfg.max_epochs=$PRETRAIN_EPOCHS" \
    "param_scheduler.1.T_max=$((PRETRAIN_EPOCHS - 1))" \
    "param_scheduler.1.end=$PRETRAIN_EPOCHS" \
    "randomness.seed=$SEED" \
    "${PRETRAIN_DATA[@]}"

echo "[quickstart] 2/2 frozen-encoder evaluation: linear probe and kNN on $EVAL_IMAGES training images"
run "$PY" tools/analysis/evaluate_frozen.py "$EVAL_CONFIG" \
  "$WORK_DIR/$NAME/epoch_$PRETRAIN_EPOCHS.pth" \
  --out "$WORK_DIR/metrics.json" "${AMP[@]}" \
  --save-linear "$WORK_DIR/linear_probe.pth" \
  --cfg-options "model.prototype.dataset.indices=$EVAL_IMAGES" \
    "test_dataloader.dataset.indices=$TEST_IMAGES" "${EVAL_DATA[@]}"

if [ "$DRY_RUN" = 1 ]; then exit 0; fi
"$PY" - "$WORK_DIR" "$TEST_IMAGES" <<'PYEOF'
import json, os, sys
work_dir, test_images = sys.argv[1], int(sys.argv[2])
with open(os.path.join(work_dir, 'metrics.json')) as f:
    metrics = json.load(f)
message = (f"linear-probe top-1 accuracy on the {test_images:,} Fashion-MNIST "
           f"test images: {metrics['linear/top1']:.2f} % "
           f"(kNN top-1 {metrics['knn/top1']:.2f} %)")
print(f'\n[quickstart] {message}')
with open(os.path.join(work_dir, 'accuracy.txt'), 'w') as f:
    f.write(message + '\n')
PYEOF
