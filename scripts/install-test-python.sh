#!/usr/bin/env bash
# A Python virtual environment with the official `openai` client (pinned) for the server tests.
#
# Created once under the cache directory and reused; a second run only checks that the pinned
# version is installed. Usage: scripts/install-test-python.sh [DIR]
# (default ${AIRS_VENV_DIR:-~/.cache/airs/venv}). Prints the venv's python on its last line.
set -euo pipefail

dir=${1:-${AIRS_VENV_DIR:-$HOME/.cache/airs/venv}}
openai_version=3.57.0
python=$dir/bin/python
if [ -x "$python" ] && "$python" -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
  echo "$python"
  exit 0
fi
python3 -m venv "$dir" >&2 || {
  echo "error: python3 -m venv failed (Debian: apt-get install python3-venv)" >&2
  exit 1
}
"$python" -m pip install --quiet --disable-pip-version-check "openai==$openai_version" >&2
"$python" -c "import openai; print('openai', openai.__version__)" >&2
echo "$python"
