"""Depth on demand: decoding speed and BLEU of translation checkpoints at every depth, and
the speed/quality frontier they draw beside fairseq's transformer.

    python -m benchmarks.bench_depth --data data-bin/multi30k --checkpoints ckpt/plain.pt ckpt/mixed.pt
    python -m benchmarks.bench_depth --data data-bin/toy --checkpoints ckpt.pt --depths 1,2,1/2 --rounds 3
    python -m benchmarks.bench_depth --data data-bin/multi30k --checkpoints sret.pt transformer.pt \
        --names "SReT tiny" "transformer 3+3" --figure frontier.png --json frontier.json
    python -m benchmarks.bench_depth --from-json frontier.json --figure frontier.png --force   # redraw only
    python -m benchmarks.bench_depth --smoke      # trains a tiny model on the toy corpus (seconds)

Every checkpoint is loaded once per depth the way users run it, through fairseq's
``load_model_ensemble_and_task`` with the override of ``fairseq-generate --model-overrides
"{'encoder_depth': E, 'decoder_depth': D}"``: the model is built with the trained
recursions and runs the first E (D) applications of every encoder (decoder) layer. Depths
default to 1 .. the trained count (a side with fewer recursions stays at its full depth);
``--depths 1,2,1/2`` lists them (ENC/DEC for different depths). A checkpoint of another
model (fairseq's ``transformer``) is decoded as trained, so that SReT at every depth and the
baselines are measured in one process, on one clock: ``--figure`` draws them as sentences/s
against BLEU (the speed/quality frontier; points far below the best BLEU in an overview
beside a zoom on the rest), ``--json`` keeps the rows, ``--from-json`` draws them again.

Decoding: the whole ``--subset`` with beam ``--beam`` (every model prepared with
``prepare_for_inference_`` and decoded by fairseq's sequence generator via
``task.inference_step``, as fairseq-generate), batches built once, the depths timed
round-robin (``--rounds``; a line per round on stderr); sentences/s is the median round, and
the ratio is over the checkpoint's full depth. tokens/hypothesis (EOS included) shows how
much decoding a depth did: a depth that never learned to stop decodes to fairseq's maximum
length. BLEU: sacreBLEU of the detokenized hypotheses against the data set's references when
the data-bin was made by ``sret-prepare`` (its ``sret_data.json``), otherwise against the
data-bin's own target sentences.
"""

import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.common import (
    benchmark_parser, finite_float, non_negative_int, positive_int,
    clock_fn, clock_note, command_line, default_clock, hardware_line, median, prepare_as_generate,
    print_table, quiet_logging, start_benchmark,
)
from fairseq_sret import json_text

warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")
warnings.filterwarnings("ignore", message=".*'pin_memory' argument is set as true")
Depth = Tuple[int, int]


def parse_depths(value: Optional[str]) -> Optional[List[Depth]]:
    """``"1,2,1/2"`` -> [(1, 1), (2, 2), (1, 2)]; None -> None (every depth)."""
    if not value:
        return None
    depths = []
    for item in value.split(","):
        parts = item.strip().split("/")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            raise SystemExit(f"--depths: {item!r} is not DEPTH or ENC/DEC") from None
        if len(values) not in (1, 2) or min(values) < 1:
            raise SystemExit(f"--depths: {item!r} is not DEPTH or ENC/DEC with depths >= 1")
        depths.append((values[0], values[-1]))
    return depths


def build_parser():
    # --json: the rows (what --from-json draws again), refused where a file not made here is in the way
    p = benchmark_parser(__doc__, smoke="train a tiny mixed-depth model on the toy corpus for a few updates and"
                                        " benchmark it")
    p.set_defaults(device="cpu")
    p.add_argument("--data", help="fairseq data-bin (of sret-prepare, or any translation data-bin)")
    p.add_argument("--checkpoints", nargs="+", help="translation checkpoints (sret_transformer at every depth,"
                   " any other fairseq model as trained)")
    p.add_argument("--names", nargs="+", help="a name per checkpoint for the table and the figure"
                   " (default: its folder and file name)")
    p.add_argument("--figure", help="draw sentences/s against BLEU to this PNG")
    p.add_argument("--from-json", metavar="JSON",
                   help="decode nothing: print the table and draw --figure from the rows a --json run kept"
                        " (its command and machine stay in the caption)")
    p.add_argument("--force", action="store_true", help="replace a --figure/--json file this script did not make")
    p.add_argument("--subset", default="test")
    p.add_argument("--depths", default=None, help="comma-separated DEPTH or ENC/DEC (default: 1 .. trained)")
    p.add_argument("--beam", type=positive_int, default=5)
    p.add_argument("--lenpen", type=finite_float, default=1.0)
    p.add_argument("--batch-size", type=positive_int, default=64, help="sentences per batch")
    p.add_argument("--max-tokens", type=positive_int, default=None)
    p.add_argument("--rounds", type=positive_int, default=3, help="timed passes over the subset per depth")
    p.add_argument("--warmup", type=non_negative_int, default=1, help="untimed passes per depth first")
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="timer (default: cpu time for single-threaded CPU runs, else wall)")
    return p


def parse_args(argv=None):
    p = build_parser()
    args = p.parse_args(argv)
    if args.from_json:
        if args.smoke or args.checkpoints or args.json:
            p.error("--from-json draws from kept rows: it takes no --smoke, --checkpoints or --json")
        if not args.figure:
            p.error("--from-json needs --figure")
    elif not args.smoke and (not args.data or not args.checkpoints):
        p.error("--data and --checkpoints are required (or --smoke, or --from-json)")
    if args.names and not args.smoke and len(args.names) != len(args.checkpoints or []):
        p.error(f"--names: {len(args.names)} names for {len(args.checkpoints or [])} checkpoints")
    args.depth_list = parse_depths(args.depths)
    return args


# --------------------------------------------------------------------------- loading
def load(checkpoint, data, depth: Optional[Depth], device, beam: int):
    """(model, task, cfg) of ``checkpoint`` at ``depth`` (None: as trained), via the
    override mechanism of fairseq-generate's ``--model-overrides``, prepared for beam
    ``beam`` as fairseq-generate prepares it (eval mode; SReT's LRC folded into its weights)."""
    from fairseq import checkpoint_utils

    overrides = {"data": str(data)}
    if depth is not None:
        overrides.update(encoder_depth=depth[0], decoder_depth=depth[1])
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides)
    model = models[0].to(device)
    prepare_as_generate(model, beam)
    return model, task, cfg


def batches(task, model, subset, batch_size, max_tokens, device) -> List[dict]:
    from fairseq import utils

    task.load_dataset(subset)
    itr = task.get_batch_iterator(
        dataset=task.dataset(subset), max_tokens=max_tokens, max_sentences=batch_size,
        max_positions=utils.resolve_max_positions(task.max_positions(), model.max_positions()),
        ignore_invalid_inputs=False, required_batch_size_multiple=1, num_workers=0, seed=1,
    ).next_epoch_itr(shuffle=False)
    return [utils.move_to_cuda(s, device=device) if device.type == "cuda" else s for s in itr if s]


def decoder_fn(task, model, samples, beam, lenpen):
    from fairseq.dataclass.configs import GenerationConfig

    generator = task.build_generator([model], GenerationConfig(beam=beam, lenpen=lenpen))

    def decode():
        with torch.no_grad():
            return [(s["id"], task.inference_step(generator, [model], s)) for s in samples]

    return decode


# --------------------------------------------------------------------------- scoring
def hypotheses(task, outputs, n) -> List[str]:
    tgt = task.target_dictionary
    hyps = [""] * n
    for ids, hypos in outputs:
        for i, h in zip(ids.tolist(), hypos):
            hyps[i] = tgt.string(h[0]["tokens"].int().cpu())
    return hyps


def bleu(task, data, subset, hyps) -> Tuple[float, str]:
    """(sacreBLEU, what it was scored against)."""
    import sacrebleu

    data = Path(data)
    if (data / "sret_data.json").exists():
        from fairseq_sret_cli.data.common import read_metadata
        from fairseq_sret_cli.data.subword import SentencePieceCodec
        from fairseq_sret_cli.evaluation.evaluate import score

        meta = read_metadata(data)
        results = score(meta, data, subset, [SentencePieceCodec.decode(h) for h in hyps])
        first = next((r for r in results if r.name.startswith("sacreBLEU")), results[0])
        return first.score, f"{first.name} vs the {meta['recipe']} references"
    dataset = task.dataset(subset)
    refs = [task.target_dictionary.string(dataset.tgt[i]) for i in range(len(dataset))]
    return sacrebleu.corpus_bleu(hyps, [refs]).score, "sacreBLEU vs the data-bin's target sentences"


# --------------------------------------------------------------------------- smoke set-up
def smoke_setup(folder: Path) -> Tuple[Path, List[Path]]:
    """A toy data-bin, a tiny sret_transformer trained with --mixed-depth 1:0.5 and a tiny
    fairseq transformer, a few updates each (fairseq's command-line tools, as a user would)."""
    from fairseq_sret_cli.toy import write_reversal_corpus

    raw = folder / "raw"
    write_reversal_corpus(raw, (("train", 200), ("valid", 20), ("test", 20)), seed=0, vocab_size=16, lengths=(2, 8))
    bin_dir, save, baseline = folder / "bin", folder / "ckpt", folder / "transformer"
    tools = Path(sys.executable).parent
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    user_dir = str(Path(__file__).resolve().parents[1] / "fairseq_sret")
    for tool, *argv in (
        ("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", raw / "train",
         "--validpref", raw / "valid", "--testpref", raw / "test", "--destdir", bin_dir, "--joined-dictionary",
         "--workers", "1"),
        ("fairseq-train", bin_dir, "--user-dir", user_dir, "--arch", "sret_transformer_tiny",
         "--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
         "--decoder-ffn-embed-dim", "64", "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3",
         "--max-tokens", "400", "--cpu", "--num-workers", "0", "--seed", "1", "--max-update", "5",
         "--criterion", "sret_mixed_depth_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--mixed-depth", "1:0.5", "--save-dir", save, "--no-epoch-checkpoints", "--disable-validation",
         "--no-progress-bar", "--log-format", "simple"),
        ("fairseq-train", bin_dir, "--user-dir", user_dir, "--arch", "transformer", "--encoder-layers", "1",
         "--decoder-layers", "1", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
         "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "2",
         "--decoder-attention-heads", "2",
         "--share-all-embeddings", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--cpu",
         "--num-workers", "0", "--seed", "1", "--max-update", "5", "--save-dir", baseline, "--no-epoch-checkpoints",
         "--disable-validation", "--no-progress-bar", "--log-format", "simple"),
    ):
        result = subprocess.run([str(tools / tool), *map(str, argv)], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{tool} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return bin_dir, [save / "checkpoint_last.pt", baseline / "checkpoint_last.pt"]


# --------------------------------------------------------------------------- main
def bench_checkpoint(checkpoint, args, device, clock, name: Optional[str] = None) -> List[dict]:
    """One row per depth: ``{"checkpoint", "depth", "trained", "sentences", "tokens_per_hypothesis",
    "sentences_per_second", "vs_full_depth", "bleu"}``; a model without recursions: one row, as trained."""
    full, task, _ = load(checkpoint, args.data, None, device, args.beam)
    trained = getattr(full, "recursions", None)
    if trained is None:
        depths = [None]
    elif args.depth_list is None:
        depths = [(min(d, trained[0]), min(d, trained[1])) for d in range(1, max(trained) + 1)]
    else:
        depths = list(args.depth_list)
    if trained not in depths:
        depths.append(trained)  # the reference of the speed ratio
    models = {d: full if d == trained else load(checkpoint, args.data, d, device, args.beam)[0] for d in depths}
    samples = batches(task, full, args.subset, args.batch_size, args.max_tokens, device)
    n = len(task.dataset(args.subset))
    fns = {d: decoder_fn(task, models[d], samples, args.beam, args.lenpen) for d in depths}
    outputs = {}
    for d, fn in fns.items():
        for _ in range(args.warmup):
            outputs[d] = fn()
    now = clock_fn(clock)
    seconds: Dict[Depth, List[float]] = {d: [] for d in depths}
    label = name or "/".join(Path(checkpoint).parts[-2:])  # folder/checkpoint_last.pt
    for round_ in range(args.rounds):
        for d, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = now()
            outputs[d] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[d].append(now() - start)
        speeds = ", ".join(f"depth {_depth(d)} {n / seconds[d][-1]:.1f}" for d in depths)
        print(f"{label}: round {round_ + 1}/{args.rounds}: sentences/s {speeds}", file=sys.stderr, flush=True)
    rows = []
    reference = n / median(seconds[trained])
    for d in depths:
        speed = n / median(seconds[d])
        score, scored_against = bleu(task, args.data, args.subset, hypotheses(task, outputs[d], n))
        length = sum(len(h[0]["tokens"]) for _, hypos in outputs[d] for h in hypos) / n
        rows.append({"checkpoint": label, "depth": None if d is None else list(d),
                     "trained": None if trained is None else list(trained), "sentences": n,
                     "tokens_per_hypothesis": round(length, 2), "sentences_per_second": round(speed, 2),
                     "vs_full_depth": round(speed / reference, 3), "bleu": round(score, 2)})
    print(f"BLEU of {checkpoint}: {scored_against}", flush=True)
    return rows


def _depth(value) -> str:
    return "as trained" if value is None else f"{value[0]}/{value[1]}"


def table_row(row: dict) -> list:
    return [row["checkpoint"], _depth(row["depth"]), "–" if row["trained"] is None else _depth(row["trained"]),
            row["sentences"], f"{row['tokens_per_hypothesis']:.1f}", f"{row['sentences_per_second']:.1f}",
            f"{row['vs_full_depth']:.2f}x", f"{row['bleu']:.2f}"]


#: where a label may sit beside its point (offset points, alignment), in order of preference
LABEL_PLACES = [((dx, dy), "left" if dx > 0 else "right" if dx < 0 else "center", "bottom" if dy > 0 else "top")
                for rise in (4, 14, 24) for dx, dy in ((5, rise), (5, -rise), (-5, rise), (-5, -rise))]


def place_labels(fig, axis, labels: Sequence[Tuple[str, Tuple[float, float]]]) -> None:
    """Annotate each point with its label at the first place beside it that overlaps no label
    placed before, no other point and no edge of the plot (else where it overlaps least); a
    label set further off than the nearest places has a line to its point."""
    fig.canvas.draw()  # the limits and layout as they will be saved
    renderer = fig.canvas.get_renderer()
    frame = axis.get_window_extent(renderer)
    points = [axis.transData.transform(xy) for _, xy in labels]

    def clash(box, index, placed) -> float:
        """How much ``box`` is in the way: area shared with placed labels, plus points and edges."""
        shared = sum(max(0.0, min(box.x1, b.x1) - max(box.x0, b.x0)) * max(0.0, min(box.y1, b.y1) - max(box.y0, b.y0))
                     for b in placed)
        hidden = sum(box.contains(*p) for i, p in enumerate(points) if i != index)
        outside = not (frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1)
        return shared + 1e4 * (hidden + outside)

    placed = []
    for index, (text, xy) in enumerate(labels):
        best = None
        for offset, ha, va in LABEL_PLACES:
            label = axis.annotate(text, xy, textcoords="offset points", xytext=offset, ha=ha, va=va, fontsize=8)
            box = label.get_window_extent(renderer).expanded(1.04, 1.2)
            cost = clash(box, index, placed)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, label, box)
            else:
                label.remove()
            if cost == 0:
                break
        _, label, box = best
        if abs(label.xyann[1]) > 4:  # a line to its point (the text's place stays as measured)
            label.remove()
            axis.annotate(text, xy, textcoords="offset points", xytext=label.xyann, ha=label.get_ha(),
                          va=label.get_va(), fontsize=8,
                          arrowprops=dict(arrowstyle="-", linewidth=0.5, color="0.5", shrinkA=0, shrinkB=3))
        placed.append(box)


#: points more than this many BLEU below the best are drawn in an overview beside a zoom on the others
ZOOM_BLEU = 5.0


def zoom_split(rows: Sequence[dict], within: float = ZOOM_BLEU) -> Tuple[List[dict], List[dict]]:
    """(rows within ``within`` BLEU of the best, the rows below): a depth that was not trained
    for squeezes the converged models into a few pixels unless they get an axis of their own."""
    best = max(row["bleu"] for row in rows)
    return ([row for row in rows if row["bleu"] >= best - within],
            [row for row in rows if row["bleu"] < best - within])


def _frontier_points(axis, rows: Sequence[dict]) -> List[Tuple[str, Tuple[float, float]]]:
    """Scatter ``rows`` on ``axis`` (SReT red circles, other models blue squares); their labels."""
    labels = []
    for row in rows:
        sret = row["trained"] is not None
        axis.scatter(row["sentences_per_second"], row["bleu"], marker="o" if sret else "s",
                     color="tab:red" if sret else "tab:blue", zorder=3)
        labels.append((row["checkpoint"] + ("" if not sret or row["depth"] == row["trained"]
                                            else f" @ depth {_depth(row['depth'])}"),
                       (row["sentences_per_second"], row["bleu"])))
    return labels


def draw_frontier(rows: Sequence[dict], path, title: str, caption: str) -> None:
    """Sentences/s against BLEU, a point per checkpoint and depth, labelled; points far below
    the best (``zoom_split``) in an overview panel on the left, the rest zoomed on the right."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Rectangle

    from fairseq_sret_cli import pyplot

    plt = pyplot()
    zoomed, below = zoom_split(rows)
    if below:
        fig, (overview, axis) = plt.subplots(1, 2, figsize=(10, 5.2), gridspec_kw={"width_ratios": [1, 2.2]})
        overview_labels = _frontier_points(overview, below)
        _frontier_points(overview, zoomed)
        overview.margins(x=0.25, y=0.1)
        overview.set_title("all points", fontsize=9)
    else:
        fig, axis = plt.subplots(figsize=(8, 5.2))
    labels = _frontier_points(axis, zoomed)
    axis.margins(x=0.3, y=0.15)  # room for the labels
    low, high = axis.get_xlim()
    axis.set_xlim(low, high + 0.15 * (high - low))  # labels run to the right of their points first
    handles = [Line2D([], [], marker=m, color=c, linestyle="", label=name) for m, c, name in
               (("o", "tab:red", "sret_transformer"), ("s", "tab:blue", "other model (as trained)"))]
    axis.legend(handles=handles, loc="lower right", fontsize=8)
    for panel in ([overview, axis] if below else [axis]):
        panel.set_xlabel("sentences/s (beam search, higher is faster)")
        panel.set_ylabel("BLEU")
        panel.grid(alpha=0.3)
    if below:
        axis.set_title(f"within {ZOOM_BLEU:g} BLEU of the best", fontsize=9)
        (x0, x1), (y0, y1) = axis.get_xlim(), axis.get_ylim()
        overview.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, linestyle="--", linewidth=0.7,
                                     edgecolor="0.4"))
        fig.suptitle(title, fontsize=10)
    else:
        axis.set_title(title, fontsize=10)
    caption = "\n".join(textwrap.fill(line, 160, subsequent_indent="    ") for line in caption.splitlines())
    fig.text(0.01, 0.01, caption, fontsize=6)
    fig.tight_layout(rect=(0, 0.02 + 0.017 * (caption.count("\n") + 1), 1, 1))
    if below:
        place_labels(fig, overview, overview_labels)
    place_labels(fig, axis, labels)  # where the layout has put the points
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet_logging()
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    if args.from_json:
        return redraw(args)
    import fairseq_sret.models  # noqa: F401  (registers sret_transformer and its criterion)

    device = start_benchmark(args)
    clock = args.clock or default_clock(device)
    outputs = checked_outputs(args, [args.figure, args.json], [*(args.checkpoints or []), args.data])
    if outputs is None:  # before the long part
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.data, args.checkpoints = smoke_setup(Path(tmp))
            args.rounds, args.warmup = 1, 0
        names = args.names if args.names and len(args.names) == len(args.checkpoints) else [None] * len(args.checkpoints)
        rows = []
        for checkpoint, name in zip(args.checkpoints, names):
            rows += bench_checkpoint(checkpoint, args, device, clock, name)
    title = (f"decoding at every depth: beam {args.beam}, subset '{args.subset}', {clock_note(clock)},"
             f" median of {args.rounds} round(s)")
    print_table(title, TABLE_HEADER, [table_row(r) for r in rows])
    if args.json:
        outputs.write_text(args.json, json_text.dumps({"command": command_line(), "hardware": hardware_line(device),
                                                  "title": title, "rows": rows}, indent=2) + "\n")
    if args.figure:
        with outputs.writing(args.figure) as tmp:
            draw_frontier(rows, tmp, FIGURE_TITLE,
                          f"command: {command_line()}\nhardware: {hardware_line(device)}\n{title}")
        print(f"figure: {args.figure}")
    return 0


TABLE_HEADER = ["checkpoint", "depth enc/dec", "trained enc/dec", "sentences", "tokens/hypothesis", "sentences/s",
                "vs full depth", "BLEU"]
#: the figure's title; its caption names the beam, the subset and the clock
FIGURE_TITLE = "Translation speed against BLEU"


def checked_outputs(args, paths, inputs):
    """The script's ``Outputs`` once none of ``paths`` (None: not asked for) is in the way of
    writing; None, with the reason on stderr, where one is (a file it did not make, no --force)."""
    from fairseq_sret_cli.outputs import Outputs, OutputInTheWay

    outputs = Outputs("bench_depth", force=args.force, inputs=inputs)
    try:
        outputs.check([path for path in paths if path])
    except OutputInTheWay as exc:
        print(f"bench_depth: {exc}", file=sys.stderr)
        return None
    return outputs


def redraw(args) -> int:
    """``--from-json``: the table and the figure of a kept run, nothing decoded."""
    try:
        kept = json.loads(Path(args.from_json).read_text())
        rows, title, command, hardware = kept["rows"], kept["title"], kept["command"], kept["hardware"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"bench_depth: --from-json {args.from_json}: not the rows of a --json run ({exc})", file=sys.stderr)
        return 2
    outputs = checked_outputs(args, [args.figure], [args.from_json])
    if outputs is None:
        return 2
    print(f"rows of: {command}")
    print_table(title, TABLE_HEADER, [table_row(r) for r in rows])
    with outputs.writing(args.figure) as tmp:
        redrawn_by = command_line()
        draw_frontier(rows, tmp, FIGURE_TITLE,
                      f"command: {command}\nhardware: {hardware}\n{title}\ndrawn from its JSON by {redrawn_by}")
    print(f"figure: {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
