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
# One pytest worker per core (SRET_TEST_WORKERS to choose), each file's tests in one worker
# (module-scoped fixtures are built once); one torch thread per worker.
workers="${SRET_TEST_WORKERS:-auto}"
echo "[tests] running pytest ($workers workers)"
OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" SRET_REQUIRE_TIMM=1 exec "$venv/bin/python" -m pytest tests -n "$workers" --dist loadfile "$@"
