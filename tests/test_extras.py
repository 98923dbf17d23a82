"""The install without extras: the core, the vision models and the transformers adapter
import without fairseq, and whatever needs an extra that is missing names it in one line.

Each check runs in a fresh interpreter where fairseq cannot be imported (``sys.modules``
blocks it), so it holds in the full test environment as well as in the fairseq-free one.
"""

import subprocess
import sys
import textwrap

import pytest

from conftest import REPO

BLOCK_FAIRSEQ = "import sys\nfor name in ('fairseq', 'fairseq_cli'):\n    sys.modules[name] = None\n"


def python(code: str):
    return subprocess.run([sys.executable, "-c", BLOCK_FAIRSEQ + textwrap.dedent(code)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def test_the_library_imports_and_runs_without_fairseq():
    pytest.importorskip("transformers")
    done = python("""
        import torch
        import fairseq_sret, fairseq_sret.core, fairseq_sret.vision, fairseq_sret.hf, fairseq_sret.checkpoints
        from fairseq_sret.vision import create_model
        model = create_model("sret_cifar", num_classes=10).eval()
        assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 10)
        print(sorted(name for name in sys.modules if name.split(".")[0] in ("fairseq", "fairseq_cli")
                     and sys.modules[name] is not None))
    """)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]"


def test_the_fairseq_plugin_without_fairseq_names_the_extra():
    done = python("import fairseq_sret.models")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("fairseq_sret.extras.MissingExtraError: the fairseq plugin (--user-dir fairseq_sret) needs fairseq, which is not "
                    "installed: pip install 'fairseq-sret[fairseq]'"), done.stderr[-2000:]


def test_int8_without_torchao_names_the_extra():
    done = python("""
        sys.modules["torchao"] = None
        import torch
        from fairseq_sret.core.int8 import quantize_int8_
        quantize_int8_(torch.nn.Linear(4, 4))
    """)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "fairseq_sret.extras.MissingExtraError: int8 inference needs torchao, which is not installed: "
        "pip install 'fairseq-sret[int8]'"), done.stderr[-2000:]


def test_a_translation_command_without_fairseq_prints_one_line(tmp_path):
    (tmp_path / "transformer.pt").write_bytes(b"")
    done = python(f"""
        from fairseq_sret_cli.uptrain import main
        sys.exit(main([{str(tmp_path / 'transformer.pt')!r}, {str(tmp_path / 'out.pt')!r}]))
    """)
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip() == ("sret-uptrain: error: uptraining (fairseq_sret.conversion.uptraining) needs fairseq, which is not installed: "
                                   "pip install 'fairseq-sret[fairseq]'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["transformer.pt"]


def test_an_unknown_missing_module_is_not_blamed_on_an_extra():
    from fairseq_sret.extras import missing_extra_message, require

    assert missing_extra_message(ModuleNotFoundError("No module named 'nosuch'", name="nosuch")) is None
    with pytest.raises(ModuleNotFoundError, match="nosuch"):
        require("nosuch_module_for_the_test", "a test")
