"""Export a trained sret_transformer checkpoint as a Hugging Face transformers model folder.

  sret-export-hf runs/multi30k/checkpoints/checkpoint_last.pt --data-bin runs/multi30k/data-bin --out exported/

DIR (--data-bin) is the data-bin sret-prepare made for the run: its spm.model and fairseq
dictionaries become the folder's tokenizer. The folder loads without fairseq:

  import fairseq_sret.hf
  from transformers import pipeline
  pipeline("sret-translation", model="exported/")("Ein Hund rennt über die Wiese.")

The files of --out follow the commands' output rule (fairseq_sret_cli.outputs): one this
command did not make (or made from another checkpoint or data-bin) is replaced only with
--force, the inputs never; files beside them stay. The conversion is fairseq_sret.hf.convert
(needs: pip install 'fairseq-sret[hf]').
"""

import argparse
import os
import shutil
import sys
from pathlib import Path

from . import HelpFormatter, UserError, user_errors
from .outputs import Outputs, exclusive, read_manifest

COMMAND = "sret-export-hf"


@user_errors("sret-export-hf")
def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="sret-export-hf", description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("checkpoint", help="fairseq checkpoint of an sret_transformer model")
    p.add_argument("--data-bin", required=True, metavar="DIR", help="the run's data-bin (made by sret-prepare)")
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write")
    p.add_argument("--force", action="store_true", help="replace --out even if this command did not make it")
    args = p.parse_args(argv)
    try:
        from fairseq_sret.hf.convert import EXPORT_FILES, export_checkpoint
    except ImportError as exc:
        raise UserError(f"{exc}") from None
    out = Path(args.out)
    outputs = Outputs(COMMAND, force=args.force, inputs=[args.checkpoint, args.data_bin],
                      settings={"checkpoint": str(Path(args.checkpoint).resolve()),
                                "data_bin": str(Path(args.data_bin).resolve())})
    outputs.check([out / name for name in EXPORT_FILES], folders=[out])  # before the work
    # one export per OUT; a failure leaves no trace of an OUT it made
    with exclusive(out, COMMAND, remove=True, why="two exports into one folder would mix their models"):
        # written into a hidden folder inside OUT, then moved in file by file: a failure leaves OUT as it was
        staging = out / f".{COMMAND}.{os.getpid()}"
        try:
            try:
                summary = export_checkpoint(args.checkpoint, args.data_bin, staging)
            except Exception as exc:  # transformers' and safetensors' own errors on a full disk
                from fairseq_sret.atomic_files import disk_full

                full = disk_full(exc, out)
                if full is None:
                    raise
                raise full from None
            outputs.check([out / name for name in summary["files"]])
            for name in summary["files"]:
                outputs.move_in(staging / name, out / name)
            for name, entry in read_manifest(out).items():  # what an earlier export wrote and this one did not
                if entry.get("command") == COMMAND and name not in summary["files"]:
                    outputs.remove(out / name)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    summary["out"] = str(out)
    print(f"wrote {summary['out']}: {summary['source_lang']}->{summary['target_lang']},"
          f" {summary['unique_parameters']:,} parameters, depth {summary['depth'][0]}/{summary['depth'][1]}"
          f" of {summary['recursions'][0]}/{summary['recursions'][1]} recursions", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
