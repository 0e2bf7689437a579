"""The errors that mean "the input or the configuration is wrong": entry points print them as one line. Each
stage raises its own kind; all of them are defined here, at the bottom of the package, so that any stage can raise
or catch another's without importing it."""

from mt.config import ConfigError


class DataError(ValueError):
    """Unusable input data; the message names the file (and line) and what to do."""


class TokenizerError(ValueError):
    """A tokenizer file that cannot be used; the message names it and what to do."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and what to do."""


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. repeated non-finite losses); the message says what to do."""


USER_ERRORS = (CheckpointError, ConfigError, DataError, TokenizerError, TrainingError)
