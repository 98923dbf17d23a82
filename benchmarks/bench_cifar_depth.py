"""Accuracy against images/s for the runs of a vision experiment, every recursive model at every depth.

    python -m benchmarks.bench_cifar_depth examples/cifar10/ladder.yaml --data DATA \\
        --output runs/experiments/cifar10_ladder --out docs/results/cifar10_depth.png

The accuracies are those the runs recorded (test top-1 of the last epoch's weights, mean over
the finished seeds, at each depth: ``sret-train-cifar`` evaluates every depth): finished runs in
``--output``, and those the results file (``--results``/NAME.json) records, as sret-experiments
counts them (so committed rows are drawn on a machine without their run folders). The speed is
measured here: inference of each row's model at each depth on one thread, batch ``--batch-size``
of 32x32 images, process CPU time, median of ``--repeats``. Rows without a finished run are
listed as missing. Writes the figure and ``OUT`` with ``.json``.
"""

import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import (
    benchmark_parser, command_line, hardware_line, median, positive_int, print_table, start_benchmark,
)
from fairseq_sret import json_text


def images_per_cpu_second(model, batch: int, repeats: int) -> float:
    x = torch.randn(batch, 3, 32, 32)
    with torch.no_grad():
        model(x)
        times = []
        for _ in range(repeats):
            start = time.process_time()
            model(x)
            times.append(time.process_time() - start)
    return batch / median(times)


def build_parser():
    # its results go beside the figure (OUT with .json): no --json
    p = benchmark_parser(__doc__, prog="bench_cifar_depth", smoke=False, device=False, json=False)
    p.set_defaults(threads=1)
    p.add_argument("experiment", help="a vision experiment file (kind: vision)")
    p.add_argument("--data", required=True, help="the data the runs were given (their settings are checked)")
    p.add_argument("--output", required=True, help="the experiment's run folder (sret-experiments --output)")
    p.add_argument("--results", default="docs/results",
                   help="the folder of the experiment's results file NAME.json (sret-experiments --results;"
                        " default: %(default)s)")
    p.add_argument("--out", required=True, help="the figure to write (.png); its data goes beside it as .json")
    p.add_argument("--batch-size", type=positive_int, default=256)
    p.add_argument("--repeats", type=positive_int, default=5)
    p.add_argument("--force", action="store_true", help="replace a figure this command did not make")
    return p


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    start_benchmark(args, torch.device("cpu"))
    import yaml

    from fairseq_sret.vision import create_model
    from fairseq_sret_cli import pyplot
    from fairseq_sret_cli.experiment_runner import ExperimentError, RecordedRuns, collect_image_runs as collect
    from fairseq_sret_cli.experiment_runner import parse_image_experiment
    from fairseq_sret_cli.outputs import Outputs

    experiment = parse_image_experiment(yaml.safe_load(Path(args.experiment).read_text(encoding="utf-8")),
                                        args.experiment)
    out = Path(args.out)
    outputs = Outputs("bench_cifar_depth", force=args.force, settings={"experiment": experiment.name})
    outputs.check([out, out.with_suffix(".json")])
    try:
        recorded = RecordedRuns.from_file(Path(args.results) / f"{experiment.name}.json", args.data)
    except ExperimentError as exc:
        parser.error(str(exc))
    records = collect(experiment, Path(args.output), args.data, recorded)
    points, table = [], []
    for row in experiment.rows:
        done = [r["result"] for r in records if r["row"] == row.id and r["status"] == "done"]
        if not done:
            table.append([row.title, "", "missing", "", ""])
            continue
        model = create_model(done[0]["model"], **done[0]["model_kwargs"]).eval()
        for depth_key in done[0]["test"]:
            depth = int(depth_key[len("depth"):]) if depth_key else None
            accuracies = [r["test"][depth_key]["acc1"] for r in done]
            if depth is not None:
                model.set_depth(depth)
            speed = images_per_cpu_second(model, args.batch_size, args.repeats)
            point = {"row": row.id, "title": row.title, "depth": depth, "images_per_cpu_s": speed,
                     "top1_mean": statistics.mean(accuracies), "top1": accuracies, "seeds": len(done)}
            points.append(point)
            table.append([row.title, "" if depth is None else depth, f"{point['top1_mean']:.2f}",
                          f"{speed:.0f}", len(done)])
    print_table(f"{experiment.title}: test top-1 against inference speed", ["row", "depth", "test top-1 (%)",
                "images / CPU s", "seeds"], table)

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
