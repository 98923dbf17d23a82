"""FLOPs per target token of the rows of an experiment file, on real batches.

    python -m benchmarks.flops_per_token examples/multi30k/cpu_experiments.yaml \
        --data data-bin/multi30k_de_en --out docs/results/multi30k_cpu_flops.md

Every row's model is built the way its training builds it (the row's ``--arch`` and flags
on top of the schedule's, parsed by fairseq's own training parser, the data-bin's
dictionaries), then the first ``--batches`` batches of the valid set (the schedule's
``--max-tokens``) run one training-mode forward each under torch's FLOP counter
(``benchmarks.common.flop_counter``). FLOPs count matrix products (linear layers, the
attention products, the output projection); element-wise work is not counted. The NLLs
of SReT are linear layers and are counted. A training update costs about three times the
forward (forward + backward); the ratio between rows is the same either way. Nothing is
timed, so the figure does not depend on the machine.
"""

import logging
import sys
from pathlib import Path

import torch

from benchmarks.common import checked_outputs
from benchmarks.common import benchmark_parser, command_line, flop_counter, positive_int, write_json


def build(data: str, arch: str, args):
    from fairseq import options, tasks

    import fairseq_sret
    import fairseq_sret.models  # noqa: F401  (registers the architectures before the parser lists them)

    user_dir = str(Path(fairseq_sret.__file__).parent)
    parser = options.get_training_parser()
    parsed = options.parse_args_and_arch(parser, [data, "--user-dir", user_dir, "--arch", arch, *args, "--cpu"])
    task = tasks.setup_task(parsed)
    return parsed, task, task.build_model(parsed)


def batches(task, parsed, count: int):
    task.load_dataset("valid")
    iterator = task.get_batch_iterator(
        dataset=task.dataset("valid"), max_tokens=parsed.max_tokens, max_positions=(1024, 1024),
        ignore_invalid_inputs=True, seed=1, num_workers=0,
    ).next_epoch_itr(shuffle=False)
    for i, sample in enumerate(iterator):
        if i >= count:
            break
        yield sample


def forward_flops(model, samples) -> dict:
    model.train()  # the NLLs and every layer application run as in training
    flops = tokens = 0
    with torch.no_grad():
        for sample in samples:
            with flop_counter() as counter:
                model(**sample["net_input"])
            flops += counter.get_total_flops()
            tokens += sample["ntokens"]
    return {"forward_flops": flops, "target_tokens": tokens, "flops_per_token": flops / tokens}


def build_parser():
    # counts, not times: no device, threads or smoke mode; --json: the rows, as beside --out
    p = benchmark_parser(__doc__.split("\n\n")[0], smoke=False, device=False, threads=False)
    p.add_argument("experiment")
    p.add_argument("--data", required=True, help="the prepared data-bin the rows train on")
    p.add_argument("--rows", nargs="+", default=None, help="only these row ids (default: all)")
    p.add_argument("--batches", type=positive_int, default=8, help="valid batches to count (default: %(default)s)")
    p.add_argument("--out", type=Path, default=None, help="write the table here (and a .json beside it)")
    p.output_options = ("json", "out")
    return p


def main(argv=None) -> int:
    from fairseq_sret_cli.experiment_runner import load_experiment

    parser = build_parser()
    args = parser.parse_args(argv)
    # before anything is counted: a file it did not make is refused unless --force, an input always
    outputs = checked_outputs(parser, args, [args.out, args.out.with_suffix(".json")] if args.out else [])
    logging.disable(logging.WARNING)
    torch.manual_seed(0)
    experiment = load_experiment(args.experiment).select(args.rows)
    results = []
    for row in experiment.rows:
        parsed, task, model = build(args.data, row.arch, [*experiment.schedule.args, *row.args])
        counted = forward_flops(model, batches(task, parsed, args.batches))
        encoder = parsed.encoder_layers * getattr(parsed, "encoder_recursions", 1)
        decoder = parsed.decoder_layers * getattr(parsed, "decoder_recursions", 1)
        results.append({"row": row.id, "title": row.label, "applications": f"{encoder}+{decoder}",
                        "params": sum(p.numel() for p in model.parameters()), **counted})
        print(f"{row.id}: {counted['flops_per_token'] / 1e6:.2f} MFLOPs per target token", file=sys.stderr)
    base = results[0]["flops_per_token"]
    command = command_line()
    lines = [f"# Forward FLOPs per target token: {experiment.title}", "",
             f"Written by `{command}`: one training-mode forward of the first {args.batches} valid batches"
             f" ({results[0]['target_tokens']:,} target tokens), torch's FLOP counter (matrix products"
             " only; SReT's NLLs included). Not timed: the same on every machine.", "",
             f"| row | layer applications | params (M) | MFLOPs / target token | vs `{results[0]['row']}` |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['title']} (`{r['row']}`) | {r['applications']} | {r['params'] / 1e6:.2f} |"
                     f" {r['flops_per_token'] / 1e6:.2f} | {r['flops_per_token'] / base:.2f}x |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        outputs.write_text(args.out, text)
    for path in filter(None, [args.out and args.out.with_suffix(".json"), args.json]):
        write_json(path, {"command": command, "rows": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
