"""Small torch models and flat-vector views of their parameters."""

from sluice.models.flat import get_flat, num_params, output_layer, set_flat
from sluice.models.mlp import mlp

__all__ = ["get_flat", "mlp", "num_params", "output_layer", "set_flat"]
