#!/usr/bin/env bash
# The prepared GPU benchmark run, one command on an H100/H200 (about 7.5 minutes):
#
#   OUT=/some/dir bash benchmarks/gpu_bench.sh       # on the GPU machine, from anywhere
#   SMOKE=1 OUT=/tmp/x bash benchmarks/gpu_bench.sh  # CPU dry run of the same steps, tiny sizes
#   GPU_BENCH_STEPS="attention graph" ...             # only these steps
#   BUDGET=900 ...                                    # more time: the compile step gets the rest
#
# Steps, in priority order, each `python -m benchmarks.NAME` from the repository root under
# `timeout` (min of its own limit and the time left of BUDGET seconds, default 440):
#   vision     before/after of every fast path on SReT-T, SReT-T w/o slice and SReT-S (3op = the
#              code before: LRC as three kernels, no Triton, packed attention groups; packed = no
#              one-kernel attention; eager = the defaults (no Triton kernel in eager mode,
#              three-kernel LRC in training); lean = the LRC's lean backward in training too;
#              triton = the Triton kernel in eager mode too; fold = fold_lrc), each against
#              DeiT-T / DeiT-S eager; inference batch 256 + training batch 128, bf16 autocast;
#              torch.profiler tables of SReT-T (eager and folded) and DeiT-T
#   graph      CUDA graphs of SReT-T (default: Triton kernel captured; nofuse; folded) and DeiT-T
#              captured in ONE process (the
#              condition of the first run's illegal memory access), against eager; then the first
#              run's code (--graph-drop-references) in a process of its own, expected to fail
#   attention  sliced attention module, G=8 vs G=1 over lengths 128-4096, and the one-kernel
#              (masked) path against packed groups for short and padded sequences
#   lrc        the LRC residual alone and with its LayerNorm: 3op, one-op (addcmul), the Triton
#              kernel, folded, at SReT-T/SReT-S stream sizes (kernel-level before/after)
#   nmt        fairseq-train target tokens/s and fairseq-generate beam-5 sentences/s (also after the
#              first batch: a one-batch split generated on its own, its time subtracted; SReT
#              also with SDPA in its decoding steps, the code before the matrix products), fp16
#              (bf16: --precisions), sret_transformer_iwslt_de_en vs pre-LN transformer_iwslt_de_en; fairseq is
#              installed from the git-ignored .gpu-kit/ of the checkout (a copy of
#              ../shared/gpu-kit; pass it with the run's carry) when it is not importable
#              then benchmarks.bench_nmt (fp32): the same two models built in one process, training
#              step and beam-5 generation timed round-robin (SReT also with its LRC kept apart at
#              generation, --keep-lrc), with torch.profiler tables of each;
#              NMT_COMPILE=1 adds generation with the decoder layers compiled (--compile-decoder:
#              fairseq's layers one by one, SReT's shared layers once each) and gives it 240 s
#   compile    torch.compile (channels-last, default mode) of SReT-T and DeiT-T, inference then
#              training, as the remaining time allows, against eager in the same process
#   compile_more  the same for SReT-S / DeiT-S and the folded SReT-T, only with > 2 minutes left
#              (not in the default budget: run it as a second call, see COMPILE_MORE below)
#   sanitizer  compute-sanitizer memcheck of two graph captures in one process with the fix (last;
#              50 s are kept for it when the CUDA toolkit's compute-sanitizer is installed)
# Logs in $OUT: summary.txt (environment, steps, exit codes, times) and one NAME.txt per step
# (at most 9 files); the NMT corpus, data-bin and checkpoints go to $GPU_BENCH_WORK (default
# /tmp/sret_gpu_bench).
set -uo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"  # `python -m` finds benchmarks/ and fairseq_sret/ here
export PYTHONUNBUFFERED=1
OUT="${OUT:?set OUT to the folder for the logs}"
mkdir -p "$OUT"
PY="${PYTHON:-python}"
SMOKE="${SMOKE:-0}"
NMT_COMPILE="${NMT_COMPILE:-0}"
BUDGET="${BUDGET:-440}"
KIT="${GPU_KIT:-$repo/.gpu-kit}"  # else shared/gpu-kit (a checkout's shared/ travels to the device too)
[[ -f "$KIT/install.sh" || -n "${GPU_KIT:-}" ]] || KIT="$repo/shared/gpu-kit"
WORK="${GPU_BENCH_WORK:-${TMPDIR:-/tmp}/sret_gpu_bench}"
start=$SECONDS
summary="$OUT/summary.txt"  # environment, then one line per step
: > "$summary"
rm -f "$OUT"/{vision,graph,attention,lrc,nmt,compile,compile_more,sanitizer}.txt  # steps append

left() { echo $(( BUDGET - (SECONDS - start) )); }

selected() { [[ -z "${GPU_BENCH_STEPS:-}" || " $GPU_BENCH_STEPS " == *" $1 "* ]]; }

# step NAME MAX_SECONDS COMMAND...: run with a timeout of min(MAX_SECONDS, time left)
step() {
    local name="$1" max="$2"; shift 2
    selected "$name" || return 0
    local limit; limit=$(left)
    (( limit > max )) && limit=$max
    if (( limit < 15 )); then
        echo "$name: skipped (budget spent)" | tee -a "$summary"
        return
    fi
    local t0=$SECONDS
    echo "== $name (limit ${limit}s): $*" | tee -a "$summary"
    timeout -k 10 "$limit" "$@" >> "$OUT/$name.txt" 2>&1
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
for name in ("timm", "triton", "fairseq"):
    try:
        module = __import__(name); print(name, getattr(module, "__version__", "present"))
    except Exception as e:
        print(name, "not importable:", type(e).__name__)
from fairseq_sret.core import fused
print("fused residual+LRC+LayerNorm kernel available:", fused.triton_available())
PYEOF
} 2>&1 | tee -a "$summary"

if [[ "$SMOKE" == 1 ]]; then
    DEV=(--device cpu)
    VISION=(--smoke --variants 3op eager fold --profile sret_t)
    GRAPH=()
    ATTENTION=(--smoke --skip-parity)
    LRC=(--smoke)
    NMT=(--smoke --sdpa-decoding)
    DECODE=(--smoke --profile --no-memory --sdpa-decoding --keep-lrc)
    COMPILE=()
    COMPILE_MORE=()
    [[ "${SMOKE_COMPILE:-0}" == 1 ]] && COMPILE=(--smoke --models sret_t --variants eager --compile sret_t)
else
    DEV=(--device cuda)
    VISION=(--models sret_t deit_tiny_patch16_224 sret_t_wo_slice:eager,fold sret_s:3op,packed,eager,triton,fold
            deit_small_patch16_224 --variants 3op packed eager lean triton fold --timm-variants eager
            --warmup 3 --iters 10 --rounds 3 --time-budget 120 --profile sret_t sret_t:fold deit_tiny_patch16_224)
    GRAPH=(--models sret_t deit_tiny_patch16_224 --modes infer --variants eager graph nofuse+graph fold+graph
           --timm-variants eager graph --warmup 3 --iters 10 --rounds 3 --time-budget 40)
    # batch 256 as in the first run: its 154 MB input is a segment of its own, which the second
    # capture's empty_cache returns to the driver once the first graph's input is freed
    GRAPH_REPRO=(--models sret_t deit_tiny_patch16_224 --modes infer --variants graph --timm-variants graph
                 --warmup 1 --iters 3 --rounds 1 --device cuda)
    GRAPH_SMALL=(--models sret_t deit_tiny_patch16_224 --modes infer --variants graph --timm-variants graph
                 --batch-infer 8 --warmup 1 --iters 1 --rounds 1 --no-memory --device cuda)
    ATTENTION=(--lengths 128 256 512 1024 4096 --groups 1 8 --skip-parity
               --one-kernel-lengths 32 64 128 256 512 --one-kernel-groups 2 8)
    LRC=(--dtype bfloat16)
    # fp16 and bf16 together outrun the step's limit; SReT's checkpoint also generates with
    # SDPA in its decoding steps (the code before the matrix-product path), in the same call
    NMT=(--precisions fp16 --sdpa-decoding)
    # the models of the nmt step in one process, with torch.profiler tables of a training step
    # and of a beam-5 generation batch: where SReT's decoding time goes on the GPU
    DECODE=(--gen-batch 64 --warmup 1 --iters 2 --rounds 3 --profile --sdpa-decoding --keep-lrc)
    # compiled vs compiled: SReT-T and DeiT-T, inference first, then training; eager rows of both
    # again in the same process. compile_more (the S pair, the folded SReT-T) runs when time is
    # left, e.g. in a second call: GPU_BENCH_STEPS=compile_more BUDGET=420 OUT=... bash benchmarks/gpu_bench.sh
    COMPILE=(--models sret_t deit_tiny_patch16_224 --variants eager --timm-variants eager
             --compile sret_t deit_tiny_patch16_224 --compile-variants compile --compile-priority infer
             --warmup 3 --iters 10 --rounds 3 --compile-estimate 40 90)
    COMPILE_MORE=(--models sret_s deit_small_patch16_224 sret_t --variants eager --timm-variants eager
                  --compile sret_s deit_small_patch16_224 sret_t --compile-variants compile fold+compile
                  --compile-priority infer --warmup 3 --iters 10 --rounds 3 --compile-estimate 40 90)
fi

step vision 130 "$PY" -m benchmarks.bench_vision "${VISION[@]}" "${DEV[@]}"

if (( ${#GRAPH[@]} )); then
    step graph 60 "$PY" -m benchmarks.bench_vision "${GRAPH[@]}" "${DEV[@]}"
    # the first run's code (only graph.replay kept): expected to end in "an illegal memory access"
    # (or NaN rows) once the second capture's empty_cache has unmapped the first graph's tensors
    selected graph && echo "--- graph: reproduction of the first run's bug (--graph-drop-references), expected to fail" >> "$OUT/graph.txt"
    step graph 30 "$PY" -m benchmarks.bench_vision "${GRAPH_REPRO[@]}" --graph-drop-references
fi

step attention 45 "$PY" -m benchmarks.bench_attention "${ATTENTION[@]}" "${DEV[@]}"
step lrc 30 "$PY" -m benchmarks.bench_lrc "${LRC[@]}" "${DEV[@]}"

if selected nmt; then
    if ! "$PY" -c "import fairseq" >/dev/null 2>&1; then
        if [[ -f "$KIT/install.sh" ]]; then
            echo "nmt: installing fairseq from $KIT into $WORK/fairseq-site" | tee -a "$summary"
            bash "$KIT/install.sh" "$WORK/fairseq-site" >> "$OUT/nmt.txt" 2>&1
            export PYTHONPATH="$WORK/fairseq-site${PYTHONPATH:+:$PYTHONPATH}"
        else
            echo "nmt: fairseq not importable and no kit at $KIT (copy /work/shared/gpu-kit there)" | tee -a "$summary"
        fi
    fi
    step nmt 260 "$PY" -m benchmarks.bench_fairseq_cli --work "$WORK/nmt" "${NMT[@]}"
    # then the Python-level benchmark, appended to nmt.txt (the device returns at most 8 files)
    echo "--- nmt: benchmarks.bench_nmt, the same models in one process, profiled" >> "$OUT/nmt.txt"
    if [[ "$NMT_COMPILE" == 1 ]]; then
        step nmt 240 "$PY" -m benchmarks.bench_nmt "${DECODE[@]}" --compile-decoder "${DEV[@]}"
    else
        step nmt 90 "$PY" -m benchmarks.bench_nmt "${DECODE[@]}" "${DEV[@]}"
    fi
fi

SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)"
RESERVE=0
[[ -n "$SAN" && ${#GRAPH[@]} -gt 0 ]] && selected sanitizer && RESERVE=50  # kept for the memcheck run
if (( ${#COMPILE[@]} )); then
    # the python budget (compile variants that would not fit are skipped) sits inside the timeout
    step compile $(( $(left) - RESERVE )) "$PY" -m benchmarks.bench_vision "${COMPILE[@]}" "${DEV[@]}" \
        --time-budget $(( $(left) - RESERVE - 25 ))
fi
if (( ${#COMPILE_MORE[@]} )) && (( $(left) > 120 )); then
    step compile_more 400 "$PY" -m benchmarks.bench_vision "${COMPILE_MORE[@]}" "${DEV[@]}" --time-budget $(( $(left) - 25 ))
fi
if (( ${#GRAPH[@]} )) && selected sanitizer; then
    if [[ -n "$SAN" ]]; then
        # memcheck over two graph captures in one process, with the fix: expect "ERROR SUMMARY: 0 errors"
        step sanitizer 50 "$SAN" --tool memcheck --leak-check no --print-limit 20 \
            "$PY" -m benchmarks.bench_vision "${GRAPH_SMALL[@]}"
    else
        echo "sanitizer: compute-sanitizer not found (CUDA toolkit not installed)" | tee -a "$summary"
    fi
fi
echo "done in $(( SECONDS - start ))s" | tee -a "$summary"
