"""The errors that mean "the input or the configuration is wrong": entry points print them as one line."""

from mt.checkpoint import CheckpointError
from mt.config import ConfigError
from mt.data import DataError
from mt.tokenizer import TokenizerError
from mt.training import TrainingError

USER_ERRORS = (CheckpointError, ConfigError, DataError, TokenizerError, TrainingError)
