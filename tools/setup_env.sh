#!/usr/bin/env bash
# Set up everything mmae-plugin needs on a fresh machine, idempotently:
#   1. a virtual environment in <repo>/.venv with the pinned packages of
#      setup.py (re-installed whenever setup.py changes);
#   2. Fashion-MNIST in /usr/share/datasets/fashion-mnist (Debian package
#      dataset-fashion-mnist) unless FMNIST_ROOT points at the IDX files.
# Usage: bash tools/setup_env.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"
FMNIST_ROOT="${FMNIST_ROOT:-/usr/share/datasets/fashion-mnist}"

log() { echo "[setup] $*"; }

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment in $VENV"
  "$PYTHON" -m venv "$VENV"
fi

stamp="$VENV/.mmae-plugin-setup"
want="$(sha256sum "$ROOT/setup.py" | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing pinned packages (torch, mmengine, mmpretrain, ...)"
  "$VENV/bin/python" -m pip install -q --upgrade pip 'setuptools<82' wheel
  "$VENV/bin/python" -m pip install -q --no-build-isolation -e "$ROOT[all]"
  echo "$want" > "$stamp"
else
  log "virtual environment up to date"
fi

if ls "$FMNIST_ROOT"/train-images-idx3-ubyte* >/dev/null 2>&1; then
  log "Fashion-MNIST found in $FMNIST_ROOT"
elif [ "$FMNIST_ROOT" = /usr/share/datasets/fashion-mnist ] \
    && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  log "installing Fashion-MNIST (apt-get install dataset-fashion-mnist)"
  apt-get update -qq
  apt-get install -y -qq dataset-fashion-mnist >/dev/null
else
  log "Fashion-MNIST is missing: run 'sudo apt-get install dataset-fashion-mnist'"
  log "or put the four IDX files (.gz is fine) in a folder and set FMNIST_ROOT"
  exit 1
fi
