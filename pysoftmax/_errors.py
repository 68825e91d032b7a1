"""Exceptions raised by pysoftmax."""


class SoftmaxError(RuntimeError):
    """The library or the GPU runtime refused a call; carries the library's message and status."""

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class LibraryNotFoundError(SoftmaxError, ImportError):
    """libsoftmax.so is missing or incompatible: run ``make``."""
