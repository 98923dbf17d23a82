"""sret-experiments with translation experiment files against what a user may try that the
documentation does not forbid: paths fairseq would split, edited rows and --max-update
overrides in the report. It must refuse by name (one line, no traceback) or report what ran."""

import shutil

import pytest

from bad_input_cases import experiment, one_line, run_here as run



# ---------------------------------------------------------------- sret-experiments
@pytest.mark.parametrize("argv,message", [
    (["--data", "b:in", "--output", "runs"], "--data b:in: fairseq reads ':' in a path as a list"),
    (["--data", "bin", "--output", "runs:1"], "--output runs:1: fairseq reads ':' in a checkpoint path"),
    (["--data", "bin", "--output", "runs:1", "--dry-run"], "--output runs:1: fairseq reads ':'"),
])
@pytest.mark.reliability("inputs-as-they-seem")
def test_a_data_or_output_path_fairseq_would_split_is_refused_before_training(tmp_path, argv, message):
    """A folder b:in passed the data-bin check (read as one folder) but fairseq-train reads it as
    the shards b and in ("b: no such data-bin folder", after the lock was taken); an --output
    with ':' trained every run and then failed each one's evaluation (fairseq-generate read its
    checkpoint path as two checkpoints)."""
    experiment(tmp_path)
    shutil.copytree(tmp_path / "bin", tmp_path / "b:in")
    rc, stderr, changed = run(tmp_path, "sret-experiments", "exp.yaml", "--cpu", "--results", "res", *argv)
    assert rc == 2 and message in one_line(stderr, "sret-experiments")
    assert changed == []


def finished_run(folder, max_update: int) -> None:
    """exp.yaml (--lr 1e-3, 10 updates), a data-bin of empty files and runs/sret/seed1 recorded
    done by the runner after training with ``--max-update max_update``."""
    import json

    import yaml

    from bad_input_cases import experiment_run
    from fairseq_sret_cli.experiment_runner import parse_experiment
    from fairseq_sret_cli.experiment_runner.settings import run_config

    root = experiment_run(folder)
    exp = parse_experiment(yaml.safe_load((folder / "exp.yaml").read_text()), folder / "exp.yaml")
    record = json.loads((root / "run.json").read_text())
    record.update(status="done", row="sret", seed=1, config=run_config(exp, exp.runs()[0], max_update),
                  train={"updates": max_update, "best_valid_loss": 4.5, "curve": []}, model={"params": 10, "applications": "4+4"},
                  eval={})
    (root / "run.json").write_text(json.dumps(record))


@pytest.mark.parametrize("edit,argv,done,cap", [
    ("", ["--max-update", "20"], [1], "trained 20 updates"),
    ("", [], [], "trained 10 updates"),
    ("--lr 5e-4", [], [], "trained 10 updates"),
])
@pytest.mark.reliability("tied-to-inputs")
def test_a_report_shows_the_runs_of_its_settings_under_their_caps(tmp_path, edit, argv, done, cap):
    """--report-only reported a run trained with --lr 1e-3 as done under the edited row's
    --lr 5e-4, and a run of --max-update 20 as done in a table headed "trained 10 updates"
    (the file's cap, also when the override was given)."""
    import json

    finished_run(tmp_path, max_update=20)
    if edit:
        exp = tmp_path / "exp.yaml"
        exp.write_text(exp.read_text().replace("--lr 1e-3", edit))
    rc, stderr, _ = run(tmp_path, "sret-experiments", "exp.yaml", "--data", "bin", "--output", "runs",
                        "--results", "res", "--report-only", *argv)
    assert rc == 0, stderr
    results = json.loads((tmp_path / "res/bound.json").read_text())
    assert results["rows"][0]["seeds_done"] == done
    assert cap in (tmp_path / "res/bound.md").read_text()
    assert json.loads((tmp_path / "runs/sret/seed1/run.json").read_text())["status"] == "done"
