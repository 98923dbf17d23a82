"""Interruption at any moment, with nothing lost: ``fairseq-train`` with an SReT model,
``sret-experiments`` and ``sret-train-vision`` are killed (SIGKILL) again and again, at random
moments and while a checkpoint or the results file is being written, then resumed.

After every kill: ``checkpoint_last.pt`` (and every results file) loads, the best checkpoint
was never replaced by a worse one, and finished runs stay recorded; the resumed run reaches
the same final update count (epoch) as an uninterrupted one.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fairseq")


from cli_helpers import ENV, REPO, SRET, command, preprocess, write_corpus
from fairseq_sret.fairseq_patches import AtomicCopyPathManager, checkpoints_copied_in_place
from fairseq_sret.checkpoints import checkpoint_num_updates, load_checkpoint

MAX_UPDATE = 100
TRAIN = [
    "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "300", "--cpu", "--num-workers", "0",
    "--log-format", "simple", "--log-interval", "1", "--no-progress-bar", "--seed", "1",
    "--max-update", str(MAX_UPDATE), "--save-interval-updates", "2", "--validate-interval-updates", "2",
    "--keep-interval-updates", "2", "--no-epoch-checkpoints",
]
WRITING = (".tmp",)  # the temporary files of a checkpoint being written (fairseq's and ours)


def test_checkpoint_copies_replace_their_target():
    from fairseq.file_io import PathManager

    assert not checkpoints_copied_in_place(AtomicCopyPathManager(PathManager))


def test_replacing_swaps_in_a_new_file_or_leaves_the_old_one(tmp_path):
    from fairseq_sret.atomic_files import replacing

    target, link = tmp_path / "results.json", tmp_path / "link.json"
    target.write_text("old")
    os.link(target, link)
    with replacing(target, sync=True) as tmp:
        assert tmp.parent == tmp_path and tmp.name.endswith(WRITING)
        tmp.write_text("new")
        assert target.read_text() == "old"  # nothing visible until the block ends
    assert target.read_text() == "new" and link.read_text() == "old"  # a new file, not a rewrite
    with pytest.raises(RuntimeError, match="killed"):
        with replacing(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed while writing")
    assert target.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "results.json"]


def start(argv, log: Path, cwd=None) -> subprocess.Popen:
    """A command in its own process group (the runner's trainings die with it), its output
    appended to ``log``. SIGINT starts at its default, as an interactive shell starts a
    command: a process that inherits SIGINT ignored (from a test worker, or a shell's
    background job) never raises KeyboardInterrupt."""
    with open(log, "ab") as handle:
        return subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=ENV, cwd=cwd,
                                start_new_session=True, preexec_fn=_default_sigint)


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def wait_then_kill(process, log: Path, started_marker: str, watch: Path, rng: random.Random, timeout=120.0) -> str:
    """Wait until the log shows ``started_marker``, then kill at a random moment, or (every
    other time) the moment a temporary checkpoint file appears in ``watch``. Returns how."""
    deadline, offset = time.time() + timeout, log.stat().st_size if log.exists() else 0

    def started():
        with open(log, "rb") as f:
            f.seek(offset)
            return started_marker.encode() in f.read()

    while time.time() < deadline and process.poll() is None and not started():
        time.sleep(0.05)
    if process.poll() is not None:
        return "ended"
    mid_write = rng.random() < 0.5
    until = time.time() + (rng.uniform(0.2, 2.0) if not mid_write else 8.0)
    while time.time() < until and process.poll() is None:
        if mid_write and any(p.name.endswith(WRITING) for p in watch.glob("*")):
            kill(process)
            return "mid-write"
        time.sleep(0.002 if mid_write else 0.05)
    if process.poll() is not None:
        return "ended"
    kill(process)
    return "random"


def best_loss(checkpoint: Path):
    return load_checkpoint(checkpoint)["extra_state"]["val_loss"] if checkpoint.is_file() else None


@pytest.mark.e2e
@pytest.mark.reliability("interruption")
def test_fairseq_train_killed_twenty_times_resumes_to_the_same_end(tmp_path):
    data = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 120), ("valid", 12), ("test", 4))))
    save = tmp_path / "ckpt"
    save.mkdir()
    argv = command("fairseq-train", data, *SRET, *TRAIN, "--save-dir", save)
    rng = random.Random(0)
    log = tmp_path / "train.log"
    kinds, best_so_far, last_updates = [], None, 0
    while len(kinds) < 20:
        kinds.append(wait_then_kill(start(argv, log), log, "Start iterating over samples", save, rng))
        if kinds[-1] == "ended":
            break
        last = save / "checkpoint_last.pt"
        if last.is_file():
            updates = checkpoint_num_updates(load_checkpoint(last))  # always loads
            assert updates >= last_updates  # never an older state
            last_updates = updates
        loss = best_loss(save / "checkpoint_best.pt")
        if loss is not None:
            assert best_so_far is None or loss <= best_so_far + 1e-9, (loss, best_so_far)
            best_so_far = loss
    # How many kills land before the run ends depends on the machine's speed (alone on a
    # quiet CI machine the run ends sooner); what must hold is that it was interrupted,
    # also while a checkpoint was being written, and then resumed to the same end.
    assert kinds.count("mid-write") >= 1 and len([k for k in kinds if k != "ended"]) >= 5, kinds
    final = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, final.stdout[-3000:] + final.stderr[-3000:]
    assert checkpoint_num_updates(load_checkpoint(save / "checkpoint_last.pt")) == MAX_UPDATE
    assert best_loss(save / "checkpoint_best.pt") <= (best_so_far if best_so_far is not None else float("inf"))


@pytest.mark.e2e
@pytest.mark.reliability("interruption")
def test_sret_experiments_killed_mid_run_and_mid_write_keeps_its_results(tmp_path):
    data = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 120), ("valid", 12), ("test", 8))))
    experiment = tmp_path / "exp.yaml"
    experiment.write_text(
        "name: kill\n"
        "train: {args: --optimizer adam --lr 1e-3 --max-tokens 300 --num-workers 0"
        " --share-all-embeddings, max_update: 6}\n"
        "eval: {beam: 1, subsets: [test], checkpoints: [best]}\n"
        "rows:\n"
        + "".join(f"  - {{id: r{i}, arch: sret_transformer_tiny, args: --encoder-layers 1 --decoder-layers 1"
                  " --encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32"
                  " --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2}\n"
                  for i in range(2)))
    results = tmp_path / "results"
    argv = [sys.executable, "-m", "fairseq_sret_cli.experiments", str(experiment), "--data", str(data), "--cpu",
            "--output", str(tmp_path / "runs"), "--results", str(results), "--progress-interval", "0"]
    rng = random.Random(1)
    log = tmp_path / "runner.log"
    done_so_far, kinds = set(), []
    for _ in range(4):
        process = start(argv, log, cwd=REPO)
        kinds.append(wait_then_kill(process, log, "training (", results, rng))
        stored = results / "kill.json"
        if stored.is_file():
            runs = json.loads(stored.read_text())["runs"]  # never truncated
            done = {r["row"] for r in runs if r.get("status") == "done"}
            assert done_so_far <= done, (done_so_far, done)  # finished rows stay recorded
            done_so_far = done
        if kinds[-1] == "ended":
            break
    final = subprocess.run(argv, env=ENV, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert final.returncode == 0, final.stderr[-3000:]
    runs = json.loads((results / "kill.json").read_text())["runs"]
    assert [(r["row"], r["status"]) for r in runs] == [(f"r{i}", "done") for i in range(2)]
    assert all(r["train"]["updates"] == 6 for r in runs)


@pytest.mark.e2e
@pytest.mark.reliability("interruption")
def test_sret_train_vision_killed_resumes_to_the_last_epoch(tmp_path):
    from bad_input_cases import images

    images(tmp_path)
    out = tmp_path / "out"
    base = [sys.executable, "-m", "fairseq_sret_cli.train_vision", "--data", str(tmp_path / "images"),
            "--model", "sret_ext", "--img-size", "32", "--epochs", "12", "--batch-size", "4", "--workers", "0",
            "--warmup-epochs", "0", "--output", str(out), "--device", "cpu"]
    rng = random.Random(2)
    log = tmp_path / "vision.log"
    best_so_far, last_epoch, kinds = None, -1, []
    for _ in range(6):
        last = out / "checkpoint_last.pt"
        argv = base + (["--resume", str(last)] if last.is_file() else [])
        kinds.append(wait_then_kill(start(argv, log), log, "epoch", out, rng))
        if last.is_file():
            state = load_checkpoint(last)  # always loads
            assert state["epoch"] >= last_epoch
            last_epoch = state["epoch"]
        best = out / "checkpoint_best.pt"
        if best.is_file():
            acc = load_checkpoint(best)["best_acc1"]
            assert best_so_far is None or acc >= best_so_far
            best_so_far = acc
            assert load_checkpoint(last)["best_acc1"] <= acc  # a kill may come between the two saves
        if kinds[-1] == "ended":
            break
    last = out / "checkpoint_last.pt"
    finished = last.is_file() and load_checkpoint(last)["epoch"] == 11
    final = subprocess.run(base + (["--resume", str(last)] if last.is_file() else []), env=ENV, capture_output=True,
                           text=True, timeout=600)
    if finished:  # a resume with nothing left to train says so and changes nothing
        assert final.returncode == 1 and "nothing to train" in final.stderr, final.stderr[-3000:]
    else:
        assert final.returncode == 0, final.stderr[-3000:]
    assert load_checkpoint(last)["epoch"] == 11
    epochs = [json.loads(line)["epoch"] for line in (out / "log.jsonl").read_text().splitlines()]
    assert epochs == sorted(set(epochs)) and epochs[-1] == 11  # each epoch logged once, in order


def running_with(text: str) -> list:
    """Pids of the processes whose command line holds ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.mark.e2e
@pytest.mark.reliability("interruption")
def test_ctrl_c_is_one_line_and_leaves_no_training_behind(tmp_path):
    """Ctrl-C (SIGINT to the command alone, as ``kill -INT`` sends it) while training: one line
    saying how to go on, exit 130, no traceback; sret-experiments stops its fairseq-train and
    records it."""
    from bad_input_cases import images

    images(tmp_path)
    data = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 120), ("valid", 12), ("test", 8))))
    (tmp_path / "exp.yaml").write_text(
        "name: ctrlc\ntrain: {args: --optimizer adam --lr 1e-3 --max-tokens 300 --num-workers 0, max_update: 5000}\n"
        "eval: {beam: 1, subsets: [test]}\nrows:\n  - {id: r, arch: sret_transformer_tiny, args: --encoder-layers 1"
        " --decoder-layers 1 --encoder-embed-dim 16 --decoder-embed-dim 16 --encoder-ffn-embed-dim 32"
        " --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 --decoder-attention-heads 2}\n")
    runs = tmp_path / "runs"
    commands = {
        "sret-train-vision": ([sys.executable, "-m", "fairseq_sret_cli.train_vision", "--data", str(tmp_path / "images"),
                               "--model", "sret_ext", "--img-size", "32", "--epochs", "500", "--batch-size", "4",
                               "--workers", "0", "--warmup-epochs", "0", "--log-interval", "1", "--output",
                               str(tmp_path / "out"), "--device", "cpu"], "epoch 1 step",
                              "interrupted; continue with the same command and --resume OUTPUT/checkpoint_last.pt"
                              " (the last finished epoch)"),
        "sret-experiments": ([sys.executable, "-m", "fairseq_sret_cli.experiments", str(tmp_path / "exp.yaml"), "--data",
                              str(data), "--cpu", "--output", str(runs), "--results", str(tmp_path / "results"),
                              "--progress-interval", "0"], "No existing checkpoint found",
                             "interrupted; the trainings were stopped and the finished runs recorded: rerun the same"
                             " command to resume"),
    }
    for name, (argv, marker, message) in commands.items():
        log = tmp_path / f"{name}.log"
        process = start(argv, log, cwd=REPO)
        watched = runs / "r" / "seed1" / "train.log" if name == "sret-experiments" else log
        deadline = time.time() + 180
        while time.time() < deadline and process.poll() is None and not (
                watched.is_file() and marker in watched.read_text(errors="replace")):
            time.sleep(0.1)
        assert process.poll() is None, log.read_text()[-3000:]
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
        text = log.read_text(errors="replace")
        assert process.returncode == 130 and text.strip().splitlines()[-1] == f"{name}: {message}", text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    assert running_with(str(runs)) == []  # its fairseq-train was stopped with it
    record = json.loads((runs / "r" / "seed1" / "run.json").read_text())
    assert record["train_processes"] == 1 and record["train_cpu_seconds"] > 0
