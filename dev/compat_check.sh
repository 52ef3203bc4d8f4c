#!/usr/bin/env bash
# Build a virtual environment with another torch (and numpy) than the pinned
# one, install the plugin into it and run the test suite there.
#
# Usage: bash dev/compat_check.sh TORCH_VERSION [NUMPY_SPEC] [-- PYTEST_ARGS...]
#   TORCH_VERSION  2.4 (newest 2.4.x), 2.4.1, 2.11, ...
#   NUMPY_SPEC     a pip specifier for numpy, e.g. '==1.26.*' or '<2'
#                  (default: whatever pip picks for that torch)
#   PYTEST_ARGS    passed to pytest (default: the whole suite)
# Environment:
#   PYTHON         interpreter for the venv (default: python3.11, the
#                  version CI runs)
#   COMPAT_REF     git revision to test (default: HEAD); the suite runs in a
#                  clean export of it, so edits in the working tree while it
#                  runs do not change what is tested
#
# The venv is <repo>/.venv-compat-<torch>[-numpy<spec>] (ignored by git) and
# is reused while the requested stack stays the same; the tested source is
# exported to <venv>/src. torch comes from PyPI as published (with its CUDA
# libraries: several GB on the first run). mmengine, mmcv-lite and
# mmpretrain are the pinned versions of constraints.txt; everything else is
# what pip resolves within setup.py's ranges, written to <venv>/freeze.txt.
# The last lines printed are the pytest summary and, per failing test, its
# node id; the log is <venv>/pytest.log and the JUnit report <venv>/junit.xml.
set -euo pipefail

usage() {
  echo "usage: bash dev/compat_check.sh TORCH_VERSION [NUMPY_SPEC] [-- PYTEST_ARGS...]" >&2
  exit 2
}

[ $# -ge 1 ] || usage
TORCH_VERSION="$1"; shift
NUMPY_SPEC=''
if [ $# -ge 1 ] && [ "$1" != -- ]; then NUMPY_SPEC="$1"; shift; fi
if [ $# -ge 1 ] && [ "$1" = -- ]; then shift; fi
PYTEST_ARGS=("$@")

if ! [[ "$TORCH_VERSION" =~ ^2\.([0-9]+)(\.[0-9]+)?$ ]]; then
  echo "compat_check: TORCH_VERSION must look like 2.4 or 2.4.1, got '$TORCH_VERSION'" >&2
  exit 2
fi
MINOR="${BASH_REMATCH[1]}"
if [ "$MINOR" -lt 4 ]; then
  echo "compat_check: TORCH_VERSION $TORCH_VERSION is older than 2.4, the first" \
    "torch with torch.serialization.add_safe_globals (setup.py: torch>=2.4)" >&2
  exit 2
fi
if [ -n "$NUMPY_SPEC" ] && ! [[ "$NUMPY_SPEC" =~ ^(==|>=|<=|~=|<|>|!=)[0-9][0-9.*]*(,(==|>=|<=|<|>|!=)[0-9][0-9.*]*)*$ ]]; then
  echo "compat_check: NUMPY_SPEC must be a pip version specifier such as" \
    "'==1.26.*' or '<2', got '$NUMPY_SPEC'" >&2
  exit 2
fi

# torchvision's minor release that matches each torch minor: 0.(minor + 15).
TORCHVISION_MINOR=$((MINOR + 15))
if [[ "$TORCH_VERSION" == *.*.* ]]; then
  TORCH_PIN="torch==$TORCH_VERSION"
else
  TORCH_PIN="torch==$TORCH_VERSION.*"
fi
TORCHVISION_PIN="torchvision==0.$TORCHVISION_MINOR.*"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3.11}"
COMPAT_REF="${COMPAT_REF:-HEAD}"
TAG="$TORCH_VERSION"
[ -z "$NUMPY_SPEC" ] || TAG="$TAG-numpy$(echo "$NUMPY_SPEC" | tr -c 'A-Za-z0-9.\n' '_')"
VENV="$ROOT/.venv-compat-$TAG"
SRC="$VENV/src"

log() { echo "[compat $TAG] $*"; }

pinned() {  # the version constraints.txt pins for package $1
  grep -i "^$1==" "$ROOT/constraints.txt"
}

if [ ! -x "$VENV/bin/python" ]; then
  log "creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

CONSTRAINTS="$VENV/constraints.txt"
{
  echo "$TORCH_PIN"
  echo "$TORCHVISION_PIN"
  [ -z "$NUMPY_SPEC" ] || echo "numpy$NUMPY_SPEC"
  pinned setuptools
  pinned wheel
  pinned mmengine
  pinned mmcv-lite
  pinned mmpretrain
} > "$CONSTRAINTS.new"
mv "$CONSTRAINTS.new" "$CONSTRAINTS"

stamp="$VENV/.stack"
want="$(cat "$CONSTRAINTS" "$ROOT/setup.py" | sha256sum | cut -d' ' -f1)"
# The stamp alone is not enough: a killed run (or anything that pip-installs
# into the venv) can leave another torch behind it.
installed_torch="$("$VENV/bin/python" -m pip show torch 2>/dev/null \
  | sed -n 's/^Version: //p')"
if [[ "$installed_torch" != "$TORCH_VERSION"* ]]; then
  [ -z "$installed_torch" ] || log "installed torch $installed_torch is not $TORCH_VERSION"
  rm -f "$stamp"
fi
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing: $(tr '\n' ' ' < "$CONSTRAINTS")"
  "$VENV/bin/python" -m pip install -q --progress-bar off -c "$CONSTRAINTS" \
    --upgrade pip setuptools wheel
  # The plugin's own requirements with the test extras, read from setup.py.
  mapfile -t REQUIREMENTS < <("$VENV/bin/python" - "$ROOT/setup.py" <<'EOF'
import re
import sys
# The requirement strings of setup.py, without running it.
text = re.sub(r'#[^\n]*', '', open(sys.argv[1]).read())
reqs = re.search(r'INSTALL_REQUIRES = \[(.*?)\n\]', text, re.S).group(1)
tests = re.search(r"'tests': \[(.*?)\]", text, re.S).group(1)
lite = re.search(r"'lite': \[(.*?)\]", text, re.S).group(1)
print('\n'.join(re.findall(r"'([^']+)'", reqs + tests + lite)))
EOF
)
  "$VENV/bin/python" -m pip install --progress-bar off -c "$CONSTRAINTS" \
    "$TORCH_PIN" "$TORCHVISION_PIN" "numpy${NUMPY_SPEC}" "${REQUIREMENTS[@]}"
  echo "$want" > "$stamp"
fi

# A clean export of the revision under test (tracked files only).
rm -rf "$SRC"
mkdir -p "$SRC"
git -C "$ROOT" archive "$COMPAT_REF" | tar -x -C "$SRC"
# A repository of its own: tests list tracked files with git ls-files.
git -C "$SRC" init -q
git -C "$SRC" add -A
git -C "$SRC" -c user.name=compat_check -c user.email=compat@localhost \
  commit -q -m "$(git -C "$ROOT" rev-parse "$COMPAT_REF")"
# Scripts that call <repo>/.venv/bin/python find this stack's interpreter,
# and tools/setup_env.sh (run by tools/quickstart.sh) finds its stamp up to
# date instead of installing the pinned torch of constraints.txt here.
ln -s "$VENV" "$SRC/.venv"
cat "$SRC/setup.py" "$SRC/constraints.txt" | sha256sum | cut -d' ' -f1 \
  > "$VENV/.mmae-plugin-setup"
"$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e "$SRC"
"$VENV/bin/python" -m pip freeze --exclude-editable > "$VENV/freeze.txt"
log "testing $(git -C "$ROOT" rev-parse --short "$COMPAT_REF") with" \
  "$(grep -iE '^(torch|torchvision|numpy|mmengine|mmcv-lite|mmpretrain)==' "$VENV/freeze.txt" | tr '\n' ' ')"

cd "$SRC"
set +e
"$VENV/bin/python" -m pytest -p no:cacheprovider -q -rfE \
  --junitxml="$VENV/junit.xml" "${PYTEST_ARGS[@]:-tests}" > "$VENV/pytest.log" 2>&1
status=$?
set -e
"$VENV/bin/python" -m pip freeze --exclude-editable > "$VENV/freeze-after.txt"
if ! cmp -s "$VENV/freeze.txt" "$VENV/freeze-after.txt"; then
  log "ERROR: the test run changed the installed packages:"
  diff "$VENV/freeze.txt" "$VENV/freeze-after.txt" || true
  rm -f "$stamp"  # reinstall the requested stack next time
  status=3
fi
log "pytest exit status $status; log: $VENV/pytest.log"
"$VENV/bin/python" - "$VENV/junit.xml" "$TAG" <<'EOF'
import sys
import xml.etree.ElementTree as ET
# Counts and failing node ids from the JUnit report.
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == 'testsuite' else list(root)
counts = {k: sum(int(s.get(k, 0)) for s in suites)
          for k in ('tests', 'failures', 'errors', 'skipped')}
passed = counts['tests'] - counts['failures'] - counts['errors'] - counts['skipped']
print(f"[compat {sys.argv[2]}] {passed} passed, {counts['failures']} failed, "
      f"{counts['errors']} errors, {counts['skipped']} skipped")
for case in root.iter('testcase'):
    for kind in ('failure', 'error'):
        if case.find(kind) is not None:
            print(f"[compat {sys.argv[2]}] {kind.upper()}: "
                  f"{case.get('classname')}::{case.get('name')}")
EOF
exit "$status"
