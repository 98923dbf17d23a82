"""Depth on demand: decoding speed and BLEU of translation checkpoints at every depth.

    python -m benchmarks.bench_depth --data data-bin/multi30k --checkpoints ckpt/plain.pt ckpt/mixed.pt
    python -m benchmarks.bench_depth --data data-bin/toy --checkpoints ckpt.pt --depths 1,2,1/2 --rounds 3
    python -m benchmarks.bench_depth --smoke      # trains a tiny model on the toy corpus (seconds)

Every checkpoint is loaded once per depth the way users run it, through fairseq's
``load_model_ensemble_and_task`` with the override of ``fairseq-generate --model-overrides
"{'encoder_recursions': E, 'decoder_recursions': D}"``: the model is built with the trained
recursions and runs the first E (D) applications of every encoder (decoder) layer. Depths
default to 1 .. the trained count (a side with fewer recursions stays at its full depth);
``--depths 1,2,1/2`` lists them (ENC/DEC for different depths).

Decoding: the whole ``--subset`` with beam ``--beam`` (fairseq's sequence generator via
``task.inference_step``, as fairseq-generate), batches built once, the depths timed
round-robin (``--rounds``); sentences/s is the median round, and the ratio is over the
checkpoint's full depth. tokens/hypothesis (EOS included) shows how much decoding a depth
did: a depth that never learned to stop decodes to fairseq's maximum length. BLEU: sacreBLEU of the detokenized hypotheses against the data
set's references when the data-bin was made by ``sret-prepare`` (its ``sret_data.json``),
otherwise against the data-bin's own target sentences.
"""

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from benchmarks.common import (
    clock_fn, clock_note, command_line, default_clock, hardware_line, median, pick_device, print_table,
    quiet_logging, set_threads,
)

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


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", help="fairseq data-bin (of sret-prepare, or any translation data-bin)")
    p.add_argument("--checkpoints", nargs="+", help="sret_transformer checkpoints")
    p.add_argument("--subset", default="test")
    p.add_argument("--depths", default=None, help="comma-separated DEPTH or ENC/DEC (default: 1 .. trained)")
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--lenpen", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=64, help="sentences per batch")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--rounds", type=int, default=3, help="timed passes over the subset per depth")
    p.add_argument("--warmup", type=int, default=1, help="untimed passes per depth first")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clock", choices=["wall", "cpu"], default=None,
                   help="timer (default: cpu time for single-threaded CPU runs, else wall)")
    p.add_argument("--smoke", action="store_true",
                   help="train a tiny mixed-depth model on the toy corpus for a few updates and benchmark it")
    args = p.parse_args(argv)
    if not args.smoke and (not args.data or not args.checkpoints):
        p.error("--data and --checkpoints are required (or --smoke)")
    args.depth_list = parse_depths(args.depths)
    return args


# --------------------------------------------------------------------------- loading
def load(checkpoint, data, depth: Optional[Depth], device):
    """(model, task, cfg) of ``checkpoint`` at ``depth`` (None: as trained), via the
    override mechanism of fairseq-generate's ``--model-overrides``."""
    from fairseq import checkpoint_utils

    overrides = {"data": str(data)}
    if depth is not None:
        overrides.update(encoder_recursions=depth[0], decoder_recursions=depth[1])
    models, cfg, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)], arg_overrides=overrides)
    model = models[0].to(device).eval()
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
    """A toy data-bin and a tiny sret_transformer trained with --mixed-depth 1:0.5 for a few
    updates (fairseq's command-line tools, as a user would)."""
    from fairseq_sret_cli.toy import write_reversal_corpus

    raw = folder / "raw"
    write_reversal_corpus(raw, (("train", 200), ("valid", 20), ("test", 20)), seed=0, vocab_size=16, lengths=(2, 8))
    bin_dir, save = folder / "bin", folder / "ckpt"
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
    ):
        result = subprocess.run([str(tools / tool), *map(str, argv)], env=env, capture_output=True, text=True)
        if result.returncode != 0:
            raise SystemExit(f"{tool} failed:\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return bin_dir, [save / "checkpoint_last.pt"]


# --------------------------------------------------------------------------- main
def bench_checkpoint(checkpoint, args, device, clock) -> List[list]:
    full, task, _ = load(checkpoint, args.data, None, device)
    trained = full.recursions
    if args.depth_list is None:
        depths = [(min(d, trained[0]), min(d, trained[1])) for d in range(1, max(trained) + 1)]
    else:
        depths = args.depth_list
    if trained not in depths:
        depths.append(trained)  # the reference of the speed ratio
    models = {d: full if d == trained else load(checkpoint, args.data, d, device)[0] for d in depths}
    samples = batches(task, full, args.subset, args.batch_size, args.max_tokens, device)
    n = len(task.dataset(args.subset))
    fns = {d: decoder_fn(task, models[d], samples, args.beam, args.lenpen) for d in depths}
    outputs = {}
    for d, fn in fns.items():
        for _ in range(args.warmup):
            outputs[d] = fn()
    now = clock_fn(clock)
    seconds: Dict[Depth, List[float]] = {d: [] for d in depths}
    for _ in range(args.rounds):
        for d, fn in fns.items():
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = now()
            outputs[d] = fn()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            seconds[d].append(now() - start)
    rows = []
    label = "/".join(Path(checkpoint).parts[-2:])  # folder/checkpoint_last.pt
    reference = n / median(seconds[trained])
    for d in depths:
        speed = n / median(seconds[d])
        score, scored_against = bleu(task, args.data, args.subset, hypotheses(task, outputs[d], n))
        length = sum(len(h[0]["tokens"]) for _, hypos in outputs[d] for h in hypos) / n
        rows.append([label, f"{d[0]}/{d[1]}", f"{trained[0]}/{trained[1]}", n, f"{length:.1f}",
                     f"{speed:.1f}", f"{speed / reference:.2f}x", f"{score:.2f}"])
    print(f"BLEU of {checkpoint}: {scored_against}", flush=True)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    quiet_logging()
    logging.getLogger("fairseq").setLevel(logging.WARNING)
    import fairseq_sret.models  # noqa: F401  (registers sret_transformer and its criterion)

    device = pick_device(args.device)
    set_threads(args.threads)
    clock = args.clock or default_clock(device)
    print(command_line())
    print(hardware_line(device), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        if args.smoke:
            args.data, args.checkpoints = smoke_setup(Path(tmp))
            args.rounds, args.warmup = 1, 0
        rows = []
        for checkpoint in args.checkpoints:
            rows += bench_checkpoint(checkpoint, args, device, clock)
    print_table(
        f"decoding at every depth: beam {args.beam}, subset '{args.subset}', {clock_note(clock)},"
        f" median of {args.rounds} round(s)",
        ["checkpoint", "depth enc/dec", "trained enc/dec", "sentences", "tokens/hypothesis", "sentences/s",
         "vs full depth", "BLEU"],
        rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
