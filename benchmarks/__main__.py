"""One entry point for the benchmarks: ``python -m benchmarks NAME [options]`` runs
``python -m benchmarks.NAME [options]``; ``python -m benchmarks`` (or ``--list``) lists them."""

import difflib
import runpy
import sys
from typing import NamedTuple


class Benchmark(NamedTuple):
    module: str
    summary: str


#: every benchmark script: its name -> its module and what it measures, in one line
BENCHMARKS = {name: Benchmark(f"benchmarks.{name}", summary) for name, summary in (
    ("bench_attention", "sliced attention: G scaling, G=1 parity, one kernel against packed groups"),
    ("bench_theorem1", "FLOP counts: N recursions with G groups cost N/G attentions"),
    ("bench_lrc", "the LRC residual, kernel by kernel"),
    ("bench_vision", "SReT against timm's models, every fast path as a variant, --profile"),
    ("bench_compile", "torch.compile of the vision models: compile time, speed, depth switches"),
    ("bench_onnx", "ONNX export: time, size, ONNX Runtime against PyTorch"),
    ("bench_vision_deploy", "SReT-T against DeiT-T deployed: eager, ONNX Runtime fp32 and int8, images/s"),
    ("bench_cifar_input", "where an epoch of sret-train-cifar goes: decoding, input pipeline, model"),
    ("bench_cifar_depth", "accuracy against images/s of a vision experiment's runs at every depth"),
    ("bench_nmt", "sret_transformer against fairseq's transformer, in Python"),
    ("bench_fairseq_cli", "the same through fairseq-train and fairseq-generate"),
    ("bench_cpu_bf16", "translation on the CPU in fp32 and --bf16, decoding in int8 with --int8"),
    ("bench_deploy", "a trained translation model deployed on the CPU, beside CTranslate2"),
    ("bench_ct2_sret", "SReT unrolled into CTranslate2 against fairseq: sizes, fidelity, decoding speed"),
    ("bench_hf", "the transformers export against fairseq-generate: hypotheses, BLEU, speed"),
    ("bench_depth", "depth on demand: decoding speed and BLEU at every depth"),
    ("bench_uptrain", "uptraining against training from scratch, on the toy task"),
    ("bench_import", "import time of the package's entry points"),
    ("count_ops", "kernel-launching operations per forward, training step and decoder step"),
    ("flops_per_token", "FLOPs per target token of an experiment file's rows"),
    ("deep_recursion", "1,000 layer applications: peak training memory and a short run"),
    ("gpu_checks", "mixed-precision checks for the GPU: attention precision, fp16 training"),
    ("quickstart_budget", "the quick start against fairseq's transformer at the same CPU budget"),
)}


def listing() -> str:
    width = max(map(len, BENCHMARKS))
    lines = ["usage: python -m benchmarks NAME [options]   (NAME --help: its options)", ""]
    return "\n".join(lines + [f"  {name:<{width}}  {b.summary}" for name, b in BENCHMARKS.items()])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("--list", "-h", "--help"):
        print(listing())
        return 0
    name = argv[0]
    if name not in BENCHMARKS:
        close = difflib.get_close_matches(name, BENCHMARKS, n=1)
        hint = f"did you mean {close[0]}? " if close else ""
        print(f"python -m benchmarks: error: unknown benchmark {name!r}; {hint}--list names them", file=sys.stderr)
        return 2
    # as `python -m benchmarks.NAME`: the script runs as __main__ with its own arguments
    sys.argv = [sys.argv[0], *argv[1:]]
    runpy.run_module(BENCHMARKS[name].module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
