"""Datasets, partitioners and scenario generators (no downloads: everything is embedded or generated)."""

from sluice.data.datasets import Dataset, load_dataset
from sluice.data.federated import FederatedData, load_federated
from sluice.data.partition import label_histogram, partition
from sluice.data.synthetic import synthetic

__all__ = [
    "Dataset",
    "FederatedData",
    "label_histogram",
    "load_dataset",
    "load_federated",
    "partition",
    "synthetic",
]
