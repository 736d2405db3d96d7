"""Published compression methods ("peers") on Sluice's own HFL engine, under Sluice's byte accounting.

Each peer is a server half and a client half with the constructors and methods of
:class:`sluice.hfl.server.Server` and :class:`sluice.hfl.client.Client`, so :class:`sluice.hfl.engine.HFLEngine`
drives it unchanged (``HFLEngine(cfg, server_cls=..., client_cls=...)``): the same client sampling, data,
local training (:meth:`sluice.hfl.client.Client.local_update`, the same seeds) and the same byte
count, ``len()`` of every encoded message. Only the compression differs. Every message is real bytes that
the other half decodes: vector payloads (:mod:`sluice.wire.vector`) or, for the ternary and quantised codes,
a raw frame of updates (:mod:`sluice.wire.updates`); either way it carries a CRC-32, and a corrupted message
raises :class:`WireError`. Nothing crosses between the halves beside the bytes except what Sluice's own
halves share: the configuration (its seed) and the round number.

:data:`PEERS` maps a display name to ``(server class, client class, config overrides)``. The ratios come
from the configuration where their meaning matches the method's, so a benchmark can put every method on the
same budget: ``compression.up_ratio`` is the share of coordinates a client sends (STC's p_up, DGC's
density), ``compression.down_ratio`` the share the server applies and sends (STC's p_down, FetchSGD's k/d;
when unset, the share Sluice's own server applies in a round where every sampled client uploads),
``compression.momentum`` FetchSGD's server momentum ρ, ``compression.sketch_rows`` /
``sketch_cols_ratio`` FetchSGD's sketch shape and ``train.server_lr`` the server step size (1 in every paper).
Each method's other hyper-parameters sit in a small frozen dataclass (the class attribute ``hparams``), set
to the values its paper recommends.

One module per method holds its halves, its settings and, in its docstring, its paper and how it is carried
over: :mod:`sluice.hfl.baselines.stc`, :mod:`sluice.hfl.baselines.fetchsgd`, :mod:`sluice.hfl.baselines.dgc` and
:mod:`sluice.hfl.baselines.qsgd`; what they share is private to this package.

**FedAvg** (McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017). Sluice's own halves with everything dense: fp32 updates up, the fp32 model down, the plain
weighted average applied. It is the uncompressed reference.
"""

from __future__ import annotations

from sluice.hfl.baselines.dgc import DGCClient, DGCParams, DGCServer
from sluice.hfl.baselines.fetchsgd import FetchSGDClient, FetchSGDParams, FetchSGDServer
from sluice.hfl.baselines.qsgd import QSGDClient, QSGDParams, QSGDServer
from sluice.hfl.baselines.stc import STCClient, STCParams, STCServer
from sluice.hfl.client import Client
from sluice.hfl.server import Server

__all__ = [
    "PEERS",
    "DGCClient",
    "DGCParams",
    "DGCServer",
    "FetchSGDClient",
    "FetchSGDParams",
    "FetchSGDServer",
    "QSGDClient",
    "QSGDParams",
    "QSGDServer",
    "STCClient",
    "STCParams",
    "STCServer",
]


# ---------------------------------------------------------------------------------------------- registry
PEERS: dict[str, tuple[type, type, list[str]]] = {
    "FedAvg": (Server, Client, ['compression.up="dense"', 'compression.down="dense"',
                                'compression.downlink="dense"']),
    "STC": (STCServer, STCClient, ['compression.up="topk"', "compression.up_by_weight=0", 'compression.down="topk"',
                                   'compression.downlink="per-client"']),
    "FetchSGD": (FetchSGDServer, FetchSGDClient, ['compression.up="sketch"', 'compression.up_values="fp32"',
                                                  'compression.down="topk"', 'compression.momentum=0.9',
                                                  'compression.downlink="per-client"']),
    "DGC": (DGCServer, DGCClient, ['compression.up="topk"', "compression.up_by_weight=0",
                                   'compression.up_values="fp32"', 'compression.down="dense"',
                                   'compression.downlink="dense"']),
    "QSGD 8-bit": (QSGDServer, QSGDClient, ['compression.up="dense"', 'compression.down="dense"',
                                            'compression.downlink="per-client"']),
}
"""Display name -> (server class, client class, configuration overrides the method needs or implies).

The overrides describe each method in Sluice's configuration terms (what travels up, whether the server
applies a sparse or dense step, which downlink; every upload of STC and DGC keeps the same share); the classes
read only the ratios, the sketch shape, the momentum (FetchSGD's ρ = 0.9 is set here) and the training settings
from the configuration."""
