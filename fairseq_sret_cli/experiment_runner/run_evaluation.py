"""A trained run evaluated: the checkpoint of each kind (``best``, ``last``, ``lastN``
averaged), decoded and scored on every subset, its learning curve, and the model's size."""

import functools
from pathlib import Path
from typing import Dict, List, Optional

from .. import log as lab_log
from .commands import last_epochs_averaged
from .cpu_time import seconds_on_path
from .experiment_file import AVERAGE, CHECKPOINT_KINDS, Experiment, Row
from .records import TranslationRunRecord
from .run_folder import RunPaths, write_record
from .training import read_training

log = functools.partial(lab_log, stage="experiments")


def model_facts(checkpoint) -> dict:
    """Unique parameters and layer applications of a fairseq checkpoint.

    Tied tensors (shared embeddings) are stored once in the file and counted once, as are
    shared layers (they are one set of parameters); buffers are not counted.
    """
    from fairseq_sret.checkpoints import load_checkpoint

    state = load_checkpoint(checkpoint)
    seen, params = set(), 0
    for name, tensor in state["model"].items():
        if name.endswith(("._float_tensor", ".version")) or not tensor.is_floating_point():
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            params += tensor.numel()
    cfg = (state.get("cfg") or {}).get("model") or state.get("args")
    get = (lambda k, d=None: getattr(cfg, k, d)) if not isinstance(cfg, dict) else (lambda k, d=None: cfg.get(k, d))
    encoder = (get("encoder_layers") or 0) * (get("encoder_recursions", 1) or 1)
    decoder = (get("decoder_layers") or 0) * (get("decoder_recursions", 1) or 1)
    return {"params": params, "applications": f"{encoder}+{decoder}", "arch": get("arch")}


class NothingToAverage(RuntimeError):
    """A ``lastN`` evaluation of a run that saved no checkpoint of that kind (a short run)."""


def checkpoint_for(kind: str, paths: RunPaths, train: Optional[dict] = None) -> Path:
    """The checkpoint file of ``kind`` (``best``, ``last``, ``lastN``: averaged here once).
    ``train``: the run's summary; a run trained past the epoch at which ``--patience`` stops it
    is read as of that epoch: ``best`` its best epoch's checkpoint, ``lastN`` the N epoch
    checkpoints ending there, ``last`` that epoch's."""
    from fairseq_sret.checkpoints import average_checkpoints, last_n_checkpoints, save_checkpoint

    until = (train or {}).get("stopped_at_epoch") if (train or {}).get("epochs_trained") else None
    if until is not None and kind in ("best", "last"):
        return paths.checkpoints / f"checkpoint{train['best_epoch'] if kind == 'best' else until}.pt"
    if kind in CHECKPOINT_KINDS:
        return paths.checkpoints / CHECKPOINT_KINDS[kind]
    match = AVERAGE.fullmatch(kind)
    n, by = int(match.group(1)), "update" if match.group(2) else "epoch"
    if by == "update":
        until = None  # update checkpoints are not cut
    target = paths.checkpoints / (f"checkpoint.{kind}.pt" if until is None else f"checkpoint.{kind}.to{until}.pt")
    if not target.is_file():
        pattern = "checkpoint_*_*.pt" if by == "update" else "checkpoint[0-9]*.pt"
        found = [p for p in paths.checkpoints.glob(pattern)
                 if until is None or int(p.stem[len("checkpoint"):]) <= until]
        available = len(found)
        if available == 0:
            hint = "--save-interval-updates" if by == "update" else "a longer run (one per epoch)"
            raise NothingToAverage(f"no {by} checkpoints in {paths.checkpoints} to average for '{kind}' ({hint})")
        if available < n:
            log(f"{paths.root}: only {available} {by} checkpoints for '{kind}'; averaging those")
        save_checkpoint(average_checkpoints(last_n_checkpoints(paths.checkpoints, min(n, available), by=by,
                                                               upper_bound=until)), target)
    return target


def evaluation_key(kind: str, variant: str) -> str:
    """``best`` (as trained) or ``best@depth1`` (with a variant's generate flags)."""
    return f"{kind}@{variant}" if variant else kind


def evaluate_run(experiment: Experiment, paths: RunPaths, data: str, cpu: bool = False,
                 row: Optional[Row] = None, skipped: Optional[Dict[str, str]] = None,
                 train: Optional[dict] = None) -> dict:
    """Scores and generation speed of every checkpoint kind (and variant) on every subset:
    ``{key: {subset: result}}`` with keys from :func:`evaluation_key`.

    A ``lastN`` kind with no checkpoint to average is left out, its reason put in ``skipped``.
    """
    from ..evaluation.evaluate import evaluate

    ev = experiment.evaluation
    results: Dict[str, Dict[str, dict]] = {}
    for kind in ev.checkpoints:
        try:
            checkpoint = checkpoint_for(kind, paths, train)
        except NothingToAverage as exc:
            log(f"{paths.root}: '{kind}' not evaluated: {exc}")
            if skipped is not None:
                skipped[kind] = str(exc)
            continue
        for variant, flags in ev.variants.items():
            if row is not None and row.variants is not None and variant not in row.variants:
                continue
            key = evaluation_key(kind, variant)
            for subset in ev.subsets:
                report = evaluate(data, checkpoint=checkpoint, subset=subset, output_dir=paths.eval_dir / key,
                                  beam=ev.beam, lenpen=ev.lenpen, max_tokens=ev.max_tokens, cpu=cpu,
                                  extra_args=flags)
                results.setdefault(key, {})[subset] = {
                    "subset_name": report["subset_name"], "sentences": report["sentences"],
                    "scores": report["scores"], "speed": report.get("speed"), "generate_args": flags,
                }
    return results


def evaluate_curve(experiment: Experiment, paths: RunPaths, data: str, record: TranslationRunRecord,
                   cpu: bool = False) -> List[dict]:
    """BLEU against training CPU time: every ``curve_every``-th epoch checkpoint (and the
    last counted epoch's: :func:`~.training_log.training_summary`) decoded like the table on
    ``curve_subsets``. Each point is
    ``{"epoch", "update", "cpu_seconds", "valid_loss", "eval": {subset: result}}``, kept in
    ``record.curve`` as it is made (a rerun continues). Then the epoch checkpoints that
    neither the curve nor a ``lastN`` average needs are deleted."""
    from ..evaluation.evaluate import evaluate

    ev = experiment.evaluation
    train = record.train or {}
    epochs = {e["epoch"]: e for e in train.get("curve", [])}
    until = train.get("stopped_at_epoch")
    saved = sorted(int(p.stem[len("checkpoint"):]) for p in paths.checkpoints.glob("checkpoint[0-9]*.pt"))
    counted = [e for e in saved if until is None or e <= until]
    wanted = [e for e in counted if e % ev.curve_every == 0 or e == counted[-1]]
    _, path = read_training(paths)
    points = {p["epoch"]: p for p in record.curve or []}
    for epoch in wanted:
        if epoch in points or epoch not in epochs:
            continue
        update = epochs[epoch]["update"]
        point = {"epoch": epoch, "update": update, "cpu_seconds": seconds_on_path(path or [], update),
                 "valid_loss": epochs[epoch]["valid_loss"], "eval": {}}
        for subset in ev.curve_subsets:
            report = evaluate(data, checkpoint=paths.checkpoints / f"checkpoint{epoch}.pt", subset=subset,
                              output_dir=paths.eval_dir / "curve" / f"epoch{epoch}", beam=ev.beam, lenpen=ev.lenpen,
                              max_tokens=ev.max_tokens, cpu=cpu)
            point["eval"][subset] = {"subset_name": report["subset_name"], "scores": report["scores"]}
        points[epoch] = point
        record.curve = [points[e] for e in sorted(points)]
        write_record(paths, record)
    keep = set(wanted) | set(counted[-last_epochs_averaged(experiment):])
    if until is not None:  # a cut run's best and last are epoch checkpoints (:func:`checkpoint_for`)
        keep |= {train.get("best_epoch"), until}
    for epoch in saved:
        if epoch not in keep:
            (paths.checkpoints / f"checkpoint{epoch}.pt").unlink()
    return record.curve or []
