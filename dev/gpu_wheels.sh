#!/usr/bin/env bash
# Download, on a machine with network access, the wheels that
# dev/gpu_check.sh installs on the GPU machine (Python 3.12, x86-64
# manylinux, torch preinstalled, no network there).
#
# Usage: bash dev/gpu_wheels.sh [DEST]
#   DEST     folder for the wheels (default: <repo>/.whl, ignored by git)
# Environment:
#   PYTHON   interpreter whose pip downloads (default: <repo>/.venv/bin/python
#            if it exists, else python3); it only downloads, installs nothing
#
# What is carried: the OpenMMLab stack at the versions of constraints.txt
# (mmengine, mmpretrain, mmcv-lite) and those of their pure-Python needs the
# GPU machine's image does not have (its package list: PREINSTALLED below).
# setuptools<82 is carried because mmengine 0.10.7 resolves `mmpretrain::`
# config bases through pkg_resources, which setuptools 82 removed, and the
# image's setuptools version is not known. Every wheel is fetched with
# --no-deps; afterwards each wheel's Requires-Dist (markers evaluated for
# CPython 3.12 on Linux) is checked against what is carried plus what is
# preinstalled, so a missing need fails here and not on the GPU machine.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
DEST="${1:-$ROOT/.whl}"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
MAX_MIB=40

# name==version, the versions of constraints.txt (the tested stack).
WHEELS=(
  mmengine==0.10.7
  mmpretrain==1.2.0
  mmcv-lite==2.2.0
  addict==2.4.0          # mmengine, mmcv
  termcolor==3.3.0       # mmengine
  yapf==0.43.0           # mmengine, mmcv
  platformdirs==4.14.8   # yapf
  mat4py==0.6.0          # mmpretrain
  modelindex==0.0.2      # mmpretrain
  model-index==0.1.11    # modelindex
  ordered-set==4.1.0     # model-index
  importlib-metadata==10.2.0  # mmpretrain
  lazy-importer==0.1.0   # importlib-metadata 10 (Python < 3.15)
  setuptools==81.0.0     # pkg_resources for mmengine's `mmpretrain::` bases
)

# The GPU machine's image ('cuda', package list of 2026-11-17 in the device
# notes), as far as the carried wheels need it. opencv-python is satisfied by
# opencv-python-headless (the same cv2 module).
PREINSTALLED="click einops markdown matplotlib numpy opencv-python
opencv-python-headless packaging pillow pyyaml regex rich zipp torch
torchvision scipy tensorboard timm pytest"

# Manylinux tags pip matches exactly (see the device notes); pure-Python
# wheels (py3-none-any) match any of them.
PLATFORMS=(manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64
           manylinux2014_x86_64 manylinux1_x86_64)

# The folder never travels by git: ignored in .gitignore (tracked) and in
# .git/info/exclude (the device tool reads the latter).
GIT_DIR="$(git -C "$ROOT" rev-parse --git-dir 2>/dev/null || true)"
if [ -n "$GIT_DIR" ]; then
  case "$GIT_DIR" in /*) ;; *) GIT_DIR="$ROOT/$GIT_DIR" ;; esac
  mkdir -p "$GIT_DIR/info"
  grep -qxF '/.whl/' "$GIT_DIR/info/exclude" 2>/dev/null \
    || echo '/.whl/' >> "$GIT_DIR/info/exclude"
fi

mkdir -p "$DEST"
PLATFORM_ARGS=()
for p in "${PLATFORMS[@]}"; do PLATFORM_ARGS+=(--platform "$p"); done
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
  --python-version 3.12 --implementation cp "${PLATFORM_ARGS[@]}" \
  -d "$DEST" "${WHEELS[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)

# One version per project (two stop the whole install there), no wheel that
# is not asked for (left over from an earlier list), every need met.
"$PYTHON" - "$DEST" "$PREINSTALLED" "${WHEELS[@]}" <<'EOF'
import glob
import os
import re
import sys
import zipfile

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

dest, preinstalled, wanted = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
wanted = {canonicalize_name(w.split('==')[0]): w.split('==')[1]
          for w in wanted}
env = dict(default_environment(), python_version='3.12',
           python_full_version='3.12.3', sys_platform='linux',
           platform_system='Linux', implementation_name='cpython',
           platform_machine='x86_64', extra='')
found, problems = {}, []
for path in sorted(glob.glob(os.path.join(dest, '*.whl'))):
    name, version, _, _ = parse_wheel_filename(os.path.basename(path))
    if name in found:
        problems.append(f'two wheels of {name}: {found[name][0]} and '
                        f'{version}; keep one')
    if name not in wanted or str(version) != wanted[name]:
        problems.append(f'{os.path.basename(path)} is not in the list '
                        '(left from an earlier run?); remove it')
    with zipfile.ZipFile(path) as wheel:
        meta = next(n for n in wheel.namelist()
                    if re.fullmatch(r'[^/]+\.dist-info/METADATA', n))
        lines = wheel.read(meta).decode().splitlines()
    needs = [Requirement(line.split(':', 1)[1].strip()) for line in lines
             if line.startswith('Requires-Dist:')]
    found[name] = (str(version), needs)
missing = sorted(set(wanted) - set(found))
if missing:
    problems.append(f'not downloaded: {missing}')
have = set(found) | {canonicalize_name(p) for p in preinstalled}
for name, (version, needs) in sorted(found.items()):
    for need in needs:
        if need.marker is not None and not need.marker.evaluate(env):
            continue  # an extra, Windows-only or older-Python need
        if canonicalize_name(need.name) not in have:
            problems.append(f'{name} {version} needs {need} (neither '
                            'carried nor preinstalled on the GPU machine)')
for name, (version, _) in sorted(found.items()):
    print(f'  {name}=={version}')
if problems:
    sys.exit('gpu_wheels: ' + '\n  '.join(problems))
EOF

SIZE_KIB=$(du -sk "$DEST" | cut -f1)
COUNT=$(ls "$DEST"/*.whl | wc -l)
echo "gpu_wheels: $COUNT wheels, $((SIZE_KIB / 1024)).$(( (SIZE_KIB % 1024) * 10 / 1024 )) MiB in $DEST"
if [ "$SIZE_KIB" -gt $((MAX_MIB * 1024)) ]; then
  echo "gpu_wheels: over $MAX_MIB MiB (the device call carries at most 64 MiB with the tree)" >&2
  exit 1
fi
if [ "$DEST" = "$ROOT/.whl" ]; then
  echo "gpu_wheels: the device call carries them: run(command='bash dev/gpu_check.sh', carry=['.whl'], timeout_s=600)"
fi
