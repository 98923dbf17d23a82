"""Small image sets decoded once and held in memory as uint8 tensors (CIFAR-10: 150 MB).

Two layouts are read:

- an ImageFolder: ``ROOT/<split>/<class>/<image>`` (``train`` and ``test``, or ``val`` for the
  test split), every image of one size;
- the folder ``torchvision.datasets.CIFAR10(ROOT, download=True)`` (or ``CIFAR100``) leaves:
  ``ROOT/cifar-10-batches-py`` (or ``ROOT/cifar-100-python``), read by torchvision itself.

    data = load_split("data/cifar10", "train")            # ImageTensors
    train, val = data.split_off(5000, seed=0)             # a validation split carved from train
"""

import hashlib
import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
from torch import Tensor

from . import UserError, log as _log
from .image_folder import ImageFolder, read_image

TORCHVISION_FOLDERS = {"cifar-10-batches-py": "CIFAR10", "cifar-100-python": "CIFAR100"}


def log(message: str) -> None:
    _log(message, stage="data")


@dataclass
class ImageTensors:
    """``images`` (N, H, W, 3) uint8, ``targets`` (N,) int64, the class names, and where they
    came from (``source``: a description for logs and results)."""

    images: Tensor
    targets: Tensor
    classes: List[str]
    source: str

    def __len__(self) -> int:
        return self.images.size(0)

    def fingerprint(self) -> str:
        """sha256 of the pixels, labels and class names: what a result was computed on."""
        digest = hashlib.sha256()
        digest.update(self.images.contiguous().numpy().tobytes())
        digest.update(self.targets.numpy().tobytes())
        digest.update("\n".join(self.classes).encode())
        return digest.hexdigest()[:16]

    def subset(self, index: Tensor, source: str) -> "ImageTensors":
        return ImageTensors(self.images[index], self.targets[index], self.classes, source)

    def split_off(self, count: int, seed: int = 0) -> Tuple["ImageTensors", "ImageTensors"]:
        """(the rest, ``count`` held-out images): the same number from every class (as near as
        ``count`` allows), chosen by ``seed`` alone, so every run holds out the same images."""
        if not 0 < count < len(self):
            raise UserError(f"cannot hold out {count} of {len(self)} images for validation")
        generator = torch.Generator().manual_seed(seed)
        held = []
        per_class = count // len(self.classes)
        extra = count - per_class * len(self.classes)
        for c in range(len(self.classes)):
            members = (self.targets == c).nonzero().flatten()
            members = members[torch.randperm(members.numel(), generator=generator)]
            held.append(members[: per_class + (1 if c < extra else 0)])
        held_index = torch.cat(held).sort().values
        keep = torch.ones(len(self), dtype=torch.bool)
        keep[held_index] = False
        rest_index = keep.nonzero().flatten()
        return (self.subset(rest_index, f"{self.source} less {count} held out (seed {seed})"),
                self.subset(held_index, f"{count} held out of {self.source} (seed {seed})"))


def torchvision_layout(root: str) -> Optional[Tuple[str, str]]:
    """(torchvision's root, dataset class name) if ``root`` is, or holds, a torchvision CIFAR download."""
    root = os.path.normpath(root)
    for folder, name in TORCHVISION_FOLDERS.items():
        if os.path.isdir(os.path.join(root, folder)):
            return root, name
        if os.path.basename(root) == folder:
            return os.path.dirname(root) or ".", name
    return None


def _load_torchvision(root: str, name: str, split: str) -> ImageTensors:
    try:
        import torchvision.datasets
    except ImportError as err:
        raise UserError(f"{root} is a torchvision {name} download: reading it needs torchvision"
                        " (pip install torchvision), or give an ImageFolder") from err
    if split not in ("train", "test"):
        raise UserError(f"a torchvision {name} download has the splits train and test, not {split!r}")
    try:
        dataset = getattr(torchvision.datasets, name)(root, train=split == "train", download=False)
    except RuntimeError as exc:  # torchvision checks every file's checksum
        raise UserError(f"{root}: its torchvision {name} download is incomplete or damaged ({exc}); download it"
                        f" again (torchvision.datasets.{name}(root, download=True)), or give an ImageFolder") from None
    images = torch.from_numpy(dataset.data).contiguous()
    return ImageTensors(images, torch.tensor(dataset.targets, dtype=torch.int64), list(dataset.classes),
                        f"torchvision {name} {split}")


def _load_image_folder(folder: str, split: str) -> ImageTensors:
    try:
        dataset = ImageFolder(folder)
    except (FileNotFoundError, ValueError) as exc:
        raise UserError(str(exc)) from None
    n = len(dataset)
    images: Optional[Tensor] = None
    step = max(n // 10, 1)
    for i, (path, _) in enumerate(dataset.samples):
        try:
            img = read_image(path)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        w, h = img.size
        if images is None:
            images = torch.empty(n, h, w, 3, dtype=torch.uint8)
        if (h, w) != tuple(images.shape[1:3]):
            raise UserError(f"{path} is {w}x{h}, the first image {images.size(2)}x{images.size(1)}: every image of"
                            " an in-memory set must have one size (resize them first)")
        images[i] = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(h, w, 3)
        if (i + 1) % step == 0 or i + 1 == n:
            log(f"{split}: decoded {i + 1:,}/{n:,} images")
    targets = torch.tensor([t for _, t in dataset.samples], dtype=torch.int64)
    return ImageTensors(images, targets, dataset.classes, f"ImageFolder {split}/")


def load_split(root: str, split: str, option: str = "--data-dir") -> ImageTensors:
    """The ``split`` (``train`` or ``test``) of the data set at ``root``, decoded into memory.
    An ImageFolder without ``test/`` gives its ``val/`` as the test split. ``option``: the
    command's option that gave ``root``, named in the error for a missing folder."""
    if not os.path.isdir(root):
        raise UserError(f"{option} {root}: no such folder")
    layout = torchvision_layout(root)
    if layout:
        return _load_torchvision(*layout, split)
    folder = os.path.join(root, split)
    if split == "test" and not os.path.isdir(folder) and os.path.isdir(os.path.join(root, "val")):
        folder = os.path.join(root, "val")
    if not os.path.isdir(folder):
        raise UserError(f"{root} holds no {split}/ folder (an ImageFolder: SPLIT/CLASS/IMAGE) and no torchvision"
                        f" download ({', '.join(TORCHVISION_FOLDERS)})")
    return _load_image_folder(folder, os.path.basename(folder))
