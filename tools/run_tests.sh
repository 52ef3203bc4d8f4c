#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (CPU only; about 17 minutes
# on 2 cores, measured 17 min 26 s beside two niced training jobs, plus 2-5
# minutes of set-up on a fresh machine; MMAE_TEST_LONG=1 adds the tests
# marked long, about 20 minutes more).
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
