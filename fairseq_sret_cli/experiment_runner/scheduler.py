"""The one scheduler of training processes every experiment kind uses: ``jobs`` process slots,
a deadline, and Ctrl-C or SIGTERM, each stopping the trainings so that they resume.

A kind subclasses :class:`ProcessScheduler` and says how a job starts (:meth:`start_next`), how
a job that has ended is read (:meth:`reap_ended`), how a running one is stopped
(:meth:`stop_running`), how a running one goes (:meth:`progress_lines`) and what it says at the
deadline. The loop, the slots, the progress lines and the stopping are the same for every kind:
a job whose process is stopped resumes when the same command runs again on the same output
folder.
"""

import functools
import time
from abc import ABC, abstractmethod
from typing import Generic, List, Optional, TypeVar

from .. import log as lab_log
from .. import sigterm_as_interrupt

log = functools.partial(lab_log, stage="experiments")

#: a job waiting for a slot
Job = TypeVar("Job")
#: a job's running process and what the kind keeps on it
Running = TypeVar("Running")


class ProcessScheduler(ABC, Generic[Job, Running]):
    """Runs ``pending`` jobs ``jobs`` at a time until every one has ended, the ``deadline`` (a
    ``time.time()`` value) passes, or the command is interrupted (Ctrl-C, or SIGTERM to this
    process: the running jobs are stopped, then ``KeyboardInterrupt`` is raised). Every
    ``progress_interval`` seconds (0: never) it logs the :meth:`progress_lines` of the running jobs."""

    #: seconds between two looks at the running processes
    poll_seconds = 1.0

    def __init__(self, jobs: int = 1, deadline: Optional[float] = None, progress_interval: float = 0.0):
        self.jobs, self.deadline, self.progress_interval = max(1, jobs), deadline, progress_interval
        self.pending: List[Job] = []
        self.running: List[Running] = []
        self.last_progress = time.time()

    def schedule(self) -> None:
        """The loop: start jobs into free slots, watch, reap; stop at the deadline."""
        self.last_progress = time.time()
        with sigterm_as_interrupt():
            try:
                while self.pending or self.running:
                    if self.deadline is not None and time.time() >= self.deadline:
                        self.at_deadline()
                        return
                    self.start_free_slots()
                    time.sleep(self.poll_seconds)
                    self.watch()
                    self.say_progress()
                    self.reap_ended()
            except BaseException:
                self.stop_running()
                raise

    def start_free_slots(self) -> None:
        while self.pending and len(self.running) < self.jobs:
            if not self.start_next():
                return

    @abstractmethod
    def start_next(self) -> bool:
        """Take a pending job and start it (or settle it at once); False when none may start now."""

    def watch(self) -> None:
        """Look at the running jobs between two reapings (none by default)."""

    def say_progress(self) -> None:
        """Log the :meth:`progress_lines` once ``progress_interval`` seconds have passed since last time."""
        if self.progress_interval and time.time() - self.last_progress >= self.progress_interval:
            self.last_progress = time.time()
            for line in self.progress_lines():
                log(line)

    def progress_lines(self) -> List[str]:
        """One line for each running job: how far it is (none by default)."""
        return []

    @abstractmethod
    def reap_ended(self) -> None:
        """Take every ended job off ``running`` and record how it ended."""

    @abstractmethod
    def stop_running(self) -> None:
        """Stop every running job so that it resumes next time; leave ``running`` empty."""

    @abstractmethod
    def at_deadline(self) -> None:
        """The deadline passed: stop what runs and say what is left."""
