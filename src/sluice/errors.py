"""Exceptions a user can cause. Each message says what was wrong and what is allowed."""


class SluiceError(Exception):
    """Base class of every error Sluice raises on purpose."""


class ConfigError(SluiceError):
    """A configuration value or request field is invalid."""


class DataError(SluiceError):
    """A dataset or partition cannot be built as asked."""


class WireError(SluiceError):
    """A payload is truncated, corrupted or of an unsupported version."""


class TransportError(SluiceError):
    """A link failed: the peer died, stalled past its timeout or refused the connection."""


class NegotiationError(SluiceError):
    """Parties could not agree on a task (dataset, samples, model, parameters)."""


class TrainingError(SluiceError):
    """Training could not go on (for example the model diverged)."""


class TaskError(ConfigError):
    """A task cannot be built or its parts do not fit (model, data, loss, optimizer, device)."""
