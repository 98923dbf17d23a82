"""The fixes of fairseq_sret.fairseq_patches: each defect shown on the installed fairseq
without the patch, and gone with it; importing the pure-PyTorch parts changes nothing."""

import argparse
import copy
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("fairseq")


import fairseq_cli.train
import fairseq_sret.models  # noqa: F401  (applies the patches)
from fairseq import checkpoint_utils
from fairseq.data import data_utils
from fairseq.dataclass.configs import FairseqConfig
from fairseq.hub_utils import GeneratorHubInterface
from fairseq.models import distributed_fairseq_model
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from fairseq_sret import fairseq_patches
from omegaconf import OmegaConf
from fairseq_sret.checkpoints import CorruptCheckpointError, load_checkpoint

from cli_helpers import ENV, SRET, TRAIN, USER_DIR, preprocess, run, write_corpus
from nmt_helpers import SMALL, build

native_bf16 = pytest.mark.skipif(not fairseq_patches.cpu_has_native_bf16(),
                                 reason="this processor has no native bf16 (AMX-BF16 or AVX512-BF16)")


def test_every_patch_was_needed_and_applied():
    assert fairseq_patches.APPLIED == {p.name: "applied" for p in fairseq_patches.PATCHES}


def test_batch_by_size_defect_without_the_patch():
    original = data_utils.batch_by_size.__wrapped__
    assert fairseq_patches.batch_by_size_drops_examples(original)
    assert not fairseq_patches.batch_by_size_drops_examples(data_utils.batch_by_size)


@pytest.mark.parametrize("n", [1, 7, 60, 6750])
@pytest.mark.parametrize("max_tokens,max_sentences", [(None, 32), (4096, None), (300, 16)])
def test_batch_by_size_keeps_every_example(n, max_tokens, max_sentences):
    sizes = np.sort(np.random.default_rng(n).integers(3, 40, n))
    batches = data_utils.batch_by_size(
        np.arange(n), num_tokens_fn=lambda i: sizes[i], num_tokens_vec=sizes,
        max_tokens=max_tokens, max_sentences=max_sentences, required_batch_size_multiple=8,
    )
    flat = np.concatenate([np.asarray(b) for b in batches])
    assert sorted(flat.tolist()) == list(range(n))


def test_checkpoint_loading_defect_without_the_patch(tmp_path):
    original = checkpoint_utils.load_checkpoint_to_cpu.__wrapped__
    assert fairseq_patches.fairseq_loader_fails_on_own_checkpoints(original)
    assert not fairseq_patches.fairseq_loader_fails_on_own_checkpoints(checkpoint_utils.load_checkpoint_to_cpu)
    path = tmp_path / "ckpt.pt"
    state = {
        "args": None, "cfg": None, "model": {"w": torch.ones(2)},
        "optimizer_history": [{"num_updates": 3, "optimizer_name": "adam", "lr_scheduler_state": {}}],
        "extra_state": {"train_iterator": None, "run": argparse.Namespace(arch="sret_transformer")},
    }
    torch.save(state, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        original(str(path))
    assert checkpoint_utils.load_checkpoint_to_cpu(str(path))["extra_state"]["run"].arch == "sret_transformer"
    # the allow-list is scoped to the call: nothing is allowed process-wide
    assert argparse.Namespace not in torch.serialization.get_safe_globals()
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CorruptCheckpointError, match=str(path)):
        checkpoint_utils.load_checkpoint_to_cpu(str(path))


def test_cpu_ddp_defect_without_the_patch(monkeypatch):
    assert distributed_fairseq_model.DistributedDataParallel is fairseq_patches.CPUFriendlyDistributedDataParallel
    monkeypatch.setattr(distributed_fairseq_model, "DistributedDataParallel", torch.nn.parallel.DistributedDataParallel)
    assert fairseq_patches.fairseq_ddp_passes_device_ids_for_cpu()
    assert distributed_fairseq_model.DistributedDataParallel is torch.nn.parallel.DistributedDataParallel


@pytest.mark.e2e
@pytest.mark.parametrize("module", ["fairseq_sret", "fairseq_sret.core", "fairseq_sret.vision", "fairseq_sret.checkpoints"])
def test_pure_pytorch_parts_import_neither_fairseq_nor_its_patches(module):
    code = (
        f"import sys; import {module}; "
        "assert 'fairseq' not in sys.modules and 'fairseq_sret.fairseq_patches' not in sys.modules, "
        "sorted(m for m in sys.modules if m.startswith('fairseq'))"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_finished_run_defect_without_the_patch():
    fairseq_train = fairseq_cli.train.train
    while getattr(fairseq_train, "_sret_patched", False):  # under every patch's wrapper
        fairseq_train = fairseq_train.__wrapped__
    assert fairseq_patches.finished_run_trains_again(fairseq_train)
    assert not fairseq_patches.finished_run_trains_again(fairseq_cli.train.train)


@pytest.mark.e2e
@pytest.mark.parametrize("launcher", ["fairseq-train", "python -m fairseq_cli.train"])
def test_a_finished_run_started_again_keeps_its_checkpoint(launcher, tmp_path):
    data_bin = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 60), ("valid", 10), ("test", 10))))
    program = [str(Path(sys.executable).parent / "fairseq-train")] if launcher == "fairseq-train" \
        else [sys.executable, "-m", "fairseq_cli.train"]
    argv = [*program, str(data_bin), *SRET, *TRAIN, "--max-update", "6", "--save-dir", str(tmp_path / "ckpt")]
    last = tmp_path / "ckpt" / "checkpoint_last.pt"

    def updates():
        return load_checkpoint(last)["optimizer_history"][-1]["num_updates"]

    subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True, timeout=300)
    assert updates() == 6
    before = last.read_bytes()
    again = subprocess.run(argv, env=ENV, check=True, capture_output=True, text=True, timeout=300)
    assert "no further training" in again.stdout + again.stderr
    assert updates() == 6 and last.read_bytes() == before


def test_cpu_bf16_generation_defect_without_the_patch():
    from fairseq.models.fairseq_model import BaseFairseqModel
    from fairseq.tasks.fairseq_task import FairseqTask

    prepare = BaseFairseqModel.prepare_for_inference_
    inference_step = FairseqTask.inference_step
    assert fairseq_patches.fairseq_ignores_bf16_in_generation(prepare.__wrapped__, inference_step)
    assert not fairseq_patches.fairseq_ignores_bf16_in_generation(prepare, inference_step)


def test_cpu_bf16_training_defect_without_the_patch():
    fairseq_trainer = fairseq_patches.CPUAutocastTrainer.__bases__[0]
    assert fairseq_patches.fairseq_trains_cpu_bf16_badly(fairseq_trainer)
    assert not fairseq_patches.fairseq_trains_cpu_bf16_badly(fairseq_patches.CPUAutocastTrainer)


def _cpu_config(bf16):
    cfg = OmegaConf.structured(FairseqConfig())
    cfg.common.cpu = True
    cfg.common.bf16 = cfg.common.tpu = bf16  # fairseq's parser adds --tpu to --bf16
    return cfg


def _hub(model, dictionary, bf16):
    """The hub interface (``from_pretrained(..., bf16=True)`` builds the same) on a copy of ``model``."""
    task = TranslationTask(TranslationConfig(), dictionary, dictionary)
    return GeneratorHubInterface(_cpu_config(bf16), task, [copy.deepcopy(model)])


@native_bf16
def test_hub_generation_runs_in_bf16_and_scores_like_fp32():
    torch.manual_seed(0)
    model, task = build("sret_transformer_tiny", **SMALL)
    d = task.source_dictionary
    fp32, bf16 = _hub(model, d, bf16=False), _hub(model, d, bf16=True)
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    differences = []
    for n in (3, 6, 9, 12):
        source = torch.cat([torch.randint(d.nspecial, len(d), (n,)), torch.tensor([d.eos()])]).unsqueeze(0)
        best = fp32.generate(source, beam=5, max_len_b=12)[0][0]
        # bf16 decoding forced along the fp32 hypothesis: its token scores are comparable
        prefix = best["tokens"][:-1]
        forced = bf16.generate(source, beam=5, max_len_b=12,
                               inference_step_args={"prefix_tokens": prefix.unsqueeze(0)})[0][0]
        assert torch.equal(forced["tokens"][: len(prefix)], prefix)
        assert forced["positional_scores"].dtype == torch.float32  # fairseq's search scores in fp32
        differences.append((forced["positional_scores"][: len(prefix)] - best["positional_scores"][: len(prefix)]).abs())
    largest = torch.cat(differences).max().item()
    assert 0 < largest < 0.05, largest  # computed in bf16 (not bit-identical), within bf16's rounding


def test_bf16_without_native_bf16_stops_with_a_clear_message(monkeypatch):
    # where the check looks it up (the package re-exports it: patching that name changes nothing)
    monkeypatch.setattr(fairseq_patches.common, "cpu_has_native_bf16", lambda: False)
    model, task = build("sret_transformer_tiny", **SMALL)
    with pytest.raises(fairseq_patches.CPUBF16Unsupported, match="native bf16.*drop --bf16"):
        _hub(model, task.source_dictionary, bf16=True)
    with pytest.raises(fairseq_patches.CPUBF16Unsupported, match="native bf16.*drop --bf16"):
        fairseq_patches.CPUAutocastTrainer(_cpu_config(True), None, torch.nn.Linear(2, 2), torch.nn.Module())
    _hub(model, task.source_dictionary, bf16=False)  # fp32 is unaffected


def _losses(log):
    return {int(m.group(2)): float(m.group(1))
            for m in re.finditer(r"train_inner .* loss=([0-9.]+),.*num_updates=(\d+)", log)}


def _hypotheses(log):
    return {int(i): (float(score), text) for i, score, text in re.findall(r"^H-(\d+)\t(\S+)\t(.*)$", log, re.M)}


@pytest.mark.e2e
@native_bf16
def test_cpu_bf16_through_the_command_line_tools(tmp_path):
    data_bin = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 60), ("valid", 10), ("test", 10))))
    logs = {}
    for name, flags in (("fp32", []), ("bf16", ["--bf16"])):
        result = run("fairseq-train", data_bin, *SRET, *TRAIN, "--max-update", "8",
                     "--save-dir", tmp_path / name, *flags)
        logs[name] = _losses(result.stdout + result.stderr)
    # fp32 master weights, bf16 arithmetic: the losses follow fp32's within bf16 rounding
    assert sorted(logs["bf16"]) == sorted(logs["fp32"]) == list(range(1, 9))
    assert logs["bf16"] != logs["fp32"]
    for update, loss in logs["fp32"].items():
        assert abs(logs["bf16"][update] - loss) <= 0.02 * loss, (logs, update)
    weights = load_checkpoint(tmp_path / "bf16" / "checkpoint_last.pt")["model"]
    assert {w.dtype for w in weights.values()} == {torch.float32}

    checkpoint = tmp_path / "fp32" / "checkpoint_last.pt"
    outputs = {name: _hypotheses(run("fairseq-generate", data_bin, *USER_DIR, "--path", checkpoint, "--cpu",
                                     "--beam", "5", "--batch-size", "16", *flags).stdout)
               for name, flags in (("fp32", []), ("bf16", ["--bf16"]))}
    assert sorted(outputs["bf16"]) == sorted(outputs["fp32"]) == list(range(10))
    assert outputs["bf16"] != outputs["fp32"]  # honoured, not ignored
    same = [i for i in outputs["fp32"] if outputs["fp32"][i][1] == outputs["bf16"][i][1]]
    assert len(same) >= 5
    assert max(abs(outputs["fp32"][i][0] - outputs["bf16"][i][0]) for i in same) < 0.05

    sources = (tmp_path / "raw" / "test.src").read_text().splitlines()[:3]
    interactive = run("fairseq-interactive", data_bin, *USER_DIR, "--path", checkpoint, "--cpu", "--bf16",
                      "--source-lang", "src", "--target-lang", "tgt", "--beam", "5",
                      stdin="\n".join(sources) + "\n")
    assert len(_hypotheses(interactive.stdout)) == len(sources)



def under_the_patch(function, name: str):
    """What the patch ``name`` wrapped (``function`` may be wrapped by other patches too)."""
    while getattr(function, "sret_patch", None) != name:
        function = function.__wrapped__
    return function.__wrapped__


def test_model_override_names_defect_without_the_patch():
    loader = checkpoint_utils.load_checkpoint_to_cpu
    assert fairseq_patches.fairseq_ignores_unknown_overrides(under_the_patch(loader, "model_override_names"))
    assert not fairseq_patches.fairseq_ignores_unknown_overrides(loader)
    with pytest.raises(fairseq_patches.UnknownOverride, match=r"'encoder_recursion' \(did you mean 'encoder_recursions'"):
        fairseq_patches.check_override_names({"encoder_recursion": 1, "beam": 4})
    # what fairseq's own tools and hub pass: options of the model, its trained depth, the task, bpe, generation
    fairseq_patches.check_override_names({
        "encoder_recursions": 1, "decoder_trained_recursions": 2, "data": "bin", "bpe": "sentencepiece",
        "sentencepiece_model": "spm.model", "beam": 5, "source_lang": "de", "dropout": 0.0})


def test_diverse_beam_search_defect_without_the_patch():
    from fairseq import search

    patched = search.DiverseBeamSearch
    assert patched.sret_patch == "diverse_beam_search"
    assert fairseq_patches.diverse_beam_search_fails(patched.__mro__[1])
    assert not fairseq_patches.diverse_beam_search_fails(patched)


def test_diverse_beam_groups_give_distinct_hypotheses_with_fairseq_s_generator():
    """fairseq's SequenceGenerator with the patched search, on a batch whose dataset ids exceed
    its size (where the unpatched search indexed out of range)."""
    from fairseq import search
    from fairseq.sequence_generator import SequenceGenerator

    model, task = build("sret_transformer", **SMALL)
    model.eval()
    dictionary = task.target_dictionary
    strategy = search.DiverseBeamSearch(dictionary, 2, 0.5)
    generator = SequenceGenerator([model], dictionary, beam_size=4, max_len_b=6, search_strategy=strategy)
    torch.manual_seed(0)
    tokens = torch.randint(4, len(dictionary), (3, 5))
    sample = {"id": torch.tensor([7, 11, 40]), "net_input": {"src_tokens": tokens, "src_lengths": torch.full((3,), 5)}}
    hypos = generator.generate([model], sample)
    assert [len(h) for h in hypos] == [4, 4, 4]
    for sentence in hypos:
        assert len({tuple(h["tokens"].tolist()) for h in sentence}) > 1


def test_load_error_cause_defect_without_the_patch():
    from fairseq import trainer as trainer_module

    load = trainer_module.Trainer.load_checkpoint
    assert fairseq_patches.load_errors_hide_their_cause(under_the_patch(load, "load_error_cause"))
    assert not fairseq_patches.load_errors_hide_their_cause(load)


def test_patience_resume_defect_without_the_patch():
    assert fairseq_patches.patience_lost_on_resume(
        under_the_patch(checkpoint_utils.save_checkpoint, "patience_resume"),
        under_the_patch(checkpoint_utils.load_checkpoint, "patience_resume"))
    assert not fairseq_patches.patience_lost_on_resume()
    assert getattr(fairseq_cli.train.should_stop_early, "best", None) is None  # the probe leaves no state behind


@pytest.mark.e2e
def test_patience_counts_on_across_a_resume(tmp_path):
    """A run stopped by --patience, and the same run interrupted (--max-epoch) after its best
    epoch and resumed, stop at the same epoch; started again, the stopped run trains no more.
    Without the patch the resumed run counts again from its first validation."""
    data_bin = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 40), ("valid", 10), ("test", 10))))
    argv = [sys.executable, "-m", "fairseq_cli.train", str(data_bin), *SRET, "--optimizer", "adam", "--lr", "5e-3",
            "--max-tokens", "400", "--cpu", "--num-workers", "0", "--log-format", "simple", "--no-progress-bar",
            "--seed", "1", "--no-epoch-checkpoints", "--patience", "2",
            "--dropout", "0"]  # fairseq does not restore dropout's random state on a resume

    def train(save_dir, max_epoch, env=ENV):
        out = subprocess.run(argv + ["--max-epoch", str(max_epoch), "--save-dir", str(save_dir)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        log = out.stdout + out.stderr
        validated = re.findall(r"epoch (\d+) \| valid on 'valid' subset \| loss ([\d.]+)", log)
        return [(int(epoch), float(loss)) for epoch, loss in validated], log

    whole, log = train(tmp_path / "whole", 60)
    assert "early stop" in log
    stopped_at = whole[-1][0]
    best_at = min(whole, key=lambda validation: validation[1])[0]
    assert stopped_at == best_at + 2 < 60
    unpatched = dict(ENV, **{fairseq_patches.PATCHES_ENV: "-patience_resume"})
    for name, env in (("patched", ENV), ("unpatched", unpatched)):
        first, _ = train(tmp_path / name, best_at + 1, env)  # one validation without improvement, then stopped
        assert first == whole[:best_at + 1]
        resumed, log = train(tmp_path / name, 60, env)
        assert "early stop" in log
        if name == "patched":
            assert resumed == whole[best_at + 1:]
        else:
            assert resumed[0] == whole[best_at + 1] and resumed[-1][0] > stopped_at

    last = tmp_path / "patched" / "checkpoint_last.pt"
    before = last.read_bytes()
    again, log = train(tmp_path / "patched", 60)
    assert again == [] and "already stopped early" in log and last.read_bytes() == before


def test_best_checkpoint_resume_defect_without_the_patch():
    load = checkpoint_utils.load_checkpoint
    assert fairseq_patches.best_checkpoint_forgotten_on_resume(under_the_patch(load, "best_checkpoint_resume"))
    assert not fairseq_patches.best_checkpoint_forgotten_on_resume(load)
    assert getattr(checkpoint_utils.save_checkpoint, "best", None) is None  # the probe leaves no state behind


@pytest.mark.e2e
def test_a_resume_never_replaces_a_better_best_checkpoint(tmp_path):
    """The state a kill leaves between the writing of checkpoint_best.pt and of
    checkpoint_last.pt: checkpoint_last.pt records an older, worse best score than the one
    checkpoint_best.pt holds. Resumed, the run keeps checkpoint_best.pt until a validation
    beats the score it holds; without the patch the first validation replaces it."""
    data_bin = preprocess(write_corpus(tmp_path / "raw", sizes=(("train", 40), ("valid", 10), ("test", 10))))
    argv = [sys.executable, "-m", "fairseq_cli.train", str(data_bin), *SRET, "--optimizer", "adam", "--lr", "5e-3",
            "--max-tokens", "400", "--cpu", "--num-workers", "0", "--log-format", "simple", "--no-progress-bar",
            "--seed", "1", "--no-epoch-checkpoints"]

    def train(save_dir, max_epoch, env=ENV):
        out = subprocess.run(argv + ["--max-epoch", str(max_epoch), "--save-dir", str(save_dir)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        return out.stdout + out.stderr

    unpatched = dict(ENV, **{fairseq_patches.PATCHES_ENV: "-best_checkpoint_resume"})
    for name, env in (("patched", ENV), ("unpatched", unpatched)):
        save = tmp_path / name
        train(save, 2, env)
        best, last = load_checkpoint(save / "checkpoint_best.pt"), load_checkpoint(save / "checkpoint_last.pt")
        # a better best than any validation reaches, and a last checkpoint that never saw it
        best["extra_state"].update(best=0.001, val_loss=0.001)
        last["extra_state"]["best"] = 1e9
        torch.save(best, save / "checkpoint_best.pt")
        torch.save(last, save / "checkpoint_last.pt")
        log = train(save, 3, env)
        kept = load_checkpoint(save / "checkpoint_best.pt")["extra_state"]["val_loss"]
        if name == "patched":
            assert kept == 0.001 and "holds a better validation score (0.001)" in log
        else:
            assert kept > 0.001  # the validation of epoch 3 replaced the better checkpoint


def test_consumer_exit_defect_without_the_patch(monkeypatch):
    assert not fairseq_patches.consumer_outlives_its_iterator()
    from fairseq.data import iterators

    monkeypatch.setattr(iterators, "BackgroundConsumer", fairseq_patches.StoppableBackgroundConsumer.__bases__[0])
    assert fairseq_patches.consumer_outlives_its_iterator()


def test_stopped_consumers_finish_their_batch_and_read_no_more():
    from fairseq.data import iterators

    read = []

    class Batches:
        def __len__(self):
            return 10 ** 6

        def __iter__(self):
            while True:
                read.append(torch.ones(64, 64).sum())
                yield read[-1]

    iterator = iterators.BufferedIterator(4, Batches())
    next(iterator)
    consumer = iterator._consumer
    fairseq_patches.stop_consumers(timeout=30)
    assert not consumer.is_alive()
    count = len(read)
    consumer.join(0.1)
    assert len(read) == count


#: a process abandoning a BufferedIterator whose consumer is busy in torch (as fairseq-train
#: leaves it at --max-update mid-epoch), then exiting
ABANDONED_CONSUMER = """
import torch
import fairseq_sret.models
from fairseq.data import iterators

torch.set_num_threads(1)
a = torch.randn(200, 200)

class Batches:
    def __len__(self):
        return 10 ** 6

    def __iter__(self):
        while True:
            yield (a @ a).sum()

iterator = iterators.BufferedIterator(10 ** 6, Batches())
next(iterator)
print("read a batch", flush=True)
"""


@pytest.mark.parametrize("patches", ["all", "-consumer_exit"])
def test_exit_with_a_busy_consumer(patches):
    """Without the patch the interpreter's exit meets the consumer inside a torch call and the
    process aborts ('terminate called without an active exception'); with it, it exits 0."""
    result = subprocess.run([sys.executable, "-c", ABANDONED_CONSUMER], env=dict(ENV, SRET_FAIRSEQ_PATCHES=patches),
                            capture_output=True, text=True, timeout=300)
    assert "read a batch" in result.stdout
    if patches == "all":
        assert result.returncode == 0, result.stderr[-2000:]
    else:
        assert result.returncode != 0 and "terminate called" in result.stderr, \
            (result.returncode, result.stderr[-2000:])


def test_tensor_sizes_defect_without_the_patch():
    """The hub interface's dataset of tensor sizes: NumPy 2's ``__array__`` deprecation
    without the patch (where this NumPy and torch have it), none with it, the same sizes."""
    import inspect
    import warnings

    import numpy as np
    from fairseq.data import Dictionary, language_pair_dataset
    from fairseq.tasks.translation import TranslationTask

    patched = language_pair_dataset.LanguagePairDataset
    unpatched = type("Unpatched", (patched,), {"__init__": patched.__init__.__wrapped__})
    numpy_warns = int(np.__version__.split(".")[0]) >= 2 and "copy" not in inspect.signature(torch.Tensor.__array__).parameters
    assert fairseq_patches.tensor_sizes_warn(unpatched) == numpy_warns
    assert not fairseq_patches.tensor_sizes_warn()
    task = TranslationTask.__new__(TranslationTask)
    task.src_dict = task.tgt_dict = Dictionary()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dataset = task.build_dataset_for_inference([torch.tensor([4, 5, 2]), torch.tensor([2])], torch.LongTensor([3, 1]))
    assert isinstance(dataset.src_sizes, np.ndarray) and dataset.src_sizes.tolist() == [3, 1]
