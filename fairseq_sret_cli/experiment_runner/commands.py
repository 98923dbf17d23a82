"""The commands a run is trained with: the data-bin checked first, the fairseq-train command,
and for an uptrained row its teacher converted by ``sret-uptrain``."""

import shlex
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Sequence

from fairseq_sret import USER_DIR

from .experiment_file import AVERAGE, Experiment, ExperimentError, Run
from .run_folder import RunPaths, read_record, teacher_paths, uptrained_checkpoint

#: what a dry run prints in place of an uptrained row's model options (known after conversion)
UPTRAINED_MODEL_PLACEHOLDER = "<the model options sret-uptrain prints>"


def check_data(experiment: Experiment, data) -> None:
    """Fail before any training if ``data`` cannot serve the experiment: not a data-bin, no
    training or validation split, or a subset the evaluation scores that it lacks.

    Raises ``ExperimentError`` naming the folder and what is missing.
    """
    from ..evaluation.evaluate import data_bin_metadata

    try:
        meta = data_bin_metadata(data)
    except (OSError, ValueError) as exc:
        raise ExperimentError(f"--data: {exc}") from None
    pair = f"{meta['source_lang']}-{meta['target_lang']}"
    missing = [split for split in ("train", "valid")
               if not (Path(data) / f"{split}.{pair}.{meta['source_lang']}.idx").is_file()]
    if missing:
        raise ExperimentError(f"--data: {data} has no {' or '.join(missing)} split ({pair})")
    wanted = dict.fromkeys([*experiment.evaluation.subsets, *experiment.evaluation.curve_subsets])
    unknown = [s for s in wanted if s not in meta["subsets"]]
    if unknown:
        raise ExperimentError(f"{experiment.path}: eval.subsets {unknown} are not in the data-bin {data}"
                              f" (it has {sorted(meta['subsets'])})")


def train_command(experiment: Experiment, run: Run, data: str, paths: RunPaths, cpu: bool = False,
                  max_update: Optional[int] = None, max_epoch: Optional[int] = None,
                  model_options: Optional[List[str]] = None) -> List[str]:
    """The fairseq-train command of ``run`` (the schedule's flags, then the row's). An
    uptrained row's model is ``model_options`` (sret-uptrain's ``--arch sret_transformer ...``),
    fine-tuned from :func:`~.run_folder.uptrained_checkpoint`."""
    schedule = experiment.schedule
    keep = last_epochs_averaged(experiment)
    if run.row.uptrain_from:
        model = [*(model_options or [UPTRAINED_MODEL_PLACEHOLDER]),
                 "--finetune-from-model", str(uptrained_checkpoint(paths))]
    else:
        model = ["--arch", run.row.arch]
    cmd = [
        sys.executable, "-m", "fairseq_cli.train", str(data), "--user-dir", str(USER_DIR),
        *model, *schedule.args, *run.row.args,
        "--seed", str(run.seed), "--save-dir", str(paths.checkpoints),
        "--log-format", "json", "--log-interval", "50", "--no-progress-bar",
    ]
    if not experiment.evaluation.curve_every:
        cmd += ["--keep-last-epochs", str(keep)]  # with a curve, every epoch's is kept until it is read
    if max_update is None:
        max_update = run.row.max_update or schedule.max_update
    max_epoch = schedule.max_epoch if max_epoch is None else max_epoch
    if max_update:
        cmd += ["--max-update", str(max_update)]
    if max_epoch:
        cmd += ["--max-epoch", str(max_epoch)]
    if schedule.patience:
        cmd += ["--patience", str(schedule.patience)]
    if cpu:
        cmd += ["--cpu"]
    return cmd


def last_epochs_averaged(experiment: Experiment) -> int:
    """The most epoch checkpoints a ``lastN`` evaluation averages (1 if none)."""
    return max([int(m.group(1)) for m in map(AVERAGE.fullmatch, experiment.evaluation.checkpoints)
                if m and not m.group(2)] or [1])


def portable(args: Sequence[str]) -> List[str]:
    """``args`` as recorded in results: absolute paths inside the working folder made relative
    to it (the results travel to other machines; their folders mean nothing there)."""
    here = Path.cwd()
    out = []
    for arg in args:
        path = Path(arg)
        if path.is_absolute() and path.is_relative_to(here):
            arg = str(path.relative_to(here)) or "."
        out.append(arg)
    return out


def convert_teacher(output, run: Run, paths: RunPaths, env: Optional[dict] = None) -> List[str]:
    """Convert the teacher run's ``checkpoint_last.pt`` with ``sret-uptrain`` (the row's
    ``uptrain_args``, the run's seed) into :func:`~.run_folder.uptrained_checkpoint`; returns the
    model options it prints. Raises ExperimentError, with sret-uptrain's message, when it fails."""
    teacher = teacher_paths(output, run)
    source = teacher.checkpoints / "checkpoint_last.pt"
    status = read_record(teacher).status
    if status != "done":
        raise ExperimentError(
            f"{run.name} starts from {run.teacher_name}, which is not done in {teacher.root}"
            f" (status {status or 'none'}): train it first in this output folder"
        )
    if not source.is_file():
        raise ExperimentError(
            f"{run.name} starts from {run.teacher_name}, whose {source} is missing:"
            f" train that run first in this output folder (a results file holds no checkpoints)"
        )
    cmd = [sys.executable, "-m", "fairseq_sret_cli.uptrain", str(source), str(uptrained_checkpoint(paths)),
           *run.row.uptrain_args, "--seed", str(run.seed), "--force"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        message = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExperimentError(f"{run.name}: sret-uptrain failed (exit {proc.returncode}): {message}")
    return shlex.split(lines[-1])
