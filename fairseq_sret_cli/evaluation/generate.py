"""Translate a binarised subset with ``fairseq-generate`` and read its hypotheses back."""

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_sret import USER_DIR

from .. import log as lab_log

log = functools.partial(lab_log, stage="evaluate")

#: fairseq-generate options that sret-evaluate sets itself, or that would make its report describe
#: another model, data or search than the one that ran, with what to give instead. Other options
#: pass through and are recorded in the report.
OWN_GENERATE_OPTIONS = {
    "--path": "give --checkpoint", "--beam": "give --beam", "--lenpen": "give --lenpen",
    "--gen-subset": "give --subset", "--max-tokens": "give --max-tokens", "--batch-size": "give --batch-size",
    "--max-sentences": "give --batch-size", "--cpu": "give --cpu", "--results-path": "give --output-dir",
    "--post-process": "the score post-processes the pieces itself", "--remove-bpe": "the score post-processes the"
    " pieces itself", "--source-lang": "the data-bin's pair is used", "--target-lang": "the data-bin's pair is used",
    "--user-dir": "sret-evaluate loads the plugin itself",
}

#: fairseq-generate options after which the H- lines are no longer one translation of every
#: sentence of the subset by the model alone: the score would measure something else
CHANGES_THE_SCORE = {
    "--nbest": "the score reads one hypothesis per sentence, the best",
    "--score-reference": "it scores the references instead of translating",
    "--quiet": "it prints no hypotheses to score",
    "--prefix-size": "each translation would start from its reference's first tokens",
    "--num-shards": "only a part of the subset would be translated",
    "--shard-id": "only a part of the subset would be translated",
}


def refused_generate_args(tokens, own=OWN_GENERATE_OPTIONS, command: str = "sret-evaluate") -> str:
    """Why ``tokens`` (split fairseq-generate options) cannot pass to the evaluation's
    fairseq-generate, or "" if they can: an option of ``own`` (set by ``command``, the value: what
    to give instead) or of :data:`CHANGES_THE_SCORE`, also abbreviated (argparse takes a unique
    prefix) or as ``--option=value``; ``-s``/``-t``; a positional (another data-bin)."""
    for i, token in enumerate(tokens):
        name = token.split("=", 1)[0]
        if name in ("-s", "-t"):
            return f"{token} chooses a language pair; the data-bin's pair is used"
        if name.startswith("--") and len(name) > 3:
            for option, why in [*own.items(), *CHANGES_THE_SCORE.items()]:
                if option.startswith(name):
                    given = option if name == option else f"{token} (that is {option})"
                    if option in own:
                        return f"{given} is set by {command} itself: {why}"
                    return f"{given} would change what is scored: {why}"
        elif not token.startswith("-") and (i == 0 or not tokens[i - 1].startswith("-")):
            return f"{token!r} is not an option (the data-bin is --data; options take one value each)"
    return ""


def split_by_fairseq(path, what: str) -> str:
    """Why fairseq would not read ``path`` as one path, or "": it splits its data and checkpoint
    paths at ``os.pathsep`` (data shards, checkpoints to ensemble). ``what``: the option that
    gave it."""
    if os.pathsep not in str(path):
        return ""
    return (f"{what} {path}: fairseq reads '{os.pathsep}' in a path as a list of paths (data shards, checkpoints"
            f" to ensemble), so it would read other files than this one; give a path without '{os.pathsep}'"
            " (a link to it will do)")


def run_generate(
    data_dir,
    checkpoint,
    results_dir,
    subset: str = "test",
    beam: int = 5,
    lenpen: float = 1.0,
    max_tokens: int = 8000,
    batch_size: Optional[int] = None,
    cpu: bool = False,
    extra_args: Sequence[str] = (),
    verbose: bool = False,
    in_process: bool = True,
) -> Tuple[Path, Optional[str]]:
    """Translate ``subset`` with fairseq-generate (our plugin loaded with ``--user-dir``).

    The hypotheses are written as fairseq prints them (subword pieces, no post-processing)
    to ``results_dir/generate-SUBSET.txt`` (fairseq writes it beside, then it replaces the
    old one in one rename). Returns that path and fairseq's summary line
    (``Translated N sentences (T tokens) in S s (X sentences/s, Y tokens/s)``).
    ``in_process=False`` runs ``python -m fairseq_cli.generate`` in a subprocess instead of
    calling it here.
    """
    refused = refused_generate_args(list(extra_args), own={})
    if refused:
        raise ValueError(f"fairseq-generate options {' '.join(extra_args)!r}: {refused}")
    split = split_by_fairseq(data_dir, "the data-bin") or split_by_fairseq(checkpoint, "the checkpoint")
    if split:
        raise ValueError(split)
    results_dir = Path(results_dir)
    staging = results_dir / f".generate-{subset}.{os.getpid()}"
    staging.mkdir(parents=True, exist_ok=True)
    try:
        summary = _run_generate(data_dir, checkpoint, staging, subset, beam, lenpen, max_tokens, batch_size, cpu,
                                extra_args, verbose, in_process)
        os.replace(staging / f"generate-{subset}.txt", results_dir / f"generate-{subset}.txt")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return results_dir / f"generate-{subset}.txt", summary


def _run_generate(data_dir, checkpoint, results_dir: Path, subset, beam, lenpen, max_tokens, batch_size, cpu,
                  extra_args, verbose, in_process) -> Optional[str]:
    argv = [
        str(data_dir), "--user-dir", str(USER_DIR), "--path", str(checkpoint), "--gen-subset", subset,
        "--beam", str(beam), "--lenpen", str(lenpen), "--max-tokens", str(max_tokens),
        "--results-path", str(results_dir), "--num-workers", "0",
        "--log-format", "simple", "--log-interval", "10",
        # fairseq's default multiple of 8 may drop the last, incomplete batch of a test set
        "--required-batch-size-multiple", "1",
    ]
    if batch_size:
        argv += ["--batch-size", str(batch_size)]
    if cpu:
        argv += ["--cpu"]
    argv += list(extra_args)
    log(f"translating '{subset}' with beam {beam} (fairseq-generate)")
    start = time.time()
    if in_process:
        summary = _generate_here(argv, verbose)
    else:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        result = subprocess.run([sys.executable, "-m", "fairseq_cli.generate", *argv], env=env,
                                stdout=None if verbose else subprocess.PIPE,
                                stderr=None if verbose else subprocess.STDOUT, text=True)
        output = result.stdout or ""
        if result.returncode != 0:
            raise RuntimeError(f"fairseq-generate failed (exit {result.returncode}):\n{output[-4000:]}")
        summary = re.findall(r"Translated .*", output)
    log(f"done in {time.time() - start:.0f}s" + (f": {summary[-1]}" if summary else ""))
    return summary[-1] if summary else None


_SPEED = re.compile(r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)")


def generation_speed(summary: Optional[str]) -> Optional[Dict[str, float]]:
    """``{"sentences_per_second", "tokens_per_second"}`` from fairseq-generate's summary line."""
    match = _SPEED.search(summary or "")
    if match is None:
        return None
    return {"sentences_per_second": float(match.group(1)), "tokens_per_second": float(match.group(2))}


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: List[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def _generate_here(argv, verbose: bool) -> List[str]:
    """``fairseq_cli.generate.main`` in this process. Unless ``verbose``, only its progress
    lines reach the console; returns its "Translated ..." summary."""
    from fairseq import options
    from fairseq_cli import generate

    # --user-dir does not import the models when fairseq_sret is already imported (as it
    # is here): register them explicitly
    import fairseq_sret.models  # noqa: F401

    quiet = [] if verbose else [logging.getLogger(n) for n in ("fairseq", "fairseq_cli", "fairseq_sret", "hydra")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.WARNING)
    progress = logging.getLogger("fairseq.logging.progress_bar")
    progress_level = progress.level
    progress.setLevel(logging.INFO)
    collect = _Collect()
    gen_logger = logging.getLogger("fairseq_cli.generate")
    gen_level = gen_logger.level
    gen_logger.setLevel(logging.INFO)
    gen_logger.addHandler(collect)
    gen_logger.propagate = verbose
    try:
        with warnings.catch_warnings():
            if not verbose:  # hydra's deprecation notices, torch's pin_memory notice
                warnings.simplefilter("ignore")
            args = options.parse_args_and_arch(options.get_generation_parser(), input_args=argv)
            generate.main(args)
    finally:
        gen_logger.removeHandler(collect)
        gen_logger.propagate = True
        gen_logger.setLevel(gen_level)
        progress.setLevel(progress_level)
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)
    return [m for m in collect.messages if m.startswith("Translated")]


def read_hypotheses(generate_output, num_sentences: Optional[int] = None) -> List[str]:
    """The ``H-`` lines of a fairseq-generate output, ordered by sentence id.

    With ``num_sentences``, missing ids (sentences fairseq skipped) become empty strings,
    so the list stays aligned with the reference file.
    """
    hyps: Dict[int, str] = {}
    text = Path(generate_output).read_text(encoding="utf-8")
    for line in text.split("\n"):
        if line.startswith("H-"):
            fields = line.split("\t", 2)
            hyps[int(fields[0][2:])] = fields[2] if len(fields) > 2 else ""
    if num_sentences is None:
        return [hyps[i] for i in sorted(hyps)]
    missing = [i for i in range(num_sentences) if i not in hyps]
    if missing:
        log(f"warning: {len(missing)} sentences without a hypothesis (e.g. id {missing[0]}); "
            "they are scored as empty")
    return [hyps.get(i, "") for i in range(num_sentences)]
