#!/usr/bin/env bash
# Set up the test environment (if needed) and run the test suite. Extra arguments go to pytest.
# The test environment is scripts/setup_env.sh's with SRET_TIMM=1: torch, torchvision and timm
# that import together, so that the vision models are tested against timm's own model tests
# and scripts (tests/vision/test_timm.py; SRET_REQUIRE_TIMM=1 makes a missing timm a failure).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SRET_TIMM=1 bash "$repo/scripts/setup_env.sh"
venv="${SRET_VENV:-$repo/.venv}"
cd "$repo"
echo "[tests] running pytest"
SRET_REQUIRE_TIMM=1 exec "$venv/bin/python" -m pytest tests "$@"
