#!/usr/bin/env bash
# The quick start ("main job"): set up .venv, get Multi30k, prepare it (joint SentencePiece
# 8K), train a small SReT model on the CPU for a fixed number of updates (the same model on
# every machine; about 25 minutes in all on a 2-core CPU), then translate test_2016_flickr
# De->En and print its sacreBLEU and the path of the trained model.
#
#   bash scripts/quickstart.sh [--data DIR] [--run-dir DIR]
#
# Data: --data DIR, else $SRET_DATA_MULTI30K, else ../shared/data/multi30k/raw if present,
# else a download from the multi30k/dataset repository. Everything the run writes goes to
# the run folder (default runs/multi30k/): data-bin/, checkpoints/, train.log, eval/.
# Re-running continues the run in that folder (fairseq resumes from checkpoint_last.pt;
# once all updates are done it only evaluates); SRET_FRESH=1 starts it over. Progress:
# "update N/TOTAL" lines, and after the first minute the expected training time here.
#
# Settings (environment variables, all optional):
#   SRET_ARCH            model architecture (default sret_transformer_tiny; the fairseq baseline:
#                        SRET_ARCH=transformer SRET_MODEL_ARGS="--encoder-layers 3 --decoder-layers 3
#                        --encoder-embed-dim 256 --decoder-embed-dim 256 --encoder-ffn-embed-dim 1024
#                        --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4")
#   SRET_MODEL_ARGS      extra model arguments
#   SRET_MAX_UPDATE      training updates (default 1300: about 25 minutes of training on a
#                        2-core CPU; chosen with examples/multi30k/quickstart_candidates.yaml)
#   SRET_TRAIN_MINUTES   also stop after this many minutes (default 0: no time limit; a time
#                        limit makes the result depend on the machine's speed)
#   SRET_LR (2e-3)  SRET_WARMUP (600)  SRET_LR_SCHEDULER (inverse_sqrt)  SRET_MAX_TOKENS (2048)
#   SRET_DROPOUT (0.1)  SRET_WEIGHT_DECAY (0.0001)  SRET_LABEL_SMOOTHING (0.1)  SRET_SEED (1)
#   SRET_TRAIN_ARGS      extra fairseq-train arguments
#   SRET_VOCAB           joint SentencePiece vocabulary size (default 8000)
#   SRET_CHECKPOINT      checkpoint to evaluate: last (default) or best
#   SRET_AVERAGE_LAST    average the last N epoch checkpoints for the evaluation (default 0: off)
#   SRET_BEAM (5)  SRET_LENPEN (1.0)  SRET_EVAL_ARGS (extra fairseq-generate arguments)
#   SRET_RUN_DIR         run folder (default runs/multi30k)
#   SRET_FRESH=1         delete the run's checkpoints and start training over
#   SRET_SKIP_SETUP=1    skip scripts/setup_env.sh (an environment that is already set up)
#   SRET_VENV            the virtual environment (default .venv, as for setup_env.sh)
#   OMP_NUM_THREADS      CPU threads (default: all cores)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

data="${SRET_DATA_MULTI30K:-}"
run_dir="${SRET_RUN_DIR:-$repo/runs/multi30k}"
while [ $# -gt 0 ]; do
    case "$1" in
        --data) data="$2"; shift 2 ;;
        --data=*) data="${1#*=}"; shift ;;
        --run-dir) run_dir="$2"; shift 2 ;;
        --run-dir=*) run_dir="${1#*=}"; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if [ "${SRET_SKIP_SETUP:-0}" = "1" ]; then
    echo "[quickstart] SRET_SKIP_SETUP=1: using the environment as it is"
else
    bash "$repo/scripts/setup_env.sh"
fi
py="${SRET_VENV:-$repo/.venv}/bin/python"
start=$(date +%s)
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc 2>/dev/null || echo 2)}"
mkdir -p "$run_dir"
run_dir="$(cd "$run_dir" && pwd)"
bin_dir="$run_dir/data-bin"
ckpt_dir="$run_dir/checkpoints"

# ------------------------------------------------------------------ data
if [ -z "$data" ] && [ -d "$repo/../shared/data/multi30k/raw" ]; then
    data="$(cd "$repo/../shared/data/multi30k/raw" && pwd)"
fi
src_args=()
if [ -n "$data" ]; then
    echo "[quickstart] Multi30k from $data"
    src_args=(--src "$data")
else
    echo "[quickstart] no local Multi30k given (--data DIR or SRET_DATA_MULTI30K): downloading it"
fi
"$py" -m fairseq_sret_cli.prepare multi30k "${src_args[@]}" --out "$bin_dir" \
    --vocab-size "${SRET_VOCAB:-8000}" > /dev/null

# ------------------------------------------------------------------ training
arch="${SRET_ARCH:-sret_transformer_tiny}"
max_update="${SRET_MAX_UPDATE:-1300}"
minutes="${SRET_TRAIN_MINUTES:-0}"
if [ "${SRET_FRESH:-0}" = "1" ] && [ -d "$ckpt_dir" ]; then
    echo "[quickstart] SRET_FRESH=1: removing $ckpt_dir"
    rm -rf "$ckpt_dir"
fi
if [ -f "$ckpt_dir/checkpoint_last.pt" ]; then
    echo "[quickstart] continuing the run in $ckpt_dir (SRET_FRESH=1 starts over)"
fi
train_args=(
    "$bin_dir" --user-dir "$repo/fairseq_sret" --arch "$arch" --share-all-embeddings
    --optimizer adam --adam-betas "(0.9,0.98)" --clip-norm 0.0
    --lr "${SRET_LR:-2e-3}" --lr-scheduler "${SRET_LR_SCHEDULER:-inverse_sqrt}"
    --warmup-updates "${SRET_WARMUP:-600}" --warmup-init-lr 1e-7
    --dropout "${SRET_DROPOUT:-0.1}" --weight-decay "${SRET_WEIGHT_DECAY:-0.0001}"
    --criterion label_smoothed_cross_entropy --label-smoothing "${SRET_LABEL_SMOOTHING:-0.1}"
    --max-tokens "${SRET_MAX_TOKENS:-2048}" --max-update "$max_update"
    --save-dir "$ckpt_dir" --keep-last-epochs 5 --seed "${SRET_SEED:-1}"
    --log-format json --log-interval 10 --num-workers 0
)
if [ "$minutes" != "0" ]; then
    train_args+=(--stop-time-hours "$("$py" -c "print(float('$minutes') / 60)")")
fi
# shellcheck disable=SC2206
train_args+=(${SRET_MODEL_ARGS:-} ${SRET_TRAIN_ARGS:-})
echo "[quickstart] training $arch for $max_update updates (full log: $run_dir/train.log)"
set +e
"$py" -m fairseq_cli.train "${train_args[@]}" 2>&1 | tee -a "$run_dir/train.log" \
    | "$py" -m fairseq_sret_cli.experiment_runner.progress --total "$max_update" --minutes "$minutes" --prefix "[quickstart]"
status=("${PIPESTATUS[@]}")
set -e
if [ "${status[0]}" != "0" ]; then
    tail -n 30 "$run_dir/train.log" >&2
    echo "[quickstart] training failed (exit ${status[0]}); see $run_dir/train.log" >&2
    exit 1
fi

# ------------------------------------------------------------------ evaluation
if [ "${SRET_AVERAGE_LAST:-0}" -gt 1 ]; then
    model_args=(--checkpoint-dir "$ckpt_dir" --average-last "$SRET_AVERAGE_LAST")
    what="the average of the last $SRET_AVERAGE_LAST epoch checkpoints"
else
    model_args=(--checkpoint "$ckpt_dir/checkpoint_${SRET_CHECKPOINT:-last}.pt")
    what="$ckpt_dir/checkpoint_${SRET_CHECKPOINT:-last}.pt"
fi
echo "[quickstart] evaluating $what on test_2016_flickr"
"$py" -m fairseq_sret_cli.evaluate --data "$bin_dir" "${model_args[@]}" --subset test \
    --beam "${SRET_BEAM:-5}" --lenpen "${SRET_LENPEN:-1.0}" --output-dir "$run_dir/eval" \
    --generate-args "${SRET_EVAL_ARGS:-}"
elapsed=$(( $(date +%s) - start ))
"$py" - "$run_dir/eval/test.results.json" "$elapsed" <<'PY'
import json, sys
report = json.load(open(sys.argv[1]))
sacre = next(s for s in report["scores"] if s["name"] == "sacreBLEU")
elapsed = int(sys.argv[2])
print()
print(f"==> quick start done in {elapsed // 60}:{elapsed % 60:02d} (set-up excluded)")
print(f"==> sacreBLEU {report['direction']} on {report['subset_name']}: {sacre['score']:.2f}   ({sacre['signature']})")
print(f"==> trained model: {report['checkpoint']}")
PY
