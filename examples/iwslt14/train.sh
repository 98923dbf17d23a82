#!/usr/bin/env bash
# IWSLT'14 De->En with the paper's hyper-parameters (appendix, Table "Training details of our
# language models"): SReT (default), its no-LRC ablation, or the fairseq baseline; then the
# evaluation (tokenized BLEU as in the IWSLT literature + lowercased sacreBLEU). Needs a GPU.
#
#   bash examples/iwslt14/train.sh [sret|sret-nolrc|baseline]
#
# Environment (optional):
#   SRC         de-en.tgz or its extracted folder, for the preparation (default: download)
#   DATA        data-bin (default data-bin/iwslt14_de_en; prepared first if missing)
#   SAVE_DIR    checkpoints (default checkpoints/iwslt14_<model>)
#   MAX_EPOCH   training length (default 50; the paper does not state it)
#   AVERAGE_LAST  evaluate the average of the last N epoch checkpoints (default 0: checkpoint_best.pt)
#   EXTRA_ARGS  more fairseq-train arguments (e.g. "--fp16")
#   EVAL_ARGS   more sret-evaluate arguments (e.g. "--subset valid --generate-args=--max-len-b=50")
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${SRET_VENV:-$repo/.venv}/bin/python"
[ -x "$py" ] || py=python
model="${1:-sret}"
case "$model" in
    sret) arch=sret_transformer_iwslt_de_en; model_args=() ;;
    sret-nolrc) arch=sret_transformer_iwslt_de_en; model_args=(--no-lrc) ;;
    baseline) arch=transformer_iwslt_de_en; model_args=() ;;
    *) echo "usage: $0 [sret|sret-nolrc|baseline]" >&2; exit 2 ;;
esac
data="${DATA:-$repo/data-bin/iwslt14_de_en}"
save_dir="${SAVE_DIR:-$repo/checkpoints/iwslt14_$model}"

if [ ! -f "$data/sret_data.json" ]; then
    "$py" -m fairseq_sret_cli.prepare iwslt14 ${SRC:+--src "$SRC"} --out "$data" --workers "$(nproc)"
fi

mkdir -p "$save_dir"
# shellcheck disable=SC2086
"$py" -m fairseq_cli.train "$data" --user-dir "$repo/fairseq_sret" \
    --arch "$arch" ${model_args[@]+"${model_args[@]}"} --share-decoder-input-output-embed \
    --optimizer adam --adam-betas "(0.9,0.98)" --clip-norm 0.0 \
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 \
    --dropout 0.3 --weight-decay 0.0001 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens 4096 --max-epoch "${MAX_EPOCH:-50}" \
    --save-dir "$save_dir" --keep-last-epochs 10 \
    --log-format simple --log-interval 100 ${EXTRA_ARGS:-} 2>&1 | tee -a "$save_dir/train.log"

# shellcheck disable=SC2086
if [ "${AVERAGE_LAST:-0}" -gt 1 ]; then
    "$py" -m fairseq_sret_cli.evaluate --data "$data" --checkpoint-dir "$save_dir" --average-last "$AVERAGE_LAST" \
        --beam 5 --output-dir "$save_dir/eval" ${EVAL_ARGS:-}
else
    "$py" -m fairseq_sret_cli.evaluate --data "$data" --checkpoint "$save_dir/checkpoint_best.pt" \
        --beam 5 --output-dir "$save_dir/eval" ${EVAL_ARGS:-}
fi
