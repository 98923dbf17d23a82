"""Experiment files: a checked-in list of named training configurations.

An experiment file (YAML) names the data set, the schedule every row shares, the evaluation
and the rows; each row is an architecture with its flags and seeds::

    name: multi30k
    title: "Multi30k De-En: SReT against the transformer"
    data: data-bin/multi30k_de_en          # default for --data
    seeds: [1]                             # default seeds of a row
    train:                                 # the schedule, the same for every row
      args: --share-all-embeddings --optimizer adam --lr 1e-3 ...
      max_epoch: 100                       # the stated cap
      patience: 5                          # stop when valid loss has not improved for 5 epochs
      max_update: 0                        # or a fixed number of updates (0: none)
    eval:
      beam: 5
      subsets: [test, test1]
      checkpoints: [best, last5]           # checkpoint_best.pt; average of the last 5 epochs
                                           # (last5u: of the last 5 update checkpoints)
      variants:                            # optional: each checkpoint also decoded with extra
        depth1: >-
          --model-overrides "{'encoder_depth': 1, 'decoder_depth': 1}"
      curve:                               # optional: BLEU against training CPU time
        every: 5                           #   every 5th epoch checkpoint (and the last epoch's)
        subsets: [test]                    #   decoded like the table, on these subsets
    rows:
      - id: sret_3x2
        title: "SReT 3x2 (default)"
        arch: sret_transformer_iwslt_de_en
        args: ""                           # extra flags of this row
        seeds: [1, 2, 3]
        max_update: 0                      # this row's own update cap (0: the schedule's)
        variants: [""]                     # the eval variants of this row (default: all)
      - id: sret_uptrained
        arch: sret_transformer             # required: the model is the conversion's
        uptrain_from: transformer_4x4      # an earlier row: each seed starts from that
        uptrain_args: --recursions 2       #   seed's checkpoint_last.pt, converted by
                                           #   sret-uptrain with these flags, fine-tuned
                                           #   (--finetune-from-model) with the model
                                           #   options sret-uptrain prints, then args

Every (row, seed) is one *run*. :func:`load_experiment` validates the file and expands it.
The flags the runner gives every run itself (``--seed``, ``--max-update``, ``--save-dir``, ...:
:data:`RUNNER_TRAIN_OPTIONS`) are refused in ``args``, with the field that sets them.
"""

import math
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

CHECKPOINT_KINDS = {"best": "checkpoint_best.pt", "last": "checkpoint_last.pt"}
#: ``lastN``: the average of the last N epoch checkpoints; ``lastNu``: of the last N update checkpoints
AVERAGE = re.compile(r"last(\d+)(u?)")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class ExperimentError(ValueError):
    """An experiment file that cannot be run; the message names the file and the field."""


@dataclass(frozen=True)
class Schedule:
    args: List[str] = field(default_factory=list)
    max_epoch: int = 0
    max_update: int = 0
    patience: int = 0


@dataclass(frozen=True)
class Evaluation:
    beam: int = 5
    lenpen: float = 1.0
    subsets: List[str] = field(default_factory=lambda: ["test"])
    checkpoints: List[str] = field(default_factory=lambda: ["best"])
    max_tokens: int = 8000
    #: name -> extra fairseq-generate flags, e.g. a depth override; "" = as trained
    variants: Dict[str, List[str]] = field(default_factory=lambda: {"": []})
    #: the learning curve: every ``curve_every``-th epoch checkpoint decoded on ``curve_subsets``
    #: (0: no curve; then only the last epoch checkpoints that ``lastN`` averages are kept)
    curve_every: int = 0
    curve_subsets: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    id: str
    arch: str
    title: str = ""
    args: List[str] = field(default_factory=list)
    seeds: List[int] = field(default_factory=lambda: [1])
    notes: str = ""
    #: this row's update cap instead of the schedule's (e.g. equal time for a cheaper model)
    max_update: int = 0
    #: the eval variants that apply to this row (None: all; "" is the model as trained)
    variants: Optional[List[str]] = None
    #: uptraining: the row whose run of the same seed is converted by sret-uptrain
    #: (``uptrain_args``) and fine-tuned; "" = trained from scratch
    uptrain_from: str = ""
    uptrain_args: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.title or self.id


@dataclass(frozen=True)
class Run:
    row: Row
    seed: int

    @property
    def name(self) -> str:
        """``ROW/seedS``, also the run's folder under the output folder."""
        return f"{self.row.id}/seed{self.seed}"

    @property
    def teacher_name(self) -> str:
        """The name of the run an uptrained run starts from ("" when trained from scratch)."""
        return f"{self.row.uptrain_from}/seed{self.seed}" if self.row.uptrain_from else ""


@dataclass(frozen=True)
class Experiment:
    name: str
    path: Path
    title: str
    data: Optional[str]
    schedule: Schedule
    evaluation: Evaluation
    rows: List[Row]
    notes: str = ""

    def runs(self) -> List[Run]:
        return [Run(row, seed) for row in self.rows for seed in row.seeds]

    def select(self, row_ids: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None) -> "Experiment":
        """Only the rows ``row_ids`` (in file order) and/or only ``seeds`` of every row."""
        rows = select_rows(self.rows, row_ids, self.path)
        if seeds:
            rows = [replace(r, seeds=list(seeds)) for r in rows]
        return replace(self, rows=rows)

    def capped(self, max_update: Optional[int] = None, max_epoch: Optional[int] = None) -> "Experiment":
        """This experiment as ``--max-update``/``--max-epoch`` run it: an override replaces the
        schedule's cap and every row's own."""
        schedule, rows = self.schedule, self.rows
        if max_update is not None:
            schedule, rows = replace(schedule, max_update=max_update), [replace(r, max_update=0) for r in rows]
        if max_epoch is not None:
            schedule = replace(schedule, max_epoch=max_epoch)
        return replace(self, schedule=schedule, rows=rows)

    def with_runs_of(self, selection: "Experiment") -> "Experiment":
        """Every row of this experiment with its seeds, plus the seeds ``selection`` (a
        :meth:`select` of it, e.g. ``--seeds 3``) gives a row beyond the file's."""
        added = {row.id: row.seeds for row in selection.rows}
        rows = [replace(row, seeds=row.seeds + [s for s in added.get(row.id, []) if s not in row.seeds])
                for row in self.rows]
        return replace(self, rows=rows)


def select_rows(rows: Sequence, row_ids: Optional[Sequence[str]], path) -> list:
    """The rows (of any experiment file) whose ids ``row_ids`` names, in file order (all rows
    for None); ExperimentError for an id no row has: a selection that trains nothing is refused."""
    if row_ids is None:
        return list(rows)
    unknown = sorted(set(row_ids) - {r.id for r in rows})
    if unknown or not row_ids:
        raise ExperimentError(f"{path}: no rows {unknown}; rows: {[r.id for r in rows]}")
    return [r for r in rows if r.id in set(row_ids)]


def plain_name(value, where: str) -> str:
    """``value`` as a name that is a single path component (a row id, an experiment's name: they
    name folders and files); ExperimentError for one that is not (``../x``, ``a/b``, ``.hidden``)."""
    if not isinstance(value, (str, int)) or isinstance(value, bool) or not _ID.match(str(value)):
        raise ExperimentError(f"{where} {value!r} must be letters, digits, '_', '.', '-' (a plain file name,"
                              " starting with a letter or digit)")
    return str(value)


def _args(value, where: str) -> List[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list) and all(isinstance(v, (str, int, float)) for v in value):
        return [str(v) for v in value]
    raise ExperimentError(f"{where} must be a string of flags or a list of them, got {value!r}")


#: fairseq-train options the runner gives every run itself (after the file's flags, so a copy
#: in the file would be overridden without a word) -> where the file says it instead
RUNNER_TRAIN_OPTIONS = {
    "--seed": "the seeds (seeds: / the row's seeds: / --seeds)",
    "--max-update": "train.max_update, or the row's max_update:",
    "--max-epoch": "train.max_epoch",
    "--patience": "train.patience",
    "--save-dir": "the runner's --output folder",
    "--keep-last-epochs": "eval.checkpoints (lastN keeps N epochs)",
    "--user-dir": "nothing: the runner loads the plugin",
    "--arch": "the row's arch:",
    "-a": "the row's arch:",
    "--finetune-from-model": "the row's uptrain_from:",
    "--cpu": "sret-experiments --cpu",
    "--log-format": "nothing: the runner reads fairseq's JSON log",
    "--log-interval": "nothing: the runner reads fairseq's JSON log",
}


def _train_args(value, where: str) -> List[str]:
    """fairseq-train flags of the file, refusing those the runner sets for every run."""
    args = _args(value, where)
    for arg in args:
        name = arg.split("=", 1)[0]
        if name in RUNNER_TRAIN_OPTIONS:
            raise ExperimentError(f"{where}: {name} is set by the runner for every run (it would override this one);"
                                  f" give it as {RUNNER_TRAIN_OPTIONS[name]}")
    return args


#: fairseq-generate options a variant may give although the evaluation sets them: how it
#: decodes (the report names each variant's flags, and its results the beam and lenpen used)
VARIANT_DECODING_OPTIONS = ("--beam", "--lenpen", "--max-tokens", "--batch-size", "--max-sentences", "--cpu")


def _generate_args(value, where: str) -> List[str]:
    """fairseq-generate flags of an evaluation variant, refusing those that would score another
    model, subset or text than the evaluation names, and those that change what it measures."""
    from ..evaluation.generate import OWN_GENERATE_OPTIONS, refused_generate_args

    args = _args(value, where)
    instead = {"--path": "give it as eval.checkpoints", "--gen-subset": "give it as eval.subsets"}
    own = {option: instead.get(option, why) for option, why in OWN_GENERATE_OPTIONS.items()
           if option not in VARIANT_DECODING_OPTIONS}
    refused = refused_generate_args(args, own=own, command="the runner")
    if refused:
        raise ExperimentError(f"{where}: {refused}")
    return args


def _int(value, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ExperimentError(f"{where} must be an integer >= {minimum}, got {value!r}")
    return value


def _float(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExperimentError(f"{where} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ExperimentError(f"{where} must be finite, got {value!r}")
    return float(value)


def _names(value, where: str) -> List[str]:
    if not isinstance(value, list) or not value or not all(isinstance(v, (str, int)) and str(v) for v in value):
        raise ExperimentError(f"{where} must be a non-empty list of names, got {value!r}")
    return [str(v) for v in value]


def _seeds(value, where: str) -> List[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ExperimentError(f"{where} must be a non-empty list of integers, got {value!r}")
    seeds = [_int(v, where, 0) for v in value]
    if len(set(seeds)) != len(seeds):
        raise ExperimentError(f"{where} repeats a seed: {seeds}")
    return seeds


def _check_keys(section: dict, allowed: Sequence[str], where: str) -> None:
    if not isinstance(section, dict):
        raise ExperimentError(f"{where} must be a mapping, got {section!r}")
    unknown = sorted(set(section) - set(allowed))
    if unknown:
        raise ExperimentError(f"{where}: unknown fields {unknown}; allowed: {list(allowed)}")


def parse_experiment(raw: dict, path: Union[str, Path] = "<experiment>") -> Experiment:
    """Validate a loaded experiment mapping (see the module docstring)."""
    path = Path(path)
    where = str(path)
    _check_keys(raw, ["name", "title", "data", "seeds", "train", "eval", "rows", "notes"], where)
    name = raw.get("name") or path.stem
    name = plain_name(name, f"{where}: name")
    default_seeds = _seeds(raw.get("seeds", [1]), f"{where}: seeds")
    schedule = _parse_schedule(raw.get("train") or {}, where)
    if raw.get("data") is not None and not isinstance(raw["data"], str):
        raise ExperimentError(f"{where}: data must be the path of a data-bin, got {raw['data']!r}")
    if not (schedule.max_epoch or schedule.max_update):
        raise ExperimentError(f"{where}: train needs a cap: max_epoch and/or max_update")
    evaluation = _parse_evaluation(raw.get("eval") or {}, where)
    if not isinstance(raw.get("rows") or [], list):
        raise ExperimentError(f"{where}: rows must be a list of rows, got {raw['rows']!r}")
    rows = []
    for i, item in enumerate(raw.get("rows") or []):
        at = f"{where}: rows[{i}]"
        row = _parse_row(item, at, evaluation, default_seeds)
        _check_uptraining(row, rows, at)
        rows.append(row)
    if not rows:
        raise ExperimentError(f"{where}: no rows")
    ids = [r.id for r in rows]
    if len(set(ids)) != len(ids):
        raise ExperimentError(f"{where}: row ids repeat: {sorted(i for i in set(ids) if ids.count(i) > 1)}")
    return Experiment(
        name=str(name), path=path, title=str(raw.get("title", name)), data=raw.get("data"),
        schedule=schedule, evaluation=evaluation, rows=rows, notes=str(raw.get("notes", "")),
    )


def _parse_schedule(train: dict, where: str) -> Schedule:
    _check_keys(train, ["args", "max_epoch", "max_update", "patience"], f"{where}: train")
    return Schedule(
        args=_train_args(train.get("args"), f"{where}: train.args"),
        max_epoch=_int(train.get("max_epoch", 0), f"{where}: train.max_epoch"),
        max_update=_int(train.get("max_update", 0), f"{where}: train.max_update"),
        patience=_int(train.get("patience", 0), f"{where}: train.patience"),
    )


def _parse_evaluation(ev: dict, where: str) -> Evaluation:
    _check_keys(ev, ["beam", "lenpen", "subsets", "checkpoints", "max_tokens", "variants", "curve"], f"{where}: eval")
    variants = ev.get("variants") or {"": ""}
    if not isinstance(variants, dict):
        raise ExperimentError(f"{where}: eval.variants must map names to fairseq-generate flags, got {variants!r}")
    for key in variants:
        if key and not _ID.match(str(key)):
            raise ExperimentError(f"{where}: eval.variants: name {key!r} must be letters, digits, '_', '.', '-'")
    checkpoints = _checkpoint_kinds(ev.get("checkpoints", ["best"]), f"{where}: eval.checkpoints")
    curve = ev.get("curve") or {}
    _check_keys(curve, ["every", "subsets"], f"{where}: eval.curve")
    subsets = _names(ev.get("subsets", ["test"]), f"{where}: eval.subsets")
    curve_every = _int(curve.get("every", 0), f"{where}: eval.curve.every")
    curve_subsets = _names(curve.get("subsets", subsets[:1]), f"{where}: eval.curve.subsets") if curve else []
    if curve and not curve_every:
        raise ExperimentError(f"{where}: eval.curve needs 'every': decode every Nth epoch checkpoint (N >= 1)")
    return Evaluation(
        beam=_int(ev.get("beam", 5), f"{where}: eval.beam", 1),
        lenpen=_float(ev.get("lenpen", 1.0), f"{where}: eval.lenpen"),
        subsets=subsets,
        checkpoints=checkpoints,
        max_tokens=_int(ev.get("max_tokens", 8000), f"{where}: eval.max_tokens", 1),
        variants={str(k or ""): _generate_args(v, f"{where}: eval.variants.{k}") for k, v in variants.items()},
        curve_every=curve_every, curve_subsets=curve_subsets,
    )


def _checkpoint_kinds(value, where: str) -> List[str]:
    checkpoints = _names(value, where)
    for kind in checkpoints:
        average = AVERAGE.fullmatch(str(kind))
        if average and int(average.group(1)) < 1:
            raise ExperimentError(f"{where}: {kind!r} averages no checkpoint; give last1 or more")
        if kind not in CHECKPOINT_KINDS and not average:
            raise ExperimentError(
                f"{where}: unknown {kind!r}; allowed: best, last, lastN (average of the last N"
                " epoch checkpoints), lastNu (of the last N update checkpoints, --save-interval-updates)"
            )
    return checkpoints


def _parse_row(item: dict, at: str, evaluation: Evaluation, default_seeds: List[int]) -> Row:
    _check_keys(item, ["id", "title", "arch", "args", "seeds", "notes", "max_update", "variants",
                       "uptrain_from", "uptrain_args"], at)
    row_variants = item.get("variants")
    if row_variants is not None:
        if not isinstance(row_variants, list):
            raise ExperimentError(f"{at}.variants must be a list of eval.variants names, got {row_variants!r}")
        row_variants = [str(v or "") for v in row_variants]
        unknown = sorted(set(row_variants) - set(evaluation.variants))
        if unknown:
            raise ExperimentError(f"{at}.variants: {unknown} are not in eval.variants {sorted(evaluation.variants)}")
    for key in ("id", "arch"):
        if not item.get(key):
            raise ExperimentError(f"{at}: '{key}' is required")
    plain_name(item["id"], f"{at}: id")
    return Row(
        id=str(item["id"]), arch=str(item["arch"]), title=str(item.get("title", "")),
        args=_train_args(item.get("args"), f"{at}.args"),
        seeds=_seeds(item.get("seeds", default_seeds), f"{at}.seeds"), notes=str(item.get("notes", "")),
        max_update=_int(item.get("max_update", 0), f"{at}.max_update"), variants=row_variants,
        uptrain_from=str(item.get("uptrain_from") or ""),
        uptrain_args=_args(item.get("uptrain_args"), f"{at}.uptrain_args"),
    )


def _check_uptraining(row: Row, earlier: Sequence[Row], at: str) -> None:
    """An uptrained row names an earlier row that has each of its seeds, and is an
    ``sret_transformer`` (its model options are the conversion's)."""
    if not row.uptrain_from:
        if row.uptrain_args:
            raise ExperimentError(f"{at}: uptrain_args without uptrain_from")
        return
    source = next((r for r in earlier if r.id == row.uptrain_from), None)
    if source is None:
        raise ExperimentError(f"{at}: uptrain_from {row.uptrain_from!r} is not an earlier row"
                              f" (earlier rows: {[r.id for r in earlier]})")
    missing = sorted(set(row.seeds) - set(source.seeds))
    if missing:
        raise ExperimentError(f"{at}: uptrain_from {row.uptrain_from!r} has no seeds {missing}: each seed"
                              " starts from that seed's trained run")
    if row.arch != "sret_transformer":
        raise ExperimentError(f"{at}: an uptrained row's arch is sret_transformer (the converted model's"
                              f" options come from sret-uptrain), got {row.arch!r}")


def _unique_key_loader():
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        """YAML's safe loader, except that a key given twice in one mapping is an error
        (plain YAML keeps the last one silently: a row or setting would vanish)."""

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    return UniqueKeyLoader


def load_experiment(path: Union[str, Path]) -> Experiment:
    """Read and validate an experiment file."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ExperimentError(f"{path}: no such experiment file")
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_unique_key_loader())
    except UnicodeDecodeError as exc:
        raise ExperimentError(f"{path}: not UTF-8 text: {exc}") from None
    except yaml.YAMLError as exc:
        raise ExperimentError(f"{path}: not valid YAML: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise ExperimentError(f"{path}: expected a mapping at the top level")
    return parse_experiment(raw, path)


def describe(experiment: Experiment) -> Dict:
    """The experiment as JSON-able data (recorded in the results)."""
    return {
        "name": experiment.name,
        "file": str(experiment.path),
        "title": experiment.title,
        "train": {"args": experiment.schedule.args, "max_epoch": experiment.schedule.max_epoch,
                  "max_update": experiment.schedule.max_update, "patience": experiment.schedule.patience},
        "eval": vars(experiment.evaluation),
        "rows": [dict({"id": r.id, "title": r.label, "arch": r.arch, "args": r.args, "seeds": r.seeds,
                       "notes": r.notes, "max_update": r.max_update or experiment.schedule.max_update},
                      **({"uptrain_from": r.uptrain_from, "uptrain_args": r.uptrain_args} if r.uptrain_from else {}))
                 for r in experiment.rows],
    }
