#!/bin/bash
# The information-flow campaign at the paper's scale, for GPUs: SimCLR,
# BYOL, Barlow Twins and spectral contrastive learning on CIFAR-10 with a
# full-width ResNet-18 (CIFAR stem), each method's own projector width
# (128 / 256 / 2048 / 2048), 200 epochs at batch 256, MatrixInfoHook on
# the training batches and on 2 x 2,048 held-out test images before
# training and after every epoch, the frozen kNN evaluation
# (configs/cifar10/knn_cifar10_resnet.py) at epochs 1 10 50 100 200.
# Then the statements are decided as on Fashion-MNIST:
#
#   bash dev/cifar10_campaign.sh run [OUT] [compare.py options]  # resumable
#   bash dev/cifar10_campaign.sh export [OUT]
#
# OUT defaults to work_dirs/cifar10_siamese. CIFAR-10's python version must
# be in data/cifar10/cifar-10-batches-py (nothing is downloaded). Extra
# options go to tools/compare.py run, e.g. on a Slurm cluster:
#   bash dev/cifar10_campaign.sh run OUT --cluster slurm --partition gpu \
#       --gpus 1 --cpus-per-task 8 --parallel 8
#
# Cost. A SimCLR training step (batch 256, two views, random 32 x 32
# tensors, no data loading) measured by
# dev/benchmarks/bench_cifar10_siamese.py --methods simclr --steps 2 on
# this project's 2-core CPU machine, one thread, while other jobs ran:
# 42 s of CPU (71 s wall) per step. One epoch is 195 steps, about 2.3
# CPU-hours; a 200-epoch run about 19 CPU-days, so this campaign is for
# GPUs (BYOL's extra target pass costs more still). On one
# GPU of the A100 / H100 class a ResNet-18 step at 32 x 32 and batch 2 x
# 256 takes an estimated 0.03-0.06 s (not measured here: run the benchmark
# with --device cuda), about 10-20 s per epoch with data loading keeping
# up, so about 1 hour per run, 20 GPU-hours for 4 methods x 5 seeds.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: cifar10_campaign.sh run|export [OUT] [compare.py options]}
OUT=${2:-work_dirs/cifar10_siamese}
shift $(( $# > 1 ? 2 : 1 ))
PY=${PYTHON:-.venv/bin/python}
C=configs/cifar10

case "$MODE" in
run)
  exec "$PY" tools/compare.py run --out-dir "$OUT" \
    --arm simclr=$C/simclr_cifar10.py --arm byol=$C/byol_cifar10.py \
    --arm barlowtwins=$C/barlowtwins_cifar10.py \
    --arm spectral=$C/spectral_cifar10.py \
    --label simclr=SimCLR --label byol=BYOL --label 'barlowtwins=Barlow Twins' \
    --label 'spectral=Spectral contrastive' \
    --reference simclr --seeds 0 1 2 3 4 --epochs 200 \
    --eval-epochs 1 10 50 100 200 \
    --eval-config $C/knn_cifar10_resnet.py --poolings mean "$@"
  ;;
export)
  "$PY" -c "import sys; from mmae_compare.records import \
write_runs; write_runs(sys.argv[1])" "$OUT"
  "$PY" tools/compare.py report --out-dir "$OUT" \
    --title 'Siamese methods on CIFAR-10: linear probe over training'
  "$PY" tools/analysis/information_flow.py --out-dir "$OUT" \
    --report "$OUT/information_flow.md" --feature-dim 2048
  "$PY" tools/analysis/section3_controls.py \
    --control "cifar10=$OUT:2048:CIFAR-10, per-method projectors, 200 epochs" \
    --report "$OUT/section3_readings.md"
  ;;
*) echo "unknown mode $MODE (run|export)" >&2; exit 2 ;;
esac
