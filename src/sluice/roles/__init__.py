"""The producer and consumer roles of TS 28.105 training management, in memory, and their 3GPP rendering.

A :class:`Producer` serves training requests with its own engines: it negotiates the termination parameters
(:func:`negotiate`, deciding as :func:`sluice.control.propose` says), judges feasibility, and trains in the
background: ``Producer.start(request)`` returns a :class:`ProcessHandle` to query, update, suspend, resume,
cancel or wait on, kept in a :class:`ProcessRegistry` by id. A :class:`Consumer` asks one or more producers
(:func:`train_many`). :mod:`sluice.roles.threegpp` renders requests, processes and reports in 3GPP terms; the
management service (:mod:`sluice.service`) uses it for the same resources over REST.
"""

from sluice.roles.consumer import Consumer, train_many
from sluice.roles.handles import ProcessHandle, ProcessRegistry, UnknownProcessError
from sluice.roles.negotiation import Agreement, negotiate
from sluice.roles.producer import Producer, RequestRefused, RequestResponse, TrainingRequest

__all__ = ["Agreement", "Consumer", "ProcessHandle", "ProcessRegistry", "Producer", "RequestRefused",
           "RequestResponse", "TrainingRequest", "UnknownProcessError", "negotiate", "train_many"]
