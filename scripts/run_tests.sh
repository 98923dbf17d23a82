#!/usr/bin/env bash
# Set up the test environments (if needed, side by side) and run the tests: three jobs, each in
# its own virtual environment, one after the other. Extra arguments go to the main job's pytest.
#
#   main    the default interpreter (python3, 3.11 here), every extra: scripts/setup_env.sh's
#           environment with SRET_TIMM=1 (torch, torchvision and timm that import together, so
#           that the vision models are tested against timm's own model tests and scripts). The
#           whole suite; a missing fairseq or timm is a failure (SRET_REQUIRE_FAIRSEQ,
#           SRET_REQUIRE_TIMM).
#   lean    Python 3.13 without fairseq, as a vision or transformers user installs the package
#           (`pip install -e '.[hf,timm,vision,test]'`): the quick tier; the translation tests
#           skip, everything else must pass without fairseq.
#   py3.12  Python 3.12 with fairseq and timm (`.[fairseq,test]`, SRET_TIMM=1): the quick tier.
#
# The quick tier is `-m "not e2e and not fuzz and not slow"`. An interpreter that is not there
# (neither on PATH nor in pyenv) skips its job with the reason printed. Downloads are shared
# through pip's cache. SRET_TEST_JOBS chooses jobs (default: "main lean py3.12");
# SRET_TEST_WORKERS the pytest workers of each job (default: one per core).
set -uo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
jobs="${SRET_TEST_JOBS:-main lean py3.12}"
workers="${SRET_TEST_WORKERS:-auto}"
quick=(-m "not e2e and not fuzz and not slow")
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # one torch thread per pytest worker
summary=()
status=0

# the interpreter for Python $1 (e.g. 3.12): on PATH, else the newest in pyenv; empty if none
# runs (a pyenv shim on PATH for a version that is not selected does not)
find_python() {
    local candidate
    for candidate in "$(command -v "python$1" 2>/dev/null)" \
            $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}/versions/$1".*/bin/"python$1" 2>/dev/null | sort -rV); do
        if [ -n "$candidate" ] && "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$1'.split('.'))))" 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
}

for job in $jobs; do  # before any set-up starts in the background
    case "$job" in
        main|lean|py3.12) ;;
        *) echo "[tests] unknown job $job in SRET_TEST_JOBS (main, lean, py3.12)" >&2
           exit 2 ;;
    esac
done

# The environments are set up side by side (a set-up is one pip process, much of it waiting on
# downloads, the disk and decompression), then each job's pytest runs alone on every core.
setup_dir="$(mktemp -d)"
trap 'rm -rf "$setup_dir"' EXIT
names=() venvs=() pids=() started=()

# add_job NAME VENV PYTHON EXTRAS: start setting up its environment in the background
add_job() {
    local name="$1" venv="$2" python="$3" extras="$4"
    echo "[tests] job $name: $("$python" --version 2>&1), extras $extras: setting up $venv"
    names+=("$name") venvs+=("$venv")
    started+=("$(date +%s)")
    SRET_VENV="$venv" PYTHON="$python" SRET_EXTRAS="$extras" SRET_TIMM=1 \
        bash "$repo/scripts/setup_env.sh" > "$setup_dir/$name.log" 2>&1 &
    pids+=($!)
}

for job in $jobs; do
    case "$job" in
        main)
            add_job main "${SRET_VENV:-$repo/.venv}" "${PYTHON:-python3}" fairseq,test ;;
        lean)
            python="$(find_python 3.13)"
            if [ -z "$python" ]; then
                summary+=("lean: skipped, no Python 3.13 on PATH or in pyenv")
                continue
            fi
            venv="$repo/.venv-py3.13-lean"
            if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import fairseq" 2>/dev/null; then
                summary+=("lean: FAILED, $venv has fairseq installed; remove the folder")
                status=1
                continue
            fi
            add_job lean "$venv" "$python" hf,timm,vision,test ;;
        py3.12)
            python="$(find_python 3.12)"
            if [ -z "$python" ]; then
                summary+=("py3.12: skipped, no Python 3.12 on PATH or in pyenv")
                continue
            fi
            add_job py3.12 "$repo/.venv-py3.12" "$python" fairseq,test ;;
    esac
done

ready=()
for i in "${!names[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    setup_s=$(( $(date +%s) - ${started[$i]} ))
    sed "s/^/[setup ${names[$i]}] /" "$setup_dir/${names[$i]}.log"
    if [ $rc -eq 0 ]; then
        ready+=("$i:$setup_s")
    else
        summary+=("${names[$i]}: FAILED to set up the environment (exit $rc, $setup_s s)")
        status=1
    fi
done

for entry in "${ready[@]}"; do
    i="${entry%%:*}" setup_s="${entry#*:}"
    name="${names[$i]}" venv="${venvs[$i]}"
    # main: every test, a missing fairseq or timm an error; the others: the quick tier
    [ "$name" = main ] && export SRET_REQUIRE_FAIRSEQ=1 SRET_REQUIRE_TIMM=1 || unset SRET_REQUIRE_FAIRSEQ SRET_REQUIRE_TIMM
    echo "[tests] job $name: running pytest ($workers workers)"
    start=$(date +%s)
    if [ "$name" = main ]; then
        "$venv/bin/python" -m pytest tests -n "$workers" --dist loadfile --durations 15 "$@"
    else
        "$venv/bin/python" -m pytest tests -n "$workers" --dist loadfile -q "${quick[@]}"
    fi
    rc=$?
    summary+=("$name: $([ $rc -eq 0 ] && echo passed || echo "FAILED (pytest exit $rc)") in $(( $(date +%s) - start )) s of pytest, $setup_s s of set-up (side by side)")
    [ $rc -eq 0 ] || status=1
done
unset SRET_REQUIRE_FAIRSEQ SRET_REQUIRE_TIMM

echo "[tests] summary:"
for line in "${summary[@]}"; do
    echo "[tests]   $line"
done
exit $status
