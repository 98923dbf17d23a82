"""The one scheduler of training processes every experiment kind uses: ``jobs`` process slots,
a deadline, and Ctrl-C or SIGTERM, each stopping the trainings so that they resume.

A kind subclasses :class:`ProcessScheduler` and says how a job starts (:meth:`start_next`), how
a job that has ended is read (:meth:`reap_ended`), how a running one is stopped
(:meth:`stop_running`) and what it says at the deadline. The loop, the slots and the stopping
are the same for every kind: a job whose process is stopped resumes when the same command runs
again on the same output folder.
"""

import time
from abc import ABC, abstractmethod
from typing import Generic, List, Optional, TypeVar

from .. import sigterm_as_interrupt

#: a job waiting for a slot
Job = TypeVar("Job")
#: a job's running process and what the kind keeps on it
Running = TypeVar("Running")


class ProcessScheduler(ABC, Generic[Job, Running]):
    """Runs ``pending`` jobs ``jobs`` at a time until every one has ended, the ``deadline`` (a
    ``time.time()`` value) passes, or the command is interrupted (Ctrl-C, or SIGTERM to this
    process: the running jobs are stopped, then ``KeyboardInterrupt`` is raised)."""

    #: seconds between two looks at the running processes
    poll_seconds = 1.0

    def __init__(self, jobs: int = 1, deadline: Optional[float] = None):
        self.jobs, self.deadline = max(1, jobs), deadline
        self.pending: List[Job] = []
        self.running: List[Running] = []

    def schedule(self) -> None:
        """The loop: start jobs into free slots, watch, reap; stop at the deadline."""
        with sigterm_as_interrupt():
            try:
                while self.pending or self.running:
                    if self.deadline is not None and time.time() >= self.deadline:
                        self.at_deadline()
                        return
                    self.start_free_slots()
                    time.sleep(self.poll_seconds)
                    self.watch()
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

    @abstractmethod
    def reap_ended(self) -> None:
        """Take every ended job off ``running`` and record how it ended."""

    @abstractmethod
    def stop_running(self) -> None:
        """Stop every running job so that it resumes next time; leave ``running`` empty."""

    @abstractmethod
    def at_deadline(self) -> None:
        """The deadline passed: stop what runs and say what is left."""
