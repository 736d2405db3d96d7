"""Your own PyTorch model and data under Sluice: a CNN on 8x8 digits, split over 10 clients, compressed both ways."""
import argparse

import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset, random_split

import sluice


def cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32 * 4 * 4, 10))


def task() -> sluice.Task:
    X, y = load_digits(return_X_y=True)
    images = torch.tensor(X, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16
    data = TensorDataset(images, torch.tensor(y))
    train, test = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(0))
    clients = random_split(train, [0.1] * 10, generator=torch.Generator().manual_seed(1))
    return sluice.Task(model=cnn, train=clients, test=test, name="digits-cnn-example")


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", help="run directory")
    p.add_argument("--rounds", type=int, default=60)
    args = p.parse_args()
    job = {"train": {"participation": 0.3, "lr": 0.1},
           "termination": {"iterations": args.rounds, "performance": {"accuracy": {"threshold": 0.95}}}}
    raise SystemExit(sluice.run_task(task(), job, out=args.out))
