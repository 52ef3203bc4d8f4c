#!/usr/bin/env bash
# The main job on the embedded default, CPU only (10-15 minutes on 2 cores):
# set up, pretrain M-MAE on Fashion-MNIST, linear-probe the frozen encoder,
# print the top-1 accuracy on the 10,000 test images.
# Usage: bash tools/quickstart.sh [WORK_DIR]
# Sizes can be changed through the environment: PRETRAIN_IMAGES,
# PRETRAIN_EPOCHS, PROBE_IMAGES, PROBE_EPOCHS; CONFIG picks the pretraining
# config (default configs/fashion_mnist/mmae_fmnist.py, e.g. mae_fmnist.py).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK_DIR="${1:-$ROOT/work_dirs/quickstart}"
PRETRAIN_IMAGES="${PRETRAIN_IMAGES:-60000}"
PRETRAIN_EPOCHS="${PRETRAIN_EPOCHS:-4}"
PROBE_IMAGES="${PROBE_IMAGES:-20480}"
PROBE_EPOCHS="${PROBE_EPOCHS:-5}"
CONFIG="${CONFIG:-configs/fashion_mnist/mmae_fmnist.py}"

bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
PY=.venv/bin/python
DATA_OPTS=()
if [ -n "${FMNIST_ROOT:-}" ]; then
  DATA_OPTS=("train_dataloader.dataset.data_root=$FMNIST_ROOT")
fi

echo "[quickstart] 1/2 pretraining $(basename "$CONFIG" .py) on $PRETRAIN_IMAGES Fashion-MNIST images, $PRETRAIN_EPOCHS epochs"
"$PY" tools/train.py "$CONFIG" \
  --work-dir "$WORK_DIR/mmae" \
  --cfg-options \
    "train_dataloader.dataset.indices=$PRETRAIN_IMAGES" \
    "train_cfg.max_epochs=$PRETRAIN_EPOCHS" \
    "param_scheduler.1.T_max=$((PRETRAIN_EPOCHS - 1))" \
    "param_scheduler.1.end=$PRETRAIN_EPOCHS" \
    "${DATA_OPTS[@]}"
PRETRAINED="$WORK_DIR/mmae/epoch_$PRETRAIN_EPOCHS.pth"

echo "[quickstart] 2/2 linear probe on $PROBE_IMAGES images, $PROBE_EPOCHS epochs"
PROBE_DATA_OPTS=()
if [ -n "${FMNIST_ROOT:-}" ]; then
  PROBE_DATA_OPTS=("train_dataloader.dataset.data_root=$FMNIST_ROOT"
                   "val_dataloader.dataset.data_root=$FMNIST_ROOT")
fi
"$PY" tools/train.py configs/fashion_mnist/linear_fmnist.py \
  --work-dir "$WORK_DIR/linear" \
  --cfg-options \
    "model.backbone.init_cfg.checkpoint=$PRETRAINED" \
    "train_dataloader.dataset.indices=$PROBE_IMAGES" \
    "train_cfg.max_epochs=$PROBE_EPOCHS" \
    "train_cfg.val_interval=$PROBE_EPOCHS" \
    "param_scheduler.1.T_max=$((PROBE_EPOCHS - 1))" \
    "param_scheduler.1.end=$PROBE_EPOCHS" \
    "${PROBE_DATA_OPTS[@]}"

"$PY" - "$WORK_DIR" <<'PYEOF'
import glob, json, os, sys
work_dir = sys.argv[1]
logs = sorted(glob.glob(os.path.join(work_dir, 'linear', '*', 'vis_data', 'scalars.json')))
top1 = [json.loads(line)['accuracy/top1'] for line in open(logs[-1])
        if 'accuracy/top1' in line]
message = (f'linear-probe top-1 accuracy on the 10,000 Fashion-MNIST test '
           f'images: {top1[-1]:.2f} %')
print(f'\n[quickstart] {message}')
with open(os.path.join(work_dir, 'accuracy.txt'), 'w') as f:
    f.write(message + '\n')
PYEOF
