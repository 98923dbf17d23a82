"""What every kind's report shares: the finished runs of a results file, and the rows whose
seeds cannot tell them apart."""

from typing import Dict, List, Optional, Sequence, Tuple


def close_rows(rows: List[dict], columns: Sequence[Tuple[str, str]], max_seeds: Optional[int] = None) -> List[str]:
    """Markdown lines on the pairs of rows, each with 2 or more seeds, whose means lie within 2
    standard deviations (the larger of the two) of each other in a column ``(stat key, title)``:
    the seeds done cannot tell them apart there. A further seed is due, unless the study stops at
    ``max_seeds`` seeds a row and both rows have that many: then the pair stays open."""
    found = []
    for i, a in enumerate(rows):
        for b in rows[i + 1:]:
            close, seeds = [], []
            for key, title in columns:
                sa, sb = a["stats"].get(key) or {}, b["stats"].get(key) or {}
                if min(sa.get("n") or 0, sb.get("n") or 0) < 2 or sa.get("std") is None or sb.get("std") is None:
                    continue
                gap, spread = abs(sa["mean"] - sb["mean"]), 2 * max(sa["std"], sb["std"])
                if gap < spread:
                    close.append(f"{title} {sa['mean']:.2f} against {sb['mean']:.2f} ({gap:.2f} < {spread:.2f})")
                    seeds.append(min(sa["n"], sb["n"]))
            if not close:
                continue
            line = f"- `{a['id']}` and `{b['id']}`: " + "; ".join(close)
            if max_seeds is not None:
                line += (f": open at {max_seeds} seeds each" if min(seeds) >= max_seeds
                         else ": a further seed is due")
            found.append(line)
    if not found:
        return []
    head = ("Rows whose means lie within 2 standard deviations of each other (the larger of the two; rows"
            " with 2 or more seeds): their seeds cannot tell them apart there")
    if max_seeds is None:
        head += ", and a further seed is due:"
    else:
        head += (f". A further seed is due while a row has fewer than {max_seeds}, the study's seeds a row"
                 " at most; a pair with that many each stays open:")
    return ["", head, ""] + found


def done_runs(stored) -> Dict[str, dict]:
    """Run name (``ROW/seedN``) -> record, for the finished runs of a results file's JSON."""
    runs = stored.get("runs") if isinstance(stored, dict) else None
    return {f"{r['row']}/seed{r['seed']}": r for r in runs or [] if isinstance(r, dict) and r.get("status") == "done"}
