"""The Sluice wire format: every byte Sluice sends, and so every byte it counts, is produced here.

- :mod:`~sluice.wire.frame`: the shared frame (magic, format version 2, kind byte, CRC-32), the kind
  registry and LEB128 varints;
- :mod:`~sluice.wire.vector`: vector payloads of federated training (dense, sparse, count sketch, patch
  chain) and their index codings;
- :mod:`~sluice.wire.tensor`: messages of split training (tensors, JSON control messages, raw probes);
- :mod:`~sluice.wire.updates`: the ternary and quantised update messages of the published methods;
- :mod:`~sluice.wire.state`: state trees (checkpoints of every engine) as bytes;
- :mod:`~sluice.wire.dtypes`: the one table of element types (names, codes, wire layouts).

Malformed, corrupted, old-format or unknown messages raise :class:`sluice.errors.WireError`. The modules are
the interface: other packages import what they use from them (``sluice.wire.vector.encode``,
``sluice.wire.state.pack``...), so this package re-exports nothing.
"""

__all__: list[str] = []
