#!/usr/bin/env bash
# Create (or reuse) the virtual environment and install fairseq-sret into it.
# Idempotent: a second run only checks what is already there.
#   SRET_VENV    where the environment lives (default: .venv in the repository)
#   SRET_TORCH   the torch requirement installed first (default: torch==2.13.0)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SRET_VENV:-$repo/.venv}"
torch_spec="${SRET_TORCH:-torch==2.13.0}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtual environment $venv"
    "$python" -m venv "$venv"
else
    echo "[setup] reusing virtual environment $venv"
fi
py="$venv/bin/python"

if "$py" -c "import torch" 2>/dev/null; then
    echo "[setup] torch $("$py" -c 'import torch; print(torch.__version__)') already installed"
else
    # torch first: otherwise pip resolves the bare 'torch' requirement to a CUDA build.
    echo "[setup] installing $torch_spec"
    "$py" -m pip install -q "$torch_spec"
fi

if "$py" -c "import fairseq_sret, fairseq, sacrebleu, sentencepiece, sacremoses, pytest, hypothesis, onnxscript, onnxruntime, matplotlib, yaml" 2>/dev/null \
        && [ -x "$venv/bin/sret-uptrain" ] && [ -x "$venv/bin/sret-experiments" ] \
        && [ "$("$py" -c 'import fairseq_sret, os; print(os.path.dirname(os.path.dirname(fairseq_sret.__file__)))')" = "$repo" ]; then
    echo "[setup] fairseq-sret and its dependencies already installed"
else
    echo "[setup] installing fairseq-sret (editable) with test extras; the first build of fairseq takes ~4 minutes"
    "$py" -m pip install -q -e "$repo[test]"
fi
echo "[setup] environment ready: $venv"
