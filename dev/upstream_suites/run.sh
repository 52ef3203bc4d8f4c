#!/usr/bin/env bash
# Run mmengine v0.10.7's and mmpretrain v1.2.0's own test suites with and
# without `import mmae_plugin.registration`, and list every test whose outcome differs.
#
# Usage: bash dev/upstream_suites/run.sh MMENGINE_SRC MMPRETRAIN_SRC OUT [MMPRETRAIN_PATHS]
#   *_SRC: a source tree holding tests/ at the release tag, or a git clone
#          (the tag is exported from it).
#   OUT:   output folder: junit/<suite>-{plain,plugin}.xml and .log,
#          <suite>-diff.txt (the differing tests).
#   MMPRETRAIN_PATHS: comma-separated test paths (default: all of tests).
# Example:
#   git clone -q https://github.com/open-mmlab/mmengine /src/mmengine
#   git clone -q https://github.com/open-mmlab/mmpretrain /src/mmpretrain
#   nice -n 19 bash dev/upstream_suites/run.sh /src/mmengine /src/mmpretrain out
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 5,12p "$0"; exit 2
fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
PRETRAIN="mmpretrain=$2"
if [ $# -ge 4 ]; then PRETRAIN="$PRETRAIN:$4"; fi
exec "$PYTHON" "$ROOT/dev/upstream_suites/upstream_suites.py" "mmengine=$1" "$PRETRAIN" --out "$3"
