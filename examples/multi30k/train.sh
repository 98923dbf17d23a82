#!/usr/bin/env bash
# Multi30k De->En on the CPU with the quick start's budget and schedule: the SReT model
# (default) or the fairseq transformer baseline of the same width, each in its own run folder.
#
#   bash examples/multi30k/train.sh [sret|baseline]
#
# Every SRET_* setting of scripts/quickstart.sh applies (SRET_TRAIN_MINUTES, SRET_LR, ...,
# SRET_DATA_MULTI30K); the run folder defaults to runs/multi30k-<model>.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
model="${1:-sret}"
case "$model" in
    sret)
        export SRET_ARCH="${SRET_ARCH:-sret_transformer_tiny}" ;;
    baseline)
        # fairseq's transformer at the tiny SReT's width: 3+3 layers, 256/1024, 4 heads
        export SRET_ARCH=transformer
        export SRET_MODEL_ARGS="--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256
            --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4
            --decoder-attention-heads 4 ${SRET_MODEL_ARGS:-}" ;;
    *) echo "usage: $0 [sret|baseline]" >&2; exit 2 ;;
esac
export SRET_RUN_DIR="${SRET_RUN_DIR:-$repo/runs/multi30k-$model}"
exec bash "$repo/scripts/quickstart.sh"
