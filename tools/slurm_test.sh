#!/usr/bin/env bash
# Slurm testing: [GPUS=8] tools/slurm_test.sh PARTITION JOB_NAME CONFIG CHECKPOINT [test.py args]
set -x
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
CHECKPOINT=$4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
# 9 CPUs per GPU task: the ImageNet recipes' 8 dataloader workers + the
# main process (raise both together on bigger nodes; docs/gpu_clusters.md)
CPUS_PER_TASK=${CPUS_PER_TASK:-9}
SRUN_ARGS=${SRUN_ARGS:-""}
PY_ARGS=${@:5}
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON=${PYTHON:-python}

PYTHONPATH="$ROOT":$PYTHONPATH \
srun -p "${PARTITION}" \
    --job-name="${JOB_NAME}" \
    --gres=gpu:"${GPUS_PER_NODE}" \
    --ntasks="${GPUS}" \
    --ntasks-per-node="${GPUS_PER_NODE}" \
    --cpus-per-task="${CPUS_PER_TASK}" \
    --kill-on-bad-exit=1 \
    ${SRUN_ARGS} \
    "$PYTHON" -u "$ROOT/tools/test.py" "${CONFIG}" "${CHECKPOINT}" --launcher="slurm" ${PY_ARGS}
