"""The embedded demo: scikit-learn's handwritten digits as PNG files, and a small CNN trained on them.

`prepare_demo(workdir)` writes the images in ImageFolder layout (one folder per class, named 0..9), a labels
file, and the trained weights; each step is skipped when its output is already there, so `make run` trains
once. Training reads the PNG files through the same preprocessing the job uses, so the job sees exactly the
inputs the model was trained on.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image
from torch import nn

from spark_cnn.errors import missing_extra
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.models.tensors import normalise

DIGITS_FACTORY = "spark_cnn.models.digits:digits_cnn"
# 8x8 digits upscaled to 32x32: two 2x poolings leave an 8x8 map, as large as the original image.
DIGITS_PREPROCESSING = Preprocessing(resize=32, crop=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
# Seconds on 2 CPU cores; reaches ~0.99 accuracy on the held-out third of the digits.
TRAIN_EPOCHS = 12
TRAIN_BATCH = 64
TRAIN_SEED = 0


class DigitsCNN(nn.Module):
    """Two conv blocks and two linear layers: ~140 k parameters, 10 classes, 3x32x32 input."""

    spark_cnn_preprocessing = DIGITS_PREPROCESSING.to_dict()

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Sequential(nn.Flatten(), nn.Linear(32 * 8 * 8, 64), nn.ReLU(),
                                        nn.Linear(64, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def digits_cnn() -> DigitsCNN:
    """Factory for `--model spark_cnn.models.digits:digits_cnn`."""
    return DigitsCNN()


@dataclass(frozen=True)
class DemoAssets:
    images: str    # ImageFolder root: images/<digit>/<index>.png
    labels: str    # one class name per line: 0..9
    weights: str   # state_dict of DigitsCNN
    train_accuracy: float | None = None


def write_digit_images(root: str) -> tuple[str, str]:
    """The 1,797 scikit-learn digits as 8x8 grayscale PNGs under root/images/<digit>/, and root/labels.txt."""
    try:
        from sklearn.datasets import load_digits
    except ImportError as e:
        raise missing_extra("scikit-learn", "demo", "the demo's digits") from e

    images_dir, labels_path = os.path.join(root, "images"), os.path.join(root, "labels.txt")
    done_marker = os.path.join(root, ".images-complete")
    if not os.path.exists(done_marker):
        digits = load_digits()
        for index, (pixels, target) in enumerate(zip(digits.images, digits.target, strict=True)):
            folder = os.path.join(images_dir, str(target))
            os.makedirs(folder, exist_ok=True)
            gray = np.round(pixels * (255.0 / 16.0)).astype(np.uint8)  # sklearn digits are 0..16
            Image.fromarray(gray, mode="L").save(os.path.join(folder, f"{index:04d}.png"))
        with open(labels_path, "w") as f:
            f.write("\n".join(str(d) for d in range(10)) + "\n")
        open(done_marker, "w").close()
    return images_dir, labels_path


def load_folder(images_dir: str, prep: Preprocessing) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(N, H, W, 3) uint8 pixels, int labels and paths of an ImageFolder tree with digit-named classes."""
    pixels, labels, paths = [], [], []
    for label in range(10):
        folder = os.path.join(images_dir, str(label))
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                pixels.append(preprocess_pixels(f.read(), prep))
            labels.append(label)
            paths.append(path)
    return np.stack(pixels), np.array(labels), paths


def train_digits(images_dir: str, weights_path: str) -> float:
    """Train DigitsCNN on two thirds of the digits; save its state_dict; return accuracy on the other third."""
    torch.manual_seed(TRAIN_SEED)
    pixels, labels, _ = load_folder(images_dir, DIGITS_PREPROCESSING)
    inputs = normalise(torch.from_numpy(pixels), DIGITS_PREPROCESSING)
    targets = torch.from_numpy(labels)
    order = torch.randperm(len(targets), generator=torch.Generator().manual_seed(TRAIN_SEED))
    held_out, train = order[: len(order) // 3], order[len(order) // 3:]
    model = DigitsCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=2e-3)
    for _ in range(TRAIN_EPOCHS):
        model.train()
        for batch in train[torch.randperm(len(train))].split(TRAIN_BATCH):
            optimiser.zero_grad()
            nn.functional.cross_entropy(model(inputs[batch]), targets[batch]).backward()
            optimiser.step()
    model.eval()
    with torch.inference_mode():
        accuracy = (model(inputs[held_out]).argmax(1) == targets[held_out]).float().mean().item()
    os.makedirs(os.path.dirname(weights_path) or ".", exist_ok=True)
    tmp = weights_path + ".tmp"
    torch.save(model.state_dict(), tmp)
    os.replace(tmp, weights_path)
    return accuracy


def prepare_demo(workdir: str) -> DemoAssets:
    """Images, labels and trained weights under `workdir`, each made once and reused afterwards."""
    images_dir, labels_path = write_digit_images(workdir)
    weights = os.path.join(workdir, "digits_cnn.pt")
    accuracy = None
    if not os.path.exists(weights):
        accuracy = train_digits(images_dir, weights)
    return DemoAssets(images=images_dir, labels=labels_path, weights=weights, train_accuracy=accuracy)
