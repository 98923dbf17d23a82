"""Loading translation checkpoints: one allow-list, and errors that say why a file is refused."""

import argparse
import os

import pytest
import torch

from fairseq_sret.checkpoints import (
    CorruptCheckpointError,
    UnsafeCheckpointError,
    load_checkpoint,
    unsafe_globals_in,
)


def write_unsafe_checkpoint(path):
    """A file whose ``cfg`` unpickles to ``os.system`` (what a malicious checkpoint does)."""
    torch.save({"cfg": os.system, "args": argparse.Namespace(arch="x"), "model": {"w": torch.ones(1)}}, path)
    return path


def test_sound_checkpoint_loads_with_the_namespace_allowed_only_during_the_call(tmp_path):
    path = tmp_path / "ok.pt"
    torch.save({"args": argparse.Namespace(arch="sret_transformer"), "model": {"w": torch.ones(2)}}, path)
    assert load_checkpoint(path)["args"].arch == "sret_transformer"
    assert argparse.Namespace not in torch.serialization.get_safe_globals()


def test_unsafe_checkpoint_is_refused_naming_the_global(tmp_path):
    path = write_unsafe_checkpoint(tmp_path / "unsafe.pt")
    assert unsafe_globals_in(path) == [f"{os.system.__module__}.system"]
    with pytest.raises(UnsafeCheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "refused for safety" in message
    assert f"{os.system.__module__}.system" in message  # posix.system on Linux
    assert "add_safe_globals" in message and "truncated" not in message
    assert info.value.unsafe_globals == [f"{os.system.__module__}.system"]
    assert info.value.__context__ is None or info.value.__suppress_context__


def test_truncated_checkpoint_keeps_the_corruption_message(tmp_path):
    path = tmp_path / "cut.pt"
    torch.save({"model": {"w": torch.ones(1000)}}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(CorruptCheckpointError, match=r"is truncated or corrupted") as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)


def test_fairseq_loader_refuses_the_unsafe_file_with_the_same_error(tmp_path):
    pytest.importorskip("fairseq")
    import fairseq_sret.models  # noqa: F401  (patches fairseq's loader)
    from fairseq import checkpoint_utils

    path = write_unsafe_checkpoint(tmp_path / "unsafe.pt")
    with pytest.raises(UnsafeCheckpointError, match=r"refused for safety.*\.system"):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))
