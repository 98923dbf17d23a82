"""Kernel-launching operations per forward, per training step and per decoder step.

    python -m benchmarks.count_ops                       # vision + translation, a table
    python -m benchmarks.count_ops --vision sret_t deit_tiny_patch16_224 --no-nmt
    python -m benchmarks.count_ops --by-op sret_t        # which operations, most first

On a GPU every ATen operation that computes (not a view, not an allocation) is one or more
kernel launches; SReT's small layers make it launch-bound, so the count is the measure of
the cause that every machine has. Counted with a ``TorchDispatchMode`` on the CPU in eager
mode: what the dispatcher runs, not what a CPU kernel fuses. A custom operator (the fused
Triton kernel) counts once.

- vision: one eval forward (ours also as the inference copy of ``fold_lrc``, the LRC
  coefficients folded into weights), and one training step (forward, cross-entropy,
  backward; no optimizer) of a batch of 2 images, twice: every model with stochastic depth
  0.1 (the rate DeiT-T and SReT-T train with; each draw and rescale of a kept branch is
  operations too) and every model without it; timm's models (``deit_tiny_patch16_224``,
  ...) when timm imports;
- translation: one incremental decoder step (beam 5, the 6th target token, caches filled),
  of SReT tiny (2 unique layers x 2 recursions per side) against fairseq's transformer at
  the same width with 2+2 (equal unique layers) and 4+4 (equal layer applications) layers,
  and SReT tiny without NLLs (``--nll-ratio 0``: the applications alone), every model prepared
  as fairseq-generate prepares it (SReT's LRC folded into its weights; also a row with the LRC
  kept, ``--keep-lrc-in-generation``); and one step of
  fairseq's beam search (``SequenceGenerator``: the decoder step, the output layer, the
  search and the reordering of every cache), the difference of two whole generations
  whose hypotheses are forced to two lengths, with its host reads: the operations whose
  value or output size the host must read (``.item()``, ``bool(tensor)``, ``nonzero``,
  ``masked_select``), each one a wait for the device to finish on a GPU. Also the memory of
  the decoder's incremental state after that step (each tensor once however many
  applications share it), and its part that holds the encoder output's keys and values.
"""

import collections
import sys
from typing import Callable, Counter, Dict, NamedTuple, Tuple

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks.common import benchmark_parser, finish_benchmark, prepare_as_generate, print_table, start_benchmark

#: operations that launch nothing: views, metadata, allocations without compute
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "slice",
    "select", "unsqueeze", "squeeze", "detach", "alias", "as_strided", "split", "split_with_sizes",
    "unbind", "chunk", "lift_fresh", "empty", "empty_like", "empty_strided", "new_empty",
    "new_empty_strided", "unflatten", "flatten", "view_as", "expand_as", "_to_copy_view", "sym_size",
    "sym_stride", "sym_numel", "sym_storage_offset", "is_same_size", "_has_compatible_shallow_copy_type",
    "set_", "resize_", "contiguous_view", "diagonal", "narrow", "movedim", "unfold", "real", "imag",
}


#: operations whose result the host reads before it can go on (a device synchronisation on a GPU)
HOST_READS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "equal"}


class OpCounter(TorchDispatchMode):
    """Counts the kernel-launching ATen operations dispatched while active, by name."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in NO_KERNEL or getattr(func, "is_view", False):
            return out
        # an operation that hands back an input untouched (dropout in eval mode, a cast to
        # the dtype a tensor has) launches nothing; an in-place one returns its input too
        if not func._schema.is_mutable and any(out is a for a in args if isinstance(a, torch.Tensor)):
            return out
        self.ops[name] += 1
        return out

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def host_reads(self) -> int:
        return sum(n for name, n in self.ops.items() if name in HOST_READS)


def count(step: Callable[[], None]) -> OpCounter:
    with OpCounter() as counter:
        step()
    return counter


# ---------------------------------------------------------------- vision
#: stochastic depth of the training steps counted: the rate DeiT-T and SReT-T train with, and none
TRAIN_DROP_PATHS = (0.1, 0.0)


def vision_counts(name: str, batch: int = 2) -> Dict[str, OpCounter]:
    torch.manual_seed(0)
    from benchmarks.bench_vision import build

    model = build(name)
    size = getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[-2:]
    images = torch.randn(batch, 3, *size)
    labels = torch.zeros(batch, dtype=torch.long)
    model.eval()
    with torch.inference_mode():
        model(images)  # first call: lazy caches (partitions, masks) are built outside the count
        infer = count(lambda: model(images))
    counts = {"eval forward": infer}
    if hasattr(model, "recursions"):  # ours: also the inference copy with the LRC folded
        from fairseq_sret.core import fold_lrc

        folded = fold_lrc(model)
        with torch.inference_mode():
            folded(images)
            counts["eval forward, fold_lrc"] = count(lambda: folded(images))
    for rate in TRAIN_DROP_PATHS:
        trained = build(name, drop_path_rate=rate).train()
        trained(images)

        def train_step():
            F.cross_entropy(trained(images), labels).backward()

        counts[f"training step, drop path {rate}"] = count(train_step)
    return counts


# ---------------------------------------------------------------- translation
TINY = dict(encoder_embed_dim=256, decoder_embed_dim=256, encoder_ffn_embed_dim=1024,
            decoder_ffn_embed_dim=1024, encoder_attention_heads=4, decoder_attention_heads=4,
            share_all_embeddings=True)
NMT_MODELS = {
    "SReT tiny 2x2": ("sret_transformer_tiny", {}),
    "SReT tiny 2x2, LRC kept": ("sret_transformer_tiny", {"keep_lrc_in_generation": True}),
    "SReT tiny 2x2, no NLL": ("sret_transformer_tiny", {"nll_ratio": 0.0}),
    "transformer 2+2 post-LN": ("transformer", {"encoder_layers": 2, "decoder_layers": 2}),
    "transformer 4+4 post-LN": ("transformer", {"encoder_layers": 4, "decoder_layers": 4}),
}


def toy_model_and_sources(arch: str, overrides: dict, rows: int, src_len: int, vocab: int):
    """(task, model, sources (rows, src_len) ending in EOS), seeded: the same model and
    sources for every count of one architecture. The model is prepared for inference as
    fairseq-generate prepares it (``prepare_for_inference_``: eval mode, and SReT's LRC
    folded into its weights unless ``keep_lrc_in_generation``)."""
    from fairseq_sret_cli.toy import ToyTask, build_model

    torch.manual_seed(0)
    task = ToyTask.of_dictionary_size(vocab)
    model = build_model(arch, task=task, **TINY, **overrides)
    prepare_as_generate(model, beam=5)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (rows, src_len))
    src[:, -1] = d.eos()
    return task, model, src


class DecoderStep(NamedTuple):
    ops: OpCounter  # of the counted step
    incremental_state: Dict  # the decoder's caches after it
    model: torch.nn.Module


def decoder_step_counts(arch: str, overrides: dict, beam: int = 5, src_len: int = 20, step: int = 6,
                        vocab: int = 8000) -> DecoderStep:
    """The ops of decoding target token ``step`` incrementally (caches holding the earlier ones)."""
    task, model, src = toy_model_and_sources(arch, overrides, beam, src_len, vocab)
    d = task.source_dictionary
    prev = torch.randint(d.nspecial, len(d), (beam, step))
    prev[:, 0] = d.eos()
    incremental: Dict = {}
    with torch.inference_mode():
        encoder_out = model.encoder(src, src_lengths=torch.full((beam,), src_len))
        for t in range(1, step):
            model.decoder(prev[:, :t], encoder_out=encoder_out, incremental_state=incremental)
        counter = count(lambda: model.decoder(prev[:, :step], encoder_out=encoder_out, incremental_state=incremental))
    return DecoderStep(counter, incremental, model)


def cache_bytes(incremental: Dict, model: torch.nn.Module) -> Tuple[int, int]:
    """(all, encoder keys/values): bytes of the tensors in a decoder's incremental state (dicts,
    sequences and cache objects), each storage once. The encoder part is what fairseq's
    ``encoder_attn`` modules and SReT's shared ``cross_attn`` caches hold."""
    cross_ids = {module._incremental_state_id for name, module in model.named_modules()
                 if name.endswith("encoder_attn") and hasattr(module, "_incremental_state_id")}
    seen, total, encoder = set(), 0, 0

    def walk(value, cross):
        nonlocal total, encoder
        if isinstance(value, torch.Tensor):
            key = value.untyped_storage().data_ptr()
            if key not in seen:
                seen.add(key)
                size = value.untyped_storage().nbytes()
                total += size
                encoder += size if cross else 0
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(item, cross or name == "cross_attn" or str(name).split(".")[0] in cross_ids)
        elif isinstance(value, (list, tuple)):
            for item in value:
                walk(item, cross)
        elif hasattr(value, "__dict__") and not isinstance(value, torch.nn.Module):  # SReT's typed caches
            walk(vars(value), cross)

    walk(incremental, False)
    return total, encoder


def beam_step_counts(arch: str, overrides: dict, beam: int = 5, sentences: int = 4, src_len: int = 20,
                     lengths=(8, 16), vocab: int = 8000) -> OpCounter:
    """The ops of one step of fairseq's beam search, averaged: the ops of generating
    ``sentences`` translations forced to ``lengths[1]`` tokens minus those forced to
    ``lengths[0]``, over the steps in between (the encoder and the setup cancel)."""
    from fairseq.sequence_generator import SequenceGenerator

    task, model, src = toy_model_and_sources(arch, overrides, sentences, src_len, vocab)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.full((sentences,), src_len)}}
    counts = []
    for length in lengths:
        generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                      max_len_b=length, min_len=length)
        with torch.inference_mode():
            generator.forward(sample)  # first call outside the count, as for the other counts
            counts.append(count(lambda: generator.forward(sample)))
    per_step = OpCounter()
    steps = lengths[1] - lengths[0]
    for name, n in (counts[1].ops - counts[0].ops).items():
        if n % steps:
            raise RuntimeError(f"{arch}: {n} {name} operations over {steps} beam steps is not the same per step")
        per_step.ops[name] = n // steps
    return per_step


# ---------------------------------------------------------------- report
def build_parser():
    # counted on the CPU, on one thread: the counts depend on neither
    p = benchmark_parser(__doc__, smoke="only SReT-T of the vision models (harness check)", device=False,
                         threads=False)
    p.add_argument("--vision", nargs="*", default=["sret_t", "deit_tiny_patch16_224", "sret_s", "deit_small_patch16_224"],
                   help="vision models (ours, or timm's when timm imports)")
    p.add_argument("--no-nmt", dest="nmt", action="store_false", help="skip the translation decoder steps")
    p.add_argument("--by-op", nargs="*", default=[], metavar="MODEL", help="list these models' operations by name")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.vision = ["sret_t"]
    torch.set_num_threads(1)
    start_benchmark(args, torch.device("cpu"))

    rows, details = [], {}
    for name in args.vision:
        try:
            counts = vision_counts(name)
        except ImportError as exc:
            print(f"{name}: skipped ({exc})", file=sys.stderr)
            continue
        folded = counts.get("eval forward, fold_lrc")
        rows.append([name, counts["eval forward"].total, folded.total if folded else None]
                    + [counts[f"training step, drop path {rate}"].total for rate in TRAIN_DROP_PATHS])
        details[name] = counts["eval forward"]
    if rows:
        base = {r[0]: r for r in rows}
        table = []
        for name, infer, folded, *train in rows:
            ref = base.get("deit_tiny_patch16_224" if "_t" in name or "tiny" in name else "deit_small_patch16_224")

            def ratio(n, column):
                return f"{n / ref[column]:.2f}x" if ref and ref[0] != name and n is not None else ""

            table.append([name, str(infer), ratio(infer, 1), "" if folded is None else str(folded), ratio(folded, 1)]
                         + [cell for i, n in enumerate(train) for cell in (str(n), ratio(n, 3 + i))])
        print_table("Vision: kernel-launching operations (batch 2)",
                    ["model", "eval forward", "vs DeiT", "eval, fold_lrc", "vs DeiT"]
                    + [h for rate in TRAIN_DROP_PATHS for h in (f"training step, drop path {rate}", "vs DeiT")],
                    table)

    if args.nmt:
        nmt_rows, caches = [], []
        for label, (arch, overrides) in NMT_MODELS.items():
            decoded = decoder_step_counts(arch, overrides)
            search = beam_step_counts(arch, overrides)
            nmt_rows.append([label, decoded.ops.total, search.total, search.host_reads])
            caches.append([label, *cache_bytes(decoded.incremental_state, decoded.model)])
            details[label] = decoded.ops
        ref = {row[0]: row for row in nmt_rows}["transformer 4+4 post-LN"]
        print_table("Translation: kernel-launching operations per decoder step (beam 5, width 256, step 6) and "
                    "per step of fairseq's beam search (4 sentences x beam 5, steps 9-16)",
                    ["model", "decoder step", "vs transformer 4+4", "beam-search step", "vs transformer 4+4",
                     "host reads per beam-search step"],
                    [[label, str(n), f"{n / ref[1]:.2f}x", str(m), f"{m / ref[2]:.2f}x", str(reads)]
                     for label, n, m, reads in nmt_rows])
        ref = {row[0]: row for row in caches}["transformer 4+4 post-LN"]
        print_table("Translation: the decoder's incremental state after step 6 (beam 5, width 256, source 20 tokens, fp32)",
                    ["model", "KiB", "vs transformer 4+4", "encoder keys/values, KiB", "vs transformer 4+4"],
                    [[label, f"{total / 1024:.1f}", f"{total / ref[1]:.2f}x", f"{encoder / 1024:.1f}",
                      f"{encoder / ref[2]:.2f}x"] for label, total, encoder in caches])

    for name in args.by_op:
        if name not in details:
            print(f"--by-op {name}: not counted above", file=sys.stderr)
            continue
        print_table(f"{name}: operations, most first", ["operation", "count"], [[op, str(n)] for op, n in details[name].ops.most_common()])
    finish_benchmark(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
