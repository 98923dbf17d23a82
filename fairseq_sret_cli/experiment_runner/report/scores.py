"""The numbers of a translation run and of a row, read from the run records: BLEU and chrF of
each checkpoint kind, training time and loss, and their mean and spread over the seeds."""

import math
import statistics
from typing import Dict, List, Optional, Sequence

from ..experiment_file import Experiment
from ..records import TranslationRunRecord
from ..run_evaluation import evaluation_key


def evaluation_keys(experiment: Experiment) -> List[str]:
    """Every evaluated (checkpoint kind, variant): ``best``, ``best@depth1``, ``last5``, ..."""
    ev = experiment.evaluation
    return [evaluation_key(kind, variant) for kind in ev.checkpoints for variant in ev.variants]


def primary_score(scores: Sequence[dict]) -> Optional[dict]:
    """The data set's headline BLEU: the first score its metadata lists (sacreBLEU for
    Multi30k and WMT'14, tokenized BLEU for IWSLT'14)."""
    bleus = [s for s in scores if not s["name"].startswith("chrF")]
    return bleus[0] if bleus else None


def chrf_score(scores: Sequence[dict]) -> Optional[dict]:
    return next((s for s in scores if s["name"].startswith("chrF")), None)


def run_values(record: TranslationRunRecord, experiment: Experiment) -> Dict[str, Optional[float]]:
    """The table's numbers of one run."""
    train, model = record.train or {}, record.model or {}
    values = {
        "params": model.get("params"),
        "tokens_per_second": train.get("train_tokens_per_second"),
        "seconds_to_best": train.get("seconds_to_best"),
        "best_valid_loss": train.get("best_valid_loss"),
        "best_update": train.get("best_update"),
        "updates": train.get("updates"),
        "epochs": train.get("epochs"),
        "train_seconds": train.get("seconds"),
        "train_cpu_seconds": train["cpu_seconds"] if "cpu_seconds" in train else record.train_cpu_seconds,
    }
    for kind, subsets in (record.eval or {}).items():
        for subset, result in subsets.items():
            bleu, chrf = primary_score(result["scores"]), chrf_score(result["scores"])
            values[f"bleu/{kind}/{subset}"] = bleu["score"] if bleu else None
            values[f"chrf/{kind}/{subset}"] = chrf["score"] if chrf else None
            speed = result.get("speed") or {}
            values[f"speed/{kind}/{subset}"] = speed.get("sentences_per_second")
    return values


def _mean_std(values: List[float]):
    values = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    if not values:
        return None, None, 0
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None), len(values)


def aggregate(experiment: Experiment, records: List[TranslationRunRecord]) -> List[dict]:
    """Per row: mean, std and the per-seed values of every number of :func:`run_values`."""
    rows = []
    for row in experiment.rows:
        runs = [r for r in records if r.row == row.id and r.done]
        per_seed = {r.seed: run_values(r, experiment) for r in runs}
        keys = sorted({k for v in per_seed.values() for k in v})
        stats = {}
        for key in keys:
            mean, std, n = _mean_std([v.get(key) for v in per_seed.values()])
            stats[key] = {"mean": mean, "std": std, "n": n}
        applications = next((r.model["applications"] for r in runs if r.model), None)
        rows.append({"id": row.id, "title": row.label, "arch": row.arch, "args": row.args, "notes": row.notes,
                     "max_update": row.max_update,
                     "seeds_done": sorted(per_seed), "seeds_planned": row.seeds, "applications": applications,
                     "stats": stats, "per_seed": per_seed})
    return rows


def signatures(records: List[TranslationRunRecord]) -> Dict[str, str]:
    found = {}
    for record in records:
        for subsets in (record.eval or {}).values():
            for result in subsets.values():
                for score in result["scores"]:
                    found.setdefault(score["name"], score["signature"])
    return found


def subset_names(records: List[TranslationRunRecord]) -> Dict[str, str]:
    names = {}
    for record in records:
        for subsets in (record.eval or {}).values():
            for subset, result in subsets.items():
                names[subset] = result.get("subset_name", subset)
    return names


def format_stat(stat: Optional[dict], digits: int = 2, scale: float = 1.0) -> str:
    if not stat or stat.get("mean") is None:
        return "–"
    text = f"{stat['mean'] / scale:.{digits}f}"
    if stat.get("std") is not None:
        text += f" ± {stat['std'] / scale:.{digits}f}"
    return text


def row_devices(records: List[TranslationRunRecord]) -> Dict[str, List[str]]:
    """Each row's devices (those its finished runs trained on; an unknown one counts as
    another) when the finished runs trained on more than one device; else empty."""
    done = [r for r in records if r.done]
    if len({d for r in done for d in r.trained_on or []}) < 2:
        return {}
    by_row: Dict[str, set] = {}
    for r in done:
        by_row.setdefault(r.row, set()).update(r.trained_on or ["device unknown"])
    return {row: sorted(on) for row, on in by_row.items()}
