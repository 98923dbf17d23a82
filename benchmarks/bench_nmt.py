"""Translation-model speed: sret_transformer against fairseq's transformer.

    python -m benchmarks.bench_nmt                     # IWSLT'14 sizes, CPU
    python -m benchmarks.bench_nmt --threads 2 --batch 32 --src-len 30 --tgt-len 30
    python -m benchmarks.bench_nmt --smoke             # tiny, seconds (harness check)

Models are built through fairseq's model registry with the same width, heads, FFN size and
vocabulary (joined 10K, decoder input/output embeddings shared, as in the README's table):

  fairseq        ``transformer_iwslt_de_en``: 6 encoder + 6 decoder layers
  sret           ``sret_transformer_iwslt_de_en``: 3 unique layers x 2 recursions per side
                 (the same 6+6 layer applications), NLL after every application, LRC
  sret, no NLL   the same with ``--nll-ratio 0``: recursion + LRC only, i.e. exactly the
                 layer applications fairseq's model computes (the NLLs are extra layers
                 of the paper's architecture, ~20% more FLOPs at NLL ratio 1)

Training: target tokens/s of one step (forward, label-smoothed cross-entropy, backward, Adam
step) on a synthetic batch of ``--batch`` sentence pairs whose lengths are drawn up to
``--src-len``/``--tgt-len`` (left-padded sources, right-padded targets, as fairseq batches).
Generation: sentences/s of beam-5 ``fairseq.sequence_generator.SequenceGenerator`` on
``--gen-batch`` sources, every hypothesis forced to ``--tgt-len`` tokens (``min_len`` =
``max_len``) so that both models decode the same number of steps; each model a copy prepared
as fairseq-generate prepares it (cast to ``--gen-dtype``, then ``prepare_for_inference_``,
which folds SReT's LRC coefficients into its weights). All models are measured
in this one process, round-robin; ratios are over fairseq's model. Also printed: parameters,
forward GFLOPs of the training batch (torch's flop counter) and the peak memory of one step
(CPU: torch profiler allocations; CUDA: the allocator's peak).
Targets: training >= 0.95x, generation >= 0.90x of fairseq's speed.

``--compile-decoder`` adds two generation rows: fairseq's model with every decoder layer
compiled (``layer.compile(dynamic=True)``) and SReT with its shared decoder layers compiled
(``compile_shared_layers(model.decoder, dynamic=True)``: one graph per shared layer, reused by
its recursions), each a copy of the eager model's weights; the first batch's time (the
compilation) and whether the hypotheses equal the eager model's are printed.

``--sdpa-decoding`` adds the generation row "sret, SDPA decoding": the model of "sret", its
decoding steps attending through ``scaled_dot_product_attention`` instead of two matrix
products (``fast_paths(one_query_attention="sdpa")``, the code before the matrix-product path).
``--keep-lrc`` adds the generation row "sret, LRC kept": the weights of "sret" prepared with
``keep_lrc_in_generation`` (the LRC coefficients apart, two element-wise operations per
residual). ``--gen-dtype float16`` generates with every model cast to half precision (as
``fairseq-generate --fp16`` casts it); ``--skip-train`` leaves out the training rows.

``--before`` adds the row "sret, before": the same weights as "sret", run the way the code ran
before the fast paths (the LRC kept apart at generation and computed as three element-wise
kernels, ``fast_paths(lrc_one_op=False, fused="off")``, and the layers' residual stream as a
transposed (B, T, C) view of fairseq's (T, B, C) instead of a contiguous copy), so both are
measured in this one process.
"""

import copy
import time
import types
import warnings
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from benchmarks.common import (
    benchmark_parser, non_negative_int, positive_int,
    clock_note, default_clock, finish_benchmark, flop_counter, fmt_ratio, measure, median, mib,
    peak_memory, prepare_as_generate, print_table, profile_table, quiet_logging, start_benchmark, sync,
)
from fairseq.sequence_generator import SequenceGenerator
from fairseq_sret.core import compile_shared_layers, fast_paths
from fairseq_sret.models.sret_transformer import SReTDecoderLayer, SReTEncoderLayer
from fairseq_sret_cli.toy import ToyTask, architecture_args, build_model

TARGETS = {"train": 0.95, "generate": 0.90}
warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")


def build_parser():
    p = benchmark_parser(__doc__)
    p.set_defaults(device="cpu")
    p.add_argument("--fairseq-arch", default="transformer_iwslt_de_en")
    p.add_argument("--sret-arch", default="sret_transformer_iwslt_de_en")
    p.add_argument("--vocab", type=positive_int, default=10000)
    p.add_argument("--batch", type=positive_int, default=32, help="sentence pairs per training batch")
    p.add_argument("--src-len", type=positive_int, default=30, help="longest source (tokens, incl. EOS)")
    p.add_argument("--tgt-len", type=positive_int, default=30, help="longest target; also the generated length")
    p.add_argument("--gen-batch", type=positive_int, default=16, help="sentences per generation batch")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--warmup", type=non_negative_int, default=1)
    p.add_argument("--iters", type=positive_int, default=2)
    p.add_argument("--rounds", type=positive_int, default=3)
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="timer: wall-clock, or this process's CPU time (default: cpu for single-threaded CPU"
                        " runs, where other load on a shared machine inflates wall time, else wall)")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--skip-train", action="store_true")
    p.add_argument("--skip-generate", action="store_true")
    p.add_argument("--gen-dtype", choices=["float32", "float16", "bfloat16"], default="float32",
                   help="generate with the models cast to this dtype (as fairseq-generate --fp16 casts them)")
    p.add_argument("--profile", action="store_true",
                   help="print torch.profiler tables of one training step and one generation batch per model")
    p.add_argument("--compile-decoder", action="store_true",
                   help="also generate with the decoder layers compiled (fairseq's and SReT's shared ones)")
    p.add_argument("--sdpa-decoding", action="store_true",
                   help="also generate with 'sret, SDPA decoding': the same model, its decoding steps attending"
                        " through scaled_dot_product_attention (the code before the matrix-product path)")
    p.add_argument("--keep-lrc", action="store_true",
                   help="also generate with 'sret, LRC kept': the same weights prepared with"
                        " keep_lrc_in_generation (the LRC coefficients not folded into the weights)")
    p.add_argument("--before", action="store_true",
                   help="also measure 'sret, before': the code paths before the fast paths (see above)")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.vocab, args.batch, args.src_len, args.tgt_len, args.gen_batch = 200, 4, 8, 6, 2
        args.warmup, args.iters, args.rounds = 1, 1, 1
        args.small = dict(encoder_embed_dim=32, decoder_embed_dim=32, encoder_ffn_embed_dim=64,
                          decoder_ffn_embed_dim=64, encoder_attention_heads=4, decoder_attention_heads=4)
    else:
        args.small = {}
    return args


def synthetic_batch(task, batch, src_len, tgt_len, device, seed=0):
    """fairseq-style batch: left-padded sources, right-padded targets, prev_output_tokens."""
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    src_lengths = torch.randint(max(2, src_len // 2), src_len + 1, (batch,), generator=g)
    tgt_lengths = torch.randint(max(2, tgt_len // 2), tgt_len + 1, (batch,), generator=g)
    src = torch.full((batch, src_len), d.pad(), dtype=torch.long)
    target = torch.full((batch, tgt_len), d.pad(), dtype=torch.long)
    prev = torch.full((batch, tgt_len), d.pad(), dtype=torch.long)
    for i, (s, t) in enumerate(zip(src_lengths.tolist(), tgt_lengths.tolist())):
        words = torch.randint(d.nspecial, len(d), (s - 1,), generator=g)
        src[i, src_len - s:] = torch.cat([words, torch.tensor([d.eos()])])
        out = torch.randint(d.nspecial, len(d), (t - 1,), generator=g)
        target[i, :t] = torch.cat([out, torch.tensor([d.eos()])])
        prev[i, :t] = torch.cat([torch.tensor([d.eos()]), out])
    return {
        "net_input": {"src_tokens": src.to(device), "src_lengths": src_lengths.to(device),
                      "prev_output_tokens": prev.to(device)},
        "target": target.to(device),
        "ntokens": int(tgt_lengths.sum()),
    }


def _encoder_forward_strided(self, x, encoder_padding_mask, attn_mask=None):
    """SReTEncoderLayer.forward before the fast paths: the stream as a transposed view."""
    return self.recursive(x.transpose(0, 1), key_padding_mask=encoder_padding_mask).transpose(0, 1)


def _decoder_forward_strided(self, x, encoder_out=None, encoder_padding_mask=None, incremental_state=None,
                             prev_self_attn_state=None, prev_attn_state=None, self_attn_mask=None,
                             self_attn_padding_mask=None, need_attn=False, need_head_weights=False):
    """SReTDecoderLayer.forward before the fast paths (same checks skipped: benchmark inputs)."""
    memory = None if encoder_out is None else encoder_out.transpose(0, 1)
    out = self.recursive(x.transpose(0, 1), key_padding_mask=self_attn_padding_mask, memory=memory,
                         memory_padding_mask=encoder_padding_mask, caches=self._caches(incremental_state))
    return out.transpose(0, 1), None, None


def as_before(model):
    """Give ``model``'s layers the residual-stream layout of the code before the fast paths."""
    for module in model.modules():
        if isinstance(module, SReTEncoderLayer):
            module.forward = types.MethodType(_encoder_forward_strided, module)
        elif isinstance(module, SReTDecoderLayer):
            module.forward = types.MethodType(_decoder_forward_strided, module)
    return model


def switches(name):
    """The fast-path switches a row runs under."""
    if name.endswith("before"):
        return fast_paths(lrc_one_op=False, fused="off")
    if name.endswith("SDPA decoding"):
        return fast_paths(one_query_attention="sdpa")
    return nullcontext()


def train_step_fn(model, sample, pad, context=nullcontext):
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))

    def step():
        with context():
            _step()

    def _step():
        model.train()
        logits, _ = model(**sample["net_input"])
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), sample["target"].view(-1),
                               ignore_index=pad, label_smoothing=0.1, reduction="sum")
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def generate_fn(model, task, sample, beam, length, context=nullcontext):
    generator = SequenceGenerator([model], task.target_dictionary, beam_size=beam, max_len_a=0,
                                  max_len_b=length, min_len=length)
    net_input = {"src_tokens": sample["net_input"]["src_tokens"], "src_lengths": sample["net_input"]["src_lengths"]}

    def step():
        model.eval()
        with torch.no_grad(), context():
            hyps = generator.forward({"net_input": net_input})
        return hyps

    return step


#: rows whose model keeps its LRC coefficients apart at generation
KEEP_LRC = ("sret, LRC kept", "sret, before")


def prepared_for_generation(model, dtype, beam, keep_lrc=False):
    """A copy of ``model`` prepared as fairseq-generate prepares it: cast to ``dtype``, then
    ``prepare_for_inference_`` (eval mode; SReT's LRC folded into its weights unless ``keep_lrc``)."""
    model = copy.deepcopy(model).to(getattr(torch, dtype))
    if keep_lrc:
        model.args.keep_lrc_in_generation = True
    prepare_as_generate(model, beam)
    return model


#: generation rows added by --compile-decoder, and the eager model each copies
COMPILED = {"fairseq transformer, compiled decoder layers": "fairseq transformer",
            "sret, compiled decoder layers": "sret"}
#: generation rows that run another row's model (same weights, same FLOPs) on other code paths
SAME_MODEL = {**COMPILED, "sret, SDPA decoding": "sret", "sret, LRC kept": "sret"}


def with_compiled_decoder(model):
    """A copy of ``model`` whose decoder layers are compiled on their first call: SReT's
    shared layers once each (reused by the recursions), fairseq's layers one by one."""
    model = copy.deepcopy(model)
    if any(isinstance(layer, SReTDecoderLayer) for layer in model.decoder.layers):
        compile_shared_layers(model.decoder, dynamic=True)
    else:
        # one graph per layer (Dynamo guards on each layer's incremental-state key), each
        # within the limit of graphs that share the layer class's forward code
        config = torch._dynamo.config
        config.recompile_limit = max(config.recompile_limit, 4 * len(model.decoder.layers))
        for layer in model.decoder.layers:
            layer.compile(dynamic=True)
    return model


def label_reorder(model):
    """Make the beam-search cache reordering a named row in profiler tables."""
    decoder = model.decoder
    if getattr(decoder, "_reorder_labelled", False):  # a model shared by two rows
        return
    decoder._reorder_labelled = True
    inner = decoder.reorder_incremental_state_scripting

    def reorder(incremental_state, new_order):
        with torch.profiler.record_function("## decoder.reorder_incremental_state"):
            return inner(incremental_state, new_order)

    decoder.reorder_incremental_state_scripting = reorder


def forward_gflops(model, sample):
    model.eval()
    with torch.no_grad(), flop_counter() as counter:
        model(**sample["net_input"])
    return counter.get_total_flops() / 1e9


def build_models(args, task, device):
    """The models to compare (name -> model on ``device``), their parameter counts and layer
    applications (encoder + decoder); prints their architectures."""
    options = dict(share_decoder_input_output_embed=True, **args.small)
    fa, sa = architecture_args(args.fairseq_arch, **options), architecture_args(args.sret_arch, **options)
    torch.manual_seed(0)
    models = {}
    models["fairseq transformer"] = build_model(args.fairseq_arch, task=task, **options)
    models["sret"] = build_model(args.sret_arch, task=task, **options)
    models["sret, no NLL"] = build_model(args.sret_arch, task=task, nll_ratio=0.0, **options)
    if args.before:
        models["sret, before"] = as_before(build_model(args.sret_arch, task=task, **options))
        models["sret, before"].load_state_dict(models["sret"].state_dict())
    for m in models.values():
        m.to(device)
    apps = {
        "fairseq transformer": (fa.encoder_layers, fa.decoder_layers),
        "sret": (sa.encoder_layers * sa.encoder_recursions, sa.decoder_layers * sa.decoder_recursions),
    }
    apps["sret, no NLL"] = apps["sret, before"] = apps["sret"]
    print(f"architectures: {args.fairseq_arch} vs {args.sret_arch} (unique layers {sa.encoder_layers}+"
          f"{sa.decoder_layers} x {sa.encoder_recursions} recursions); width {fa.encoder_embed_dim}, FFN "
          f"{fa.encoder_ffn_embed_dim}, heads {fa.encoder_attention_heads}, vocabulary {len(task.source_dictionary)}, "
          f"dropout {fa.dropout} / {sa.dropout}")
    params = {n: sum(p.numel() for p in m.parameters()) for n, m in models.items()}
    if args.before:
        print("'sret, before': the weights of 'sret', run on the code paths before the fast paths")
    return models, params, apps


def bench_training(args, task, models, params, apps, device):
    """The training table: one step of every model, round-robin."""
    sample = synthetic_batch(task, args.batch, args.src_len, args.tgt_len, device)
    ntok, pad = sample["ntokens"], task.target_dictionary.pad()
    gflops = {n: forward_gflops(m, sample) for n, m in models.items()}
    train = {n: train_step_fn(m, sample, pad, lambda n=n: switches(n)) for n, m in models.items()}
    t = measure(train, device, args.warmup, args.iters, args.rounds, args.clock)
    mem = {n: (None if args.no_memory else peak_memory(train[n], device)) for n in models}
    base = median(t["fairseq transformer"])
    rows = []
    for n in models:
        s = median(t[n])
        rows.append([n, "{}+{}".format(*apps[n]), f"{params[n] / 1e6:.2f}", f"{gflops[n]:.2f}",
                     f"{ntok / s:,.0f}", fmt_ratio(base / s), fmt_ratio(gflops["fairseq transformer"] / gflops[n]),
                     f"{s * 1e3:.0f}", mib(mem[n])])
    print_table(
        f"NMT training ({device.type}): target tokens/s, batch of {args.batch} pairs, {ntok} target tokens "
        f"(lengths up to {args.src_len}/{args.tgt_len})",
        ["model", "layer applications enc+dec", "params (M)", "forward GFLOPs", "target tokens/s",
         "speed vs fairseq", "FLOPs ratio (fairseq / model)", "ms / step", "peak MiB (step)"],
        rows,
    )
    print(f"target check (train): sret = {base / median(t['sret']):.2f}x fairseq (target >= {TARGETS['train']}x);"
          f" sret, no NLL = {base / median(t['sret, no NLL']):.2f}x")
    if args.profile:
        for n in models:
            profile_table(train[n], device, f"training step, {n}", steps=1, rows=12)


def bench_generation(args, task, models, params, device):
    """The generation table: a beam-search batch of every model (copies prepared as
    fairseq-generate prepares them), round-robin."""
    gen_sample = synthetic_batch(task, args.gen_batch, args.src_len, args.tgt_len, device, seed=1)
    if args.keep_lrc:
        models["sret, LRC kept"], params["sret, LRC kept"] = models["sret"], params["sret"]
    models = {n: prepared_for_generation(m, args.gen_dtype, args.beam, keep_lrc=n in KEEP_LRC)
              for n, m in models.items()}
    if args.compile_decoder:
        for n, eager in COMPILED.items():
            models[n] = with_compiled_decoder(models[eager])
            params[n] = params[eager]
    if args.sdpa_decoding:
        models["sret, SDPA decoding"], params["sret, SDPA decoding"] = models["sret"], params["sret"]
    gen = {n: generate_fn(m, task, gen_sample, args.beam, args.tgt_len, lambda n=n: switches(n))
           for n, m in models.items()}
    hypotheses, first_call = {}, {}
    for n in models:
        sync(device)
        start = time.perf_counter()
        hypotheses[n] = [h[0]["tokens"].tolist() for h in gen[n]()]
        first_call[n] = time.perf_counter() - start
    lengths = {n: sorted({len(tokens) for tokens in hypotheses[n]}) for n in models}
    if args.compile_decoder:
        for n, eager in COMPILED.items():
            same = "identical to" if hypotheses[n] == hypotheses[eager] else "DIFFERENT from"
            print(f"{n}: first batch {first_call[n]:.1f} s wall (compiles; eager {first_call[eager]:.1f} s), "
                  f"hypotheses {same} the eager model's")
    gen_gflops = {}
    for n in models:
        if n in SAME_MODEL:  # the same computation as its eager model: that model's FLOPs
            continue
        with flop_counter() as counter:
            gen[n]()
        gen_gflops[n] = counter.get_total_flops() / 1e9
    gen_gflops.update({n: gen_gflops[eager] for n, eager in SAME_MODEL.items() if n in models})
    t = measure(gen, device, 0, args.iters, args.rounds, args.clock)
    mem = {n: (None if args.no_memory else peak_memory(gen[n], device)) for n in models}
    base = median(t["fairseq transformer"])
    rows = []
    for n in models:
        s = median(t[n])
        rows.append([n, f"{params[n] / 1e6:.2f}", f"{gen_gflops[n]:.2f}", f"{args.gen_batch / s:.2f}",
                     fmt_ratio(base / s), fmt_ratio(gen_gflops["fairseq transformer"] / gen_gflops[n]),
                     f"{s * 1e3:.0f}", ",".join(map(str, lengths[n])), mib(mem[n])])
    print_table(
        f"NMT generation ({device.type}, {args.gen_dtype}): beam {args.beam}, {args.gen_batch} sentences per "
        f"batch, sentences/s",
        ["model", "params (M)", "GFLOPs / batch", "sentences/s", "speed vs fairseq", "FLOPs ratio (fairseq / model)",
         "ms / batch", "output tokens (incl. EOS)", "peak MiB (batch)"],
        rows,
    )
    print(f"target check (generate): sret = {base / median(t['sret']):.2f}x fairseq (target >= "
          f"{TARGETS['generate']}x); sret, no NLL = {base / median(t['sret, no NLL']):.2f}x")
    if args.profile:
        for n, m in models.items():
            label_reorder(m)
            profile_table(gen[n], device, f"beam-{args.beam} generation, {n}", steps=1, rows=14)


def main(argv=None):
    args = parse_args(argv)
    quiet_logging()
    device = start_benchmark(args)
    task = ToyTask.of_dictionary_size(args.vocab)
    args.clock = args.clock or default_clock(device)
    print(f"settings: warmup {args.warmup}, {args.iters} iterations x {args.rounds} rounds (median of rounds),"
          f" {clock_note(args.clock)}")
    models, params, apps = build_models(args, task, device)
    if not args.skip_train:
        bench_training(args, task, models, params, apps, device)
    if not args.skip_generate:
        bench_generation(args, task, models, params, device)
    finish_benchmark(args)


if __name__ == "__main__":
    main()
