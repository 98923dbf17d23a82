"""Progress of a fixed-length fairseq training, read from its JSON log on standard input.

    fairseq-train ... --max-update 1000 --log-format json --log-interval 10 \\
        | python -m fairseq_sret_cli.experiment_runner.progress --total 1000

Prints ``update 130/1000 (13%)`` lines with the loss, the speed and the time left, and once
the first minute of training is over, the expected training time on this machine. With
``--minutes`` (the run's ``--stop-time-hours`` in minutes) the time left is whichever
comes first, the last update or the time limit. Lines
that report problems (errors, tracebacks, fairseq's warnings) and the validation results
pass through.
"""

import argparse
import json
import re
import sys
import time
from typing import Optional, TextIO

_RECORD = re.compile(r"\| (train_inner|valid) \| (\{.*\})\s*$")
_PASS = re.compile(r"Error|Traceback|WARNING|Exception|done training|num. shared model params|^\s+File |^\S+Error")


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class TrainingProgress:
    """Turns fairseq's log lines into progress lines for a run of ``total`` updates."""

    def __init__(self, total: int, every: float = 30.0, prefix: str = "[train]", out: TextIO = sys.stdout,
                 clock=time.monotonic, minutes: Optional[float] = None):
        self.total, self.every, self.prefix, self.out, self.clock = total, every, prefix, out, clock
        self.limit = None if not minutes else 60.0 * minutes  # seconds of training, as fairseq counts them
        self.start = clock()
        self.first: Optional[tuple] = None  # (time, updates) of the first record
        self.last_print = None
        self.expected_said = False

    def _say(self, text: str) -> None:
        print(f"{self.prefix} {text}", file=self.out, flush=True)

    def feed(self, line: str) -> None:
        match = _RECORD.search(line)
        if match is None:
            if _PASS.search(line):
                self.out.write(line if line.endswith("\n") else line + "\n")
                self.out.flush()
            return
        try:
            record = json.loads(match.group(2))
        except json.JSONDecodeError:
            return
        now = self.clock()
        if match.group(1) == "valid":
            self._say(f"epoch {record.get('epoch')}: valid loss {record.get('valid_loss')}"
                      f" (best {record.get('valid_best_loss', record.get('valid_loss'))})")
            return
        updates = int(float(record.get("num_updates", 0)))
        if self.first is None:
            self.first = (now, updates)
            return
        t0, u0 = self.first
        rate = (updates - u0) / max(now - t0, 1e-9)  # updates per second since the first record
        left = (self.total - updates) / rate if rate > 0 else float("inf")
        # fairseq's "wall" is the training time its --stop-time-hours compares with the limit
        trained = float(record.get("wall", now - self.start))
        timed = self.limit is not None and self.limit - trained < left
        if timed:
            left = max(self.limit - trained, 0.0)
        if not self.expected_said and now - self.start >= 60 and rate > 0:
            self.expected_said = True
            if timed:
                self._say(f"training stops at the time limit, {_minutes(self.limit)}: about"
                          f" {updates + rate * left:.0f} of {self.total} updates at {1 / rate:.2f} s each")
            else:
                self._say(f"expected training time on this machine: ~{_minutes(self.total / rate)}"
                          f" ({self.total} updates at {1 / rate:.2f} s each)")
        if self.last_print is None or now - self.last_print >= self.every or updates >= self.total:
            self.last_print = now
            done = (f"update {updates}, {100 * trained / self.limit:.0f}% of the {_minutes(self.limit)} limit" if timed
                    else f"update {updates}/{self.total} ({100 * updates / self.total:.0f}%)")
            self._say(f"{done}, loss {record.get('loss')}, {rate:.2f} updates/s, ~{_minutes(left)} left")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--total", type=int, required=True, help="the run's --max-update")
    p.add_argument("--every", type=float, default=30.0, help="seconds between progress lines (default: 30)")
    p.add_argument("--prefix", default="[train]", help="text before every line (default: [train])")
    p.add_argument("--minutes", type=float, default=None,
                   help="the run's training time limit in minutes (--stop-time-hours x 60), if any")
    args = p.parse_args(argv)
    if args.minutes is not None and args.minutes < 0:
        p.error(f"--minutes must be >= 0, got {args.minutes}")
    progress = TrainingProgress(args.total, args.every, args.prefix, minutes=args.minutes)
    for line in sys.stdin:
        progress.feed(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
