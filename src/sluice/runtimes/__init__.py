"""Where a job is assembled and where its halves run.

- :mod:`~sluice.runtimes.jobs`: the one place a job (``hfl``, ``local``, ``split`` or a registered kind) is built
  from its configuration;
- :mod:`~sluice.runtimes.training`: one job trained into a run directory under the control plane (``sluice run``,
  ``sluice local``, ``sluice split run``);
- :mod:`~sluice.runtimes.remote`: one job trained as a worker steered over a connection (the management
  service's workers, the Flower ServerApp);
- :mod:`~sluice.runtimes.api`: :func:`sluice.run_task`, the same from Python;
- :mod:`~sluice.runtimes.flower`: the HFL halves on Flower's deployment engine and on its Simulation Engine;
- :mod:`~sluice.runtimes.plots`: a run directory's plots.
"""
