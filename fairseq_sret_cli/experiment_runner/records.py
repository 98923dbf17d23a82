"""Typed run records: what a report reads of one run (row x seed), and the JSON it keeps of it.

An image run's record (:class:`ImageRunRecord`) is read from its folder's ``result.json`` and
``log.jsonl`` or from the results file of an earlier session, and written back into
``RESULTS/NAME.json`` exactly as before: ``{"row", "seed", "status", "result", "history"}``, or a
recorded run that does not serve here kept as it was recorded, with ``not_matching`` added.

A translation run's record (:class:`TranslationRunRecord`) is its folder's ``run.json``, which the
runner writes as the run goes, or a run of an earlier session's results file; written back as
it was read, unknown keys and key order included.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


class RunNaming:
    """What a run record's ``row``, ``seed`` and ``status`` say: its name (``ROW/seedN``) and
    whether it is done."""

    row: Optional[str]
    seed: Optional[int]
    status: Optional[str]

    @property
    def name(self) -> str:
        return f"{self.row}/seed{self.seed}"

    @property
    def done(self) -> bool:
        return self.status == "done"


@dataclass
class ImageRunRecord(RunNaming):
    """One image run: ``status`` ``done`` (with its ``result`` and per-epoch ``history``) or
    ``missing``; ``not_matching``: why the record a results file keeps (``recorded``) does not
    count here."""

    row: str
    seed: int
    status: str
    result: Optional[dict] = None
    history: List[dict] = field(default_factory=list)
    not_matching: Optional[str] = None
    recorded: Optional[dict] = None

    def to_json(self) -> dict:
        """The run as the results file keeps it (a recorded run that does not serve: as recorded)."""
        if self.recorded:
            return dict(self.recorded, not_matching=self.not_matching)
        stored = {"row": self.row, "seed": self.seed, "status": self.status, "result": self.result,
                  "history": self.history}
        if self.not_matching:
            stored["not_matching"] = self.not_matching
        return stored

    @classmethod
    def from_json(cls, stored: dict) -> "ImageRunRecord":
        """A run the results file records (its ``result`` and ``history``)."""
        return cls(row=stored["row"], seed=stored["seed"], status=stored.get("status", "missing"),
                   result=stored.get("result"), history=list(stored.get("history") or []),
                   not_matching=stored.get("not_matching"))


#: a translation run's keys, in the order the runner first writes them (a key set since the record
#: was read goes after those it held, in this order)
TRANSLATION_KEYS = ("uptrain", "status", "row", "seed", "command", "jobs", "config", "train_settings",
                    "train_fingerprint", "trained_on", "train_cpu_seconds", "train_processes", "train", "model",
                    "eval", "curve", "eval_skipped", "error", "returncode", "not_matching")


@dataclass
class TranslationRunRecord(RunNaming):
    """One translation run as its folder's ``run.json`` and the results file keep it: ``status``
    (``training``, ``failed``, ``done``, ``done with other settings``, ...; none before its first
    training), the training command and settings, the CPU seconds and devices of its training
    processes, ``train`` (:func:`~.training.summarise_training`), ``model``
    (:func:`~.run_evaluation.model_facts`), ``eval`` (``{checkpoint@variant: {subset: result}}``)
    and ``curve``. A field that is None is absent from the JSON. ``extras``: the keys this class
    does not name (and those stored as null), kept as read; ``key_order``: the keys in the order
    read, so that :meth:`to_json` writes back exactly what :meth:`from_json` read."""

    uptrain: Optional[dict] = None
    status: Optional[str] = None
    row: Optional[str] = None
    seed: Optional[int] = None
    command: Optional[List[str]] = None
    jobs: Optional[int] = None
    config: Optional[dict] = None
    train_settings: Optional[List[str]] = None
    train_fingerprint: Optional[str] = None
    trained_on: Optional[List[str]] = None
    train_cpu_seconds: Optional[float] = None
    train_processes: Optional[int] = None
    train: Optional[dict] = None
    model: Optional[dict] = None
    eval: Optional[Dict[str, Dict[str, dict]]] = None
    curve: Optional[List[dict]] = None
    eval_skipped: Optional[Dict[str, str]] = None
    error: Optional[str] = None
    returncode: Optional[int] = None
    not_matching: Optional[str] = None
    extras: Dict[str, Any] = field(default_factory=dict)
    key_order: List[str] = field(default_factory=list, repr=False, compare=False)

    def update(self, **fields) -> None:
        """Set the named fields (TypeError for a name that is not one)."""
        for key, value in fields.items():
            if key not in TRANSLATION_KEYS:
                raise TypeError(f"a translation run record has no field {key!r}")
            setattr(self, key, value)

    def to_json(self) -> dict:
        """The run as ``run.json`` and the results file keep it: the keys read in their order,
        then those set since in :data:`TRANSLATION_KEYS`' order."""
        values = dict(self.extras)
        values.update((key, getattr(self, key)) for key in TRANSLATION_KEYS if getattr(self, key) is not None)
        order = dict.fromkeys([*self.key_order, *TRANSLATION_KEYS, *self.extras])
        return {key: values[key] for key in order if key in values}

    @classmethod
    def from_json(cls, stored: dict) -> "TranslationRunRecord":
        """A run as ``run.json`` or a results file records it (``{}``: a run not started)."""
        named = {key: value for key, value in stored.items() if key in TRANSLATION_KEYS and value is not None}
        return cls(**named, extras={key: value for key, value in stored.items() if key not in named},
                   key_order=list(stored))
