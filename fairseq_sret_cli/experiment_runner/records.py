"""Typed run records: what a report reads of one run (row x seed), and the JSON it keeps of it.

An image run's record (:class:`ImageRunRecord`) is read from its folder's ``result.json`` and
``log.jsonl`` or from the results file of an earlier session, and written back into
``RESULTS/NAME.json`` exactly as before: ``{"row", "seed", "status", "result", "history"}``, or a
recorded run that does not serve here kept as it was recorded, with ``not_matching`` added.
"""

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class ImageRunRecord:
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

    @property
    def name(self) -> str:
        return f"{self.row}/seed{self.seed}"

    @property
    def done(self) -> bool:
        return self.status == "done"

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
