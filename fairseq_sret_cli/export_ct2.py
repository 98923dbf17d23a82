"""Export a trained sret_transformer checkpoint as a CTranslate2 model folder.

  sret-export-ct2 runs/multi30k/checkpoints/checkpoint_last.pt --data-bin runs/multi30k/data-bin --out ct2/
  sret-export-ct2 CHECKPOINT --data-bin DIR --out ct2-int8/ --quantization int8 --depth 1

DIR (--data-bin) is the data-bin sret-prepare made for the run: its fairseq dictionaries become
the folder's vocabularies and its spm.model is copied beside them. The folder translates
without fairseq or torch:

  import ctranslate2, sentencepiece
  sp = sentencepiece.SentencePieceProcessor(model_file="ct2/spm.model")
  translator = ctranslate2.Translator("ct2/")
  result = translator.translate_batch([sp.encode("Ein Hund rennt.", out_type=str)], beam_size=5)
  print(sp.decode(result[0].hypotheses[0]))

Every application of a shared layer becomes one CTranslate2 layer and every NLL one more, with
the LRC coefficients folded into the weights (fairseq_sret.conversion.ctranslate2_spec says
how, and what CTranslate2 cannot carry: it is refused with one line naming it). --depth
exports the first applications only (a mixed-depth model at depth 1). --quantization is
CTranslate2's weight type (default: the checkpoint's fp32 weights). sret_ct2_export.json in
the folder records the checkpoint, the data-bin's files and their fingerprints, the depth,
the quantization and the LayerNorm epsilon the export had to choose.

The files of --out follow the commands' output rule (fairseq_sret_cli.outputs): one this
command did not make (or made from other inputs or settings) is replaced only with --force,
the inputs never; files beside them stay. Needs: pip install 'fairseq-sret[fairseq,deploy]'.
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

from . import HelpFormatter, UsageError, UserError, user_errors
from .fingerprints import FULL, file_digest
from .outputs import Outputs, exclusive, read_manifest

COMMAND = "sret-export-ct2"
MARKER = "sret_ct2_export.json"
SPM_MODEL = "spm.model"
#: CTranslate2's weight types (ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES)
QUANTIZATIONS = ("float32", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16")


def parse_depth(text: str):
    """``DEPTH`` (both sides) or ``ENC/DEC`` -> (encoder, decoder)."""
    parts = text.split("/")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(parts) not in (1, 2) or len(values) != len(parts) or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not DEPTH or ENC/DEC (integers >= 1)")
    return (values[0], values[-1])


def fingerprint(path) -> str:
    return FULL + file_digest(path)[:16]


def load_model(checkpoint: Path, data_bin: Path):
    """(fairseq model, task) of an sret_transformer checkpoint with the data-bin's dictionaries."""
    import fairseq_sret.models  # noqa: F401  (registers sret_transformer)
    from fairseq import checkpoint_utils
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint)
    cfg = (state.get("cfg") or {}) if isinstance(state, dict) else {}
    options = cfg.get("model") if isinstance(cfg, dict) else None
    options = options if options is not None else (state.get("args") if isinstance(state, dict) else None)
    arch = options.get("_name") if isinstance(options, dict) else getattr(options, "arch", None)
    if not (isinstance(arch, str) and arch.startswith("sret_transformer")):
        hint = (" (a fairseq transformer converts with CTranslate2's own ct2-fairseq-converter)"
                if str(arch).startswith("transformer") else "")
        raise UserError(f"{checkpoint}: holds a {arch!r} model; {COMMAND} exports sret_transformer models{hint}")
    del state  # fairseq reads the file again, upgrading what it saved
    models, _, task = checkpoint_utils.load_model_ensemble_and_task([str(checkpoint)],
                                                                    arg_overrides={"data": str(data_bin)})
    return models[0].eval(), task


@user_errors(COMMAND)
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog=COMMAND, description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", type=Path, help="fairseq checkpoint of an sret_transformer model")
    p.add_argument("--data-bin", required=True, type=Path, metavar="DIR",
                   help="the run's data-bin (made by sret-prepare)")
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="the folder to write")
    p.add_argument("--depth", type=parse_depth, metavar="DEPTH|ENC/DEC",
                   help="export the first DEPTH applications of every shared layer (default: every trained one)")
    p.add_argument("--quantization", choices=QUANTIZATIONS,
                   help="CTranslate2's weight type (default: the checkpoint's fp32 weights)")
    p.add_argument("--force", action="store_true", help="replace --out's files even if this command did not make them")
    args = p.parse_args(argv)
    import ctranslate2  # noqa: F401  (missing: one line naming the 'deploy' extra)
    from fairseq_sret.conversion.ctranslate2_spec import CT2ExportError, converter

    checkpoint, data_bin, out = args.checkpoint, args.data_bin, args.out
    if not checkpoint.is_file():
        raise UsageError(f"{checkpoint}: no such checkpoint file")
    spm = data_bin / SPM_MODEL
    if not spm.is_file():
        raise UsageError(f"{data_bin}: has no {SPM_MODEL}; give the data-bin sret-prepare made for this model's run")
    outputs = Outputs(COMMAND, force=args.force, inputs=[checkpoint, data_bin],
                      settings={"checkpoint": str(checkpoint.resolve()), "data_bin": str(data_bin.resolve()),
                                "depth": list(args.depth) if args.depth else None,
                                "quantization": args.quantization})
    outputs.check([out / MARKER], folders=[out])  # before the work

    model, task = load_model(checkpoint, data_bin)
    if args.depth:
        model.set_depth(*args.depth)
    dictionaries = {side: Path(data_bin) / f"dict.{lang}.txt"
                    for side, lang in (("source", task.cfg.source_lang), ("target", task.cfg.target_lang))}
    made = converter(model, task.source_dictionary.symbols, task.target_dictionary.symbols, files=[spm])
    # one export per OUT; a failure leaves no trace of an OUT it made
    with exclusive(out, COMMAND, remove=True, why="two exports into one folder would mix their models"):
        # converted into a hidden folder inside OUT, then moved in file by file: a failure leaves OUT as it was
        staging = out / f".{COMMAND}.{os.getpid()}"
        try:
            try:
                made.convert(str(staging / "model"), quantization=args.quantization)
            except CT2ExportError as exc:
                raise UserError(f"{checkpoint}: cannot run in CTranslate2 as trained: {exc}") from None
            built = made.built
            record = {
                "made_by": COMMAND, "ctranslate2": __import__("ctranslate2").__version__,
                "checkpoint": str(checkpoint.resolve()), "checkpoint_fingerprint": fingerprint(checkpoint),
                "data_bin": str(data_bin.resolve()),
                "data_bin_fingerprints": {path.name: fingerprint(path) for path in (spm, *dictionaries.values())},
                "source_lang": task.cfg.source_lang, "target_lang": task.cfg.target_lang,
                "depth": list(model.depth), "recursions": list(model.recursions),
                "quantization": args.quantization or "float32 (the checkpoint's weights)",
                "ct2_layers": list(built.layers), "applications": list(built.applications),
                "layer_norm_epsilon": built.layer_norm_epsilon,
                "layer_norm_epsilons_asked": [min(built.epsilons), max(built.epsilons)],
                "exact": built.epsilon_spread == 1.0,
            }
            from fairseq_sret import json_text

            (staging / "model" / MARKER).write_text(json_text.dumps(record, indent=2) + "\n", encoding="utf-8")
            names = sorted(path.name for path in (staging / "model").iterdir())
            outputs.check([out / name for name in names])
            for name in names:
                outputs.move_in(staging / "model" / name, out / name)
            for name, entry in read_manifest(out).items():  # what an earlier export wrote and this one did not
                if entry.get("command") == COMMAND and name not in names:
                    outputs.remove(out / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    exactness = ("exactly SReT's function" if record["exact"] else
                 f"SReT's function but for one LayerNorm epsilon ({built.layer_norm_epsilon:.3g}; its LayerNorms"
                 f" ask for {min(built.epsilons):.3g} to {max(built.epsilons):.3g})")
    print(f"wrote {out}: {record['source_lang']}->{record['target_lang']}, depth {record['depth'][0]}/"
          f"{record['depth'][1]} of {record['recursions'][0]}/{record['recursions'][1]} recursions as"
          f" {built.layers[0]}+{built.layers[1]} CTranslate2 layers, {record['quantization']}; {exactness}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
