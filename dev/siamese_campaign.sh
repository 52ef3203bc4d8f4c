#!/bin/bash
# The Siamese information-flow campaign (docs/siamese.md,
# docs/siamese_information_flow.md): SimCLR, BYOL, Barlow Twins and spectral
# contrastive learning on Fashion-MNIST, 5 seeds, 30 epochs of 12,800
# images, MatrixInfoHook on a fixed held-out set every epoch, the frozen
# evaluation at epochs 1 2 5 10 20 30, and the random-init control.
#
#   bash dev/siamese_campaign.sh run [OUT]     # resumable; rerun to continue
#   bash dev/siamese_campaign.sh export [OUT]  # runs.json and pages -> docs/
#
# OUT defaults to work_dirs/siamese. `run` is what the pages name; start it
# with nohup in the background: a kill loses at most one epoch per run. On a
# machine without OUT's run folders, `run` first takes up the finished
# results committed in docs/siamese/runs.json (--restore): only unfinished
# runs train again.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: siamese_campaign.sh run|export [OUT]}
OUT=${2:-work_dirs/siamese}
PY=${PYTHON:-.venv/bin/python}
C=configs/fashion_mnist

case "$MODE" in
run)
  RESTORE=()
  [ -f docs/siamese/runs.json ] && RESTORE=(--restore docs/siamese/runs.json)
  exec "$PY" tools/compare.py run --out-dir "$OUT" "${RESTORE[@]}" \
    --arm simclr=$C/simclr_fmnist.py --arm byol=$C/byol_fmnist.py \
    --arm barlowtwins=$C/barlowtwins_fmnist.py \
    --arm spectral=$C/spectral_fmnist.py --arm random=random \
    --label simclr=SimCLR --label byol=BYOL --label 'barlowtwins=Barlow Twins' \
    --label 'spectral=Spectral contrastive' \
    --label 'random=random init (control)' \
    --reference simclr --seeds 0 1 2 3 4 --epochs 30 \
    --eval-epochs 1 2 5 10 20 30 \
    --eval-config $C/knn_fmnist_resnet.py --poolings mean \
    --parallel 2 --cpus-per-task 1
  ;;
export)
  # runs.json (every evaluation and each run's per-epoch hook curves) is
  # rebuilt from the run folders, copied, and the pages are made from the
  # copy alone.
  "$PY" -c "import sys; from mmae_compare.records import \
write_runs; write_runs(sys.argv[1])" "$OUT"
  mkdir -p docs/siamese
  cp "$OUT/runs.json" docs/siamese/runs.json
  "$PY" tools/compare.py report --out-dir docs/siamese \
    --report docs/siamese.md --notes docs/siamese/notes.md \
    --title 'Siamese methods on Fashion-MNIST: linear probe over training'
  "$PY" tools/analysis/information_flow.py --out-dir docs/siamese \
    --report docs/siamese_information_flow.md \
    --notes docs/siamese/information_flow_notes.md
  ;;
*) echo "unknown mode $MODE (run|export)" >&2; exit 2 ;;
esac
