"""The quick start against fairseq's transformer at the same budget, in one sitting, one job
at a time: ``scripts/quickstart.sh`` with its defaults (SReT, a fixed number of updates),
then fairseq's ``transformer`` 3+3 of the same width (256/1024, 4 heads), pre-LN and post-LN,
with the same data, schedule and evaluation, each stopped after the SReT run's training time.

    python -m benchmarks.quickstart_budget --out runs/quickstart_budget --results docs/results
    python -m benchmarks.quickstart_budget --out runs/quickstart_budget --report-only

Writes ``quickstart_budget.{json,md}`` to ``--results``: per model its unique parameters,
layer applications, updates, training time, whole-job time (set-up excluded), sacreBLEU
(with signature), tokenized lowercased BLEU and chrF on test_2016_flickr. Takes about 1.5
hours on a 2-core CPU (three ~28-minute jobs); every run folder resumes as the quick start
does, and a finished one is only evaluated again.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from benchmarks.common import benchmark_parser, checked_outputs, command_line, cpu_model
from fairseq_sret import json_text

REPO = Path(__file__).resolve().parents[1]
WIDTH = ("--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256"
         " --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024"
         " --encoder-attention-heads 4 --decoder-attention-heads 4")
BASELINES = {
    "transformer_preln": ("fairseq `transformer` 3+3, pre-LN",
                          WIDTH + " --encoder-normalize-before --decoder-normalize-before"),
    "transformer_postln": ("fairseq `transformer` 3+3, post-LN (as shipped)", WIDTH),
}
SRET = ("sret", "SReT `sret_transformer_tiny` (quick-start defaults)")


def run_quickstart(run_dir: Path, env: dict) -> None:
    """One quick-start job; its output goes to the terminal and to ``RUN/quickstart.out``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    with open(run_dir / "quickstart.out", "w") as out:
        proc = subprocess.Popen(["bash", str(REPO / "scripts" / "quickstart.sh"), "--run-dir", str(run_dir)],
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, bufsize=1)
        for line in proc.stdout:
            sys.stdout.write(line)
            out.write(line)
        if proc.wait() != 0:
            raise SystemExit(f"quickstart_budget: the job in {run_dir} failed (exit {proc.returncode})")


def training_seconds(run_dir: Path) -> float:
    """fairseq's own "done training in X seconds" (the last one: a resumed run adds up)."""
    found = re.findall(r"done training in ([0-9.]+) seconds", (run_dir / "train.log").read_text())
    if not found:
        raise SystemExit(f"quickstart_budget: {run_dir}/train.log has not finished training")
    return float(found[-1])


def summarise(run_dir: Path, title: str) -> dict:
    from fairseq_sret_cli.experiment_runner import parse_training_log, training_summary
    from fairseq_sret_cli.experiment_runner import model_facts

    log = (run_dir / "train.log").read_text()
    stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d):\d\d \|", log, flags=re.M)
    training = training_summary(parse_training_log(log))
    curve = training.get("curve") or []
    total = re.findall(r"quick start done in ([0-9]+):([0-9]+)", (run_dir / "quickstart.out").read_text())
    report = json.loads((run_dir / "eval" / "test.results.json").read_text())
    scores = {s["name"]: s for s in report["scores"]}
    facts = model_facts(report["checkpoint"])
    return {
        "run": run_dir.name, "model": title, "trained": f"{stamps[0]} to {stamps[-1][11:]}" if stamps else None,
        "params": facts["params"], "applications": facts["applications"],
        "updates": training.get("updates"), "train_seconds": training_seconds(run_dir),
        "job_seconds": int(total[-1][0]) * 60 + int(total[-1][1]) if total else None,
        "best_valid_loss": training.get("best_valid_loss"),
        "last_valid_loss": curve[-1]["valid_loss"] if curve else None,
        "subset": report["subset_name"], "sacrebleu": scores["sacreBLEU"]["score"],
        "sacrebleu_signature": scores["sacreBLEU"]["signature"],
        "tok_lc_bleu": scores["tokenized lowercased BLEU"]["score"], "chrf": scores["chrF2"]["score"],
        "sentences_per_second": report.get("speed", {}).get("sentences_per_second"),
    }


def machine() -> str:
    return f"CPU {cpu_model()}, {os.cpu_count()} cores"


def minutes(seconds) -> str:
    return "-" if seconds is None else f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


#: the results it writes in --results (recognised by their content: committed, they carry no manifest)
RESULTS = ("quickstart_budget.json", "quickstart_budget.md")


def ours(path: Path) -> bool:
    try:
        return b"benchmarks.quickstart_budget" in path.read_bytes()[:1 << 16]
    except OSError:
        return False


def write_results(rows, results: Path, command: str, measured_by: str, outputs) -> None:
    outputs.write_text(results / "quickstart_budget.json", json_text.dumps(
        {"command": command, "machine": machine(), "rows": rows}, indent=1) + "\n", own=ours)
    lines = [
        "# Multi30k De→En quick start against fairseq's transformer at the same CPU budget", "",
        f"Measured by `{measured_by}`; this table written by `{command}`.  ", f"Machine: {machine()}, `OMP_NUM_THREADS` = all cores.", "",
        "One job at a time: the SReT quick start with its defaults (a fixed number of updates), then",
        "each transformer with the same data, schedule (lr 2e-3, inverse sqrt, 600 warm-up updates,",
        "2048-token batches, dropout 0.1, label smoothing 0.1) and evaluation (beam 5, last",
        "checkpoint), stopped after the SReT run's training time (`--stop-time-hours`).", "",
        "| model | unique params | layer applications | updates | training | whole job | best valid loss |"
        " sacreBLEU | tok. lc BLEU | chrF2 | sent/s (beam 5) | trained (UTC) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['model']} | {r['params']:,} | {r['applications']} | {r['updates']} |"
                     f" {minutes(r['train_seconds'])} | {minutes(r['job_seconds'])} | {r['best_valid_loss']:.3f} |"
                     f" **{r['sacrebleu']:.2f}** | {r['tok_lc_bleu']:.2f} | {r['chrf']:.2f} |"
                     f" {r['sentences_per_second'] or '-'} | {r['trained'] or '-'} |")
    lines += ["", "Whole job: data preparation, training and evaluation, set-up excluded. sent/s: fairseq-generate's"
              " own figure for the 1,000 test sentences.", "", f"Test set: {rows[0]['subset']}; sacreBLEU signature `{rows[0]['sacrebleu_signature']}`.", ""]
    outputs.write_text(results / "quickstart_budget.md", "\n".join(lines), own=ours)


def build_parser():
    # whole quick-start jobs, each with its own threads; the results go to --results as JSON and markdown
    p = benchmark_parser(__doc__.split("\n\n")[0], smoke=False, device=False, threads=False, json=False)
    p.add_argument("--out", type=Path, default=Path("runs/quickstart_budget"), help="run folders")
    p.add_argument("--results", type=Path, default=REPO / "docs" / "results")
    p.add_argument("--report-only", action="store_true", help="only write the results of finished runs")
    p.add_argument("--skip-setup", action="store_true", help="SRET_SKIP_SETUP=1 for the first job too")
    p.add_argument("--force", action="store_true", help="replace results files in --results this script did not make")
    return p


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # before the jobs run (hours): a results file it did not make is refused unless --force
    outputs = checked_outputs(parser, args, [args.results / name for name in RESULTS], own=ours)
    out = args.out.resolve()
    if not args.report_only:
        run_quickstart(out / SRET[0], {"SRET_SKIP_SETUP": "1"} if args.skip_setup else {})
        budget_minutes = round(training_seconds(out / SRET[0]) / 60, 2)
        print(f"[quickstart_budget] SReT trained for {budget_minutes} min; the transformers get the same", flush=True)
        for name, (_, model_args) in BASELINES.items():
            run_quickstart(out / name, {"SRET_SKIP_SETUP": "1", "SRET_ARCH": "transformer",
                                        "SRET_MODEL_ARGS": model_args, "SRET_TRAIN_MINUTES": str(budget_minutes),
                                        "SRET_MAX_UPDATE": "100000"})
    rows = [summarise(out / SRET[0], SRET[1])] + [summarise(out / name, title) for name, (title, _) in BASELINES.items()]
    write_results(rows, args.results, command_line(),
                  measured_by=f"python -m benchmarks.quickstart_budget --out {args.out}", outputs=outputs)
    for r in rows:
        print(f"{r['model']}: {r['updates']} updates in {minutes(r['train_seconds'])}, sacreBLEU {r['sacrebleu']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
