#!/usr/bin/env bash
# The prepared GPU session for the translation tables: sret-experiments on one GPU with
# several trainings side by side, stopped in time to return its results.
#
# On this machine (once per session), put what the GPU machine needs into .gpu/ (git-ignored,
# ~8 MB: fairseq's offline installer and the raw Multi30k text):
#     bash benchmarks/gpu_experiments.sh --stage
# On the GPU machine, from the repository root, with .gpu carried:
#     OUT=$OUT bash benchmarks/gpu_experiments.sh examples/multi30k/experiments.yaml [--rows ...]
# Then copy $OUT/NAME.json, NAME.md and the PNGs into docs/results/ and commit them: the runs
# recorded there count as done in the next session, so the table fills over several sessions
# (checkpoints are too large to come back; a run unfinished at the time limit starts over).
#
# Environment: MINUTES (training time limit, default 8), JOBS (trainings side by side,
# default 6), OUT (results folder, default docs/results), DRY_RUN=1 (print the commands),
# SMOKE=1 (the toy experiment on the CPU, a few updates: checks the script without a GPU).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
stage="$repo/.gpu"

if [ "${1:-}" = "--stage" ]; then
    mkdir -p "$stage"
    cp -r "$repo/../shared/gpu-kit" "$stage/"
    mkdir -p "$stage/multi30k_raw"
    cp "$repo"/../shared/data/multi30k/raw/* "$stage/multi30k_raw/"
    grep -qx "/.gpu/" "$repo/.git/info/exclude" 2>/dev/null || echo "/.gpu/" >> "$repo/.git/info/exclude"
    du -sh "$stage"
    exit 0
fi

experiment="${1:?usage: gpu_experiments.sh EXPERIMENT_FILE [sret-experiments options] | --stage}"
shift
out="${OUT:-docs/results}"
mkdir -p "$out"
name="$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1])).get('name'))" "$experiment")"
# results of earlier sessions: their runs are skipped
if [ -f "docs/results/$name.json" ] && [ ! -f "$out/$name.json" ]; then
    cp "docs/results/$name.json" "$out/"
fi

if [ "${SMOKE:-0}" = "1" ]; then
    work="$(mktemp -d)"
    python3 - "$work" <<'PY'
import sys
from pathlib import Path
from fairseq_sret_cli.toy import write_reversal_corpus
raw = write_reversal_corpus(Path(sys.argv[1]) / "m30k", [("train", 600), ("val", 40), ("test_2016_flickr", 30),
                                                         ("test_2017_flickr", 30)], vocab_size=16)
for p in list(raw.iterdir()):
    p.rename(p.with_suffix(".de" if p.suffix == ".src" else ".en"))
PY
    python3 -m fairseq_sret_cli.prepare multi30k --src "$work/m30k" --out "$work/bin" --vocab-size 60 > /dev/null
    exec python3 -m fairseq_sret_cli.experiments examples/toy/experiments.yaml --data "$work/bin" \
        --output "$work/runs" --results "$out" --cpu --jobs 2 --max-update 10 --progress-interval 10 "$@"
fi

if [ ! -d "$stage/gpu-kit" ]; then
    echo "no $stage/gpu-kit: run 'bash benchmarks/gpu_experiments.sh --stage' here first and carry .gpu" >&2
    exit 2
fi
if ! python3 -c "import fairseq" 2>/dev/null; then
    bash "$stage/gpu-kit/install.sh" /tmp/fairseq-site > /dev/null
    export PYTHONPATH="/tmp/fairseq-site:$repo${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONUNBUFFERED=1
data=/tmp/sret-data/multi30k_de_en
python3 -m fairseq_sret_cli.prepare multi30k --src "$stage/multi30k_raw" --out "$data" --workers 8 > /dev/null
gpu="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || echo GPU)"
args=("$experiment" --data "$data" --output /tmp/sret-runs --results "$out" --jobs "${JOBS:-6}"
      --time-limit "${MINUTES:-8}" --progress-interval 60 --note "$gpu, ${JOBS:-6} trainings side by side")
if [ "${DRY_RUN:-0}" = "1" ]; then
    args+=(--dry-run)
fi
python3 -m fairseq_sret_cli.experiments "${args[@]}" "$@"
