"""What binds a run to the experiment file: its config (a recorded run counts as done only for
the same one) and its training settings (a run folder resumes only with the same ones)."""

import functools
import hashlib
from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from fairseq_sret import json_text

from .. import log as lab_log
from .commands import train_command
from .experiment_file import Experiment, ExperimentError, Run
from .records import TranslationRunRecord
from .run_folder import RUN_OUTPUTS, RunPaths, read_record, run_paths, teacher_paths, trained_anything

log = functools.partial(lab_log, stage="experiments")

#: options whose values locate a run's files rather than decide its numbers (and --cpu: a run may
#: continue on another machine)
_LOCATING = {"--user-dir": "<user-dir>", "--save-dir": "<run>/checkpoints", "--finetune-from-model": "<run>/uptrained.pt"}


class SettingsChanged(ExperimentError):
    """Run folders trained with other settings than the experiment file now gives them."""


def run_config(experiment: Experiment, run: Run, max_update: Optional[int] = None,
               max_epoch: Optional[int] = None) -> dict:
    """What makes a run's numbers: a recorded run counts as done only for the same config."""
    schedule = experiment.schedule
    config = {
        "arch": run.row.arch, "args": [*schedule.args, *run.row.args], "seed": run.seed,
        "variants": run.row.variants,
        "max_update": (run.row.max_update or schedule.max_update) if max_update is None else max_update,
        "max_epoch": schedule.max_epoch if max_epoch is None else max_epoch, "patience": schedule.patience,
        "eval": {"beam": experiment.evaluation.beam, "lenpen": experiment.evaluation.lenpen,
                 "subsets": list(experiment.evaluation.subsets), "checkpoints": list(experiment.evaluation.checkpoints),
                 "variants": dict(experiment.evaluation.variants)},
    }
    if experiment.evaluation.curve_every:
        config["eval"]["curve"] = {"every": experiment.evaluation.curve_every,
                                   "subsets": list(experiment.evaluation.curve_subsets)}
    if run.row.uptrain_from:
        config["uptrain"] = {"from": run.row.uptrain_from, "args": list(run.row.uptrain_args)}
    return config


def finished_record(experiment: Experiment, run: Run, output,
                    known: Optional[Dict[str, TranslationRunRecord]] = None, max_update: Optional[int] = None,
                    max_epoch: Optional[int] = None, data: Optional[str] = None) -> Optional[TranslationRunRecord]:
    """The run's record if it is done with today's config (and, given the data-bin ``data``, on
    what it holds: :func:`data_difference_of`): in its run folder, or among ``known`` records
    (the results file of earlier sessions, keyed by run name)."""
    config = run_config(experiment, run, max_update, max_epoch)
    for record in (read_record(run_paths(output, run)), (known or {}).get(run.name) or TranslationRunRecord()):
        if record.done and record.config == config and (
                data is None or data_difference_of(record.train_settings, data) is None):
            return replace(record, row=run.row.id, seed=run.seed)
    return None


def collect_records(experiment: Experiment, output, known: Optional[Dict[str, TranslationRunRecord]] = None,
                    max_update: Optional[int] = None, max_epoch: Optional[int] = None,
                    data: Optional[str] = None) -> List[TranslationRunRecord]:
    """Every run's record: the finished one (this session's or ``known``, on ``data`` when
    given), else what is there."""
    records = []
    for run in experiment.runs():
        done = finished_record(experiment, run, output, known, max_update, max_epoch, data)
        records.append(done or _unfinished_record(run, output, data))
    return records


def _unfinished_record(run: Run, output, data: Optional[str] = None) -> TranslationRunRecord:
    """What the run folder holds of a run not done with today's config and data; a run done with
    another one (an edited row, another --max-update, another data-bin) is not reported as done."""
    record = replace(read_record(run_paths(output, run)), row=run.row.id, seed=run.seed)
    if record.done:
        why = data_difference_of(record.train_settings, data) if data is not None else None
        record.status = "done on other data" if why else "done with other settings"
        if why:
            record.not_matching = why
    return record


def training_settings(command: Sequence[str]) -> List[str]:
    """A fairseq-train command (``[python,] -m fairseq_cli.train DATA ...``, as :func:`train_command`
    makes it or ``run.json`` records it) as the settings that decide the model: the data-bin
    and the paths of the run's files become placeholders, ``--cpu`` is left out
    (:func:`run_settings` then puts what the data-bin holds in the data's place)."""
    args = list(command)
    args = args[args.index("fairseq_cli.train") + 2:] if "fairseq_cli.train" in args else args[1:]
    out, located = ["<data>"], None
    for arg in args:
        if located is not None:
            out.append(located)
            located = None
        elif arg in _LOCATING:
            out.append(arg)
            located = _LOCATING[arg]
        elif arg != "--cpu":
            out.append(arg)
    return out


def _data_bin(data: str) -> Path:
    folder = Path(str(data).split(":")[0])
    if not folder.is_dir():
        raise ExperimentError(f"--data: {folder}: no such data-bin folder")
    return folder


def data_fingerprint(data: str) -> str:
    """What a data-bin holds: every byte of its dictionaries and binary files, with their names
    (fairseq's first folder of a colon-separated list; :mod:`fairseq_sret_cli.fingerprints`)."""
    from ..fingerprints import file_digest, full

    digest = hashlib.sha256()
    for path in sorted(_data_bin(data).iterdir()):
        if (path.name.startswith("dict.") and path.suffix == ".txt") or path.suffix in (".bin", ".idx"):
            digest.update(f"{path.name}\0{file_digest(path)}\0".encode("utf-8"))
    return full(digest)


def legacy_data_fingerprint(data: str) -> str:
    """The fingerprint runs recorded before :func:`data_fingerprint` read every byte: the
    dictionaries' text and the binary files' names and sizes. Still compared with the runs
    that record it (a data-bin edited in place to the same sizes is not told apart by it)."""
    digest = hashlib.sha256()
    for path in sorted(_data_bin(data).iterdir()):
        if path.name.startswith("dict.") and path.suffix == ".txt":
            digest.update(path.name.encode("utf-8") + b"\0" + path.read_bytes() + b"\0")
        elif path.suffix in (".bin", ".idx"):
            digest.update(f"{path.name}\0{path.stat().st_size}\0".encode("utf-8"))
    return digest.hexdigest()[:16]


def data_setting(data: str) -> str:
    """The data-bin in a run's settings: ``<data FINGERPRINT>`` (:func:`data_fingerprint`)."""
    return f"<data {data_fingerprint(data)}>"


def data_difference_of(recorded: Optional[Sequence[str]], data: str) -> Optional[str]:
    """None when settings a run recorded name the data-bin ``data`` holds now, else why not
    (:func:`fairseq_sret_cli.fingerprints.data_difference`, the check every reuse of a result
    goes through). Settings recorded before data-bins were fingerprinted (``<data>``, or none)
    name no data and pass."""
    from ..fingerprints import data_difference

    if not recorded or recorded[0] == "<data>":
        return None
    if not (recorded[0].startswith("<data ") and recorded[0].endswith(">")):
        return "its settings name no data-bin"
    difference = data_difference({"data-bin": recorded[0][6:-1]}, {"data-bin": data_fingerprint(data)},
                                 lambda: {"data-bin": legacy_data_fingerprint(data)})
    return None if difference is None else f"{difference}: not the data-bin {data}"


def _without_data_fingerprint(settings: Sequence[str]) -> List[str]:
    return ["<data>" if arg.startswith("<data ") else arg for arg in settings]


def settings_fingerprint(settings: Sequence[str]) -> str:
    return hashlib.sha256(json_text.dumps(list(settings)).encode("utf-8")).hexdigest()[:16]


def _options(settings: Sequence[str]) -> Dict[str, str]:
    found, flag = {}, None
    for arg in settings:
        if arg.startswith("--"):
            flag = arg
            found[flag] = ""
        elif flag is not None:
            found[flag] = (found[flag] + " " + arg).strip()
    return found


def settings_difference(old: Sequence[str], new: Sequence[str]) -> str:
    """``--lr 0.001 -> 0.0005; --dropout 0.3 added`` (the options whose values differ)."""
    a, b = _options(old), _options(new)
    parts = []
    if old and new and old[0] != new[0] and old[0].startswith("<data") and new[0].startswith("<data"):
        parts.append(f"the data-bin's contents: fingerprint {old[0][6:-1] or '?'} -> {new[0][6:-1]}")
    for flag in list(a) + [f for f in b if f not in a]:
        if flag not in b:
            parts.append(f"{flag} {a[flag]} removed".replace("  ", " "))
        elif flag not in a:
            parts.append(f"{flag} {b[flag]} added".replace("  ", " "))
        elif a[flag] != b[flag]:
            parts.append(f"{flag} {a[flag]} -> {b[flag]}")
    return "; ".join(parts) or "the options' order or positional arguments differ"


def recorded_settings(paths: RunPaths, record: TranslationRunRecord) -> Optional[List[str]]:
    """The settings a run folder's training used (``run.json``), None if it records none."""
    if record.train_settings:
        return list(record.train_settings)
    if record.command:  # recorded before the settings were
        return training_settings(record.command)
    return None


def check_run_folder(run: Run, paths: RunPaths, settings: List[str], force: bool = False,
                     data: Optional[str] = None) -> Optional[str]:
    """Bind ``run``'s folder to ``settings``: None when it is empty, or trained with these
    settings (it resumes; given the data-bin ``data``, a data fingerprint of the format recorded
    before is compared as :func:`data_difference_of` does); else what differs. With ``force`` what the runner made in a folder
    trained otherwise is set aside (said loudly; :func:`settle_start_over` drops it once the new
    training has saved a checkpoint, or puts it back) and None returned."""
    settle_start_over(paths)  # a runner killed after --force set a run aside
    record = read_record(paths)
    if not trained_anything(paths) and not paths.train_log.exists():
        return None
    recorded = recorded_settings(paths, record)
    if recorded is not None and (recorded == settings or (
            _without_data_fingerprint(recorded) == _without_data_fingerprint(settings)
            and (recorded[0] == "<data>" or (data is not None and data_difference_of(recorded, data) is None)))):
        return None  # the same settings, on the same data (of a fingerprint recorded before, or none)
    why = (f"{run.name}: {paths.root} holds checkpoints that sret-experiments did not record (no run.json)"
           if recorded is None else
           f"{run.name} was trained in {paths.root} with other settings ({settings_difference(recorded, settings)})")
    if not force:
        return why
    log(f"{why}: --force: training it again from scratch (its checkpoints, log and evaluations are replaced once"
        " the new training has saved a checkpoint; kept until then)")
    from ..outputs import set_aside

    set_aside(paths.root, RUN_OUTPUTS)
    return None


def settle_start_over(paths: RunPaths) -> None:
    """A run started again with ``--force`` (:func:`check_run_folder` set the earlier run's files
    aside): once the new training has saved a checkpoint the earlier run goes; before that (it
    failed, was stopped or killed) the earlier run is put back as it was."""
    from ..outputs import ASIDE, drop_replaced, restore_replaced

    if not (paths.root / ASIDE).is_dir():
        return
    if (paths.checkpoints / "checkpoint_last.pt").is_file():
        drop_replaced(paths.root)
    else:
        restore_replaced(paths.root, locked_by_me=True)
        log(f"{paths.root}: the new training saved no checkpoint; the earlier run is kept as it was")


def run_settings(experiment: Experiment, run: Run, data: str, output, cpu: bool, max_update, max_epoch,
                 model_options: Optional[List[str]]) -> List[str]:
    """The training settings of ``run``; an uptrained run's include its teacher's (the teacher
    row's, or when the row is not selected, those its run folder records)."""
    paths = run_paths(output, run)
    settings = training_settings(train_command(experiment, run, data, paths, cpu=cpu, max_update=max_update,
                                               max_epoch=max_epoch, model_options=model_options))
    settings[0] = data_setting(data)
    if run.row.uptrain_from:
        row = next((r for r in experiment.rows if r.id == run.row.uptrain_from), None)
        if row is not None:
            teacher = run_settings(experiment, Run(row, run.seed), data, output, cpu, max_update, max_epoch, None)
        else:
            teacher = read_record(teacher_paths(output, run)).train_settings or ["<not recorded>"]
        settings += ["<teacher>", *teacher]
    return settings
