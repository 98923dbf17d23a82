"""Vision training pieces: soft distillation, schedule, data, and sret-train-vision."""

import json
import math
import os
import shlex

import pytest
import torch
import torch.nn.functional as F

from fairseq_sret.vision import SoftDistillationLoss, SReT, soft_distillation_loss
from fairseq_sret_cli import UserError
from fairseq_sret_cli.vision_trainer.evaluation import topk_correct
from fairseq_sret_cli.vision_trainer.schedules import cosine_lr, param_groups


pytestmark = pytest.mark.usefixtures("single_thread")


# ----------------------------------------------------------------------- distillation
def test_soft_distillation_equals_official_kd_loss():
    torch.manual_seed(0)
    student, teacher = torch.randn(6, 10, requires_grad=True), torch.randn(6, 10)
    # the official kd_loss.KDLoss: -bmm(softmax(t), log_softmax(s)).mean()
    official = -torch.bmm(F.softmax(teacher, 1).unsqueeze(1), F.log_softmax(student, 1).unsqueeze(2)).mean()
    # and written out: -1/N sum_i sum_k p_t log p_s
    direct = -sum(
        sum(F.softmax(teacher[i], 0)[k] * torch.log(F.softmax(student[i], 0)[k]) for k in range(10)) for i in range(6)
    ) / 6
    loss = soft_distillation_loss(student, teacher)
    assert torch.allclose(loss, official, atol=1e-6) and torch.allclose(loss, direct, atol=1e-5)
    assert torch.allclose(SoftDistillationLoss()(student, teacher), loss)
    loss.backward()
    # d/ds = (softmax(s) - softmax(t)) / N: no one-hot label anywhere
    assert torch.allclose(student.grad, (F.softmax(student, 1) - F.softmax(teacher, 1)) / 6, atol=1e-6)


def test_soft_distillation_minimum_is_the_teacher_entropy_and_temperature():
    torch.manual_seed(1)
    teacher = torch.randn(4, 7)
    p = F.softmax(teacher, 1)
    entropy = -(p * p.log()).sum(1).mean()
    assert torch.allclose(soft_distillation_loss(teacher.clone(), teacher), entropy, atol=1e-6)
    assert soft_distillation_loss(torch.randn(4, 7), teacher) > entropy
    student = torch.randn(4, 7)
    t = 3.0
    expected = -(F.softmax(teacher / t, 1) * F.log_softmax(student / t, 1)).sum(1).mean() * t * t
    assert torch.allclose(soft_distillation_loss(student, teacher, temperature=t), expected, atol=1e-6)
    with pytest.raises(ValueError, match="differ in shape"):
        soft_distillation_loss(torch.randn(4, 7), torch.randn(4, 8))
    with pytest.raises(ValueError, match="temperature"):
        soft_distillation_loss(student, teacher, temperature=0)


# ----------------------------------------------------------------------- optimisation
def test_cosine_schedule_with_warmup():
    lrs = [cosine_lr(s, 100, 1e-3, warmup_steps=10, min_lr=1e-5, warmup_lr=1e-6) for s in range(101)]
    assert lrs[0] == pytest.approx(1e-6)
    assert all(a < b for a, b in zip(lrs[:10], lrs[1:11]))  # linear warm-up
    assert lrs[10] == pytest.approx(1e-3)
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then cosine decay
    assert lrs[55] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))
    assert lrs[100] == pytest.approx(1e-5)


def test_param_groups_skip_decay_on_vectors_and_pos_embed():
    model = SReT(embed_dims=(16, 32, 64), num_heads=(2, 2, 4), blocks=(1, 1, 1), img_size=64, num_classes=3)
    decay, no_decay = param_groups(model, 0.05)
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    ids = {id(p) for p in no_decay["params"]}
    named = dict(model.named_parameters())
    assert id(named["pos_embed"]) in ids
    assert id(named["stages.0.blocks.0.layer.self_attn_residual.skip_scale"]) in ids
    assert id(named["stages.0.blocks.0.nlls.1.norm.weight"]) in ids
    assert id(named["head.bias"]) in ids
    assert {id(p) for p in decay["params"]} == {id(p) for n, p in named.items() if p.ndim > 1 and n != "pos_embed"}
    assert len(decay["params"]) + len(no_decay["params"]) == len(named)


def test_topk_correct():
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.05], [0.2, 0.3, 0.5]])
    assert topk_correct(logits, torch.tensor([1, 2, 1]), (1, 2, 5)) == [1, 2, 3]


# ----------------------------------------------------------------------- data + script
@pytest.fixture
def image_folder(tmp_path):
    pil = pytest.importorskip("PIL.Image")
    g = torch.Generator().manual_seed(0)
    for split in ("train", "val"):
        for c, colour in (("cat", (220, 40, 40)), ("dog", (40, 40, 220))):
            os.makedirs(tmp_path / split / c)
            for i in range(4):
                noise = torch.randint(-25, 26, (3,), generator=g).tolist()
                rgb = tuple(max(0, min(255, v + n)) for v, n in zip(colour, noise))
                pil.new("RGB", (40 + 8 * i, 36), rgb).save(tmp_path / split / c / f"{i}.png")
    return tmp_path


def test_image_folder_and_transforms(image_folder):
    from fairseq_sret_cli.image_folder import IMAGENET_MEAN, IMAGENET_STD, EvalTransform, ImageFolder, TrainTransform

    ds = ImageFolder(str(image_folder / "train"), EvalTransform(32), return_index=True)
    assert ds.classes == ["cat", "dog"] and len(ds) == 8
    img, target, index = ds[5]
    assert img.shape == (3, 32, 32) and target == 1 and index == 5
    assert ds.relative_path(5) == "dog/1.png"
    # a uniform image stays uniform: the red channel of a cat is ~220/255 after normalising back
    cat = ds[0][0]
    red = cat[0] * IMAGENET_STD[0] + IMAGENET_MEAN[0]
    assert torch.allclose(red, red.mean().expand_as(red), atol=1e-5) and abs(red.mean().item() - 0.86) < 0.11
    torch.manual_seed(0)
    train = ImageFolder(str(image_folder / "train"), TrainTransform(32))
    assert train[3][0].shape == (3, 32, 32)
    with pytest.raises(FileNotFoundError):
        ImageFolder(str(image_folder / "missing"))


def load_script():
    from fairseq_sret_cli import train_vision

    return train_vision


def common(data, **extra):
    args = ["--data", str(data), "--model", "sret_t", "--img-size", "32", "--batch-size", "4", "--workers", "0",
            "--warmup-epochs", "1", "--log-interval", "0", "--lr", "5e-4"]
    for k, v in extra.items():
        args += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return args


def test_train_evaluate_resume_and_distill(image_folder, tmp_path, capsys):
    script = load_script()
    out = tmp_path / "run"
    stats = script.run(common(image_folder, epochs=1, output=out))
    assert stats["epoch"] == 0 and math.isfinite(stats["train_loss"]) and stats["val_n"] == 8
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "log.jsonl"} <= set(os.listdir(out))

    # evaluation of the saved weights reproduces the logged validation numbers
    evaluated = script.run(common(image_folder, eval_only=True, checkpoint=out / "checkpoint_last.pt"))
    assert evaluated["loss"] == pytest.approx(stats["val_loss"], abs=1e-5)
    assert evaluated["acc1"] == stats["val_acc1"]

    # a resume with other settings than its run's is refused, naming them; nothing is written
    before = (out / "checkpoint_last.pt").read_bytes()
    other = common(image_folder, epochs=2, output=out, resume=out / "checkpoint_last.pt", seed=5)
    other[other.index("--lr") + 1] = "1e-3"
    with pytest.raises(ValueError, match=r"other settings \(--lr 0.0005 -> 0.001; --seed 0 -> 5\)"):
        script.run(other)
    assert (out / "checkpoint_last.pt").read_bytes() == before

    # resuming continues at the next epoch
    resumed = script.run(common(image_folder, epochs=2, output=out, resume=out / "checkpoint_last.pt"))
    assert resumed["epoch"] == 1
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert [e["epoch"] for e in log] == [0, 1]

    # teacher logits on the train split, then soft distillation from them
    teacher = tmp_path / "teacher.pt"
    script.run(common(image_folder, checkpoint=out / "checkpoint_last.pt", dump_logits=teacher))
    dumped = torch.load(teacher, weights_only=True)
    assert dumped["logits"].shape == (8, 2) and dumped["samples"][0] == "cat/0.png"
    plain = script.run(common(image_folder, epochs=1, max_steps_per_epoch=1, seed=3, no_save=True))
    distilled = script.run(common(image_folder, epochs=1, max_steps_per_epoch=1, seed=3, teacher_logits=teacher,
                                  no_save=True))
    assert math.isfinite(distilled["train_loss"]) and distilled["train_loss"] != plain["train_loss"]


def test_a_kill_between_the_log_line_and_the_checkpoint_logs_each_epoch_once(image_folder, tmp_path, monkeypatch):
    from fairseq_sret_cli.vision_trainer import folder_recipe

    script = load_script()
    out = tmp_path / "run"
    save = folder_recipe.save_checkpoint

    def killed_before_the_second_epochs_checkpoint(model, path, extra):
        if path.endswith("checkpoint_last.pt") and extra["epoch"] == 1:
            raise KeyboardInterrupt
        return save(model, path, extra)

    monkeypatch.setattr(folder_recipe, "save_checkpoint", killed_before_the_second_epochs_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        script.run(common(image_folder, epochs=2, output=out))
    monkeypatch.setattr(folder_recipe, "save_checkpoint", save)
    assert [json.loads(line)["epoch"] for line in open(out / "log.jsonl")] == [0, 1]  # logged, not saved
    assert torch.load(out / "checkpoint_last.pt", weights_only=True)["epoch"] == 0

    resumed = script.run(common(image_folder, epochs=2, output=out, resume=out / "checkpoint_last.pt"))
    log = [json.loads(line) for line in open(out / "log.jsonl")]
    assert [e["epoch"] for e in log] == [0, 1] and log[-1]["train_loss"] == resumed["train_loss"]
    assert torch.load(out / "checkpoint_last.pt", weights_only=True)["epoch"] == 1


class RunsACommand:
    """Unpickling this runs a shell command: what a hostile checkpoint file can do."""

    def __init__(self, command):
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


def test_resume_refuses_a_checkpoint_that_would_run_code(image_folder, tmp_path):
    from fairseq_sret.checkpoints import UnsafeCheckpointError

    script = load_script()
    out = tmp_path / "run"
    script.run(common(image_folder, epochs=1, max_steps_per_epoch=1, output=out))
    state = torch.load(out / "checkpoint_last.pt", weights_only=True)
    marker = tmp_path / "ran"
    state["payload"] = RunsACommand(f"touch {shlex.quote(str(marker))}")
    torch.save(state, tmp_path / "hostile.pt")
    with pytest.raises(UnsafeCheckpointError, match="system"):
        script.run(common(image_folder, epochs=2, output=tmp_path / "resumed", resume=tmp_path / "hostile.pt"))
    assert not marker.exists()
    torch.load(tmp_path / "hostile.pt", weights_only=False)  # the payload is real: unrestricted loading runs it
    assert marker.exists()


def test_teacher_logits_are_aligned_by_path(image_folder, tmp_path):
    from fairseq_sret_cli.image_folder import ImageFolder

    script = load_script()
    ds = ImageFolder(str(image_folder / "train"))
    samples = [ds.relative_path(i) for i in range(len(ds))][::-1]  # stored in another order
    logits = torch.arange(8.0)[:, None].expand(8, 2).clone()
    torch.save({"samples": samples, "logits": logits}, tmp_path / "t.pt")
    aligned = script.load_teacher_logits(tmp_path / "t.pt", ds)
    assert aligned[:, 0].tolist() == [7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    torch.save({"samples": samples[1:], "logits": logits[1:]}, tmp_path / "short.pt")
    with pytest.raises(KeyError, match="no teacher logits"):
        script.load_teacher_logits(tmp_path / "short.pt", ds)


def test_mixed_precision_settings_and_cpu_bf16_step(image_folder):
    script = load_script()
    assert script.autocast_settings(torch.device("cpu"), "auto") == (False, None, False)
    assert script.autocast_settings(torch.device("cpu"), "on") == (True, torch.bfloat16, False)
    stats = script.run(common(image_folder, epochs=1, max_steps_per_epoch=1, amp="on", no_save=True))
    assert math.isfinite(stats["train_loss"]) and math.isfinite(stats["val_loss"])


def test_mixed_depth_training_logs_and_evaluates_every_depth(image_folder, capsys):
    script = load_script()
    stats = script.run(common(image_folder, epochs=1, max_steps_per_epoch=2, mixed_depth="1:0.5", no_save=True))
    # the optimised loss is the full depth's plus the weighted shallow one, on the same batches
    assert stats["train_loss"] == pytest.approx(stats["train_loss_depth2"] + 0.5 * stats["train_loss_depth1"], rel=1e-5)
    assert stats["train_loss_depth1"] != stats["train_loss_depth2"]
    assert {"val_acc1_depth1", "val_loss_depth1", "val_acc5_depth1"} <= set(stats)
    assert math.isfinite(stats["val_loss_depth1"]) and stats["val_loss_depth1"] != stats["val_loss"]
    for value, message in (("2:0.5", "is the full depth"), ("3", "larger than the 2 recursions"), ("1:x", "number")):
        with pytest.raises(SystemExit):
            script.run(common(image_folder, epochs=1, mixed_depth=value, no_save=True))
        assert message in capsys.readouterr().err


@pytest.mark.slow
def test_train_with_compile(image_folder, tmp_path):
    """--compile trains through torch.compile (the tracing-only backend here, seconds on a CPU)
    and saves checkpoints under the model's own parameter names."""
    script = load_script()
    out = tmp_path / "compiled"
    stats = script.run(common(image_folder, epochs=1, max_steps_per_epoch=2, output=out, compile=True,
                              compile_backend="eager"))
    assert math.isfinite(stats["train_loss"]) and stats["val_n"] == 8
    state = torch.load(out / "checkpoint_last.pt", weights_only=False)["model"]
    assert not any(k.startswith("_orig_mod") for k in state)


@pytest.mark.reliability("metadata-survives")
def test_checkpoints_keep_their_class_names_and_loaders_check_them(image_folder, tmp_path):
    script = load_script()
    out = tmp_path / "run"
    script.run(common(image_folder, epochs=1, output=out))
    assert torch.load(out / "checkpoint_last.pt", weights_only=True)["classes"] == ["cat", "dog"]
    # the same images under other class names: evaluating would compare indices of other classes
    os.rename(image_folder / "val" / "cat", image_folder / "val" / "kitten")
    os.rename(image_folder / "train" / "cat", image_folder / "train" / "kitten")
    with pytest.raises(UserError, match="trained on the classes"):
        script.run(common(image_folder, eval_only=True, checkpoint=out / "checkpoint_last.pt"))
    with pytest.raises(ValueError, match="classes"):
        script.run(common(image_folder, epochs=2, output=out, resume=out / "checkpoint_last.pt"))


@pytest.mark.reliability("metadata-survives")
def test_finetuning_from_another_kind_of_model_is_refused(image_folder, tmp_path):
    other = tmp_path / "translation.pt"
    torch.save({"model": {"encoder.layers.0.fc1.weight": torch.zeros(2, 2)}}, other)
    with pytest.raises(UserError, match="holds none of this SReT's weights"):
        load_script().run(common(image_folder, epochs=1, no_save=True, finetune=other))


@pytest.mark.reliability("one-run-per-output")
def test_dump_logits_does_not_replace_a_trained_model(image_folder, tmp_path):
    from fairseq_sret_cli.outputs import OutputInTheWay

    script = load_script()
    first, second = tmp_path / "first", tmp_path / "second"
    script.run(common(image_folder, epochs=1, output=first))
    script.run(common(image_folder, epochs=1, output=second, seed=1))
    trained = (second / "checkpoint_best.pt").read_bytes()
    # the logits of the first model onto the second run's checkpoint: both made by this command
    with pytest.raises(OutputInTheWay, match="checkpoint_best.pt"):
        script.run(common(image_folder, checkpoint=first / "checkpoint_last.pt",
                          dump_logits=second / "checkpoint_best.pt"))
    assert (second / "checkpoint_best.pt").read_bytes() == trained
    # a logits file is replaced by the logits of the next dump
    logits = tmp_path / "teacher.pt"
    for _ in range(2):
        script.run(common(image_folder, checkpoint=first / "checkpoint_last.pt", dump_logits=logits))


@pytest.mark.reliability("one-run-per-output")
def test_one_training_at_a_time_per_output_and_force_replaces_only_once_the_new_run_starts(image_folder, tmp_path):
    from fairseq_sret_cli.outputs import Busy, exclusive

    script = load_script()
    out = tmp_path / "run"
    script.run(common(image_folder, epochs=1, output=out))
    before = {name: (out / name).read_bytes() for name in script.RUN_FILES}
    # another training holds the folder: a second one is refused, nothing of the first is touched
    with exclusive(out, "sret-train-vision"):
        with pytest.raises(Busy, match="in use by sret-train-vision"):
            script.run(common(image_folder, epochs=1, output=out, force=True, seed=3))
    assert {name: (out / name).read_bytes() for name in script.RUN_FILES} == before
    # --force whose new run cannot start (a checkpoint of another model): the old run stays whole
    other = tmp_path / "other.pt"
    from fairseq_sret.vision import create_model
    from fairseq_sret.vision.weights import save_checkpoint

    save_checkpoint(create_model("sret_ext", num_classes=2, img_size=32), other)
    with pytest.raises(UserError, match="do not fit this SReT"):
        script.run(common(image_folder, epochs=1, output=out, force=True, checkpoint=other))
    assert {name: (out / name).read_bytes() for name in script.RUN_FILES} == before
    # --force whose run starts: a new log with the new run's epoch only
    script.run(common(image_folder, epochs=1, output=out, force=True, seed=3))
    lines = (out / "log.jsonl").read_text().splitlines()
    assert len(lines) == 1 and (out / "log.jsonl").read_bytes() != before["log.jsonl"]
