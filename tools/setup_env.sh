#!/usr/bin/env bash
# Set up everything mmae-plugin needs on a fresh machine, idempotently:
#   1. a virtual environment in <repo>/.venv with the plugin (editable) and
#      the exact tested versions of constraints.txt: torch, torchvision,
#      mmengine, mmcv-lite, mmpretrain, and the test / analysis extras
#      (re-installed whenever setup.py or constraints.txt changes);
#   2. optionally, a C compiler and jpeglib.h (Debian packages gcc and
#      libjpeg-dev, installed when root and missing), for the recipes'
#      loader's region decoding of JPEGs; without them it decodes whole files;
#   3. Fashion-MNIST in /usr/share/datasets/fashion-mnist (Debian package
#      dataset-fashion-mnist) unless FMNIST_ROOT points at the IDX files.
# A first run downloads several GB (torch with its CUDA libraries; about 6 GB
# installed); pip prints each package as it goes. A re-run with nothing changed takes a
# second; after a change it keeps every installed package that already
# matches, so the environment stays usable while it runs.
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
want="$(cat "$ROOT/setup.py" "$ROOT/constraints.txt" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing mmae-plugin[all,lite] (editable) with the pinned versions of constraints.txt:"
  grep -E '^(torch|torchvision|mmengine|mmcv-lite|mmpretrain|timm)==' \
    "$ROOT/constraints.txt" | sed 's/^/[setup]   /'
  "$VENV/bin/python" -m pip install --progress-bar on -c "$ROOT/constraints.txt" \
    --upgrade pip setuptools wheel
  "$VENV/bin/python" -m pip install --progress-bar on -c "$ROOT/constraints.txt" \
    --no-build-isolation -e "$ROOT[all,lite]"
  echo "$want" > "$stamp"
  log "virtual environment ready"
else
  log "virtual environment up to date"
fi

# Optional: a C compiler and libjpeg-turbo's header, with which the recipes'
# loader builds its region decoder on first use (decoding only the crop of
# each JPEG, mmae_plugin/datasets/transforms/jpeg_region.py); without them
# it decodes whole JPEGs with OpenCV: the same images, more CPU per image.
if printf '#include <stdio.h>\n#include <jpeglib.h>\n' \
    | "${CC:-cc}" -E -x c - >/dev/null 2>&1; then
  log "C compiler and jpeglib.h found (the loader's region decoding of JPEGs)"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  log "installing gcc and libjpeg-dev (the loader's region decoding of JPEGs)"
  if ! { apt-get update -qq && apt-get install -y -qq gcc libjpeg-dev \
      >/dev/null; }; then
    log "could not install them: the loader will decode whole JPEGs"
  fi
else
  log "no C compiler or jpeglib.h: the loader will decode whole JPEGs"
  log "(to decode only the crop: sudo apt-get install gcc libjpeg-dev)"
fi

# Optional: jpegtran (libjpeg-turbo-progs), with which
# tools/dataset_converters/add_jpeg_restarts.py writes lossless copies of a
# dataset's JPEGs that the loader decodes faster (its tests need it).
if command -v jpegtran >/dev/null; then
  log "jpegtran found (tools/dataset_converters/add_jpeg_restarts.py)"
elif command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  log "installing libjpeg-turbo-progs (jpegtran, add_jpeg_restarts.py)"
  if ! { apt-get update -qq && apt-get install -y -qq libjpeg-turbo-progs \
      >/dev/null; }; then
    log "could not install it: add_jpeg_restarts.py will not run"
  fi
else
  log "no jpegtran: add_jpeg_restarts.py will not run"
  log "(sudo apt-get install libjpeg-turbo-progs)"
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
