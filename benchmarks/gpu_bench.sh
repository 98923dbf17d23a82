#!/usr/bin/env bash
# The prepared GPU benchmark run: the fp16 checks (gpu_checks), sliced attention, Theorem 1
# FLOPs and vision throughput against timm, each as `python -m benchmarks.NAME` from the
# repository root. Needs torch (and timm for the baselines); never imports fairseq. Writes at
# most 8 logs to $OUT.
#
#   OUT=/some/dir bash benchmarks/gpu_bench.sh       # on the GPU machine, from anywhere
#   SMOKE=1 OUT=/tmp/x bash benchmarks/gpu_bench.sh  # CPU dry run of the same steps, tiny sizes
#   GPU_BENCH_STEPS="attention theorem1" ...         # only these steps
#   GRAPH_VARIANT=1 ...                               # also the CUDA-graph variant, last (experimental)
#
# Budget: BUDGET seconds (default 335) for everything; each step runs under `timeout`,
# and the torch.compile steps (last) get only what is left, so the whole run stays under
# ~6 minutes on an H100. Logs: summary.txt (environment, steps, exit codes, times),
# gpu_checks.txt, attention.txt, theorem1.txt, vision.txt, vision_compile.txt (vision_graph.txt).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"  # `python -m` finds benchmarks/ and fairseq_sret/ here
export PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT to the folder for the logs}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
SMOKE="${SMOKE:-0}"
BUDGET="${BUDGET:-335}"
start=$SECONDS
summary="$OUT/summary.txt"  # environment, then one line per step
: > "$summary"

left() { echo $(( BUDGET - (SECONDS - start) )); }

# step NAME MAX_SECONDS COMMAND...: run with a timeout of min(MAX_SECONDS, time left)
step() {
    local name="$1" max="$2"; shift 2
    if [[ -n "${GPU_BENCH_STEPS:-}" && " $GPU_BENCH_STEPS " != *" $name "* ]]; then
        return  # not selected
    fi
    local limit; limit=$(left)
    (( limit > max )) && limit=$max
    if (( limit < 15 )); then
        echo "$name: skipped (budget spent)" | tee -a "$summary"
        return
    fi
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$summary"
    timeout -k 10 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    local rc=$?
    echo "   rc=$rc after $(( SECONDS - t0 ))s (total $(( SECONDS - start ))s)" | tee -a "$summary"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "git: $(git rev-parse --short HEAD 2>/dev/null || echo n/a) $(git status --porcelain 2>/dev/null | wc -l) changed files"
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    "$PY" - <<'PYEOF'
import platform, os, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda,
      "| cudnn", torch.backends.cudnn.version(), "| cpus", os.cpu_count())
if torch.cuda.is_available():
    print("gpu", torch.cuda.get_device_name(), torch.cuda.get_device_capability())
try:
    import timm; print("timm", timm.__version__)
except Exception as e:
    print("timm not importable:", e)
try:
    import fairseq; print("fairseq present (unused)")
except Exception:
    print("fairseq absent (not needed)")
PYEOF
} 2>&1 | tee -a "$summary"

if [[ "$SMOKE" == 1 ]]; then
    S=(--smoke); DEV=(--device cpu)
    VISION=(--smoke)
    GRAPH=()
    COMPILE=()
    [[ "${SMOKE_COMPILE:-0}" == 1 ]] && COMPILE=(--smoke --models sret_t --variants eager --compile sret_t)
else
    S=(); DEV=(--device cuda)
    VISION=(--models sret_t deit_tiny_patch16_224 sret_tl sret_s deit_small_patch16_224 pit_ti_224 pit_s_224
            --variants eager cl --timm-variants eager --warmup 3 --iters 10 --rounds 3
            --time-budget 90 --profile sret_t deit_tiny_patch16_224)
    # No `graph` variant: in the first device run (H100, torch 2.11) both vision steps died
    # with "CUDA error: an illegal memory access" once CUDA-graph variants had been
    # captured, and the rerun without them completed. GRAPH_VARIANT=1 runs them in a process of
    # their own (a CUDA fault ends the process), after everything else.
    GRAPH=()
    [[ "${GRAPH_VARIANT:-0}" == 1 ]] && GRAPH=(--models sret_t deit_tiny_patch16_224 --modes infer
           --variants eager graph --warmup 3 --iters 10 --rounds 3 --time-budget 45)
    # torch.compile (cl + default mode): SReT-T first, DeiT-T only if the budget has room;
    # the eager and channels-last rows of both are re-measured in the same process for the ratios
    COMPILE=(--models deit_tiny_patch16_224 sret_t --variants eager cl --compile sret_t deit_tiny_patch16_224
             --warmup 3 --iters 10 --rounds 3 --compile-estimate 40 90)
fi

if [[ "$SMOKE" == 1 ]]; then
    step gpu_checks 75 "$PY" -m benchmarks.gpu_checks --device cpu --updates 3 --batch 8
else
    step gpu_checks 75 "$PY" -m benchmarks.gpu_checks
fi
step attention 75 "$PY" -m benchmarks.bench_attention "${DEV[@]}" "${S[@]}"
step theorem1 40 "$PY" -m benchmarks.bench_theorem1 "${DEV[@]}" "${S[@]}"
step vision 150 "$PY" -m benchmarks.bench_vision "${VISION[@]}" "${DEV[@]}"
if (( ${#COMPILE[@]} )); then
    # the python budget (compile variants that would not fit are skipped) sits inside the timeout
    step vision_compile 400 "$PY" -m benchmarks.bench_vision "${COMPILE[@]}" "${DEV[@]}" --time-budget $(( $(left) - 30 ))
fi
if (( ${#GRAPH[@]} )); then
    step vision_graph 70 "$PY" -m benchmarks.bench_vision "${GRAPH[@]}" "${DEV[@]}"
fi
echo "done in $(( SECONDS - start ))s" | tee -a "$summary"
