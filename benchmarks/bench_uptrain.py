"""Uptraining, a CPU stand-in on the reversal toy task: a trained 4+4 pre-LN fairseq
transformer converted by sret-uptrain to 2 unique layers x 2 recursions per side and
fine-tuned, against the same 2x2 sret_transformer trained from scratch.

    python -m benchmarks.bench_uptrain                    # the measurement (~10-15 min, one core)
    python -m benchmarks.bench_uptrain --smoke            # tiny, a minute (harness check)

Not the project's GPU measurement (Multi30k, 6+6 -> 3x2): the same protocol on a task a CPU
trains in minutes. Data: the reversal corpus (reverse the words, map w<i> to v<i>) with
``--vocab`` words and 4-16 words per sentence. Every run is fairseq-train with the same
optimisation (Adam 0.9/0.98, inverse-sqrt lr with warm-up, label smoothing 0.1, dropout
0.1, ``--max-tokens``), single-threaded, validation every ``--valid-every`` updates:

  teacher      fairseq ``transformer``, 4+4 layers, pre-LN, ``--teacher-updates`` updates
  uptrained    ``sret-uptrain`` of the teacher's best checkpoint (layers 0+1 -> 0, 2+3 -> 1,
               identity NLLs, LRC 1), fine-tuned ``--updates`` updates with
               ``--finetune-from-model`` (fresh optimiser and schedule)
  scratch      the same sret_transformer options (sret-uptrain prints them), random init,
               ``--updates`` updates
  scratch, teacher's budget too   (unless --no-long-scratch) the scratch run for
               teacher + fine-tuning updates: the uptrained model's total training

Reported: the valid loss (label-smoothed, base 2) of the converted model before fine-tuning
(fairseq-validate), each run's best valid loss, the first fine-tuning update whose valid
loss reaches the from-scratch run's best, and test BLEU (beam 4, last checkpoint, sacreBLEU
with tokenize=none: the words are the tokens).
"""

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import (
    benchmark_parser, finish_benchmark, non_negative_int, positive_float, positive_int, print_table, start_benchmark,
)

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
USER_DIR = ["--user-dir", str(REPO / "fairseq_sret")]
VALID = re.compile(r"valid on 'valid' subset \| loss ([\d.]+) .*?\| num_updates (\d+)")


def env():
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def tool(name, *args, log=None):
    cmd = [str(BIN / name), *map(str, args)]
    result = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    if log is not None:
        Path(log).write_text(result.stdout + result.stderr)
    if result.returncode != 0:
        raise SystemExit(f"{name} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result.stdout + result.stderr


def parallel(commands):
    """Run (name, args, log) tool commands two at a time; returns their outputs in order."""
    procs, outputs = [], [None] * len(commands)
    pending = list(enumerate(commands))
    while pending or procs:
        while pending and len(procs) < 2:
            i, (name, args, log) = pending.pop(0)
            handle = open(log, "w")
            procs.append((i, name, log, handle, subprocess.Popen([str(BIN / name), *map(str, args)], env=env(),
                                                                 stdout=handle, stderr=subprocess.STDOUT, text=True)))
        i, name, log, handle, proc = procs.pop(0)
        code = proc.wait()
        handle.close()
        outputs[i] = Path(log).read_text()
        if code != 0:
            raise SystemExit(f"{name} failed:\n{outputs[i][-3000:]}")
    return outputs


def curve(log: str):
    """[(update, valid loss)] in update order (one point per update)."""
    points = {int(u): float(loss) for loss, u in VALID.findall(log)}
    return sorted(points.items())


def bleu(data, checkpoint, raw):
    from fairseq_sret_cli.evaluation.bleu import tokenized_bleu

    out = tool("fairseq-generate", data, *USER_DIR, "--path", checkpoint, "--gen-subset", "test", "--beam", "4",
               "--batch-size", "64", "--cpu", "--required-batch-size-multiple", "1")
    hyps = dict(re.findall(r"^H-(\d+)\t\S+\t(.*)$", out, flags=re.M))
    refs = (raw / "test.tgt").read_text().splitlines()
    return tokenized_bleu([hyps.get(str(i), "") for i in range(len(refs))], refs).score


def build_parser():
    # CPU only; every fairseq run is single-threaded (OMP_NUM_THREADS=1)
    p = benchmark_parser(__doc__, smoke="tiny settings (harness check)", device=False, threads=False)
    p.add_argument("--work-dir", default=None, help="where data and checkpoints go (default: a temporary folder)")
    p.add_argument("--teacher-updates", type=positive_int, default=1200)
    p.add_argument("--updates", type=positive_int, default=800, help="fine-tuning and from-scratch updates")
    p.add_argument("--valid-every", type=positive_int, default=25)
    p.add_argument("--dim", type=positive_int, default=64)
    p.add_argument("--vocab", type=positive_int, default=40)
    p.add_argument("--train-sentences", type=positive_int, default=4000)
    p.add_argument("--eval-sentences", type=positive_int, default=200, help="valid and test sentences each")
    p.add_argument("--lr", type=positive_float, default=2e-3)
    p.add_argument("--warmup", type=non_negative_int, default=100)
    p.add_argument("--max-tokens", type=positive_int, default=1500)
    p.add_argument("--seed", type=non_negative_int, default=1)
    p.add_argument("--no-long-scratch", action="store_true", help="skip the from-scratch run with the teacher's budget")
    return p


def prepare_data(args, work: Path):
    """The reversal corpus and its data-bin in ``work``: (raw text folder, data-bin)."""
    from fairseq_sret_cli.toy import write_reversal_corpus

    raw = write_reversal_corpus(work / "raw", (("train", args.train_sentences), ("valid", args.eval_sentences),
                                                 ("test", args.eval_sentences)),
                                seed=0, vocab_size=args.vocab, lengths=(4, 16))
    data = work / "data-bin"
    tool("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", data, "--joined-dictionary",
         "--workers", "1")
    return raw, data


def train_runs(args, work: Path, data: Path):
    """The teacher, its conversion and the runs after it: (valid-loss curves by run, the
    converted model's valid loss before fine-tuning)."""
    optim = ["--optimizer", "adam", "--adam-betas", "(0.9,0.98)", "--lr", args.lr, "--lr-scheduler", "inverse_sqrt",
             "--warmup-updates", args.warmup, "--warmup-init-lr", "1e-7", "--dropout", "0.1",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", args.max_tokens, "--cpu", "--num-workers", "0", "--seed", args.seed,
             "--log-format", "simple", "--log-interval", "50", "--no-epoch-checkpoints",
             "--required-batch-size-multiple", "1", "--validate-interval-updates", args.valid_every]
    dim = args.dim
    teacher_model = ["--arch", "transformer", "--encoder-layers", "4", "--decoder-layers", "4",
                     "--encoder-embed-dim", dim, "--decoder-embed-dim", dim, "--encoder-ffn-embed-dim", 4 * dim,
                     "--decoder-ffn-embed-dim", 4 * dim, "--encoder-attention-heads", "4",
                     "--decoder-attention-heads", "4", "--encoder-normalize-before", "--decoder-normalize-before",
                     "--share-all-embeddings"]
    # fairseq alone (no plugin, so no consumer_exit patch): no reading thread to abort its exit
    teacher_log = tool("fairseq-train", data, *optim, *teacher_model, "--max-update", args.teacher_updates,
                       "--data-buffer-size", "0", "--save-dir", work / "teacher", log=work / "teacher.log")
    teacher = work / "teacher" / "checkpoint_best.pt"  # what a user converts: the best valid loss

    converted = work / "uptrained.pt"
    result = subprocess.run([sys.executable, "-m", "fairseq_sret_cli.uptrain", teacher, converted],
                            env=env(), capture_output=True, text=True, check=True)
    sret_model = result.stdout.split()
    print("sret-uptrain:", " ".join(line.strip() for line in result.stderr.splitlines() if "->" in line))
    print("sret_transformer options:", " ".join(sret_model))
    before = tool("fairseq-validate", data, *USER_DIR, "--path", converted, "--task", "translation", "--valid-subset", "valid", "--cpu",
                  "--max-tokens", args.max_tokens, "--criterion", "label_smoothed_cross_entropy",
                  "--label-smoothing", "0.1")
    loss_before = float(re.search(r"valid on 'valid' subset \| loss ([\d.]+)", before).group(1))

    runs = {
        "uptrained": ["fairseq-train", [data, *USER_DIR, *optim, *sret_model, "--finetune-from-model", converted,
                                        "--max-update", args.updates, "--save-dir", work / "uptrained"],
                      work / "uptrained.log"],
        "scratch": ["fairseq-train", [data, *USER_DIR, *optim, *sret_model, "--max-update", args.updates,
                                      "--save-dir", work / "scratch"], work / "scratch.log"],
    }
    if not args.no_long_scratch:
        long_updates = args.teacher_updates + args.updates
        runs["scratch_long"] = ["fairseq-train", [data, *USER_DIR, *optim, *sret_model, "--max-update", long_updates,
                                                  "--save-dir", work / "scratch_long"], work / "scratch_long.log"]
    logs = dict(zip(runs, parallel(list(runs.values()))))
    curves = {name: curve(log) for name, log in logs.items()}
    curves["teacher"] = curve(teacher_log)
    return curves, loss_before


def report(args, work: Path, data: Path, raw: Path, curves, loss_before) -> None:
    """The table of the runs (best and last valid loss, test BLEU) and their curves."""
    scratch_best = min(loss for _, loss in curves["scratch"])
    reached = next((u for u, loss in curves["uptrained"] if loss <= scratch_best), None)
    rows = []
    labels = {"teacher": "teacher: transformer 4+4 pre-LN",
              "uptrained": "uptrained 2x2: the teacher's best checkpoint converted, then fine-tuned",
              "scratch": "scratch 2x2: random init",
              "scratch_long": "scratch 2x2: random init, the teacher's updates too"}
    updates = {"teacher": f"{args.teacher_updates}", "uptrained": f"{args.updates} (+{args.teacher_updates} teacher)",
               "scratch": f"{args.updates}", "scratch_long": f"{args.teacher_updates + args.updates}"}
    for name in ("teacher", "uptrained", "scratch", "scratch_long"):
        if name not in curves:
            continue
        points = curves[name]
        best_update, best = min(points, key=lambda x: x[1])
        ckpt = work / name / "checkpoint_last.pt"
        first = "-" if name == "scratch" else next((str(u) for u, loss in points if loss <= scratch_best), "never")
        rows.append([labels[name], updates[name], f"{best:.3f} ({best_update})", f"{points[-1][1]:.3f}", first,
                     f"{bleu(data, ckpt, raw):.2f}"])
    print()
    print(f"converted model before fine-tuning: valid loss {loss_before:.3f}"
          f" (the teacher's best checkpoint: {min(loss for _, loss in curves['teacher']):.3f})")
    print(f"from-scratch best valid loss ({args.updates} updates): {scratch_best:.3f};"
          f" the uptrained model reaches it at update {reached}")
    print_table(f"uptraining vs. from scratch, reversal toy task (vocab {args.vocab}, 4-16 words, width {args.dim})",
                ["run", "updates", "best valid loss (update)", "last valid loss", f"first update <= {scratch_best:.3f}",
                 "test BLEU (beam 4, last)"], rows)
    print("valid loss curves (update: loss), every", args.valid_every, "updates:")
    for name in ("uptrained", "scratch"):
        pts = curves[name]
        step = max(1, len(pts) // 8)
        print(f"  {name}: " + ", ".join(f"{u}: {loss:.2f}" for u, loss in pts[::step]))


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.teacher_updates, args.updates, args.valid_every, args.dim, args.train_sentences = 12, 8, 4, 32, 150
        args.eval_sentences = 30
        args.no_long_scratch = True
    start_benchmark(args, torch.device("cpu"))
    print("every fairseq run: OMP_NUM_THREADS=1, two runs at a time")
    began = time.time()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench_uptrain_"))
    raw, data = prepare_data(args, work)
    curves, loss_before = train_runs(args, work, data)
    report(args, work, data, raw, curves, loss_before)
    finish_benchmark(args)
    print(f"total wall time {time.time() - began:.0f} s; work dir {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
