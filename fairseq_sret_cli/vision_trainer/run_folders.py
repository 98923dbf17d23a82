"""The output rules of the vision trainer (``fairseq_sret_cli.outputs``, docs/outputs.md): a
folder that holds a run is continued only with ``--resume`` or started over with ``--force``
(its files replaced once the new run has saved its first epoch), and an input of the command
is never replaced."""

import os
from pathlib import Path

from .. import UsageError
from ..outputs import OutputInTheWay, Outputs, restore_replaced
from . import cifar_recipe

#: what a ``sret-train-vision`` training run writes in --output
FOLDER_RUN_FILES = ("checkpoint_best.pt", "checkpoint_last.pt", "log.jsonl")


def refuse_other_runs(args, outputs: Outputs) -> None:
    """``sret-train-cifar``: refuse, before anything is written, a folder that holds a run
    (unless ``--resume`` or ``--force``) or files this command may not replace, and
    ``--resume`` without a run."""
    out = Path(args.output)
    restore_replaced(out)  # a start-over killed before its first save: the old run is put back first
    if args.resume:
        if not (out / "checkpoint_last.pt").is_file():
            raise UsageError(f"--resume: {out} holds no checkpoint_last.pt to continue from; drop --resume to start")
        return
    present = [name for name in cifar_recipe.RUN_FILES if (out / name).exists()]
    if present and not args.force:
        raise OutputInTheWay(f"{out} holds a run ({', '.join(present)}): continue it with --resume, give another"
                             " --output, or pass --force to start over (replaced once the new run has started)")
    outputs.check([out / name for name in cifar_recipe.RUN_FILES], folders=[out])


def check_run_folder(args, outputs: Outputs) -> bool:
    """``sret-train-vision``: a folder that holds a run is continued only with ``--resume
    OUTPUT/checkpoint_last.pt`` (else its trained model would be replaced by an untrained one
    and its log get a second history) or started over with ``--force``. Returns whether the run starts over: its old log
    is removed only when the new run starts training (:func:`.folder_recipe.train_folder`), so a start that fails
    leaves the old run as it was."""
    out = Path(args.output)
    outputs.check([], folders=[out])
    present = [name for name in FOLDER_RUN_FILES if (out / name).exists()]
    last = out / "checkpoint_last.pt"
    continuing = bool(args.resume) and last.exists() and os.path.exists(args.resume) and os.path.samefile(args.resume, last)
    refuse_inputs_in_run(args, outputs, continuing)
    if present and not continuing:
        if not args.force:
            raise OutputInTheWay(
                f"{out} holds a run ({', '.join(present)}): continue it with --resume {last}, give another --output,"
                f" or pass --force to start over (replaces {', '.join(present)}; nothing else is touched)")
        return True
    return False


def refuse_inputs_in_run(args, outputs: Outputs, continuing: bool) -> None:
    """A run file that is one of the inputs (``--finetune``, ``--teacher-checkpoint``, ... through
    any link) is never replaced, not even with ``--force``; only the ``checkpoint_last.pt`` that
    ``--resume`` continues is."""
    out = Path(args.output)
    taken = [(out / name, source) for name in FOLDER_RUN_FILES for source in [outputs.input_at(out / name)]
             if source is not None and not (continuing and name == "checkpoint_last.pt"
                                            and os.path.samefile(source, args.resume))]
    if taken:
        path, source = taken[0]
        named = "" if os.path.abspath(source) == os.path.abspath(path) else f" ({source})"
        raise UsageError(f"{path}: an input of this command{named}, which the run in {out} would replace;"
                         " give another --output, or copy the file out of it first")
