"""Small torch models and flat-vector views of their parameters."""

from sluice.models.flat import (
           get_buffers,
           get_flat,
           layers,
           num_buffers,
           num_params,
           output_layer,
           set_buffers,
           set_flat,
)
from sluice.models.mlp import mlp

__all__ = ["get_buffers", "get_flat", "layers", "mlp", "num_buffers", "num_params", "output_layer", "set_buffers",
           "set_flat"]
