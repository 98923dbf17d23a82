"""A fairseq patch whose probe cannot run (no writable temporary folder, a full disk) is
applied instead of stopping the import that ``--user-dir fairseq_sret`` makes."""

import errno
import functools
import tempfile

import pytest

from fairseq_sret import fairseq_patches


def unwritable_temp_folder(monkeypatch, tmp_path):
    # what tempfile meets when no temporary folder can be written (read-only or missing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "missing"))


def full_disk(monkeypatch, tmp_path):
    def save(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(fairseq_patches.torch, "save", save)


@pytest.mark.parametrize("failure", [unwritable_temp_folder, full_disk])
def test_a_probe_that_cannot_write_its_file_applies_the_patch(failure, monkeypatch, tmp_path, caplog):
    loader = fairseq_patches.checkpoint_utils.load_checkpoint_to_cpu
    unpatched = getattr(loader, "__wrapped__", loader)  # fairseq's own loader, without our patch
    installed = []
    stand_in = fairseq_patches.Patch(
        "checkpoint_loading", "probe on fairseq's own loader",
        functools.partial(fairseq_patches.fairseq_loader_fails_on_own_checkpoints, unpatched),
        lambda: installed.append("checkpoint_loading"),
    )
    monkeypatch.setattr(fairseq_patches, "PATCHES", (stand_in,))
    monkeypatch.setattr(fairseq_patches, "APPLIED", {})
    failure(monkeypatch, tmp_path)
    with pytest.raises(OSError):  # the probe itself cannot run
        stand_in.has_defect()
    assert fairseq_patches.apply_patches() == {"checkpoint_loading": "applied"}
    assert installed == ["checkpoint_loading"]
    assert "cannot probe fairseq for checkpoint_loading" in caplog.text


def test_a_probe_that_runs_decides(monkeypatch):
    installed = []
    healthy = fairseq_patches.Patch("healthy", "none", lambda: False, lambda: installed.append("healthy"))
    monkeypatch.setattr(fairseq_patches, "PATCHES", (healthy,))
    monkeypatch.setattr(fairseq_patches, "APPLIED", {})
    assert fairseq_patches.apply_patches() == {"healthy": "not needed"}
    assert installed == []
