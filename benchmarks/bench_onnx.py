"""ONNX export of the vision models: export time, file size, ONNX Runtime vs. PyTorch logits
and CPU inference time.

    python -m benchmarks.bench_onnx                          # sret_t and sret_s, 224, one thread
    python -m benchmarks.bench_onnx --smoke                  # harness check (small models)

For each model (weights randomised, BatchNorm statistics and LRC coefficients included):
``fairseq_sret.vision.export_onnx`` (torch.onnx.export(dynamo=True), eval mode, dynamic
batch), timed in process CPU time and wall time; the largest absolute difference between
ONNX Runtime's (CPU provider) and PyTorch's logits on batches of 1 and 8; then the median
time of one batch-1 forward in each, measured round-robin (ratios are what to compare;
absolute times depend on the machine's load).
"""

import os
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import benchmark_parser, finish_benchmark, median, positive_int, print_table, start_benchmark


def randomised(name: str, **kwargs):
    """Model ``name`` in eval mode whose BatchNorm statistics and affine weights, LRC
    coefficients and position embedding are random too (their initial values are trivial,
    so an export that mishandled them would still match)."""
    from fairseq_sret.vision import create_model

    torch.manual_seed(0)
    model = create_model(name, **kwargs)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.2)
                module.running_var.uniform_(0.5, 2.0)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
        for name_, p in model.named_parameters():
            if name_.endswith(("skip_scale", "branch_scale")):
                p.uniform_(0.5, 1.5)
            elif name_.endswith("pos_embed"):
                p.normal_(0, 0.02)
    return model.eval()


def build_parser():
    p = benchmark_parser(__doc__, smoke="one block per stage at 64x64 (harness check, seconds)", device=False)
    p.set_defaults(threads=1)
    p.add_argument("--models", nargs="+", default=["sret_t", "sret_s"])
    p.add_argument("--iters", type=positive_int, default=10, help="timed batch-1 forwards per runtime")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    size, kwargs = 224, {}
    if args.smoke:
        args.iters, size, kwargs = 1, 64, dict(blocks=(1, 1, 1), img_size=64)
    start_benchmark(args, torch.device("cpu"))

    import onnxruntime

    from fairseq_sret.vision import check_onnx, export_onnx

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = args.threads
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            model = randomised(name, **kwargs)
            path = Path(tmp) / f"{name}.onnx"
            wall, cpu = time.perf_counter(), time.process_time()
            export_onnx(model, path)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            diffs = [check_onnx(model, path, torch.randn(b, 3, size, size)) for b in (1, 8)]
            session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
            image = torch.randn(1, 3, size, size)
            feed = {"images": image.numpy()}
            times = {"pytorch": [], "onnxruntime": []}
            with torch.no_grad():
                model(image), session.run(None, feed)  # warm-up
                for _ in range(args.iters):
                    for runtime, fn in (("pytorch", lambda: model(image)), ("onnxruntime", lambda: session.run(None, feed))):
                        start = time.perf_counter()
                        fn()
                        times[runtime].append(time.perf_counter() - start)
            eager, ort = median(times["pytorch"]), median(times["onnxruntime"])
            rows.append([name, f"{cpu:.1f} s ({wall:.1f} s wall)", f"{os.path.getsize(path) / 2**20:.1f} MiB",
                         f"{max(diffs):.1e}", f"{eager * 1e3:.0f} ms", f"{ort * 1e3:.0f} ms", f"{eager / ort:.2f}x"])
    print_table(f"ONNX export (torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, {args.threads} thread(s))",
                ["model", "export: CPU time (wall)", "file", "max abs difference ORT vs. PyTorch (logits, batch 1 and 8)",
                 "PyTorch eager, batch 1", "ONNX Runtime, batch 1", "ORT speed-up"], rows)
    finish_benchmark(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
