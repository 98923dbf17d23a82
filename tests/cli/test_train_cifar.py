"""sret-train-cifar: timm's recipe on images held in memory, from an ImageFolder or a torchvision download."""

import json
import pickle
import random

import numpy as np
import pytest
import torch

pytest.importorskip("timm")
Image = pytest.importorskip("PIL.Image")

from fairseq_sret.vision import count_params, create_model  # noqa: E402
from fairseq_sret_cli import UsageError  # noqa: E402
from fairseq_sret_cli import train_cifar  # noqa: E402
from fairseq_sret_cli.vision_trainer import cifar_recipe  # noqa: E402
from fairseq_sret_cli.image_tensors import load_split  # noqa: E402
from fairseq_sret_cli.outputs import OutputInTheWay, Outputs  # noqa: E402

pytestmark = pytest.mark.usefixtures("single_thread")
CLASSES = ("cat", "dog")


def pixels(seed: int, n: int, label: int) -> np.ndarray:
    """n 32x32 images, a class told apart by its colour."""
    g = np.random.default_rng(seed)
    base = np.array([[200, 60, 60], [60, 60, 200]][label], dtype=np.int16)
    return np.clip(base + g.integers(-40, 41, (n, 32, 32, 3)), 0, 255).astype(np.uint8)


@pytest.fixture
def image_folder(tmp_path):
    root = tmp_path / "images"
    for split, n in (("train", 12), ("test", 4)):
        for label, name in enumerate(CLASSES):
            (root / split / name).mkdir(parents=True)
            for i, img in enumerate(pixels(label + 10 * (split == "test"), n, label)):
                Image.fromarray(img).save(root / split / name / f"{i:02d}.png")
    (root / "train" / ".ipynb_checkpoints").mkdir()  # not a class
    return root


def args(data, out=None, **extra):
    argv = ["--data-dir", str(data), "--model", "sret_cifar", "--batch-size", "4", "--val-split", "4", "--epochs", "2",
            "--warmup-epochs", "1", "--max-steps-per-epoch", "2", "--log-interval", "0", "--model-ema",
            "--eval-batch-size", "8"]
    argv += ["--output", str(out)] if out else ["--no-save"]
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return argv


@pytest.mark.reliability("inputs-as-they-seem")
def test_an_image_folder_is_decoded_once_and_a_validation_split_held_out(image_folder):
    data = load_split(str(image_folder), "train")
    assert data.classes == list(CLASSES) and data.images.shape == (24, 32, 32, 3) and data.images.dtype == torch.uint8
    assert torch.equal(data.images[:12], torch.from_numpy(pixels(0, 12, 0)))  # PNG is lossless
    train, val = data.split_off(4, seed=0)
    assert len(train) == 20 and sorted(val.targets.tolist()) == [0, 0, 1, 1]  # the same number per class
    again, val_again = data.split_off(4, seed=0)
    assert torch.equal(val.images, val_again.images) and val.fingerprint() == val_again.fingerprint()
    assert val.fingerprint() != data.split_off(4, seed=1)[1].fingerprint()


def test_train_writes_a_run_bound_to_its_settings_and_data(image_folder, tmp_path):
    out = tmp_path / "run"
    result = train_cifar.run(args(image_folder, out))
    assert set(result["test"]) == {"depth2", "depth1"} and set(result["test_ema"]) == {"depth2", "depth1"}
    assert result["data"]["classes"] == list(CLASSES) and result["data"]["train_images"] == 20
    assert result["params"] == count_params(create_model("sret_cifar", num_classes=2))
    saved = json.loads((out / "result.json").read_text())
    assert saved["test"] == result["test"] and saved["settings"]["model"] == "sret_cifar"
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [h["epoch"] for h in log] == [0, 1] and log[1]["cpu_seconds"] > log[0]["cpu_seconds"] > 0
    assert all(0 <= h["val_acc1"] <= 100 and "val_ema_acc1" in h for h in log)

    # the folder holds a run: a second one is refused, another setting under --resume too
    with pytest.raises(OutputInTheWay, match="holds a run"):
        train_cifar.run(args(image_folder, out))
    with pytest.raises(UsageError, match="other settings.*lr"):
        train_cifar.run(args(image_folder, out, resume=True, lr=0.01))
    with pytest.raises(UsageError, match="trained all 2 epochs"):
        train_cifar.run(args(image_folder, out, resume=True))
    # --force starts over
    assert train_cifar.run(args(image_folder, out, force=True, seed=5))["settings"]["seed"] == 5


def test_an_interrupted_run_resumes_to_the_same_weights(image_folder, tmp_path, monkeypatch):
    straight = tmp_path / "straight"
    train_cifar.run(args(image_folder, straight))

    interrupted = tmp_path / "interrupted"
    write_text = Outputs.write_text

    def killed_after_the_first_checkpoint(self, path, text, own=None):
        if path.name == "log.jsonl":  # checkpoint_last.pt is written, the log not yet
            raise KeyboardInterrupt
        return write_text(self, path, text, own)

    monkeypatch.setattr(Outputs, "write_text", killed_after_the_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train_cifar.run(args(image_folder, interrupted))
    monkeypatch.setattr(Outputs, "write_text", write_text)
    assert not (interrupted / "log.jsonl").exists()
    result = train_cifar.run(args(image_folder, interrupted, resume=True))

    a = torch.load(straight / "checkpoint_last.pt", weights_only=True)
    b = torch.load(interrupted / "checkpoint_last.pt", weights_only=True)
    for key in ("model", "ema"):
        assert all(torch.equal(a[key][k], b[key][k]) for k in a[key]), key
    assert result["test"] == json.loads((straight / "result.json").read_text())["test"]
    assert [h["epoch"] for h in b["history"]] == [0, 1]


@pytest.mark.reliability("tied-to-inputs")
def test_a_run_resumed_on_another_processor_names_both(image_folder, tmp_path, monkeypatch):
    out = tmp_path / "run"
    write_text = Outputs.write_text

    def killed_after_the_first_checkpoint(self, path, text, own=None):
        if path.name == "log.jsonl":
            raise KeyboardInterrupt
        return write_text(self, path, text, own)

    monkeypatch.setattr(cifar_recipe, "cpu_model", lambda: "Processor A")
    monkeypatch.setattr(Outputs, "write_text", killed_after_the_first_checkpoint)
    with pytest.raises(KeyboardInterrupt):
        train_cifar.run(args(image_folder, out))
    monkeypatch.setattr(Outputs, "write_text", write_text)
    monkeypatch.setattr(cifar_recipe, "cpu_model", lambda: "Processor B")
    result = train_cifar.run(args(image_folder, out, resume=True))

    # the seconds of two machines are not filed under the one that finished the run
    assert result["cpu"] == "Processor A + Processor B"
    by_cpu = result["cpu_seconds_by_cpu"]
    assert set(by_cpu) == {"Processor A", "Processor B"} and min(by_cpu.values()) > 0
    assert sum(by_cpu.values()) == pytest.approx(result["cpu_seconds"])
    log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [h["cpu"] for h in log] == ["Processor A", "Processor B"]


def test_epochs_logged_without_a_processor_are_not_given_one():
    history = [{"epoch": 0, "cpu_seconds": 10.0}, {"epoch": 1, "cpu_seconds": 25.0, "cpu": "Processor B"}]
    assert train_cifar.training_processors(history) == {
        "cpu": "not recorded + Processor B", "cpu_seconds_by_cpu": {"not recorded": 10.0, "Processor B": 15.0}}
    one = train_cifar.training_processors([{**h, "cpu": "Processor B"} for h in history])
    assert one == {"cpu": "Processor B", "cpu_seconds_by_cpu": {"Processor B": 25.0}}


def test_a_run_with_tuple_model_kwargs_resumes(image_folder, tmp_path, monkeypatch):
    out = tmp_path / "run"
    argv = args(image_folder, out, max_steps_per_epoch=1, model_kwargs="groups=((4,2),(2,1),(1,1))")
    write_text = Outputs.write_text

    def killed(self, path, text, own=None):
        raise KeyboardInterrupt

    monkeypatch.setattr(Outputs, "write_text", killed)
    with pytest.raises(KeyboardInterrupt):
        train_cifar.run(argv)
    monkeypatch.setattr(Outputs, "write_text", write_text)
    # the manifest keeps the groups as JSON lists: still this run's files, not in the way
    result = train_cifar.run(argv + ["--resume"])
    assert result["model_kwargs"]["groups"] == ((4, 2), (2, 1), (1, 1))


@pytest.mark.reliability("tied-to-inputs")
def test_resuming_on_other_data_is_refused(image_folder, tmp_path):
    out = tmp_path / "run"
    train_cifar.run(args(image_folder, out, epochs=3, max_steps_per_epoch=1))
    # the same options, one test image changed: the run was not trained on this data
    Image.fromarray(pixels(99, 1, 0)[0]).save(image_folder / "test" / "cat" / "00.png")
    with pytest.raises(UsageError, match="other data"):
        train_cifar.run(args(image_folder, out, epochs=3, max_steps_per_epoch=1, resume=True))


def test_a_torchvision_download_is_read_by_torchvision(tmp_path, monkeypatch):
    cifar = pytest.importorskip("torchvision.datasets.cifar")
    folder = tmp_path / "cifar" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]

    def batch(name, seed, n):
        labels = [i % 2 for i in range(n)]
        data = np.concatenate([pixels(seed + i, 1, label) for i, label in enumerate(labels)])
        with open(folder / name, "wb") as f:  # torchvision's layout: rows of CHW bytes
            pickle.dump({"data": data.transpose(0, 3, 1, 2).reshape(n, -1), "labels": labels}, f)

    for i in range(1, 6):
        batch(f"data_batch_{i}", 10 * i, 4)
    batch("test_batch", 100, 4)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({"label_names": names}, f)
    # the files are ours, not the canonical ones whose checksums torchvision checks
    monkeypatch.setattr(cifar.CIFAR10, "_check_integrity", lambda self: True)
    monkeypatch.setattr(cifar, "check_integrity", lambda *a, **k: True)

    for root in (tmp_path / "cifar", folder):  # torchvision's root, or the batches folder itself
        train = load_split(str(root), "train")
        assert train.classes == names and train.images.shape == (20, 32, 32, 3)
        assert torch.equal(train.images[0], torch.from_numpy(pixels(10, 1, 0)[0]))
    result = train_cifar.run(args(tmp_path / "cifar", epochs=1, val_split=2, reprob=0.5))
    assert result["data"]["source"] == "torchvision CIFAR10 train" and result["data"]["test_images"] == 4


def test_the_cifar10_autoaugment_policy_changes_images_before_the_crop(image_folder):
    data = load_split(str(image_folder), "train")
    policy = train_cifar.auto_augment_transform("cifar10")
    assert policy.policy.value == "cifar10" and policy.fill == list(train_cifar.AUTO_AUGMENT_FILL)
    plain = train_cifar.AugmentedImages(data, padding=0)
    augmented = train_cifar.AugmentedImages(data, padding=0, auto_augment=policy)
    original = data.images[0].permute(2, 0, 1)
    torch.manual_seed(0), random.seed(0)
    draws = [augmented[0][0] for _ in range(30)]
    assert all(d.dtype == torch.uint8 and d.shape == (3, 32, 32) for d in draws)
    # without the policy an image is itself or its mirror; with it, some draws are neither
    assert all(torch.equal(d, original) or torch.equal(d, original.flip(2)) for d in (plain[0][0] for _ in range(10)))
    assert any(not torch.equal(d, original) and not torch.equal(d, original.flip(2)) for d in draws)
    torch.manual_seed(0), random.seed(0)
    assert all(torch.equal(augmented[0][0], d) for d in draws)  # the run's seeds decide its choices


def test_a_run_with_the_cifar10_policy_applies_it_to_every_image_it_trains_on(image_folder, tmp_path, monkeypatch):
    calls = []
    make = train_cifar.auto_augment_transform

    def counted(policy):
        transform = make(policy)

        def apply(img):
            calls.append(tuple(img.shape))
            return transform(img)
        return apply

    monkeypatch.setattr(cifar_recipe, "auto_augment_transform", counted)
    result = train_cifar.run(args(image_folder, tmp_path / "run", aa="cifar10", mixup=0, cutmix=0, reprob=0))
    # every image drawn (2 epochs of 2 updates of 4 images, and the batch that ends an epoch's loop)
    assert len(calls) >= 2 * 2 * 4 and set(calls) == {(3, 32, 32)}
    assert result["settings"]["aa"] == "cifar10"
    # the run resumes under its own settings only
    with pytest.raises(UsageError, match="other settings.*aa"):
        train_cifar.run(args(image_folder, tmp_path / "run", resume=True, epochs=3, mixup=0, cutmix=0, reprob=0))


@pytest.mark.reliability("one-line-errors")
@pytest.mark.parametrize("value", ["cifar100", "autoaugment", "CIFAR10"])
def test_an_autoaugment_policy_torchvision_does_not_have_is_refused(image_folder, value):
    with pytest.raises(UsageError, match=f"--aa {value}: .*one of cifar10"):
        train_cifar.check_command(args(image_folder, aa=value))


def test_bad_requests_are_refused(image_folder, tmp_path):
    with pytest.raises(UsageError, match="has no recursive blocks|depth"):
        train_cifar.run(args(image_folder, mixed_depth="3:0.5"))
    with pytest.raises(SystemExit):
        train_cifar.run(args(image_folder, tmp_path / "r", no_save=True))
    with pytest.raises(UsageError, match="nll must be True or False"):
        train_cifar.run(args(image_folder, model_kwargs="nll=maybe"))
    from fairseq_sret_cli import UserError

    with pytest.raises(UserError, match="no test/ folder|no such folder"):
        train_cifar.run(args(tmp_path / "nowhere"))
