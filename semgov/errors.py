"""One error root for everything semgov reports to a user.

Every error carries a ``source`` (file, or ``<stdin>``), an optional ``line``
and ``field``, and renders as ``source:line: field: message`` so that
diagnostics point at the exact place to fix.
"""

from __future__ import annotations


class SemgovError(Exception):
    """Root of all user-facing semgov errors."""

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.source = source
        self.line = line
        self.field = field

    def diagnostic(self) -> str:
        """Render as ``source:line: field: message`` (parts omitted when unknown)."""
        where = ""
        if self.source is not None:
            where = self.source
            if self.line is not None:
                where += f":{self.line}"
            where += ": "
        what = f"{self.field}: " if self.field else ""
        return f"{where}{what}{self.message}"

    def __str__(self) -> str:
        return self.diagnostic()


class InputError(SemgovError):
    """A captured request, keyring or other input document is malformed."""


class PolicyError(SemgovError):
    """A policy file cannot be loaded (syntax, unknown key, wrong type, bad value).

    ``others``: the further problems found in the same pass (``semgov policy check`` lists them
    all; the message says how many there are).
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        line: int | None = None,
        field: str | None = None,
        others: tuple[PolicyError, ...] = (),
    ) -> None:
        super().__init__(message, source=source, line=line, field=field)
        self.others = others

    def all_diagnostics(self) -> list[str]:
        """This problem's diagnostic and every other one found with it, in file order."""
        return [self.diagnostic(), *(o.diagnostic() for o in self.others)]


class KeyFileError(SemgovError):
    """A key file or keyring entry is missing, unreadable or of the wrong kind."""


class SignatureError(SemgovError):
    """A signature does not verify."""


class BundleError(SemgovError):
    """A policy bundle is malformed, tampered with, untrusted or older than the one running
    (``source``: the bundle, ``field``: the member of it at fault)."""
