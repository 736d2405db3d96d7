"""Horizontal FL across real hosts on Flower's deployment engine (``pip install 'sluice[flower]'``).

:mod:`sluice.flower.app` is the Flower App (a ServerApp driving :class:`sluice.hfl.Server` under the
control plane, a ClientApp running :class:`sluice.hfl.Client`), :mod:`sluice.flower.engine` the server loop
as a Sluice engine (:mod:`sluice.flower.rounds`: rounds no node answers), :mod:`sluice.flower.deploy` the
local deployment and the submission of a job, and :mod:`sluice.flower.certs` the certificates of a TLS
deployment. Importing this package imports no Flower.
"""
