"""A run's folder, ``OUTPUT/<row>/seed<S>/``: where its files are, and its record ``run.json``."""

import json
from dataclasses import dataclass
from pathlib import Path

from fairseq_sret import json_text
from fairseq_sret.atomic_files import replacing

from .experiment_file import Run
from .records import TranslationRunRecord

#: what the runner makes in a run folder (``--force`` on a changed run removes exactly these)
RUN_OUTPUTS = ("checkpoints", "train.log", "eval", "run.json", "cpu_trace.jsonl", "uptrained.pt")


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def train_log(self) -> Path:
        return self.root / "train.log"

    @property
    def eval_dir(self) -> Path:
        return self.root / "eval"

    @property
    def record(self) -> Path:
        return self.root / "run.json"

    @property
    def cpu_trace(self) -> Path:
        """``{"update", "cpu_seconds"}`` lines sampled while training (:class:`~.cpu_time.CpuTrace`)."""
        return self.root / "cpu_trace.jsonl"


def run_paths(output: Path, run: Run) -> RunPaths:
    return RunPaths(Path(output) / run.name)


def uptrained_checkpoint(paths: RunPaths) -> Path:
    """Where an uptrained run keeps its converted starting point."""
    return paths.root / "uptrained.pt"


def teacher_paths(output, run: Run) -> RunPaths:
    """The run an uptrained ``run`` starts from: its ``uptrain_from`` row, the same seed."""
    return RunPaths(Path(output) / run.teacher_name)


def trained_anything(paths: RunPaths) -> bool:
    return paths.checkpoints.is_dir() and any(paths.checkpoints.iterdir())


def read_record(paths: RunPaths) -> TranslationRunRecord:
    """The run's ``run.json`` (an empty record where there is none yet)."""
    if paths.record.is_file():
        return TranslationRunRecord.from_json(json.loads(paths.record.read_text(encoding="utf-8")))
    return TranslationRunRecord()


def write_text_atomically(path: Path, text: str) -> None:
    """Replace ``path`` by ``text`` so that a reader, or a process killed at any moment, sees
    the old file or the new one, never a part (a synced temporary file, then a rename)."""
    with replacing(path, sync=True) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_record(paths: RunPaths, record: TranslationRunRecord) -> None:
    paths.root.mkdir(parents=True, exist_ok=True)
    write_text_atomically(paths.record, json_text.dumps(record.to_json(), indent=2, ensure_ascii=False) + "\n")
