"""A run folder of sret-experiments is bound to the settings it was trained with, and one
sret-experiments at a time works on an output folder.

Editing a row (its learning rate, a flag, the update cap) and running again would resume the
old row's checkpoints and record the old model's scores under the new settings: the runner
refuses before it starts anything, naming the runs and the options that changed, or with
``--force`` trains them again from scratch. Everything here is decided before any training,
so these tests run the command in this process on a data-bin of empty files.
"""

import json
import shutil
from pathlib import Path

import pytest

from bad_input_cases import Case, experiment, experiment_run, run_case_here, write
from fairseq_sret_cli.experiment_runner import parse_experiment
from fairseq_sret_cli.experiment_runner.run_folder import RUN_OUTPUTS, run_paths
from fairseq_sret_cli.experiment_runner.settings import (check_run_folder, run_config, run_settings,
                                                         training_settings)
from fairseq_sret_cli.outputs import exclusive

ROW = "  - {id: sret, arch: sret_transformer_tiny, args: --lr 1e-3}\n"
EXPERIMENT = "name: bound\ntrain: {args: --optimizer adam --max-tokens 500, max_update: 10}\n" \
             "eval: {subsets: [test]}\nrows:\n"


def trained_run(folder: Path, row: str = ROW, curve: bool = False) -> Path:
    """An output folder holding the run ``sret/seed1`` as the runner leaves it after training
    with ``row`` (its run.json and a checkpoint), and the experiment file."""
    header = EXPERIMENT.replace("eval: {subsets: [test]}", "eval: {subsets: [test], curve: {every: 2}}") if curve \
        else EXPERIMENT
    return experiment_run(folder, row, header)


def experiment_of(folder: Path):
    import yaml

    return parse_experiment(yaml.safe_load((folder / "exp.yaml").read_text()), folder / "exp.yaml")


def sret_experiments(folder: Path, *extra):
    argv = ["sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs", "--results", "results", *extra]
    return run_case_here(Case("binding", "", argv, ""), folder)


def test_settings_leave_out_where_the_files_are_and_keep_what_makes_the_model():
    base = ["python", "-m", "fairseq_cli.train", "/data/a", "--user-dir", "/repo/fairseq_sret", "--arch", "x",
            "--lr", "1e-3", "--save-dir", "/runs/r/seed1/checkpoints", "--cpu"]
    moved = ["-m", "fairseq_cli.train", "/elsewhere/a", "--user-dir", "/other/fairseq_sret", "--arch", "x",
             "--lr", "1e-3", "--save-dir", "/b/checkpoints"]  # as an older run.json records it
    assert training_settings(base) == training_settings(moved) == [
        "<data>", "--user-dir", "<user-dir>", "--arch", "x", "--lr", "1e-3", "--save-dir", "<run>/checkpoints"]
    assert training_settings(base) != training_settings([*base[:8], "--lr", "5e-4", *base[10:]])


@pytest.mark.reliability("tied-to-inputs")
def test_an_edited_row_is_refused_before_anything_runs(tmp_path):
    root = trained_run(tmp_path)
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    write(tmp_path, "exp.yaml", EXPERIMENT + ROW.replace("--lr 1e-3", "--lr 5e-4 --dropout 0.1"))
    rc, err, changed = sret_experiments(tmp_path)
    line = err.strip().splitlines()[-1]
    assert rc == 2 and "sret/seed1 was trained in runs/sret/seed1 with other settings (--lr 1e-3 -> 5e-4;" \
        " --dropout 0.1 added)" in line and "--force to train them again" in line, err[-2000:]
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == before
    assert [c for c in changed if not c.startswith("+runs/.sret-lock")] == []


@pytest.mark.parametrize("curve", [False, True], ids=["table", "curve"])
@pytest.mark.reliability("one-run-per-output")
def test_force_trains_a_changed_run_again_from_scratch_and_keeps_foreign_files(tmp_path, curve):
    root = trained_run(tmp_path, curve=curve)
    notes = write(root, "notes.txt", "mine")
    write(tmp_path, "exp.yaml", (EXPERIMENT + ROW.replace("1e-3", "5e-4")).replace(
        "eval: {subsets: [test]}", "eval: {subsets: [test], curve: {every: 2}}" if curve else "eval: {subsets: [test]}"))
    exp = experiment_of(tmp_path)
    run = exp.runs()[0]
    settings = run_settings(exp, run, str(tmp_path / "bin"), tmp_path / "runs", False, None, None, None)
    assert "--lr 1e-3 -> 5e-4" in check_run_folder(run, run_paths(tmp_path / "runs", run), settings)
    assert check_run_folder(run, run_paths(tmp_path / "runs", run), settings, force=True) is None
    assert not any((root / name).exists() for name in RUN_OUTPUTS) and notes.read_text() == "mine"


def test_the_same_settings_resume_and_another_data_path_is_the_same_run(tmp_path):
    root = trained_run(tmp_path)
    exp = experiment_of(tmp_path)
    run = exp.runs()[0]
    shutil.copytree(tmp_path / "bin", tmp_path / "moved" / "bin")
    for data, cpu in ((tmp_path / "bin", False), (tmp_path / "moved" / "bin", True)):
        settings = run_settings(exp, run, str(data), tmp_path / "runs", cpu, None, None, None)
        assert check_run_folder(run, run_paths(tmp_path / "runs", run), settings) is None
    assert (root / "checkpoints" / "checkpoint_last.pt").is_file()
    # a smoke run's update cap is a setting too
    smoke = run_settings(exp, run, str(tmp_path / "bin"), tmp_path / "runs", False, 3, None, None)
    assert "--max-update 10 -> 3" in check_run_folder(run, run_paths(tmp_path / "runs", run), smoke)


@pytest.mark.reliability("tied-to-inputs")
def test_checkpoints_the_runner_did_not_record_are_not_resumed(tmp_path):
    experiment(tmp_path, EXPERIMENT + ROW)
    write(tmp_path, "runs/sret/seed1/checkpoints/checkpoint_last.pt", "someone's weights")
    rc, err, _ = sret_experiments(tmp_path)
    assert rc == 2 and "holds checkpoints that sret-experiments did not record (no run.json)" in err, err[-2000:]
    assert (tmp_path / "runs/sret/seed1/checkpoints/checkpoint_last.pt").read_text() == "someone's weights"


@pytest.mark.reliability("one-run-per-output")
def test_two_processes_never_work_on_one_output(tmp_path):
    trained_run(tmp_path)
    with exclusive(tmp_path / "runs", "sret-experiments exp.yaml (the first)"):
        rc, err, _ = sret_experiments(tmp_path)
    assert rc == 2 and "runs is in use by sret-experiments exp.yaml (the first) (pid" in err, err[-2000:]
    # reporting reads the runs and writes results only: it needs no lock
    rc, err, _ = sret_experiments(tmp_path, "--report-only")
    assert rc == 0, err[-2000:]


def test_foreign_results_files_are_refused(tmp_path):
    trained_run(tmp_path)
    write(tmp_path, "results/bound.md", "my notes on the experiment\n")
    rc, err, _ = sret_experiments(tmp_path, "--report-only")
    assert rc == 2 and "results/bound.md: exists, not made by sret-experiments" in err, err[-2000:]
    assert (tmp_path / "results/bound.md").read_text() == "my notes on the experiment\n"


@pytest.mark.parametrize("status", ["training", "done"])
@pytest.mark.reliability("tied-to-inputs")
def test_a_run_of_another_data_bins_contents_is_refused(tmp_path, status):
    """The data-bin's path is not a setting, what it holds is: a run trained (or finished, with
    its scores) on one data-bin is neither resumed nor reported as done on another one at the
    same path, which is refused naming the change; --force trains it again."""
    root = trained_run(tmp_path)
    if status == "done":
        exp = experiment_of(tmp_path)
        record = json.loads((root / "run.json").read_text())
        record.update(status="done", config=run_config(exp, exp.runs()[0]))
        (root / "run.json").write_text(json.dumps(record))
    write(tmp_path, "bin/dict.src.txt", "w2 1\n")  # rebuilt from other text
    rc, err, _ = sret_experiments(tmp_path)
    line = err.strip().splitlines()[-1]
    assert rc == 2 and "with other settings (the data-bin's contents: fingerprint" in line, err[-2000:]
    assert "done already" not in err
