"""Convert a trained fairseq transformer checkpoint into an sret_transformer checkpoint with
fewer unique layers (uptraining), to be fine-tuned with fairseq-train --finetune-from-model.

  sret-uptrain checkpoints/transformer/checkpoint_best.pt uptrained.pt --recursions 2

A 6+6-layer transformer becomes 3 unique layers x 2 recursions per side. Unique layer i
starts from the average of the original layers it replaces (original layer j of L goes to
unique layer j*U//L: layers 0,1 -> 0, 2,3 -> 1, 4,5 -> 2), every NLL starts as the identity
(its output layer is zero), every LRC coefficient at 1; embeddings and the output layer
are copied. The command prints the fairseq-train options of the converted model.

The dictionaries of the data-bin the transformer was trained on (--data-bin, by default the
one its checkpoint names) are recorded beside the weights, as in every trained SReT
checkpoint: fine-tuning or generating on another dictionary is then refused.

The input is never written; an existing output is replaced only with --force.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional, Tuple

from . import HelpFormatter, UserError, at_least, user_errors
from .outputs import Outputs


@user_errors("sret-uptrain")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-uptrain", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("input", help="fairseq checkpoint of a transformer model (any transformer_* architecture)")
    p.add_argument("output", help="the sret_transformer checkpoint to write")
    p.add_argument("--recursions", type=int, default=2, help="recursions per side (default: 2)")
    for side in ("encoder", "decoder"):
        p.add_argument(f"--{side}-recursions", type=int, default=None, help="overrides --recursions for the " + side)
        p.add_argument(f"--{side}-layers", type=int, default=None,
                       help=f"unique {side} layers (default: the original's {side} layers / recursions)")
        p.add_argument(f"--{side}-groups", default="1", help="self-attention groups per recursion (default: 1)")
    p.add_argument("--nll-ratio", type=at_least(0.0, float), default=1.0,
                   help="hidden ratio of the NLLs, which start as the identity (default: 1.0; 0: no NLL)")
    p.add_argument("--no-lrc", action="store_true", help="plain residuals instead of LRC (coefficients 1)")
    p.add_argument("--seed", type=int, default=1, help="seed of the NLLs' other weights (default: 1)")
    p.add_argument("--data-bin", default=None,
                   help="the data-bin the transformer was trained on, whose dictionaries are recorded (default:"
                        " the one its checkpoint names, when it is there)")
    p.add_argument("--force", action="store_true", help="replace an output file this command did not make (never the input)")
    args = p.parse_args(argv)
    for name in ("recursions", "encoder_recursions", "decoder_recursions", "encoder_layers", "decoder_layers"):
        value = getattr(args, name)
        if value is not None and value < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if not Path(args.input).is_file():
        raise UserError(f"{args.input}: no such checkpoint file")
    settings = {k: v for k, v in vars(args).items() if k not in ("output", "force")}
    settings["input"] = str(Path(args.input).resolve())
    outputs = Outputs("sret-uptrain", force=args.force, settings=settings, inputs=[args.input])
    outputs.check([args.output])

    from fairseq_sret.conversion.uptraining import uptrain_checkpoint
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(args.input)
    fingerprints, data_bin = recorded_dictionaries(state, args.data_bin, args.input)
    try:
        converted, report = uptrain_checkpoint(
            state, seed=args.seed, fingerprints=fingerprints,
            encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers,
            encoder_recursions=args.encoder_recursions or args.recursions,
            decoder_recursions=args.decoder_recursions or args.recursions,
            encoder_groups=args.encoder_groups, decoder_groups=args.decoder_groups,
            nll_ratio=args.nll_ratio, lrc=not args.no_lrc,
        )
    except (KeyError, ValueError) as exc:
        raise UserError(f"{args.input}: {exc.args[0] if isinstance(exc, KeyError) else exc}") from None
    out = outputs.save(converted, args.output)
    print(f"{args.input}: {report['source_arch']}, {report['source_params']:,} parameters", file=sys.stderr)
    for side, groups in report["groups"].items():
        mapping = ", ".join(f"{'+'.join(map(str, g))} -> {i}" for i, g in enumerate(groups))
        print(f"  {side}: {len(groups)} unique x {report['recursions'][side]} recursions; original layers"
              f" averaged into each unique layer: {mapping}", file=sys.stderr)
    print(f"wrote {out}: sret_transformer, {report['params']:,} parameters", file=sys.stderr)
    if data_bin is None:
        print(f"note: {args.input} names no data-bin that is here and --data-bin was not given: the dictionaries"
              " are not recorded, so fine-tuning cannot check that its data-bin is the transformer's", file=sys.stderr)
    else:
        named = "" if args.data_bin else (f" ({Path(data_bin.split(':')[0]).resolve()}: the data-bin {args.input}"
                                          " names, as found from this folder; --data-bin chooses another)")
        print(f"  recorded the dictionaries of {data_bin}{named}: fine-tuning on another dictionary is refused",
              file=sys.stderr)
    if report["finetune_options"] is None:
        print(f"note: {report['note']}", file=sys.stderr)
        return 0
    print("fine-tune it with: fairseq-train DATA --user-dir fairseq_sret " + " ".join(report["finetune_options"])
          + f" --finetune-from-model {out} ...", file=sys.stderr)
    print(" ".join(report["finetune_options"]))
    return 0


def recorded_dictionaries(state: dict, given: Optional[str], source: str) -> Tuple[Optional[dict], Optional[str]]:
    """(fingerprints, data-bin) of the data-bin given, or else of the one the checkpoint names
    when it is there; (None, None) when there is neither."""
    from fairseq_sret.conversion.uptraining import data_bin_fingerprints

    data = given
    if data is None:
        options = state.get("args") or (state.get("cfg") or {}).get("task")
        named = getattr(options, "data", None) if not hasattr(options, "get") else options.get("data")
        if not named or not Path(str(named).split(":")[0]).is_dir():
            return None, None
        data = str(named)
    elif not Path(data.split(":")[0]).is_dir():
        raise UserError(f"--data-bin {data}: no such folder")
    try:
        return data_bin_fingerprints(data, state), data
    except ValueError as exc:
        where = "--data-bin" if given is not None else f"the data-bin {source} names"
        raise UserError(f"{where}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
