#!/usr/bin/env bash
# Create (or reuse) the virtual environment and install fairseq-sret into it.
# Idempotent: a second run only checks what is already there.
#   SRET_VENV    where the environment lives (default: .venv in the repository)
#   SRET_TORCH   the torch requirement installed first (default: torch==2.13.0, the CPU build)
#   SRET_TIMM=1  the test environment (scripts/run_tests.sh): instead of SRET_TORCH, a torch,
#                torchvision and timm that import together ($timm_stack below), for the tests
#                of the vision models against timm. Package index torchvision wheels are CUDA
#                builds, which fail to import beside the CPU torch 2.13.0, so the stack takes
#                the CUDA torch 2.14.1 (it runs on the CPU): about 3.7 GB more disk than the
#                default environment (docs/vision.md). Upgrades an existing environment in place.
#   SRET_EXTRAS  the extras of fairseq-sret to install (default: fairseq,test; the fairseq-free
#                test environment of scripts/run_tests.sh: hf,timm,vision,test)
#   PYTHON       the interpreter that creates the environment (default: python3)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${SRET_VENV:-$repo/.venv}"
torch_spec="${SRET_TORCH:-torch==2.13.0}"
timm_stack=(torch==2.14.1 torchvision==0.29.1 timm==1.0.31)
python="${PYTHON:-python3}"
extras="${SRET_EXTRAS:-fairseq,test}"

if [ "${SRET_TIMM:-0}" = "1" ]; then
    if [ -n "${SRET_TORCH:-}" ]; then
        echo "[setup] SRET_TIMM=1 installs ${timm_stack[*]}; unset SRET_TORCH=$SRET_TORCH" >&2
        exit 2
    fi
    torch_spec="${timm_stack[0]}"
fi

if [ ! -x "$venv/bin/python" ]; then
    echo "[setup] creating virtual environment $venv"
    "$python" -m venv "$venv"
else
    echo "[setup] reusing virtual environment $venv"
fi
py="$venv/bin/python"

have_torch="$("$py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null || true)"
if [ -n "$have_torch" ] && { [ "${SRET_TIMM:-0}" != "1" ] || [ "torch==$have_torch" = "$torch_spec" ]; }; then
    echo "[setup] torch $have_torch already installed"
else
    # torch first: otherwise pip resolves the bare 'torch' requirement to a CUDA build.
    echo "[setup] installing $torch_spec"
    "$py" -m pip install -q "$torch_spec"
fi

if [ "${SRET_TIMM:-0}" = "1" ]; then
    versions="$("$py" -c 'import torch, torchvision, timm; print("torch==%s torchvision==%s timm==%s" % (torch.__version__.split("+")[0], torchvision.__version__.split("+")[0], timm.__version__))' 2>/dev/null || true)"
    if [ "$versions" = "${timm_stack[*]}" ]; then
        echo "[setup] ${timm_stack[*]} already installed"
    else
        echo "[setup] installing ${timm_stack[*]:1}"
        "$py" -m pip install -q "${timm_stack[@]}"
    fi
fi

# what the extras must have installed, by module (fairseq-sret's own commands checked by file)
modules="fairseq_sret, yaml"
case ",$extras," in *,fairseq,*) modules="$modules, fairseq, sacrebleu, sentencepiece, sacremoses" ;; esac
case ",$extras," in *,test,*) modules="$modules, pytest, xdist, hypothesis, onnxscript, onnxruntime, matplotlib, transformers, safetensors" ;; esac
case ",$extras," in *,hf,*) modules="$modules, transformers, safetensors, sentencepiece" ;; esac
recorded="$venv/.sret-extras"
if "$py" -c "import $modules" 2>/dev/null && [ "$(cat "$recorded" 2>/dev/null)" = "$extras" ] \
        && [ -x "$venv/bin/sret-uptrain" ] && [ -x "$venv/bin/sret-export-hf" ] && [ -x "$venv/bin/sret-train-cifar" ] \
        && [ "$("$py" -c 'import fairseq_sret, os; print(os.path.dirname(os.path.dirname(fairseq_sret.__file__)))')" = "$repo" ]; then
    echo "[setup] fairseq-sret[$extras] and its dependencies already installed"
else
    case ",$extras," in
        *,fairseq,*) echo "[setup] installing fairseq-sret[$extras] (editable); the first build of fairseq takes ~4 minutes" ;;
        *) echo "[setup] installing fairseq-sret[$extras] (editable)" ;;
    esac
    "$py" -m pip install -q -e "$repo[$extras]"
    echo "$extras" > "$recorded"
fi
echo "[setup] environment ready: $venv"
