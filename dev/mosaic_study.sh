#!/bin/bash
# The mosaic study (docs/mosaic.md): does M-MAE's coding-rate term help
# where a task needs many directions, and does MAE keep local features that
# contrastive learning drops? Every arm of the study on 2 x 2 Fashion-MNIST
# mosaics, seeds 0-2, 10 epochs of 30,000 training mosaics, evaluated at
# epoch 10 by the mosaic probes (tools/compare.py --evaluation mosaic).
#
#   bash dev/mosaic_study.sh run [OUT]      # resumable; start with nohup
#   bash dev/mosaic_study.sh export [OUT]   # records -> docs/mosaic/runs.json
#                                           # and cost.json
#
# OUT defaults to work_dirs/mosaic. On a machine without OUT's run folders,
# `run` first takes up the finished runs committed in docs/mosaic/runs.json
# (--restore): only unfinished runs train again. The jobs run niced, so
# interactive work on the same cores keeps its speed.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: mosaic_study.sh run|export [OUT]}
OUT=${2:-work_dirs/mosaic}
PY=${PYTHON:-.venv/bin/python}
C=configs/fashion_mnist_mosaic
DOCS=docs/mosaic

case "$MODE" in
run)
  RESTORE=()
  [ -f "$DOCS/runs.json" ] && RESTORE=(--restore "$DOCS/runs.json")
  exec nice -n 10 "$PY" tools/compare.py run --out-dir "$OUT" \
    "${RESTORE[@]}" \
    --arm random_init=random \
    --arm mae=$C/mae_mosaic.py \
    --arm "umae=$C/umae_mosaic.py model.regularizer.loss_weight=0.01" \
    --arm "mmae_lam0.01=$C/mmae_mosaic.py model.regularizer.loss_weight=0.01
           model.regularizer.mu=1.0" \
    --arm "mmae_lam0.05=$C/mmae_mosaic.py model.regularizer.loss_weight=0.05
           model.regularizer.mu=1.0" \
    --arm simclr=$C/simclr_mosaic.py \
    --arm supervised=$C/supervised_mosaic.py \
    --label 'random_init=random init (control)' --label mae=MAE \
    --label 'umae=U-MAE λ=0.01' --label 'mmae_lam0.01=M-MAE λ=0.01' \
    --label 'mmae_lam0.05=M-MAE λ=0.05' --label simclr=SimCLR \
    --label 'supervised=supervised (control)' \
    --reference mae --seeds 0 1 2 --epochs 10 --images 30000 \
    --eval-config $C/features_mosaic.py --evaluation mosaic \
    --poolings cls mean --shots 10 \
    --cfg-options default_hooks.logger.interval=50 \
    --parallel "${PARALLEL:-2}" --cpus-per-task 1
  ;;
export)
  "$PY" -c "import sys; from mmae_compare.records import \
write_runs; write_runs(sys.argv[1])" "$OUT"
  mkdir -p "$DOCS"
  cp "$OUT/runs.json" "$DOCS/runs.json"
  "$PY" -c "import sys; from mmae_compare.cost import export_cost; \
export_cost(*sys.argv[1:])" "$OUT" "$DOCS/cost.json"
  ;;
*) echo "unknown mode $MODE (run|export)" >&2; exit 2 ;;
esac
