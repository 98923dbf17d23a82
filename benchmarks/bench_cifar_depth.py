"""Accuracy against images/s for the runs of a vision experiment, every recursive model at every depth.

    python -m benchmarks.bench_cifar_depth examples/cifar10/ladder.yaml --data DATA \\
        --output runs/experiments/cifar10_ladder --out docs/results/cifar10_depth.png

The accuracies are those the runs recorded (test top-1 of the last epoch's weights, mean over
the finished seeds, at each depth: ``sret-train-cifar`` evaluates every depth): finished runs in
``--output``, and those the results file (``--results``/NAME.json) records, as sret-experiments
counts them (so committed rows are drawn on a machine without their run folders). The speed is
measured here: inference of each row's model at each depth on one thread, batch ``--batch-size``
of 32x32 images, process CPU time, median of ``--rounds`` taken round-robin over every model and
depth (so that a machine's slower minutes fall on every point alike; rows of one model and
configuration are one measurement); the table and the JSON give the range of the turns beside
the median. Rows without a finished run are listed as missing. Writes the figure and ``OUT``
with ``.json``.
"""

import statistics
from pathlib import Path
from typing import Dict, Hashable, Tuple

import torch

from benchmarks.common import (
    benchmark_outputs, benchmark_parser, command_line, hardware_line, measure, median, positive_int, print_table,
    start_benchmark,
)
from fairseq_sret import json_text


def images_per_cpu_second(points: Dict[Hashable, tuple], batch: int,
                          rounds: int) -> Dict[Hashable, Tuple[float, float, float]]:
    """{name: (median, slowest, fastest) images per CPU second} of ``points`` {name: (model,
    depth)}: each model at its depth (``None``: as built) takes one batch a turn, round-robin,
    ``rounds`` turns."""
    x = torch.randn(batch, 3, 32, 32)

    def forward(model, depth):
        if depth is not None:
            model.set_depth(depth)
        return model(x)

    calls = {name: (lambda model=model, depth=depth: forward(model, depth)) for name, (model, depth) in points.items()}
    with torch.no_grad():
        times = measure(calls, torch.device("cpu"), warmup=1, iters=1, rounds=rounds, clock="cpu")
    return {name: (batch / median(seconds), batch / max(seconds), batch / min(seconds))
            for name, seconds in times.items()}


def build_parser():
    # its results go beside the figure (OUT with .json): no --json
    p = benchmark_parser(__doc__, smoke=False, device=False, json=False)
    p.set_defaults(threads=1)
    p.add_argument("experiment", help="a vision experiment file (kind: vision)")
    p.add_argument("--data", required=True, help="the data the runs were given (their settings are checked)")
    p.add_argument("--output", required=True, help="the experiment's run folder (sret-experiments --output)")
    p.add_argument("--results", default="docs/results",
                   help="the folder of the experiment's results file NAME.json (sret-experiments --results;"
                        " default: %(default)s)")
    p.add_argument("--out", required=True, help="the figure to write (.png); its data goes beside it as .json")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--rounds", type=positive_int, default=9,
                   help="turns of every model and depth, round-robin; the median counts (default: %(default)s)")
    p.add_argument("--force", action="store_true",
                   help="replace a figure (or its .json) this command did not make; never one of its inputs")
    p.output_options = ("out",)
    return p


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    import yaml

    from fairseq_sret.vision import create_model
    from fairseq_sret_cli import pyplot
    from fairseq_sret_cli.experiment_runner import ExperimentError, RecordedRuns, collect_image_runs as collect
    from fairseq_sret_cli.experiment_runner import parse_image_experiment
    from fairseq_sret_cli.outputs import OutputInTheWay

    experiment = parse_image_experiment(yaml.safe_load(Path(args.experiment).read_text(encoding="utf-8")),
                                        args.experiment)
    out = Path(args.out)
    # before anything is measured; the results file it reads, the experiment file and the runs are inputs
    try:
        outputs = benchmark_outputs(args, [out, out.with_suffix(".json")], parser=parser, inputs=[
            Path(args.results) / f"{experiment.name}.json", args.experiment, args.output],
            settings={"experiment": experiment.name})
    except OutputInTheWay as exc:
        parser.error(str(exc))
    start_benchmark(args, torch.device("cpu"))
    try:
        recorded = RecordedRuns.from_file(Path(args.results) / f"{experiment.name}.json", args.data)
    except ExperimentError as exc:
        parser.error(str(exc))
    records = collect(experiment, Path(args.output), args.data, recorded)
    points, table = [], []
    models = {}  # one model, and one measurement, per model and configuration: rows that differ in training only
    for row in experiment.rows:
        done = [r.result for r in records if r.row == row.id and r.done]
        if not done:
            table.append((row.title, None))
            continue
        config = json_text.dumps([done[0]["model"], done[0]["model_kwargs"]], sort_keys=True)
        if config not in models:
            models[config] = create_model(done[0]["model"], **done[0]["model_kwargs"]).eval()
        for depth_key in done[0]["test"]:
            depth = int(depth_key[len("depth"):]) if depth_key else None
            accuracies = [r["test"][depth_key]["acc1"] for r in done]
            point = {"row": row.id, "title": row.title, "depth": depth, "images_per_cpu_s": None,
                     "top1_mean": statistics.mean(accuracies), "top1": accuracies, "seeds": len(done)}
            points.append((config, point))
            table.append((row.title, point))
    speeds = images_per_cpu_second({(config, p["depth"]): (models[config], p["depth"]) for config, p in points},
                                   args.batch_size, args.rounds)
    for config, point in points:
        speed, slowest, fastest = speeds[config, point["depth"]]
        point["images_per_cpu_s"], point["images_per_cpu_s_range"] = speed, [slowest, fastest]
    points = [point for _, point in points]
    table = [[title, "", "missing", "", ""] if p is None else
             [title, "" if p["depth"] is None else p["depth"], f"{p['top1_mean']:.2f}",
              "{:.0f} ({:.0f}-{:.0f})".format(p["images_per_cpu_s"], *p["images_per_cpu_s_range"]), p["seeds"]]
             for title, p in table]
    print_table(f"{experiment.title}: test top-1 against inference speed", ["row", "depth", "test top-1 (%)",
                f"images / CPU s, median (range) of {args.rounds}", "seeds"], table)

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, row in enumerate(experiment.rows):
        mine = sorted((q for q in points if q["row"] == row.id), key=lambda q: q["images_per_cpu_s"])
        if not mine:
            continue
        ax.plot([q["images_per_cpu_s"] for q in mine], [q["top1_mean"] for q in mine], "o-", color=f"C{i}",
                label=row.title)
        for q in mine:
            if len(mine) > 1:  # a model run at several depths
                ax.annotate(f"depth {q['depth']}", (q["images_per_cpu_s"], q["top1_mean"]), fontsize=7,
                            xytext=(4, -10), textcoords="offset points")
    ax.set_xlabel(f"inference images / CPU second (one thread, batch {args.batch_size})")
    ax.set_ylabel("test top-1 (%)")
    ax.set_title(f"{experiment.title}\n{hardware_line(torch.device('cpu')).split(' | ')[0]}",
                 fontsize=8)
    ax.grid(alpha=0.3)
    if points:
        ax.legend(fontsize=7)
    fig.tight_layout()
    with outputs.writing(out) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    outputs.write_text(out.with_suffix(".json"), json_text.dumps(
        {"command": command_line(), "hardware": hardware_line(torch.device("cpu")), "points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
