"""seal-lite's errors: every error a user can cause or fix is a ``SealLiteError``.

The CLI turns any of them into one clean message and a non-zero exit (``cli.SealLiteGroup``); a library caller
catches ``SealLiteError`` once. Each module raises the subclass that names its subject; the message says what to
do. Errors that only a bug can cause stay plain Python exceptions and keep their traceback.
"""


class SealLiteError(Exception):
    """Something a user can fix: a recipe, a model, a run directory, a backend, the machine."""


class ConfigError(SealLiteError, ValueError):
    """A recipe, an option or an input line that cannot be used as given."""


class ModelError(SealLiteError, RuntimeError):
    """A model, adapter or backend that cannot be found, loaded or reached."""


class RunError(SealLiteError, RuntimeError):
    """A run directory or store that cannot be used as asked (finished, different recipe, full disk...)."""
