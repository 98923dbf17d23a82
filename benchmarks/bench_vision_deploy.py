"""The vision models deployed on the CPU through an inference engine: SReT-T against DeiT-T in
eager PyTorch, ONNX Runtime fp32 and ONNX Runtime int8, images per second at batch 1 and 16.

    pip install -e '.[onnx,timm]'
    python -m benchmarks bench_vision_deploy --threads 1 --json sret_deploy_1t.json
    python -m benchmarks bench_vision_deploy --threads 2
    python -m benchmarks bench_vision_deploy --smoke                # harness check (small models)

Each model (random weights: speed does not depend on them) is exported with
``fairseq_sret.vision.export_onnx`` (torch's dynamo exporter, eval mode, dynamic batch); SReT
first has its LRC folded into the weights (``fold_lrc``) and its conv stem's BatchNorm folded
into the convolutions, as it would be prepared for serving. ONNX Runtime runs the file with
every graph optimisation (``ORT_ENABLE_ALL``: fused LayerNorm, GELU and MatMul+Add where it
finds them). int8 is ONNX Runtime's dynamic quantisation (``quantize_dynamic``: int8 weights
per output channel, activations quantised per batch at run time), after its own pre-processing
(shape inference, graph optimisation), of the MatMuls only: its integer convolution
(``ConvInteger``) is slower than the fp32 one on processors without int8 dot products, where it
took a quarter of SReT-T's time (see ``--profile``).

Rows: ``MODEL/ENGINE/PRECISION``. Per row and batch size, ``--rounds`` measurements, each the
median time of ``--iters`` forwards, taken round-robin over the rows (every row measured once
per round, in the same process); the table gives the median images/s over the rounds and
their range. With one thread the time is this process's CPU time (ONNX Runtime's threads are
this process's), with more the wall time. Also given: the largest difference of each engine's
logits from PyTorch's (fp32: the export's error; int8: the quantisation's).
"""

import argparse
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List

import torch

from benchmarks.common import benchmark_parser, finish_benchmark, median, positive_int, print_table, start_benchmark

MODELS = {"sret_t": "fairseq_sret", "deit_tiny_patch16_224": "timm"}
ENGINES = ("pytorch/fp32", "onnxruntime/fp32", "onnxruntime/int8")


def build_model(name: str, smoke: bool) -> torch.nn.Module:
    """``name`` with random weights, in eval mode, prepared for serving (SReT: LRC folded)."""
    torch.manual_seed(0)
    if MODELS[name] == "timm":
        import timm

        kwargs = dict(img_size=64, depth=2) if smoke else {}
        return timm.create_model(name, **kwargs).eval()
    from fairseq_sret.core import fold_lrc
    from fairseq_sret.vision import create_model

    kwargs = dict(blocks=(1, 1, 1), img_size=64) if smoke else {}
    model = create_model(name, **kwargs).eval()
    with torch.no_grad():  # non-trivial LRC and BatchNorm statistics, so folding them is exercised
        for param_name, p in model.named_parameters():
            if param_name.endswith(("skip_scale", "branch_scale")):
                p.uniform_(0.5, 1.5)
    model = fold_lrc(model, inplace=True)
    for module in model.modules():
        if hasattr(module, "fold_norm_for_inference"):
            module.fold_norm_for_inference()
    return model


def onnx_session(path: Path, threads: int, profile: bool = False):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.enable_profiling = profile
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def quantize_int8(fp32: Path, out: Path) -> Path:
    """ONNX Runtime's dynamic int8 quantisation of ``fp32``, after its pre-processing."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    prepared = out.with_suffix(".prep.onnx")
    quant_pre_process(str(fp32), str(prepared), skip_symbolic_shape=True)
    quantize_dynamic(str(prepared), str(out), weight_type=QuantType.QInt8, per_channel=True,
                     op_types_to_quantize=["MatMul"])
    return out


def operator_profile(path: Path, threads: int, images: torch.Tensor, iters: int) -> Dict[str, float]:
    """ONNX Runtime's own profile of ``iters`` runs of the file at ``path``: the share of the
    operators' time each operator type takes (what bounds the engine's speed)."""
    import json

    session = onnx_session(path, threads, profile=True)
    for _ in range(iters + 1):  # the first run (allocations, kernel set-up) is left out
        session.run(None, {"images": images.numpy()})
    trace = Path(session.end_profiling())
    events = json.loads(trace.read_text())
    first_run = min((e for e in events if e["name"] == "model_run"), key=lambda e: e["ts"])
    warm = first_run["ts"] + first_run["dur"]
    totals: Dict[str, float] = {}
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time") and event["ts"] > warm:
            op = event.get("args", {}).get("op_name", "?")
            totals[op] = totals.get(op, 0.0) + event["dur"]
    trace.unlink()
    whole = sum(totals.values()) or 1.0
    return {op: t / whole for op, t in sorted(totals.items(), key=lambda kv: -kv[1])}


def runners(name: str, model: torch.nn.Module, folder: Path, threads: int, size: int) -> Dict[str, Callable]:
    """Row name -> a function of a (B, 3, H, W) float tensor returning logits as a tensor."""
    from fairseq_sret.vision import export_onnx

    fp32 = export_onnx(model, folder / f"{name}.onnx", img_size=size)
    int8 = quantize_int8(fp32, folder / f"{name}.int8.onnx")
    sessions = {"onnxruntime/fp32": onnx_session(fp32, threads), "onnxruntime/int8": onnx_session(int8, threads)}

    def eager(images):
        with torch.inference_mode():
            return model(images)

    def engine(session):
        return lambda images: torch.from_numpy(session.run(None, {"images": images.numpy()})[0])

    runs = {"pytorch/fp32": eager, **{key: engine(s) for key, s in sessions.items()}}
    return runs, {"onnxruntime/fp32": fp32, "onnxruntime/int8": int8}


def time_once(run: Callable, images: torch.Tensor, iters: int, clock: Callable[[], float]) -> float:
    """The median seconds of ``iters`` calls (after one warm-up call)."""
    run(images)
    times = []
    for _ in range(iters):
        start = clock()
        run(images)
        times.append(clock() - start)
    return median(times)


def build_parser() -> argparse.ArgumentParser:
    p = benchmark_parser(__doc__, smoke="shallow models at 64x64 (harness check, seconds)", device=False)
    p.set_defaults(threads=1)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--batches", nargs="+", type=positive_int, default=[1, 16], metavar="B")
    p.add_argument("--iters", type=positive_int, default=10, help="timed forwards per measurement")
    p.add_argument("--profile", action="store_true",
                   help="also print ONNX Runtime's operator profile of each file (share of time per operator type)")
    p.add_argument("--rounds", type=positive_int, default=3,
                   help="measurements per row, round-robin (the table: their median and range)")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    size = 64 if args.smoke else 224
    if args.smoke:
        args.iters, args.rounds, args.batches = 1, 2, [1, 2]
    start_benchmark(args, torch.device("cpu"))
    clock = time.process_time if args.threads == 1 else time.perf_counter
    rows: Dict[str, Callable] = {}
    errors: Dict[str, float] = {}
    profiles: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        probe = torch.randn(2, 3, size, size, generator=torch.Generator().manual_seed(1))
        for name in args.models:
            model = build_model(name, args.smoke)
            runs, files = runners(name, model, Path(tmp), args.threads, size)
            for engine, run in runs.items():
                rows[f"{name}/{engine}"] = run
                errors[f"{name}/{engine}"] = (run(probe) - rows[f"{name}/pytorch/fp32"](probe)).abs().max().item()
            if args.profile:
                for engine, path in files.items():
                    shares = operator_profile(path, args.threads, probe[:1], args.iters)
                    profiles[f"{name}/{engine}"] = shares
                    print_table(f"{name}/{engine}: operator types by share of ONNX Runtime's kernel time, batch 1",
                                ["operator", "share"], [[op, f"{share:.1%}"] for op, share in list(shares.items())[:8]])
        measured: Dict[tuple, List[float]] = {}
        for batch in args.batches:
            images = torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(batch))
            for _ in range(args.rounds):
                for row, run in rows.items():
                    seconds = time_once(run, images, args.iters, clock)
                    measured.setdefault((row, batch), []).append(batch / seconds)
    baseline = "deit_tiny_patch16_224"
    headers = ["row", "max |logit - PyTorch's|"]
    for batch in args.batches:
        headers += [f"images/s, batch {batch}: median (range)"] + (
            [f"x DeiT-T, batch {batch}"] if baseline in args.models else [])
    table = []
    for row in rows:
        model, engine = row.split("/", 1)
        line = [row, f"{errors[row]:.1e}"]
        for batch in args.batches:
            speeds = measured[(row, batch)]
            line.append(f"{median(speeds):.1f} ({min(speeds):.1f}-{max(speeds):.1f})")
            if baseline in args.models:
                line.append(f"{median(speeds) / median(measured[(f'{baseline}/{engine}', batch)]):.2f}")
        table.append(line)
    print_table(f"{args.threads} thread(s), {size}x{size}: {args.rounds} measurements of {args.iters} forwards "
                f"each, {'CPU' if args.threads == 1 else 'wall'} time", headers, table)
    finish_benchmark(args, rows={f"{row}/b{batch}": speeds for (row, batch), speeds in measured.items()},
                     errors=errors, profiles=profiles)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
