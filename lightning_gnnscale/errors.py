"""Errors shared by every layer (a leaf module: it imports nothing of the suite)."""


class ConfigError(ValueError):
    """A bad config value; the message names the key and the valid choices."""
