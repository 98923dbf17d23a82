"""Train and evaluate the runs of an experiment file, resumably.

Every run (row x seed) lives in ``OUTPUT/<row>/seed<S>/``: ``checkpoints/``, ``train.log``
(fairseq's JSON log), ``eval/`` and ``run.json`` (:mod:`.run_folder`). A run whose ``run.json``
says ``done`` is skipped, an interrupted training resumes from ``checkpoint_last.pt``
(fairseq's default), so a table can be filled over several short sessions. ``jobs`` trainings
run side by side (one GPU is far from busy with one small fairseq model); each is evaluated as
soon as it ends (:mod:`.run_evaluation`): beam search on every subset with every checkpoint
kind of the file (``best``, ``last``, ``lastN`` = average of the last N epoch checkpoints),
scored by :func:`fairseq_sret_cli.evaluation.evaluate.evaluate` (sacreBLEU with signature,
chrF, ...).
"""

import functools
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Dict, List, Optional

from .. import log as lab_log
from .commands import convert_teacher, portable, train_command
from ..hardware import device_name
from .cpu_time import CpuTrace, add_cpu_seconds, add_training_device, is_running, reap
from .experiment_file import Experiment, ExperimentError, Run
from .records import TranslationRunRecord
from .run_evaluation import checkpoint_for, evaluate_curve, evaluate_run, model_facts
from .run_folder import RunPaths, read_record, run_paths, trained_anything, uptrained_checkpoint, write_record
from .settings import (SettingsChanged, check_run_folder, collect_records, finished_record, run_config, run_settings,
                       settings_fingerprint, settle_start_over)
from .training import converged_by_log, summarise_training
from .scheduler import ProcessScheduler
from .training_log import parse_training_log, validations_without_improvement

#: how often the runner reads a running training's log for :func:`~.training_log.stopping_epoch`
CONVERGENCE_CHECK_SECONDS = 30.0

#: the runner's progress lines: ``[experiments] ...``
log = functools.partial(lab_log, stage="experiments")


def run_experiment(
    experiment: Experiment,
    data: str,
    output,
    jobs: int = 1,
    cpu: bool = False,
    max_update: Optional[int] = None,
    max_epoch: Optional[int] = None,
    progress_interval: float = 60.0,
    env: Optional[dict] = None,
    on_run_done: Optional[Callable[[Run, TranslationRunRecord], None]] = None,
    known: Optional[Dict[str, TranslationRunRecord]] = None,
    deadline: Optional[float] = None,
    force: bool = False,
) -> List[TranslationRunRecord]:
    """Train and evaluate every run that is not done yet; returns every run's record.

    ``known``: records of earlier sessions (run name -> record) that count as done when
    their config matches. ``deadline`` (a ``time.time()`` value): no run starts after it,
    and trainings still going then are stopped (they resume from their last checkpoint
    when the command runs again on the same output folder). A run folder trained with other
    settings (:func:`~.settings.check_run_folder`) stops everything before any training
    (:class:`~.settings.SettingsChanged`), or with ``force`` is trained again from scratch.
    Ctrl-C, or SIGTERM to this process, stops the trainings (they resume the same way) and
    raises ``KeyboardInterrupt``. Interrupted runs resume before new runs start, so that rows
    already begun finish first.
    """
    return Scheduler(experiment, data, output, jobs=jobs, cpu=cpu, max_update=max_update, max_epoch=max_epoch,
                     progress_interval=progress_interval, env=env, on_run_done=on_run_done, known=known,
                     deadline=deadline, force=force).run()


@dataclass
class Training:
    """A training process the scheduler started, and what it keeps on it."""

    run: Run
    paths: RunPaths
    process: subprocess.Popen
    log_file: IO[str]
    started: float
    trace: Optional[CpuTrace] = None  # with eval.curve, until the process has ended
    checked: float = 0.0  # when its log was last read for --patience
    converged: bool = False  # stopped here because its log met --patience


class Scheduler(ProcessScheduler[Run, Training]):
    """Trains the runs not done yet ``jobs`` at a time and evaluates each as it ends
    (:func:`run_experiment` says how)."""

    poll_seconds = 0.5

    def __init__(self, experiment: Experiment, data: str, output, jobs: int = 1, cpu: bool = False,
                 max_update: Optional[int] = None, max_epoch: Optional[int] = None, progress_interval: float = 60.0,
                 env: Optional[dict] = None,
                 on_run_done: Optional[Callable[[Run, TranslationRunRecord], None]] = None,
                 known: Optional[Dict[str, TranslationRunRecord]] = None, deadline: Optional[float] = None,
                 force: bool = False):
        super().__init__(jobs, deadline, progress_interval)
        self.experiment, self.data, self.output = experiment, data, Path(output)
        self.cpu, self.max_update, self.max_epoch = cpu, max_update, max_epoch
        self.on_run_done, self.known = on_run_done, known
        self.force = force
        self.env = dict(os.environ if env is None else env, PYTHONUNBUFFERED="1")
        self.failures: List[str] = []  # runs whose training, uptraining or evaluation failed
        self.stopped: List[str] = []  # runs left unfinished at the deadline

    def run(self) -> List[TranslationRunRecord]:
        self.pending = self._pending_runs()
        self._check_run_folders()
        self.schedule()
        if self.failures:
            why = ("the log above says why: a run started over with --force has its earlier files back, so"
                   " its run.json and train.log are the earlier run's" if self.force
                   else "the log above and their run.json and train.log say why")
            raise RuntimeError(f"{len(self.failures)} runs failed: {', '.join(self.failures)} ({why})")
        return collect_records(self.experiment, self.output, self.known, self.max_update, self.max_epoch, self.data)

    def _pending_runs(self) -> List[Run]:
        """The runs not done yet, those an earlier session began first (file order otherwise)."""
        pending = []
        for run in self.experiment.runs():
            record = finished_record(self.experiment, run, self.output, self.known, self.max_update, self.max_epoch,
                                     self.data)
            if record is not None:
                log(f"{run.name}: done already, skipped")
            else:  # a run done on another data-bin's contents is refused by _check_run_folders
                pending.append(run)
        pending.sort(key=lambda run: not trained_anything(run_paths(self.output, run)))  # stable
        return pending

    def _check_run_folders(self) -> None:
        """Raise :class:`~.settings.SettingsChanged` if a pending run's folder was trained with
        other settings (with ``force``, such folders are emptied instead)."""
        changed = []
        for run in self.pending:
            paths = run_paths(self.output, run)
            options = (read_record(paths).uptrain or {}).get("model_options")
            problem = check_run_folder(run, paths, self._settings(run, options), self.force, self.data)
            if problem:
                changed.append(problem)
        if changed:
            more = f"; and {len(changed) - 2} more" if len(changed) > 2 else ""
            raise SettingsChanged("; ".join(changed[:2]) + more + ": their checkpoints would give the new row's"
                                  " numbers from the old model; restore the experiment file, give another --output,"
                                  " or pass --force to train them again from scratch")

    def _settings(self, run: Run, model_options: Optional[List[str]]) -> List[str]:
        return run_settings(self.experiment, run, self.data, self.output, self.cpu, self.max_update, self.max_epoch,
                            model_options)

    def _config(self, run: Run) -> dict:
        return run_config(self.experiment, run, self.max_update, self.max_epoch)

    def at_deadline(self) -> None:
        self.stop_running()
        self.stopped += [run.name for run in self.pending]
        log(f"time limit reached: {len(self.stopped)} runs not finished ({', '.join(self.stopped)});"
            " run the same command again to continue")

    # ------------------------------------------------------------ starting
    def start_next(self) -> bool:
        run = self._next_run()
        if run is None:
            return False
        self.pending.remove(run)
        self._start(run)
        return True

    def _next_run(self) -> Optional[Run]:
        """The first pending run free to start: an uptrained run waits for its teacher run when
        that is still to finish here."""
        busy = {r.name for r in self.pending} | {training.run.name for training in self.running}
        return next((r for r in self.pending if r.teacher_name not in busy), None)

    def _start(self, run: Run) -> None:
        """Start ``run``'s training; or evaluate it at once when its log already meets
        ``--patience``, or record it as failed when its teacher cannot be converted."""
        paths = run_paths(self.output, run)
        paths.root.mkdir(parents=True, exist_ok=True)
        record = read_record(paths)
        stopped_at = converged_by_log(self.experiment, paths)
        if stopped_at is not None:
            log(f"{run.name}: its validation loss stopped improving at epoch {stopped_at} (--patience"
                f" {self.experiment.schedule.patience}); not trained further")
            record.update(row=run.row.id, seed=run.seed, config=self._config(run))
            self._finish(run, paths, record, time.time())
            return
        model_options = None
        if run.row.uptrain_from:
            try:
                model_options = self._uptrained_model(run, paths, record)
            except ExperimentError as exc:
                log(f"{run.name}: uptraining FAILED: {exc}")
                self._fail(run, paths, record, row=run.row.id, seed=run.seed, error=str(exc))
                return
        self._launch(run, paths, record, model_options)

    def _uptrained_model(self, run: Run, paths: RunPaths, record: TranslationRunRecord) -> List[str]:
        """An uptrained run's model options: those recorded with its converted teacher, else
        the teacher converted now (:func:`~.commands.convert_teacher`)."""
        model_options = (record.uptrain or {}).get("model_options")
        if not (model_options and uptrained_checkpoint(paths).is_file()):
            model_options = convert_teacher(self.output, run, paths, self.env)
            log(f"{run.name}: converted {run.teacher_name} with sret-uptrain")
        record.uptrain = {"from": run.teacher_name, "model_options": model_options}
        return model_options

    def _launch(self, run: Run, paths: RunPaths, record: TranslationRunRecord,
                model_options: Optional[List[str]]) -> None:
        cmd = train_command(self.experiment, run, self.data, paths, cpu=self.cpu, max_update=self.max_update,
                            max_epoch=self.max_epoch, model_options=model_options)
        settings = self._settings(run, model_options)
        record.update(status="training", row=run.row.id, seed=run.seed, command=portable(cmd[1:]), jobs=self.jobs,
                      config=self._config(run), train_settings=settings,
                      train_fingerprint=settings_fingerprint(settings))
        add_training_device(record, device_name(self.cpu))
        write_record(paths, record)
        log(f"{run.name}: training ({len(self.running) + 1} side by side; log {paths.train_log})")
        log_file = open(paths.train_log, "a", encoding="utf-8")
        log_offset = log_file.tell()
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=self.env)
        trace = CpuTrace(paths, process.pid, log_offset) if self.experiment.evaluation.curve_every else None
        self.running.append(Training(run, paths, process, log_file, time.time(), trace))

    # ------------------------------------------------------------ watching
    def watch(self) -> None:
        """Sample the CPU traces and stop the trainings that met ``--patience``."""
        for training in self.running:
            if training.trace is not None:
                training.trace.poll(time.time())
        self._stop_the_converged(time.time())

    def progress_lines(self) -> List[str]:
        return [_progress_line(training.run, training.paths, training.started, self.experiment.schedule.patience)
                for training in self.running]

    def _stop_the_converged(self, now: float) -> None:
        """Stop a training whose log meets --patience (a fairseq without the patience_resume
        patch, resumed, counts again and would train on)."""
        for training in self.running:
            if training.converged or now - training.checked < CONVERGENCE_CHECK_SECONDS:
                continue
            training.checked = now
            stopped_at = converged_by_log(self.experiment, training.paths)
            if stopped_at is not None and is_running(training.process):
                log(f"{training.run.name}: its validation loss stopped improving at epoch {stopped_at} (--patience"
                    f" {self.experiment.schedule.patience}); stopping the training")
                training.converged = True
                training.process.terminate()

    # ------------------------------------------------------------ ending
    def reap_ended(self) -> None:
        """Evaluate each training that has ended, or record it as failed."""
        still = []
        for training in self.running:
            returncode, cpu_seconds = reap(training.process)
            if returncode is None:
                still.append(training)
                continue
            record = self._training_ended(training, cpu_seconds)
            if returncode != 0 and not training.converged:
                self._training_failed(training, record)
            else:
                self._finish(training.run, training.paths, record, training.started)
        self.running = still

    def _training_ended(self, training: Training, cpu_seconds: float) -> TranslationRunRecord:
        """Close the ended training's log, end its CPU trace, and return its record with the
        process's CPU time added (not written yet)."""
        training.log_file.close()
        if training.trace is not None:
            training.trace.finish(cpu_seconds)
            training.trace = None
        record = read_record(training.paths)
        add_cpu_seconds(record, cpu_seconds)
        return record

    def _training_failed(self, training: Training, record: TranslationRunRecord) -> None:
        run, paths, code = training.run, training.paths, training.process.returncode
        text = paths.train_log.read_text(encoding="utf-8", errors="replace")
        tail = "\n".join(text.splitlines()[-15:])
        log(f"{run.name}: training FAILED (exit {code}); last lines of {paths.train_log}:\n{tail}")
        self._fail(run, paths, record, returncode=code)
        settle_start_over(paths)  # --force: an earlier run its first checkpoint did not replace is kept

    def stop_running(self) -> None:
        """Stop every running training; each resumes from its last checkpoint next time."""
        for training in self.running:
            training.process.terminate()
            _, cpu_seconds = reap(training.process, block=True)
            write_record(training.paths, self._training_ended(training, cpu_seconds))
            settle_start_over(training.paths)
            self.stopped.append(training.run.name)
        self.running.clear()

    def _fail(self, run: Run, paths: RunPaths, record: TranslationRunRecord, **fields) -> None:
        record.update(status="failed", **fields)
        write_record(paths, record)
        self.failures.append(run.name)

    def _finish(self, run: Run, paths: RunPaths, record: TranslationRunRecord, started: float) -> None:
        """Summarise the run's training and evaluate it; record it as done (and tell
        ``on_run_done``), or as failed when its evaluation fails."""
        settle_start_over(paths)  # its checkpoints replace an earlier run's (--force)
        record.train = summarise_training(self.experiment, paths, record)
        log(f"{run.name}: trained in {(time.time() - started) / 60:.1f} min, best valid loss "
            f"{record.train.get('best_valid_loss')} at update {record.train.get('best_update')}; evaluating")
        skipped: Dict[str, str] = {}
        try:
            self._evaluate(run, paths, record, skipped)
        except Exception as exc:  # one run's evaluation must not stop the others
            log(f"{run.name}: evaluation FAILED: {type(exc).__name__}: {exc}")
            self._fail(run, paths, record, error=f"evaluation: {type(exc).__name__}: {exc}")
            return
        record.error = None
        if skipped:
            record.eval_skipped = skipped
        record.status = "done"
        write_record(paths, record)
        if self.on_run_done is not None:
            self.on_run_done(run, record)

    def _evaluate(self, run: Run, paths: RunPaths, record: TranslationRunRecord, skipped: Dict[str, str]) -> None:
        train = record.train
        record.model = model_facts(checkpoint_for("best", paths, train))
        record.eval = evaluate_run(self.experiment, paths, self.data, cpu=self.cpu, row=run.row, skipped=skipped,
                                      train=train)
        if self.experiment.evaluation.curve_every:
            evaluate_curve(self.experiment, paths, self.data, record, cpu=self.cpu)


def _progress_line(run: Run, paths: RunPaths, started: float, patience: int = 0) -> str:
    """One line on a training: its update and loss, its validation loss and best, and with
    ``patience`` how many validations have not improved on the best (fairseq's count)."""
    text = paths.train_log.read_text(encoding="utf-8", errors="replace") if paths.train_log.is_file() else ""
    parsed = parse_training_log(text)
    last = parsed["last"]
    epochs = [e for e in parsed["epochs"] if "valid_loss" in e]
    parts = [f"{run.name}:"]
    if last:
        parts.append(f"epoch {last.get('epoch')}, update {last.get('num_updates')}, loss {last.get('loss')}")
    if epochs:
        parts.append(f"valid loss {epochs[-1]['valid_loss']} (best {min(e['valid_loss'] for e in epochs)})")
        if patience:
            parts.append(f"{validations_without_improvement(epochs)} of --patience {patience} without improvement")
    parts.append(f"{(time.time() - started) / 60:.1f} min")
    return " ".join(parts)
