"""Export a trained sret_transformer checkpoint as a Hugging Face transformers model folder.

  sret-export-hf runs/multi30k/checkpoints/checkpoint_last.pt --data-bin runs/multi30k/data-bin --out exported/

DIR (--data-bin) is the data-bin sret-prepare made for the run: its spm.model and fairseq
dictionaries become the folder's tokenizer. The folder loads without fairseq:

  import fairseq_sret.hf
  from transformers import pipeline
  pipeline("sret-translation", model="exported/")("Ein Hund rennt über die Wiese.")

An existing --out is replaced only if this command made it, or with --force. The logic lives in
fairseq_sret.hf.convert (needs: pip install 'fairseq-sret[hf]').
"""

import argparse
import sys

from . import HelpFormatter, UserError, user_errors


@user_errors("sret-export-hf")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-export-hf", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", help="fairseq checkpoint of an sret_transformer model")
    p.add_argument("--data-bin", required=True, metavar="DIR", help="the run's data-bin (made by sret-prepare)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    p.add_argument("--force", action="store_true", help="replace --out even if this command did not make it")
    args = p.parse_args(argv)
    try:
        from fairseq_sret.hf.convert import export_checkpoint
    except ImportError as exc:
        raise UserError(f"{exc}") from None
    summary = export_checkpoint(args.checkpoint, args.data_bin, args.out, force=args.force)
    print(f"wrote {summary['out']}: {summary['source_lang']}->{summary['target_lang']},"
          f" {summary['unique_parameters']:,} parameters, depth {summary['depth'][0]}/{summary['depth'][1]}"
          f" of {summary['recursions'][0]}/{summary['recursions'][1]} recursions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
