"""Translation throughput through fairseq's own command-line tools.

    python -m benchmarks.bench_fairseq_cli --work /tmp/nmt_cli               # CUDA: fp16 and bf16
    python -m benchmarks.bench_fairseq_cli --work /tmp/nmt_cli --smoke       # CPU, tiny, fp32 (harness check)

For every precision and architecture (default ``sret_transformer_iwslt_de_en`` against
fairseq's ``transformer_iwslt_de_en`` made pre-LN with ``--encoder-normalize-before
--decoder-normalize-before``, both ``--share-all-embeddings``):

- ``fairseq_cli.train``: ``--max-update`` updates of ``--max-tokens`` tokens on a generated
  reversal corpus (``fairseq_sret_cli.toy``, ~10K joined vocabulary like IWSLT'14, 10-40
  words a sentence); target tokens/s = the median ``wps`` of fairseq's ``train_inner`` logs
  after the first interval (warm-up);
- ``fairseq_cli.generate``: beam ``--beam`` on ``--gen-sentences`` test sentences with every
  hypothesis forced to ``--gen-len`` tokens (``--min-len`` = ``--max-len-b``, ``--max-len-a 0``),
  so both models decode the same number of steps of the just-trained checkpoint;
  sentences/s as fairseq prints it (generation time only, which includes whatever the first
  batch does once: CUDA and Triton initialisation, kernels loaded on first use). The
  ``valid`` split is one batch (``--gen-batch`` sentences), also generated, in a process of
  its own; the difference of the two generation times is the time of the test set's other
  batches, whose rate is the "after the first batch" column (sentences drawn alike, decoded
  to the same length: what the first batch costs once is left out).

``--sdpa-decoding`` adds a row per SReT architecture: the same checkpoint generated with its
decoding steps attending through ``scaled_dot_product_attention``
(``fast_paths(one_query_attention="sdpa")``, the code before the matrix-product path).
``--profile-generate`` then generates the test split once more per model under
``torch.profiler`` and prints its top operators (not timed).

Precisions: ``fp16`` is fairseq's ``--fp16`` (half-precision model, fp32 master weights in the
optimizer; generation in half precision). ``bf16`` is bfloat16 autocast: fairseq's ``--bf16``
implies ``--tpu`` and does not run on a GPU, so training uses ``--amp`` with fairseq's autocast
switched to bfloat16, and generation runs inside ``torch.autocast("cuda", torch.bfloat16)``
(this module's ``run-train`` / ``run-generate`` wrappers do both). ``fp32``: neither (CPU).
Each run is its own process (fairseq's start-up is excluded from both rates).

``--work`` follows the rule of every command that writes (:mod:`fairseq_sret_cli.outputs`):
what the benchmark would replace there (the corpus, the data-bin, a checkpoint folder, a log,
``results.json``) must have been made by it, else it stops before running anything, unless
``--force``. A rerun reuses the corpus and data-bin made with the same data settings and
trains every model afresh (its checkpoint folder emptied, so that fairseq does not resume).
"""

import functools
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE_FLAGS = {"transformer_iwslt_de_en": ["--encoder-normalize-before", "--decoder-normalize-before"],
                  "transformer": ["--encoder-normalize-before", "--decoder-normalize-before"]}
WPS = re.compile(r'"wps":\s*"?([0-9.]+)')
INNER = re.compile(r"train_inner")
GEN = re.compile(r"Translated ([0-9,]+) sentences \(([0-9,]+) tokens\) in ([0-9.]+)s \(([0-9.]+) sentences/s, ([0-9.]+) tokens/s\)")


def build_parser():
    from benchmarks.common import benchmark_parser, positive_float, positive_int  # not at import: see main's json_text

    # the device is fairseq's choice (CUDA when available, the CPU with --smoke), as are its threads
    p = benchmark_parser(__doc__, smoke="CPU, tiny models and data, fp32 (harness check)", device=False,
                         threads=False)
    p.add_argument("--work", required=True,
                   help="folder for the corpus, the data-bin, checkpoints and logs: new, or one this benchmark"
                        " wrote (its corpus and data-bin are reused when made with the same data settings)")
    p.add_argument("--force", action="store_true",
                   help="replace what is in the way in --work (files and folders this benchmark would write)")
    p.add_argument("--archs", nargs="+", default=["sret_transformer_iwslt_de_en", "transformer_iwslt_de_en"])
    p.add_argument("--precisions", nargs="+", choices=["fp16", "bf16", "fp32"], default=None,
                   help="default: fp16 bf16 on CUDA, fp32 on CPU")
    p.add_argument("--vocab", type=positive_int, default=5000, help="words per side (joined dictionary ~2x)")
    p.add_argument("--train-sentences", type=positive_int, default=30000)
    p.add_argument("--max-tokens", type=positive_int, default=4096)
    p.add_argument("--max-update", type=positive_int, default=60)
    p.add_argument("--log-interval", type=positive_int, default=10)
    p.add_argument("--gen-sentences", type=positive_int, default=512)
    p.add_argument("--gen-batch", type=positive_int, default=128)
    p.add_argument("--gen-len", type=positive_int, default=30)
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--timeout", type=positive_float, default=180, help="seconds per fairseq process")
    p.add_argument("--skip-generate", action="store_true")
    p.add_argument("--sdpa-decoding", action="store_true",
                   help="also generate with SReT's decoding steps attending through scaled_dot_product_attention"
                        " (fast_paths(one_query_attention='sdpa'), the code before the matrix-product path): a"
                        " row of its own, the same checkpoint")
    p.add_argument("--profile-generate", action="store_true",
                   help="then generate the test split once more per model under torch.profiler and print its"
                        " top operators (by self device time, and by self CPU time with the runtime's"
                        " synchronisations); not timed")
    return p


def parse_args(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.archs = ["sret_transformer_tiny", "transformer"]
        args.precisions = ["fp32"]
        args.vocab, args.train_sentences, args.max_tokens = 40, 300, 400
        args.max_update, args.log_interval = 4, 1
        args.gen_sentences, args.gen_batch, args.gen_len, args.beam = 16, 8, 6, 2
        args.timeout = 240
        args.extra = ["--cpu", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim",
                      "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
                      "--decoder-attention-heads", "2", "--encoder-layers", "2", "--decoder-layers", "2"]
    else:
        args.extra = []
    return args


# ----------------------------------------------------------------------------- wrappers
def _bf16_autocast(*_, enabled=True, **__):
    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=enabled)


def run_train(argv):
    """fairseq_cli.train with fairseq's AMP autocast in bfloat16 when ``--sret-bf16`` is given."""
    import torch

    if "--sret-bf16" in argv:
        argv = [a for a in argv if a != "--sret-bf16"] + ["--amp"]
        torch.cuda.amp.autocast = functools.partial(_bf16_autocast)  # fairseq_task.train_step's autocast
    sys.argv = ["fairseq-train"] + argv
    from fairseq_cli.train import cli_main

    cli_main()


def run_generate(argv):
    """fairseq_cli.generate, inside bfloat16 autocast when ``--sret-bf16`` is given, under
    torch.profiler when ``--sret-profile`` is (its tables printed at the end)."""
    import contextlib

    import torch

    bf16 = "--sret-bf16" in argv
    profiled = "--sret-profile" in argv
    sdpa_decoding = "--sret-sdpa-decoding" in argv
    argv = [a for a in argv if a not in ("--sret-bf16", "--sret-profile", "--sret-sdpa-decoding")]
    if sdpa_decoding:
        from argparse import Namespace

        from fairseq.utils import import_user_module

        # the plugin loaded the way --user-dir loads it (models, patches), then switched
        import_user_module(Namespace(user_dir=str(REPO / "fairseq_sret")))
        from fairseq_sret.core.config import set_fast_paths

        set_fast_paths(one_query_attention="sdpa")
    sys.argv = ["fairseq-generate"] + argv
    from fairseq_cli.generate import cli_main

    with contextlib.ExitStack() as stack:
        if bf16:
            stack.enter_context(torch.autocast("cuda", dtype=torch.bfloat16))
        if profiled:
            from torch.profiler import ProfilerActivity, profile

            cuda = torch.cuda.is_available() and "--cpu" not in argv
            prof = stack.enter_context(
                profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])))
        cli_main()
    if profiled:
        averages = prof.key_averages()
        sorts = (["self_device_time_total"] if cuda else []) + ["self_cpu_time_total"]
        for sort in sorts:
            print(f"\n#### profile: fairseq-generate, whole run, sorted by {sort}\n")
            print(averages.table(sort_by=sort, row_limit=25, max_name_column_width=70), flush=True)


def after_first_batch(test, first):
    """Sentences/s of the test set's batches after the first: (test - one batch) sentences over
    the difference of the two generation times (None when either run failed or the
    difference is not positive)."""
    if not (test["sentences_s"] and first["sentences_s"]):
        return None
    extra_sentences = test["sentences"] - first["sentences"]
    extra_seconds = test["sentences"] / test["sentences_s"] - first["sentences"] / first["sentences_s"]
    return extra_sentences / extra_seconds if extra_sentences > 0 and extra_seconds > 0 else None


def table_rows(results, base_arch):
    """The table's rows: every (arch, precision)'s rates and their ratios over ``base_arch``'s."""
    from benchmarks.common import fmt_ratio

    rows = []
    for (arch, precision), (r, g) in results.items():
        base_r, base_g = results.get((base_arch, precision), (None, None))
        rows.append([
            arch, precision, f"{r['wps']:,.0f}" if r["wps"] else f"failed ({r['rc']})",
            fmt_ratio(r["wps"] / base_r["wps"]) if r["wps"] and base_r and base_r["wps"] else "n/a",
            f"{g['sentences_s']:.1f}" if g and g["sentences_s"] else "n/a",
            fmt_ratio(g["sentences_s"] / base_g["sentences_s"]) if g and g["sentences_s"] and base_g and base_g["sentences_s"] else "n/a",
            f"{g['tokens_s']:,.0f}" if g and g["tokens_s"] else "n/a",
            f"{g['after_first_batch']:.1f}" if g and g["after_first_batch"] else "n/a",
            fmt_ratio(g["after_first_batch"] / base_g["after_first_batch"])
            if g and g["after_first_batch"] and base_g and base_g["after_first_batch"] else "n/a",
        ])
    return rows


# ----------------------------------------------------------------------------- driver
def _run(cmd, log, timeout, outputs):
    """Run ``cmd`` with its output in the file ``log`` (recorded as made by ``outputs``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    start = time.perf_counter()
    with open(log, "w") as f:
        outputs.record(log)
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.perf_counter() - start, Path(log).read_text(errors="replace")


def data_settings(args) -> dict:
    """What the corpus and data-bin depend on."""
    return {"vocab": args.vocab, "train_sentences": args.train_sentences, "gen_batch": args.gen_batch,
            "gen_sentences": args.gen_sentences, "smoke": args.smoke}


def claim_work(args, work: Path):
    """(data outputs, run outputs) of this benchmark in ``work``, after checking that
    everything it would replace there is its own (or ``--force``); raises
    :class:`~fairseq_sret_cli.outputs.OutputInTheWay` naming what is in the way."""
    from fairseq_sret_cli.outputs import Outputs

    data = Outputs("bench_fairseq_cli", force=args.force, settings=data_settings(args))
    runs = Outputs("bench_fairseq_cli", force=args.force)  # logs and checkpoints: any run refreshes its own
    folders = [work / "raw", work / "bin"] + [
        work / f"ckpt_{arch}_{precision}" for arch in args.archs for precision in args.precisions]
    files = [work / "preprocess.log", work / "results.json"] + [
        work / f"{kind}_{arch}_{precision}{suffix}.log" for arch in args.archs for precision in args.precisions
        for kind, suffixes in (("train", [""]), ("generate", [f"_{split}{extra}" for split in ("test", "valid")
                                                              for extra in ("", "_sdpa", "_profiled")]))
        for suffix in suffixes]
    # a folder of ours made with other data settings is replaced, like a file of ours
    runs.check(files, replaced=folders)
    return data, runs


def prepare_data(args, work: Path, data, runs):
    """The corpus and its data-bin in ``work`` (reused when this benchmark made them with the
    same data settings)."""
    import shutil

    from fairseq_sret_cli.toy import write_reversal_corpus

    raw, binned = work / "raw", work / "bin"
    if data.made_by_me(binned) and (binned / "dict.src.txt").exists():
        return binned
    for folder in (raw, binned):  # checked by claim_work: ours, or --force
        if folder.exists():
            shutil.rmtree(folder)
    splits = (("train", args.train_sentences), ("valid", args.gen_batch), ("test", args.gen_sentences))
    write_reversal_corpus(raw, splits=splits, vocab_size=args.vocab, lengths=(10, 40) if not args.smoke else (3, 8))
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--source-lang", "src", "--target-lang", "tgt",
           "--trainpref", str(raw / "train"), "--validpref", str(raw / "valid"), "--testpref", str(raw / "test"),
           "--destdir", str(binned), "--joined-dictionary", "--workers", str(min(8, os.cpu_count() or 1))]
    rc, secs, out = _run(cmd, work / "preprocess.log", 300, runs)
    if rc != 0:
        raise SystemExit(f"fairseq preprocess failed ({rc}):\n{out[-2000:]}")
    data.record(raw, binned)
    print(f"data: {args.train_sentences} training pairs, {args.gen_sentences} test pairs, {args.gen_batch} valid pairs, "
          f"{sum(1 for _ in open(binned / 'dict.src.txt'))} dictionary entries (preprocessed in {secs:.0f} s)", flush=True)
    return binned


def precision_flags(precision):
    return {"fp16": ["--fp16"], "bf16": ["--sret-bf16"], "fp32": []}[precision]


def train(args, binned, arch, precision, work, runs):
    import shutil

    save = work / f"ckpt_{arch}_{precision}"
    if save.exists():  # checked by claim_work: ours, or --force; a fresh training, not a resumed one
        shutil.rmtree(save)
    save.mkdir(parents=True)
    runs.record(save)
    cmd = [sys.executable, "-m", "benchmarks.bench_fairseq_cli", "run-train", str(binned),
           "--user-dir", str(REPO / "fairseq_sret"), "--arch", arch, "--share-all-embeddings",
           *BASELINE_FLAGS.get(arch, []), "--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", "5e-4",
           "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "20", "--dropout", "0.3",
           "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
           "--max-tokens", str(args.max_tokens), "--max-update", str(args.max_update),
           "--log-format", "json", "--log-interval", str(args.log_interval), "--save-dir", str(save),
           "--no-epoch-checkpoints", "--disable-validation", "--num-workers", "0", "--seed", "1",
           *precision_flags(precision), *args.extra]
    rc, secs, out = _run(cmd, work / f"train_{arch}_{precision}.log", args.timeout, runs)
    wps = [float(m.group(1)) for line in out.splitlines() if INNER.search(line) for m in [WPS.search(line)] if m]
    rate = statistics.median(wps[1:]) if len(wps) > 1 else (wps[0] if wps else None)
    return {"rc": rc, "seconds": secs, "wps": rate, "intervals": len(wps), "checkpoint": save / "checkpoint_last.pt",
            "tail": out[-1500:]}


def generate(args, binned, arch, precision, checkpoint, work, runs, subset="test", profiled=False, sdpa_decoding=False):
    cmd = [sys.executable, "-m", "benchmarks.bench_fairseq_cli", "run-generate", str(binned),
           "--user-dir", str(REPO / "fairseq_sret"), "--path", str(checkpoint), "--gen-subset", subset,
           "--beam", str(args.beam), "--batch-size", str(args.gen_batch), "--min-len", str(args.gen_len),
           "--max-len-a", "0", "--max-len-b", str(args.gen_len), "--required-batch-size-multiple", "1",
           "--num-workers", "0", "--quiet", *precision_flags(precision), *(["--cpu"] if args.smoke else []),
           *(["--sret-profile"] if profiled else []), *(["--sret-sdpa-decoding"] if sdpa_decoding else [])]
    suffix = ("_profiled" if profiled else "") + ("_sdpa" if sdpa_decoding else "")
    log = work / f"generate_{arch}_{precision}_{subset}{suffix}.log"
    rc, secs, out = _run(cmd, log, args.timeout, runs)
    m = GEN.search(out)
    return {"rc": rc, "seconds": secs, "sentences_s": float(m.group(4)) if m else None,
            "tokens_s": float(m.group(5)) if m else None, "sentences": int(m.group(1).replace(",", "")) if m else None,
            "tail": out[-1500:], "output": out}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("run-train", "run-generate"):
        return (run_train if argv[0] == "run-train" else run_generate)(argv[1:])
    args = parse_args(argv)
    import torch

    sys.path.insert(0, str(REPO))
    from benchmarks.common import finish_benchmark, print_table, start_benchmark

    cuda = torch.cuda.is_available() and not args.smoke
    args.precisions = args.precisions or (["fp16", "bf16"] if cuda else ["fp32"])
    from fairseq_sret_cli.outputs import OutputInTheWay

    work = Path(args.work)
    try:
        data, runs = claim_work(args, work)
    except OutputInTheWay as exc:
        print(f"bench_fairseq_cli: {exc}", file=sys.stderr)
        return 2
    work.mkdir(parents=True, exist_ok=True)
    start_benchmark(args, torch.device("cuda" if cuda else "cpu"))
    binned = prepare_data(args, work, data, runs)
    results = {}
    for precision in args.precisions:
        for arch in args.archs:
            r = train(args, binned, arch, precision, work, runs)
            print(f"train {arch} {precision}: rc={r['rc']} {r['seconds']:.0f} s, wps {r['wps']}", flush=True)
            if r["rc"] != 0:
                print(r["tail"])
            variants = [(arch, False)] + ([(f"{arch}, SDPA decoding", True)]
                                          if args.sdpa_decoding and arch.startswith("sret") else [])
            for label, sdpa_decoding in variants:
                g = None
                if not args.skip_generate and r["checkpoint"].exists():
                    split_runs = [generate(args, binned, arch, precision, r["checkpoint"], work, runs, subset=split,
                                           sdpa_decoding=sdpa_decoding) for split in ("test", "valid")]
                    g, first = split_runs
                    g["after_first_batch"] = after_first_batch(g, first)
                    for split, run in zip(("test", "valid"), split_runs):
                        print(f"generate {label} {precision} {split}: rc={run['rc']} {run['seconds']:.0f} s, "
                              f"{run['sentences']} sentences, {run['sentences_s']} sentences/s", flush=True)
                        if run["rc"] != 0:
                            print(run["tail"])
                results[(label, precision)] = (r, g)
    base_arch = args.archs[-1]
    print_table(
        f"fairseq-train / fairseq-generate ({'cuda' if cuda else 'cpu'}): {args.max_update} updates of "
        f"{args.max_tokens} tokens; beam {args.beam}, {args.gen_sentences} sentences forced to {args.gen_len} tokens",
        ["arch", "precision", "train target tokens/s (wps)", f"vs {base_arch}", "generate sentences/s",
         f"vs {base_arch}", "generate tokens/s", "sentences/s after the first batch", f"vs {base_arch}"],
        table_rows(results, base_arch),
    )
    # imported here, not at the top: this module's child processes run fairseq's commands, whose
    # --user-dir skips the plugin's models when fairseq_sret was imported before it
    from fairseq_sret import json_text

    runs.write_text(work / "results.json", json_text.dumps(
        {f"{a}/{p}": {"train_wps": r["wps"], "train_rc": r["rc"], "generate_sentences_s": g and g["sentences_s"],
                      "generate_rc": g and g["rc"], "generate_sentences_s_after_first_batch": g and g["after_first_batch"]}
         for (a, p), (r, g) in results.items()}, indent=1, default=str))
    finish_benchmark(args)
    if args.profile_generate:
        for (arch, precision), (r, _) in results.items():
            if not args.skip_generate and r["checkpoint"].exists() and arch in args.archs:
                run = generate(args, binned, arch, precision, r["checkpoint"], work, runs, profiled=True)
                text = run["output"]
                print(f"\n### fairseq-generate {arch} {precision} under torch.profiler (rc={run['rc']}; "
                      f"{run['sentences_s']} sentences/s with the profiler's overhead)")
                print(text[text.find("#### profile:"):] if "#### profile:" in text else run["tail"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
