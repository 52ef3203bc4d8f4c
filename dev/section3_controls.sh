#!/bin/bash
# The section-3 controls (docs/siamese_controls.md): do the failures of the
# information-flow paper's statements in docs/siamese_information_flow.md
# come from the projector width or from the training length? Two
# comparisons beside the 128-wide, 30-epoch campaign of
# dev/siamese_campaign.sh, on the same data, encoder and held-out hook:
#
#   width512: SimCLR, BYOL, Barlow Twins and spectral contrastive with a
#             512-wide projector (hidden and output; ceiling ln 512 = 6.24
#             nats instead of ln 128 = 4.85), 30 epochs, seeds 0-2. The
#             held-out set is 2 batches of 1,024 test images, so the
#             512 x 512 covariance is not rank-limited.
#   length90: SimCLR and Barlow Twins at width 128, trained 90 epochs with
#             the schedule stretched to 90 (3x the campaign), seeds 0-2.
#
#   bash dev/section3_controls.sh run width512|length90 [OUT]   # resumable
#   bash dev/section3_controls.sh export width512|length90 [OUT]
#
# OUT defaults to work_dirs/section3/<control>. `run` is what the pages
# name; start it with nohup in the background: a kill loses at most one
# epoch per run. On a machine without OUT's run folders, `run` first takes
# up the finished runs committed in docs/siamese_controls/<control>/runs.json
# (--restore): only unfinished runs train again. Measured on 2 CPU cores,
# one run per core: a width512 run about 20 minutes, a length90 run about
# 45 minutes (30-epoch runs of the campaign: 12-15 minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: section3_controls.sh run|export width512|length90 [OUT]}
CONTROL=${2:?usage: section3_controls.sh run|export width512|length90 [OUT]}
OUT=${3:-work_dirs/section3/$CONTROL}
PY=${PYTHON:-.venv/bin/python}
C=configs/fashion_mnist
DOCS=docs/siamese_controls/$CONTROL

case "$CONTROL" in
width512)
  W=512
  ARGS=(
    --arm "simclr$W=$C/simclr_fmnist.py model.neck.out_channels=$W"
    --arm "byol$W=$C/byol_fmnist.py model.neck.out_channels=$W
           model.head.predictor.in_channels=$W
           model.head.predictor.out_channels=$W"
    --arm "barlowtwins$W=$C/barlowtwins_fmnist.py
           model.neck.out_channels=$W model.head.in_channels=$W"
    --arm "spectral$W=$C/spectral_fmnist.py model.neck.out_channels=$W"
    --label "simclr$W=SimCLR ($W)" --label "byol$W=BYOL ($W)"
    --label "barlowtwins$W=Barlow Twins ($W)"
    --label "spectral$W=Spectral contrastive ($W)"
    --reference simclr$W --epochs 30 --eval-epochs 1 10 30
    # hidden width 512 is the configs' own (proj_hidden)
    --cfg-options custom_hooks.0.heldout.batch_size=1024
                  custom_hooks.0.heldout.num_batches=2)
  ;;
length90)
  ARGS=(
    --arm simclr90=$C/simclr_fmnist.py
    --arm barlowtwins90=$C/barlowtwins_fmnist.py
    --label 'simclr90=SimCLR (90 epochs)'
    --label 'barlowtwins90=Barlow Twins (90 epochs)'
    --reference simclr90 --epochs 90 --eval-epochs 30 60 90)
  ;;
*) echo "unknown control $CONTROL (width512|length90)" >&2; exit 2 ;;
esac

case "$MODE" in
run)
  RESTORE=()
  [ -f "$DOCS/runs.json" ] && RESTORE=(--restore "$DOCS/runs.json")
  exec "$PY" tools/compare.py run --out-dir "$OUT" "${RESTORE[@]}" \
    "${ARGS[@]}" --seeds 0 1 2 \
    --eval-config $C/knn_fmnist_resnet.py --poolings mean \
    --parallel "${PARALLEL:-1}" --cpus-per-task 1
  ;;
export)
  "$PY" -c "import sys; from mmae_compare.records import \
write_runs; write_runs(sys.argv[1])" "$OUT"
  mkdir -p "$DOCS"
  cp "$OUT/runs.json" "$DOCS/runs.json"
  ;;
*) echo "unknown mode $MODE (run|export)" >&2; exit 2 ;;
esac
