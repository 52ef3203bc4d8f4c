#!/usr/bin/env bash
# Set up if needed, then run the whole test suite (CPU only; about 25 minutes
# on 2 cores, plus 3-5 minutes of set-up on a fresh machine).
# Usage: bash tools/run_tests.sh [extra pytest arguments]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/tools/setup_env.sh"
cd "$ROOT"
exec .venv/bin/python -m pytest tests "$@"
