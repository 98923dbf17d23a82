"""ImageFolder data without torchvision: Pillow for decoding, torch for everything else.

Layout: ``root/<class name>/<image>``; classes are the sorted sub-folder names. Pillow is
an optional dependency (``pip install fairseq-sret[vision]``), imported on first use.
"""

import hashlib
import math
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.utils.data import Dataset

from fairseq_sret.vision.registry import IMAGENET_MEAN, IMAGENET_STD

IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp", ".gif")


def _pil():
    try:
        from PIL import Image
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("image loading needs Pillow: pip install 'fairseq-sret[vision]'") from err
    return Image


def to_tensor(img, mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD) -> Tensor:
    """RGB PIL image -> normalised float tensor (3, H, W)."""
    w, h = img.size
    x = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(h, w, 3)
    x = x.permute(2, 0, 1).float().div_(255)
    mean_t = torch.tensor(mean).view(3, 1, 1)
    std_t = torch.tensor(std).view(3, 1, 1)
    return (x - mean_t) / std_t


class TrainTransform:
    """Random resized crop (scale 0.08-1, aspect 3/4-4/3, bicubic) + horizontal flip.

    The geometric part of the DeiT/SReT training augmentation; random numbers come from
    torch, so ``torch.manual_seed`` (and DataLoader worker seeding) make it reproducible.
    """

    def __init__(self, size: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), hflip: float = 0.5):
        self.size, self.scale, self.ratio, self.hflip = size, scale, ratio, hflip

    def _crop_box(self, width: int, height: int) -> Tuple[int, int, int, int]:
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * torch.empty(1).uniform_(*self.scale).item()
            aspect = math.exp(torch.empty(1).uniform_(*log_ratio).item())
            w = int(round(math.sqrt(target * aspect)))
            h = int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                left = int(torch.randint(0, width - w + 1, (1,)))
                top = int(torch.randint(0, height - h + 1, (1,)))
                return left, top, left + w, top + h
        # fallback: the largest centred crop within the aspect range
        aspect = width / height
        if aspect < self.ratio[0]:
            w, h = width, int(round(width / self.ratio[0]))
        elif aspect > self.ratio[1]:
            w, h = int(round(height * self.ratio[1])), height
        else:
            w, h = width, height
        left, top = (width - w) // 2, (height - h) // 2
        return left, top, left + w, top + h

    def __call__(self, img) -> Tensor:
        image = _pil()
        box = self._crop_box(*img.size)
        img = img.resize((self.size, self.size), image.BICUBIC, box=box)
        if torch.rand(1).item() < self.hflip:
            img = img.transpose(image.FLIP_LEFT_RIGHT)
        return to_tensor(img)


class EvalTransform:
    """Resize the shorter side to ``size / crop_pct`` (bicubic), centre crop ``size``."""

    def __init__(self, size: int, crop_pct: float = 0.875):
        self.size, self.crop_pct = size, crop_pct

    def __call__(self, img) -> Tensor:
        image = _pil()
        w, h = img.size
        short = int(math.floor(self.size / self.crop_pct))
        if w <= h:
            new_w, new_h = short, max(short, int(round(h * short / w)))
        else:
            new_w, new_h = max(short, int(round(w * short / h))), short
        img = img.resize((new_w, new_h), image.BICUBIC)
        left, top = (new_w - self.size) // 2, (new_h - self.size) // 2
        return to_tensor(img.crop((left, top, left + self.size, top + self.size)))


def scan_classes(root: str, classes: Sequence[str]) -> List[Tuple[str, int]]:
    """``(image path, class index)`` of every image under ``root/<class>``, links followed.

    A folder or image reached twice (a link loop, or a link into another class's folder,
    which would duplicate images and give them a second label) raises ``ValueError`` naming
    the link, instead of walking forever or training on mislabelled copies; so does a
    broken link.
    """
    seen: Dict[Tuple[int, int], str] = {}  # (device, inode) -> the first path it was reached by

    def linked(path: str) -> bool:
        """Does ``path`` pass through a symbolic link below ``root``?"""
        parts = os.path.relpath(path, root).split(os.sep)
        return any(os.path.islink(os.path.join(root, *parts[: i + 1])) for i in range(len(parts)))

    def visit(path: str) -> None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            raise ValueError(f"{path} is a broken link: remove it, or restore what it points to") from None
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen[key] = path
            return
        link, target = (path, seen[key]) if linked(path) or not linked(seen[key]) else (seen[key], path)
        if os.path.commonpath([os.path.abspath(target), os.path.abspath(link)]) == os.path.abspath(target):
            what = "a link loop"
        else:
            what = f"a second path to images of class '{os.path.relpath(target, root).split(os.sep)[0]}'"
        raise ValueError(f"{link} leads to {target} ({what}): each image must be reached once, in the folder of its"
                         " class; remove the link, or copy the images")

    visit(root)
    for name in classes:
        visit(os.path.join(root, name))
    samples = []
    for index, name in enumerate(classes):
        for dirpath, dirnames, files in os.walk(os.path.join(root, name), followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for sub in dirnames:
                visit(os.path.join(dirpath, sub))
            for file in sorted(files):
                if file.lower().endswith(IMG_EXTENSIONS) and not file.startswith("."):
                    path = os.path.join(dirpath, file)
                    if not os.path.isfile(path):  # a FIFO or device would block or fail the reader
                        raise ValueError(f"{path} is not a regular file: remove it from the image folder")
                    visit(path)
                    samples.append((path, index))
    return sorted(samples)


def check_classes(root: str, classes: Sequence[str], samples: Sequence[Tuple[str, int]]) -> None:
    """ValueError for a class folder without images (a class no image teaches, which the model
    would still predict) or a single class (every prediction right, whatever was learnt)."""
    counts = [0] * len(classes)
    for _, index in samples:
        counts[index] += 1
    empty = [os.path.join(root, name) for name, count in zip(classes, counts) if not count]
    if empty:
        raise ValueError(f"{empty[0]}{f' and {len(empty) - 1} more' if len(empty) > 1 else ''}: a class folder"
                         f" with no images ({', '.join(IMG_EXTENSIONS)}); add its images, or remove the folder")
    if len(classes) < 2:
        raise ValueError(f"{root} holds one class ({classes[0]!r}): a classifier needs two or more class folders")


def read_image(path: str):
    """The image at ``path`` as RGB; ValueError naming the file when it cannot be decoded
    (damaged, cut short, not an image, or too large to decode safely)."""
    image = _pil()
    try:
        with open(path, "rb") as f:
            return image.open(f).convert("RGB")
    except (OSError, image.DecompressionBombError) as exc:
        raise ValueError(f"{path}: not a readable image ({exc}); remove or replace it") from None


class ImageFolder(Dataset):
    """``root/<class>/<image>`` -> ``(image tensor, class index)`` (plus the index with
    ``return_index=True``, used to look up pre-computed teacher logits)."""

    def __init__(self, root: str, transform: Optional[Callable] = None, return_index: bool = False):
        if not os.path.isdir(root):
            raise FileNotFoundError(f"image folder {root!r} does not exist")
        self.root = root
        # hidden folders (.ipynb_checkpoints, .git) are not classes
        self.classes: List[str] = sorted(e.name for e in os.scandir(root) if e.is_dir() and not e.name.startswith("."))
        if not self.classes:
            raise FileNotFoundError(f"no class sub-folders in {root!r}")
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples: List[Tuple[str, int]] = scan_classes(root, self.classes)
        if not self.samples:
            raise FileNotFoundError(f"no images ({', '.join(IMG_EXTENSIONS)}) under {root!r}")
        check_classes(root, self.classes, self.samples)
        self.transform = transform
        self.return_index = return_index

    def fingerprint(self) -> str:
        """sha256 of every image's path below the root, class and bytes (every byte of every
        file: :mod:`fairseq_sret_cli.fingerprints`): the data a run trained on (moving or copying
        the folder keeps it; another image set, or an image edited in place, changes it)."""
        from .fingerprints import file_digest, full

        digest = hashlib.sha256()
        for index, (path, target) in enumerate(self.samples):
            digest.update(f"{self.relative_path(index)}\t{target}\t{file_digest(path)}\n".encode())
        return full(digest)

    def legacy_fingerprint(self) -> str:
        """The fingerprint checkpoints recorded before :meth:`fingerprint` read the images' bytes
        (paths, classes and sizes): a resume compares a checkpoint that records it with it."""
        digest = hashlib.sha256()
        for index, (path, target) in enumerate(self.samples):
            digest.update(f"{self.relative_path(index)}\t{target}\t{os.path.getsize(path)}\n".encode())
        return digest.hexdigest()[:16]

    def relative_path(self, index: int) -> str:
        return os.path.relpath(self.samples[index][0], self.root).replace(os.sep, "/")

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int):
        path, target = self.samples[index]
        img = read_image(path)
        if self.transform is not None:
            img = self.transform(img)
        return (img, target, index) if self.return_index else (img, target)
