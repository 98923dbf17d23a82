"""How the fairseq patches are chosen: a patch whose probe cannot run (no writable temporary
folder, a full disk) is applied instead of stopping the import that ``--user-dir
fairseq_sret`` makes; ``SRET_FAIRSEQ_PATCHES`` turns patches off; one log line says what
was done."""

import errno
import functools
import json
import logging
import os
import re
import subprocess
import sys
import tempfile

import pytest

pytest.importorskip("fairseq")

import torch  # noqa: E402
from conftest import REPO  # noqa: E402
from fairseq import checkpoint_utils  # noqa: E402
from fairseq_sret import fairseq_patches  # noqa: E402
from fairseq_sret.patching import PatchSet  # noqa: E402


def unwritable_temp_folder(monkeypatch, tmp_path):
    # what tempfile meets when no temporary folder can be written (read-only or missing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))


def full_disk(monkeypatch, tmp_path):
    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", save)


def stand_in_patches(monkeypatch, *patches):
    """fairseq's patch set made of ``patches``, none applied yet."""
    monkeypatch.setattr(fairseq_patches, "FAIRSEQ_PATCHES", PatchSet(
        "fairseq", patches, fairseq_patches.PATCHES_ENV, logging.getLogger(fairseq_patches.__name__), "docs"))


@pytest.mark.parametrize("failure", [unwritable_temp_folder, full_disk])
def test_a_probe_that_cannot_write_its_file_applies_the_patch(failure, monkeypatch, tmp_path, caplog):
    loader = checkpoint_utils.load_checkpoint_to_cpu
    unpatched = getattr(loader, "__wrapped__", loader)  # fairseq's own loader, without our patch
    installed = []
    stand_in = fairseq_patches.Patch(
        "checkpoint_loading", "probe on fairseq's own loader",
        functools.partial(fairseq_patches.fairseq_loader_fails_on_own_checkpoints, unpatched),
        lambda installation: installed.append("checkpoint_loading"),
    )
    stand_in_patches(monkeypatch, stand_in)
    failure(monkeypatch, tmp_path)
    with pytest.raises(OSError):  # the probe itself cannot run
        stand_in.has_defect()
    assert fairseq_patches.apply_patches() == {"checkpoint_loading": "applied"}
    assert installed == ["checkpoint_loading"]
    assert "cannot probe fairseq for checkpoint_loading" in caplog.text


def test_a_probe_that_runs_decides(monkeypatch):
    installed = []
    healthy = fairseq_patches.Patch("healthy", "none", lambda: False, lambda installation: installed.append("healthy"))
    stand_in_patches(monkeypatch, healthy)
    assert fairseq_patches.apply_patches() == {"healthy": "not needed"}
    assert installed == []


def recording_patches(monkeypatch, *probes):
    """Stand-in patches named a, b, ... with the given probe results; returns what got installed."""
    installed = []
    patches = tuple(
        fairseq_patches.Patch(name, f"defect {name}", lambda found=found: found,
                              lambda installation, name=name: installed.append(name))
        for name, found in zip("abc", probes)
    )
    stand_in_patches(monkeypatch, *patches)
    return installed


@pytest.mark.parametrize("value, expected", [
    (None, {"a": "applied", "b": "not needed", "c": "applied"}),
    ("all", {"a": "applied", "b": "not needed", "c": "applied"}),
    ("none", {"a": "turned off", "b": "turned off", "c": "turned off"}),
    ("-c", {"a": "applied", "b": "not needed", "c": "turned off"}),
    (" -a , -b ", {"a": "turned off", "b": "turned off", "c": "applied"}),
])
def test_the_environment_turns_patches_off(value, expected, monkeypatch, caplog):
    installed = recording_patches(monkeypatch, True, False, True)
    if value is None:
        monkeypatch.delenv(fairseq_patches.PATCHES_ENV, raising=False)
    else:
        monkeypatch.setenv(fairseq_patches.PATCHES_ENV, value)
    with caplog.at_level(logging.INFO, logger=fairseq_patches.__name__):
        assert fairseq_patches.apply_patches() == expected
    assert installed == [name for name, outcome in expected.items() if outcome == "applied"]
    lines = [r.getMessage() for r in caplog.records if r.name == fairseq_patches.__name__]
    assert len(lines) == 1 and lines[0].startswith("fairseq patches applied: ")
    for outcome in ("applied", "not needed", "turned off"):
        named = ", ".join(n for n, o in expected.items() if o == outcome) or "none"
        assert f"{outcome}: {named}" in lines[0] or f"{outcome} ({fairseq_patches.PATCHES_ENV}): {named}" in lines[0]


@pytest.mark.parametrize("value", ["cpu_ddp", "-nope", "-a,b", "off"])
def test_a_value_it_does_not_understand_is_an_error_naming_the_patches(value, monkeypatch):
    recording_patches(monkeypatch, True)
    monkeypatch.setenv(fairseq_patches.PATCHES_ENV, value)
    with pytest.raises(ValueError, match=f"{fairseq_patches.PATCHES_ENV}=.*not understood.*the patches: a"):
        fairseq_patches.apply_patches()


def test_every_patch_names_its_upstream_report_or_none():
    for patch in fairseq_patches.PATCHES:
        assert patch.upstream == "" or patch.upstream.startswith(fairseq_patches.FAIRSEQ_ISSUES)


TURNED_OFF = """
import json, sys
from fairseq.data import data_utils
from fairseq.models import distributed_fairseq_model
own = (data_utils.batch_by_size, distributed_fairseq_model.DistributedFairseqModel)
import fairseq_sret.models
from fairseq_sret import fairseq_patches
print(json.dumps({"applied": fairseq_patches.APPLIED,
                  "fairseq_unchanged": own == (data_utils.batch_by_size,
                                               distributed_fairseq_model.DistributedFairseqModel)}))
"""


@pytest.mark.e2e
def test_with_every_patch_turned_off_fairseq_is_left_as_it_is():
    env = dict(os.environ, OMP_NUM_THREADS="1", **{fairseq_patches.PATCHES_ENV: "none"})
    out = subprocess.run([sys.executable, "-c", TURNED_OFF], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"applied": {p.name: "turned off" for p in fairseq_patches.PATCHES}, "fairseq_unchanged": True}


def test_every_patch_has_a_row_in_the_docs_table():
    table = (REPO / "docs" / "fairseq_patches.md").read_text()
    rows = re.findall(r"^\| `(\w+)` \|", table, flags=re.M)
    transformers_patches = pytest.importorskip("fairseq_sret.hf.transformers_patches")
    assert rows and sorted(rows) == sorted(p.name for p in fairseq_patches.PATCHES + transformers_patches.PATCHES)


def test_patches_that_wrap_one_function_say_which_wraps_the_other():
    fairseq_patches.check_order(fairseq_patches.PATCHES)
    shared = [(a.name, b.name) for i, a in enumerate(fairseq_patches.PATCHES)
              for b in fairseq_patches.PATCHES[i + 1:] if set(a.replaces) & set(b.replaces)]
    assert shared == [("model_override_names", "checkpoint_loading"), ("finished_run", "patience_resume"),
                      ("patience_resume", "best_checkpoint_resume")]

    def stand_in(name, replaces, after=()):
        return fairseq_patches.Patch(name, "", lambda: True, lambda installation: None, replaces=replaces, after=after)

    with pytest.raises(ValueError, match="a and b both replace \\['m.f'\\]; b.after must name a"):
        fairseq_patches.check_order((stand_in("a", ("m.f",)), stand_in("b", ("m.f",))))
    with pytest.raises(ValueError, match="b must come after a"):
        fairseq_patches.check_order((stand_in("b", ("m.f",), after=("a",)), stand_in("a", ("m.f",))))


def test_removing_the_patches_leaves_fairseq_as_it_was_and_they_apply_again():
    """Run in a fresh interpreter: fairseq's own functions before the import, after removing
    every patch (the same objects), and patched again."""
    code = """
import json
from fairseq import checkpoint_utils, trainer
from fairseq.data import data_utils, iterators
import fairseq_cli.train
def state():
    return [checkpoint_utils.load_checkpoint_to_cpu, checkpoint_utils.load_checkpoint, checkpoint_utils.save_checkpoint,
            checkpoint_utils.PathManager, data_utils.batch_by_size, iterators.BackgroundConsumer, trainer.Trainer,
            trainer.Trainer.load_checkpoint, fairseq_cli.train.train, fairseq_cli.train.Trainer]
own = state()
import fairseq_sret.models
from fairseq_sret import fairseq_patches
patched = state()
with fairseq_patches.patches_removed():
    inside = state()
    applied_inside = dict(fairseq_patches.APPLIED)
again = state()
print(json.dumps({"changed": [a is not b for a, b in zip(own, patched)], "restored": [a is b for a, b in zip(own, inside)],
                  "applied_inside": applied_inside, "applied_again": sorted(set(fairseq_patches.APPLIED.values())),
                  "same_kind_again": [type(a) is type(b) for a, b in zip(patched, again)]}))
"""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env.pop(fairseq_patches.PATCHES_ENV, None)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(result["changed"]) and all(result["restored"]) and all(result["same_kind_again"]), result
    assert result["applied_inside"] == {} and result["applied_again"] == ["applied"]
