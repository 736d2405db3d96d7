"""Horizontal FL across real hosts on Flower's deployment engine (``pip install 'sluice[flower]'``).

:mod:`sluice.runtimes.flower.app` is the Flower App (a ServerApp driving :class:`sluice.hfl.Server` under the
control plane, a ClientApp running :class:`sluice.hfl.Client`), :mod:`sluice.runtimes.flower.engine` the server loop
as a Sluice engine (:mod:`sluice.runtimes.flower.rounds`: rounds no node answers),
:mod:`sluice.runtimes.flower.deploy` the local deployment and the submission of a job, and
:mod:`sluice.runtimes.flower.certs` the certificates of a TLS deployment. Importing this package imports no Flower.
"""
