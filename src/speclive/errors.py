"""Exception types users can catch; each message says what went wrong and what to do."""


class SpecliveError(Exception):
    """Base class of every error speclive raises on purpose."""


class UnknownModelError(SpecliveError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class HashMismatchError(SpecliveError):
    """An assembled model file does not have the SHA-256 the registry promises."""


class ContextOverflowError(SpecliveError, ValueError):
    """A prompt (plus what must fit after it) is longer than the model's context window."""


class ConfigError(SpecliveError, ValueError):
    """An option has a value outside its allowed set."""


class BackendUnavailableError(SpecliveError, ImportError):
    """A backend's optional dependency is missing."""


class SessionClosedError(SpecliveError, RuntimeError):
    """A streaming session was used after ``finish()``."""


class EngineUnavailableError(SpecliveError, RuntimeError):
    """A remote engine (a vLLM replica) cannot be reached or answered with an error."""
