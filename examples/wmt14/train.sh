#!/usr/bin/env bash
# WMT'14 En->De with the paper's hyper-parameters (appendix, Table "Training details of our
# language models"): SReT (default), its no-LRC ablation, or the fairseq baseline; then the
# evaluation on newstest2014 (sacreBLEU + compound-split BLEU) of the average of the last 5
# update checkpoints. Needs a GPU.
#
#   bash examples/wmt14/train.sh [sret|sret-nolrc|baseline]
#
# Environment (optional):
#   SRC          folder with the WMT'14 archives or files, for the preparation (default: download)
#   DATA         data-bin (default data-bin/wmt14_en_de; prepared first if missing)
#   SAVE_DIR     checkpoints (default checkpoints/wmt14_<model>)
#   MAX_TOKENS   tokens per GPU batch (default 4096, the paper's)
#   UPDATE_FREQ  gradient accumulation (default 8: 4096 x 8 tokens per update, as 8 GPUs would)
#   MAX_UPDATE   training length (default 100000; the paper does not state it)
#   AVERAGE_LAST update checkpoints to average for the evaluation (default 5; 1 = checkpoint_best.pt)
#   EXTRA_ARGS   more fairseq-train arguments (e.g. "--fp16")
#   EVAL_ARGS    more sret-evaluate arguments (e.g. "--subset valid --generate-args=--max-len-b=50")
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
py="${SRET_VENV:-$repo/.venv}/bin/python"
[ -x "$py" ] || py=python
model="${1:-sret}"
case "$model" in
    sret) arch=sret_transformer_wmt_en_de; model_args=() ;;
    sret-nolrc) arch=sret_transformer_wmt_en_de; model_args=(--no-lrc) ;;
    baseline) arch=transformer_wmt_en_de; model_args=() ;;
    *) echo "usage: $0 [sret|sret-nolrc|baseline]" >&2; exit 2 ;;
esac
data="${DATA:-$repo/data-bin/wmt14_en_de}"
save_dir="${SAVE_DIR:-$repo/checkpoints/wmt14_$model}"

if [ ! -f "$data/sret_data.json" ]; then
    "$py" -m fairseq_sret_cli.prepare wmt14 ${SRC:+--src "$SRC"} --out "$data" --workers "$(nproc)"
fi

mkdir -p "$save_dir"
# shellcheck disable=SC2086
"$py" -m fairseq_cli.train "$data" --user-dir "$repo/fairseq_sret" \
    --arch "$arch" ${model_args[@]+"${model_args[@]}"} --share-decoder-input-output-embed \
    --optimizer adam --adam-betas "(0.9,0.98)" --clip-norm 0.0 \
    --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 4000 \
    --dropout 0.3 --weight-decay 0.0001 \
    --criterion label_smoothed_cross_entropy --label-smoothing 0.1 \
    --max-tokens "${MAX_TOKENS:-4096}" --update-freq "${UPDATE_FREQ:-8}" --max-update "${MAX_UPDATE:-100000}" \
    --save-dir "$save_dir" --save-interval-updates 1000 --keep-interval-updates 10 --keep-last-epochs 2 \
    --log-format simple --log-interval 100 ${EXTRA_ARGS:-} 2>&1 | tee -a "$save_dir/train.log"

# shellcheck disable=SC2086
if [ "${AVERAGE_LAST:-5}" -gt 1 ]; then
    "$py" -m fairseq_sret_cli.evaluate --data "$data" --checkpoint-dir "$save_dir" --average-last "${AVERAGE_LAST:-5}" \
        --by-update --beam 4 --lenpen 0.6 --output-dir "$save_dir/eval" ${EVAL_ARGS:-}
else
    "$py" -m fairseq_sret_cli.evaluate --data "$data" --checkpoint "$save_dir/checkpoint_best.pt" \
        --beam 4 --lenpen 0.6 --output-dir "$save_dir/eval" ${EVAL_ARGS:-}
fi
