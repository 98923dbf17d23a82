#!/usr/bin/env bash
# Set up the environment (if needed) and run the test suite. Extra arguments go to pytest.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$repo/scripts/setup_env.sh"
venv="${SRET_VENV:-$repo/.venv}"
cd "$repo"
echo "[tests] running pytest"
exec "$venv/bin/python" -m pytest tests "$@"
