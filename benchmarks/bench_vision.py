"""Image classifier throughput: SReT against timm's DeiT and PiT.

    python -m benchmarks.bench_vision                                  # CUDA: bf16 autocast, batch 256 / 128
    python -m benchmarks.bench_vision --compile sret_t deit_tiny_patch16_224
    python -m benchmarks.bench_vision --device cpu --batch-infer 16 --batch-train 8 --models sret_t sret_tl sret_s
    python -m benchmarks.bench_vision --smoke                          # tiny, seconds (harness check)

Two modes, each measured for every model and variant in this one process (round-robin
rounds, median): ``infer`` (``torch.no_grad``, batch ``--batch-infer``) and ``train`` (one
step: forward, cross-entropy, backward, AdamW step; batch ``--batch-train``), both under
autocast (bfloat16 on CUDA by default; float32 on CPU), or inference with the weights and
the input cast to ``--model-dtype`` (no autocast, as timm's ``benchmark.py --model-dtype``).
Synthetic inputs already on the device: this measures the model, not a data pipeline.

Variants (``--variants``, each applied to every model; timm models too, so that the
comparison is like for like). A variant is ``eager`` or tokens joined by ``+``:
  eager    the model as built (NCHW), with this package's default fast paths
  cl       channels-last memory format (model and input)
  graph    cl + the whole inference forward captured in a CUDA graph (CUDA, infer only):
           removes the CPU cost of launching ~750 small kernels per SReT forward. The graph
           holds raw addresses, so the variant keeps the model, its input and the output
           alive for as long as it replays (the first device run lost them after capture:
           the next capture's ``empty_cache`` unmapped them -> "illegal memory access")
  compile  cl + ``torch.compile`` (``--compile-mode``); compilation time is printed, not timed
  fold     ``fairseq_sret.core.fold_lrc`` (LRC folded into weights; infer only)
  nofuse   no Triton kernel for residual + LRC + LayerNorm (``fast_paths(fused="off")``; the
           default already leaves it out in eager mode, so this matters under graph/compile)
  triton   the Triton kernel in eager mode too (``fast_paths(fused="on")``)
  lean     the LRC's lean backward (one addcmul forward) on every device, CUDA training too
           (``fast_paths(lrc_one_op=True)``; by default CUDA training takes three kernels)
  packed   sliced attention always on packed groups, never the one-kernel masked path
           (``fast_paths(grouped_one_kernel=0)``; on CUDA SReT's 196-token stage takes it)
  nodnn    no oneDNN linear at CPU inference: PyTorch's linear, bias copy and separate
           activation (``fast_paths(onednn_linear=False)``, see fairseq_sret.core.linear)
  3op      the code before the fast paths: the LRC as three element-wise kernels, no Triton
           kernel, packed groups (``fast_paths(lrc_one_op=False, fused="off",
           grouped_one_kernel=0)``)
  stembn   the stem's BatchNorm as its own call at eval (a no-op hook on each, the code before
           ``ConvBNReLU`` folded it into the convolution)
e.g. ``--variants 3op eager triton fold nofuse+graph``. fold, nofuse, triton, lean, packed, nodnn, 3op
and stembn only change our models.
``--compile MODEL ...`` adds ``compile`` for the named models (``--compile-variants`` sets which:
default ``compile``, e.g. ``compile fold+compile``).

timm models (deit_tiny_patch16_224, deit_small_patch16_224, pit_ti_224, pit_s_224) are
built with ``pretrained=False`` and measured when timm is importable; without timm only our
models run. Ratios are images/s over the reference (``--reference``, default DeiT-T eager, or
the first model when timm is missing). Targets: SReT-T inference >= 1.0x and
training >= 0.8x DeiT-T images/s on the same GPU in the same run.
"""

import argparse
import time
import traceback

import torch
import torch.nn.functional as F

from contextlib import nullcontext

from benchmarks.common import (
    benchmark_parser, non_negative_float, non_negative_int, positive_float,
    clock_fn, clock_note, default_clock, finish_benchmark, fmt_ratio, median, mib, peak_memory,
    positive_int, print_table, profile_table, quiet_logging, start_benchmark, sync,
)
from fairseq_sret.core import fast_paths, fold_lrc
from fairseq_sret.vision import create_model, is_model
from fairseq_sret.vision.sret import ConvBNReLU

OURS = ["sret_t", "sret_tl", "sret_s"]
TIMM = ["deit_tiny_patch16_224", "deit_small_patch16_224", "pit_ti_224", "pit_s_224"]
NAMES = {"sret_t": "SReT-T", "sret_tl": "SReT-TL", "sret_s": "SReT-S", "sret_t_wo_slice": "SReT-T w/o slice",
         "sret_s_wo_slice": "SReT-S w/o slice", "deit_tiny_patch16_224": "DeiT-T",
         "deit_small_patch16_224": "DeiT-S", "pit_ti_224": "PiT-Ti", "pit_s_224": "PiT-S"}
TARGETS = {"infer": 1.0, "train": 0.8}
TOKENS = ("fold", "nofuse", "triton", "lean", "packed", "nodnn", "3op", "stembn", "cl", "graph", "compile")  # a label lists its tokens in this order
OURS_ONLY = ("fold", "nofuse", "triton", "lean", "packed", "nodnn", "3op", "stembn")
# fast-path switches of the variant tokens (fairseq_sret.core.fast_paths)
FAST_PATHS = {
    "nofuse": {"fused": "off"},
    "triton": {"fused": "on"},
    "lean": {"lrc_one_op": True},
    "packed": {"grouped_one_kernel": 0},
    "nodnn": {"onednn_linear": False},
    "3op": {"lrc_one_op": False, "fused": "off", "grouped_one_kernel": 0},
}


def variant_tokens(variant: str):
    """``"fold+graph"`` -> {"fold", "graph"}; ``"eager"`` -> set()."""
    tokens = set() if variant == "eager" else set(variant.split("+"))
    unknown = tokens - set(TOKENS)
    if unknown:
        raise ValueError(f"unknown variant token(s) {sorted(unknown)} in {variant!r}; known: eager, {', '.join(TOKENS)}")
    return tokens


def hardware_variant(variant: str) -> str:
    """The variant without the tokens that only change our models (fold, nofuse, 3op): the
    reference model's variant to compare with, e.g. ``fold+compile`` -> ``compile``."""
    tokens = [t for t in TOKENS if t in variant_tokens(variant) and t not in OURS_ONLY]
    return "+".join(tokens) or "eager"


def _variant(value: str) -> str:
    try:
        variant_tokens(value)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err))
    return value


def build_parser():
    p = benchmark_parser(__doc__, smoke="tiny sizes on the CPU, seconds (harness check)")
    p.add_argument("--models", nargs="+", default=OURS + TIMM,
                   help="model names; MODEL:V1,V2 gives that model its own variants instead of --variants")
    p.add_argument("--modes", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    p.add_argument("--variants", nargs="+", type=_variant, default=["eager", "cl"],
                   help="eager, or tokens joined by '+' (see above)")
    p.add_argument("--timm-variants", nargs="+", type=_variant, default=None,
                   help="variants of the timm models (default: --variants)")
    p.add_argument("--compile-variants", nargs="+", type=_variant, default=["compile"],
                   help="variants added for each --compile model (each must contain 'compile')")
    p.add_argument("--profile", nargs="*", default=[], metavar="MODEL[:VARIANT]",
                   help="print a torch.profiler table of these models (eager unless :VARIANT is given)")
    p.add_argument("--compile", nargs="*", default=[], metavar="MODEL",
                   help="models that also get the --compile-variants ('all' for every model)")
    p.add_argument("--compile-mode", default=None, help="torch.compile mode (default: torch's default)")
    p.add_argument("--batch-infer", type=positive_int, default=256)
    p.add_argument("--batch-train", type=positive_int, default=128)
    p.add_argument("--img-size", type=positive_int, default=224)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"], default="auto",
                   help="autocast dtype; auto = bfloat16 on CUDA, float32 (no autocast) on CPU")
    p.add_argument("--model-dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="weights and input in this dtype, no autocast (timm benchmark.py's --model-dtype);"
                        " inference only")
    p.add_argument("--warmup", type=non_negative_int, default=None)
    p.add_argument("--iters", type=positive_int, default=None)
    p.add_argument("--rounds", type=positive_int, default=None)
    p.add_argument("--reference", default=None, help="model whose eager variant is the 1.00x row")
    p.add_argument("--time-budget", type=positive_float, default=None,
                   help="seconds; variants not yet prepared when it is spent are skipped")
    p.add_argument("--compile-estimate", type=non_negative_float, nargs=2, default=[60.0, 150.0], metavar=("INFER", "TRAIN"),
                   help="seconds a compile variant is expected to take; skipped when the time budget has"
                        " less left (the first --compile model has priority: the others' inference compile"
                        " also leaves room for its training compile)")
    p.add_argument("--compile-priority", choices=["train", "infer"], default="train",
                   help="with a time budget: 'train' keeps room for the first --compile model's training"
                        " compile before the other models' inference compiles; 'infer' does not")
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="timer: wall-clock, or this process's CPU time (default: cpu for single-threaded CPU"
                        " runs, where other load on a shared machine inflates wall time, else wall)")
    p.add_argument("--no-memory", dest="memory", action="store_false",
                   help="CPU: skip the peak-memory run (torch profiler); CUDA always reports it")
    p.add_argument("--graph-drop-references", action="store_true",
                   help="reproduce the first device run's CUDA-graph bug: keep only graph.replay (the model, input"
                        " and output are freed after capture); for compute-sanitizer, in a process of its own")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.model_dtype != "float32":
        if args.dtype not in ("auto", "float32"):
            p.error("--model-dtype and --dtype (autocast) exclude each other: the weights already set the precision")
        if "train" in args.modes:
            p.error("--model-dtype is for inference: add --modes infer (training keeps float32 master weights)")
    if args.smoke:
        args.device = "cpu" if args.device == "auto" else args.device
        if args.models == OURS + TIMM:  # not given
            args.models = ["sret_t", "deit_tiny_patch16_224"]
        args.batch_infer, args.batch_train, args.img_size = 2, 2, 64
        args.warmup, args.iters, args.rounds = 1, 1, 1
    return args


def timm_available() -> bool:
    try:
        import timm  # noqa: F401
        return True
    except Exception:
        return False


def build(name, img_size=None, **kwargs):
    """Our model ``name`` or timm's, untrained, at ``img_size`` (None: the model's own);
    ``kwargs`` (e.g. ``drop_path_rate``) go to the model's constructor."""
    if is_model(name):
        return create_model(name, **kwargs) if img_size is None else create_model(name, img_size=img_size, **kwargs)
    import timm

    if img_size not in (None, 224):
        kwargs["img_size"] = img_size
    return timm.create_model(name, pretrained=False, **kwargs)


class Variant:
    """One (model, variant, mode): ``step()`` runs one timed iteration."""

    def __init__(self, name, variant, mode, args, device, dtype):
        self.name, self.variant, self.mode = name, variant, mode
        self.tokens = variant_tokens(variant)
        self.step = None
        self.error = None
        self.setup_s = None
        self.peak = None
        self.params = None
        self.args, self.device, self.dtype = args, device, dtype

    @property
    def label(self):
        return f"{NAMES.get(self.name, self.name)} {self.variant}"

    def autocast(self):
        if self.dtype is None:
            return torch.autocast(self.device.type, enabled=False)
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled="graph" not in self.tokens)

    def fast_paths(self):
        """The fast-path switches of this variant (ours only; a no-op for timm models)."""
        changes = {}
        for token in self.tokens:
            changes.update(FAST_PATHS.get(token, {}))
        return fast_paths(**changes) if changes else nullcontext()

    def prepare(self, warmup):
        start = time.perf_counter()
        args, device = self.args, self.device
        torch.manual_seed(0)
        model = build(self.name, args.img_size).to(device)
        self.params = sum(p.numel() for p in model.parameters())
        if "fold" in self.tokens:
            if self.mode != "infer":
                raise RuntimeError("fold: inference only")
            model = fold_lrc(model, inplace=True)  # in float32, before any cast
        if "stembn" in self.tokens:
            for layer in model.modules():
                if isinstance(layer, ConvBNReLU):
                    layer.norm.register_forward_hook(lambda *_: None)
        model_dtype = getattr(torch, args.model_dtype)
        model = model.to(model_dtype)
        batch = args.batch_infer if self.mode == "infer" else args.batch_train
        x = torch.randn(batch, 3, args.img_size, args.img_size, device=device, dtype=model_dtype)
        channels_last = bool(self.tokens & {"cl", "graph", "compile"})
        if channels_last:
            model = model.to(memory_format=torch.channels_last)
            x = x.contiguous(memory_format=torch.channels_last)
        run = torch.compile(model, mode=args.compile_mode) if "compile" in self.tokens else model
        if self.mode == "infer":
            model.eval()

            def step():
                with torch.no_grad(), self.autocast(), self.fast_paths():
                    return run(x)
        else:
            model.train()
            target = torch.randint(0, 1000, (batch,), device=device)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **({"fused": True} if device.type == "cuda" else {}))

            def step():
                with self.fast_paths():
                    with self.autocast():
                        loss = F.cross_entropy(run(x), target)
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                return loss
        for _ in range(max(warmup, 1)):
            step()
        sync(device)
        if device.type == "cuda":  # peak of one step: weights, optimizer state, activations
            torch.cuda.reset_peak_memory_stats(device)
            step()
            sync(device)
            self.peak = torch.cuda.max_memory_allocated(device)
        elif args.memory:  # CPU: allocations above those before the step (profiler)
            self.peak = peak_memory(step, device)
        if "graph" in self.tokens:
            step = self._capture(step, keep=(model, x))
        self.step = step
        self.setup_s = time.perf_counter() - start

    def _capture(self, step, keep):
        """Capture one inference step in a CUDA graph; returns its replay.

        A CUDA graph records raw device addresses: the parameters and the input it reads and
        the output it writes must stay allocated for as long as it replays. ``keep`` (model,
        input) and the captured output are held by the returned replay function. (Without
        that, the first device run's graphs read freed memory: after ``prepare`` only
        ``graph.replay`` survived, the model and its input were freed to the caching
        allocator, and the next ``torch.cuda.graph`` capture, which starts with
        ``torch.cuda.empty_cache()``, returned their segments to the driver, so the first
        timed replay raised "an illegal memory access".)

        cuDNN's algorithm search is switched off for the side-stream warm-up and the capture,
        so that no search (with its trial kernels and temporary workspaces) can happen
        inside the captured region; the device is synchronised after the first replay, so
        that a faulty capture is reported here, for this variant.
        """
        if self.device.type != "cuda" or self.mode != "infer":
            raise RuntimeError("graph: CUDA inference only")
        benchmark = torch.backends.cudnn.benchmark
        torch.backends.cudnn.benchmark = False
        try:
            torch.cuda.synchronize()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(stream)
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                output = step()
        finally:
            torch.backends.cudnn.benchmark = benchmark
        graph.replay()
        torch.cuda.synchronize()
        if self.args.graph_drop_references:  # the first device run's code: nothing but the replay survives
            return graph.replay
        held = (graph, output) + tuple(keep)

        def replay():
            held[0].replay()
            return held[1]

        return replay

    def release(self):
        self.step = None


def mode_variants(mode, args, device, dtype):
    """The variants to measure in ``mode``: each model's, then the compiled ones."""
    variants = []
    for name in args.models:
        names = args.variants if is_model(name) or args.timm_variants is None else args.timm_variants
        names = args.model_variants.get(name, names)
        for variant in names:
            tokens = variant_tokens(variant)
            if "graph" in tokens and (device.type != "cuda" or mode != "infer"):
                continue
            if "fold" in tokens and mode != "infer":
                continue
            variants.append(Variant(name, variant, mode, args, device, dtype))
    # compiled variants last, in the order given (they are the slow ones to prepare)
    # in the order of --compile-variants, then of the models: e.g. SReT-T and DeiT-T compiled
    # before the folded SReT-T
    seen = set()
    for variant in args.compile_variants:
        for name in (args.models if "all" in args.compile else args.compile):
            tokens = variant_tokens(variant) | {"compile"}
            if not is_model(name):  # fold / nofuse / packed / nodnn / 3op change only our models
                tokens -= set(OURS_ONLY)
            if ("fold" in tokens and mode != "infer") or "graph" in tokens:
                continue
            label = "+".join(t for t in TOKENS if t in tokens)
            if (name, label) not in seen:
                seen.add((name, label))
                variants.append(Variant(name, label, mode, args, device, dtype))
    return variants


def prepare_variants(variants, mode, args, device, deadline):
    """Prepare every variant that the time budget leaves room for; a failure is its row's error."""
    for v in variants:
        need = 0.0
        if "compile" in v.tokens:
            need = args.compile_estimate[0 if mode == "infer" else 1]
            if (mode == "infer" and "train" in args.modes and args.compile and v.name != args.compile[0]
                    and args.compile_priority == "train"):
                need += args.compile_estimate[1]  # leave room for the first model's training compile
        if deadline is not None and time.perf_counter() + need > deadline:
            v.error = "skipped (time budget)"
            print(f"{mode} {v.label} skipped: time budget", flush=True)
            continue
        try:
            v.prepare(args.warmup)
            print(f"prepared {mode} {v.label} in {v.setup_s:.1f} s", flush=True)
        except Exception as err:  # one failing variant must not lose the others' results
            v.error = f"failed: {type(err).__name__}: {str(err).splitlines()[0][:120] if str(err) else ''}"
            print(f"{mode} {v.label} {v.error}", flush=True)
            traceback.print_exc()
            if device.type == "cuda":
                torch.cuda.empty_cache()


def time_variants(variants, args, device):
    """Seconds per step of every prepared variant, one value per round, round-robin."""
    times = {id(v): [] for v in variants}
    now = clock_fn(args.clock)
    for _ in range(args.rounds):
        for v in variants:
            if v.step is None:
                continue
            try:
                sync(device)
                start = now()
                for _ in range(args.iters):
                    v.step()
                sync(device)
            except Exception as err:
                v.error, v.step = f"failed while timed: {type(err).__name__}", None
                traceback.print_exc()
                continue
            times[id(v)].append((now() - start) / args.iters)
    return times


def run_mode(mode, args, device, dtype, deadline):
    variants = mode_variants(mode, args, device, dtype)
    prepare_variants(variants, mode, args, device, deadline)
    times = time_variants(variants, args, device)
    ready = [v for v in variants if v.step is not None]
    batch = args.batch_infer if mode == "infer" else args.batch_train
    rate = {id(v): batch / median(times[id(v)]) for v in ready}
    ref_name = args.reference or ("deit_tiny_patch16_224" if "deit_tiny_patch16_224" in args.models else args.models[0])
    ref = next((v for v in ready if v.name == ref_name and v.variant == "eager"), None)
    same = {v.variant: v for v in ready if v.name == ref_name}
    own = {v.name: v for v in ready if v.variant == "eager"}
    rows = []
    for v in variants:
        if v.step is None:
            rows.append([NAMES.get(v.name, v.name), v.variant, batch, v.error, "", "", "", "", "", ""])
            continue
        r = rate[id(v)]
        twin, mine = same.get(hardware_variant(v.variant)), own.get(v.name)
        rows.append([
            NAMES.get(v.name, v.name), v.variant, batch, f"{r:,.0f}" if r >= 100 else f"{r:.1f}",
            fmt_ratio(r / rate[id(mine)]) if mine else "n/a",
            fmt_ratio(r / rate[id(ref)]) if ref else "n/a",
            fmt_ratio(r / rate[id(twin)]) if twin else "n/a",
            f"{median(times[id(v)]) * 1e3:.2f}", mib(v.peak), f"{v.params / 1e6:.2f}",
        ])
    ref_label = NAMES.get(ref_name, ref_name)
    what = "inference (no_grad)" if mode == "infer" else "training step (fwd + bwd + AdamW)"
    prec = str(dtype).replace("torch.", "") + " autocast" if dtype is not None else args.model_dtype
    if args.model_dtype != "float32":
        prec += " weights"
    print_table(
        f"vision {what}: images/s ({device.type}, {prec}, {args.img_size}x{args.img_size}, batch {batch})",
        ["model", "variant", "batch", "images/s", "vs own eager", f"vs {ref_label} eager", f"vs {ref_label} same variant",
         "ms / iter", "peak MiB", "params (M)"],
        rows,
    )
    if ref is not None and ref_name != "sret_t":
        for v in ready:
            if v.name == "sret_t":
                print(f"target check ({mode}): SReT-T {v.variant} = {rate[id(v)] / rate[id(ref)]:.2f}x {ref_label} eager"
                      f" (target >= {TARGETS[mode]}x)")
    for v in ready:
        if v.name in args.profile and v.variant == "eager" or f"{v.name}:{v.variant}" in args.profile:
            try:
                profile_table(v.step, device, f"{mode} {v.label}, batch {batch}")
            except Exception as err:
                print(f"profile of {v.label} failed: {type(err).__name__}: {err}")
    for v in variants:
        v.release()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    device = start_benchmark(args)
    cuda = device.type == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (3 if cuda else 1)
    args.iters = args.iters or (10 if cuda else 2)
    args.rounds = args.rounds or 3
    if args.dtype == "auto":
        dtype = torch.bfloat16 if cuda else None
    else:
        dtype = None if args.dtype == "float32" else getattr(torch, args.dtype)
    if cuda:
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    args.model_variants = {}
    names = []
    for entry in args.models:
        name, _, listed = entry.partition(":")
        names.append(name)
        if listed:
            args.model_variants[name] = [_variant(v) for v in listed.split(",")]
    args.models = names
    have_timm = timm_available()
    missing = [m for m in args.models if not is_model(m) and not have_timm]
    args.models = [m for m in args.models if m not in missing]
    args.compile = [m for m in args.compile if m == "all" or m in args.models]
    if have_timm:
        import timm
        print(f"timm {timm.__version__}")
    if missing:
        print(f"timm not installed: skipping {', '.join(missing)}")
    args.clock = args.clock or default_clock(device)
    print(f"settings: warmup {args.warmup}, {args.iters} iterations x {args.rounds} rounds (median of rounds),"
          f" {clock_note(args.clock)}")
    deadline = None if args.time_budget is None else time.perf_counter() + args.time_budget
    for mode in args.modes:
        run_mode(mode, args, device, dtype, deadline)
    finish_benchmark(args)


if __name__ == "__main__":
    main()
