"""Links between parties; what crosses them is encoded by :mod:`sluice.wire.tensor` (every byte count is ``len()``).

- :mod:`~sluice.transport.link`: the link interface, inbox and byte meters;
- :mod:`~sluice.transport.emulated`: in-process link with token-bucket bandwidth and latency;
- :mod:`~sluice.transport.grpc_link`: gRPC bidirectional stream, optional mutual TLS;
- :mod:`~sluice.transport.netns`: Linux network namespaces joined by a veth pair shaped with ``tc tbf``.

The modules are the interface (nothing is re-exported here).
"""

__all__: list[str] = []
