"""Running fairseq's command-line tools on a small generated corpus (reliability tests)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

from fairseq_sret_cli.toy import write_reversal_corpus

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
USER_DIR = ["--user-dir", str(REPO / "fairseq_sret")]
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

#: a small sret_transformer and a few fast updates
SRET = [
    *USER_DIR, "--arch", "sret_transformer_tiny",
    "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
    "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
    "--encoder-groups", "2,1", "--decoder-groups", "2,1", "--share-all-embeddings",
]
TRAIN = [
    "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "400", "--cpu", "--num-workers", "0",
    "--log-format", "simple", "--log-interval", "1", "--no-progress-bar", "--seed", "1",
    "--no-epoch-checkpoints", "--disable-validation",
]


def write_corpus(folder: Path, sizes=(("train", 200), ("valid", 20), ("test", 20)), seed=0) -> Path:
    """A small reversal toy corpus: 16 words, 2 to 8 per sentence."""
    return write_reversal_corpus(folder, sizes, seed=seed, vocab_size=16, lengths=(2, 8))


def command(tool, *args):
    return [str(BIN / tool), *map(str, args)]


def run(tool, *args, stdin=None, check=True, timeout=300):
    """Run a fairseq tool; returns the CompletedProcess (stdout and stderr as text)."""
    result = subprocess.run(command(tool, *args), input=stdin, env=ENV, capture_output=True,
                            text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{tool} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def preprocess(raw: Path) -> Path:
    out = raw / "bin"
    run("fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", out, "--joined-dictionary", "--workers", "1")
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_parallel(commands, timeout=300, width=2):
    """Run commands ``width`` at a time; returns (returncode, stdout + stderr) per command."""
    results = [None] * len(commands)
    pending = list(enumerate(commands))
    running = []
    try:
        while pending or running:
            while pending and len(running) < width:
                i, cmd = pending.pop(0)
                stdin = None
                if isinstance(cmd, tuple):
                    cmd, stdin = cmd
                proc = subprocess.Popen(list(map(str, cmd)), env=ENV, text=True, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                running.append((i, proc, stdin))
            i, proc, stdin = running.pop(0)
            out = proc.communicate(input=stdin, timeout=timeout)[0]
            results[i] = (proc.returncode, out)
    finally:
        for _, proc, _ in running:
            proc.kill()
    return results
