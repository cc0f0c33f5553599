"""User-facing errors.

`ConfigError` is raised for anything a user can fix by changing a config key or an
input: entry points print it as one line (naming the key) and exit with status 2,
without a traceback. Library code raises it as early as the bad value is known.
"""


class ConfigError(ValueError):
    """A bad config value or input. `key` names the config key to change."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"{key}: {message}")


def require(condition: bool, key: str, message: str) -> None:
    """Raise `ConfigError(key, message)` unless `condition` holds."""
    if not condition:
        raise ConfigError(key, message)
