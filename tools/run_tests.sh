#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (CPU only; ~29 CPU-minutes
# over all cores: 15-20 minutes on 2 idle cores, plus 3-5 minutes of set-up
# on a fresh machine).
# The test files are spread over one pytest-xdist worker per core (at most
# 4; MMAE_TEST_WORKERS overrides, 0 runs in this process), a file's tests on
# one worker, so a module's trained fixture is trained once.
# Usage: bash tools/run_tests.sh [extra pytest arguments]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
cores="$(nproc)"
WORKERS="${MMAE_TEST_WORKERS:-$(( cores < 4 ? cores : 4 ))}"
exec .venv/bin/python -m pytest tests -n "$WORKERS" --dist loadfile \
  --durations 25 "$@"
