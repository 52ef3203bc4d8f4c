"""Pickle payloads that run code when unpickled, for the security tests.

Each creates ``marker`` when it runs, so a test asserts that the file does
not exist after a load path refused (or ignored) it.
"""
import os


class SystemPayload:
    """Unpickling this runs a shell command that creates the marker."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f'touch {self.marker}', ))


class ExecPayload(SystemPayload):
    """Unpickling this runs Python source that creates the marker."""

    def __reduce__(self):
        return (exec, (f'open({self.marker!r}, "w").close()', ))
