"""Policy rules shared by every policy language: namespace patterns and sharing rules, and
compatible task groups. The YAML model uses them as sections; the Rego loader validates a Rego
policy's ``namespace_sharing`` and ``compatible_task_groups`` constants with the same models, so
both languages accept exactly the same rules."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

_SEGMENT = re.compile(r"[A-Za-z0-9_.:@-]+")  # NOTE: fullmatch: `$` would admit a trailing newline


class StrictSection(BaseModel):
    """A policy section: unknown keys, coercions and mutation are refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def well_formed_namespace(ns: str) -> bool:
    """Segments of ``[A-Za-z0-9_.:@-]+`` joined by ``/``, none of them ``.`` or ``..``."""
    return bool(ns) and all(s not in (".", "..") and _SEGMENT.fullmatch(s) for s in ns.split("/"))


def _check_namespace_pattern(p: str) -> str:
    """Exact namespace, or ``prefix/*`` for every namespace below ``prefix/``."""
    body = p[:-2] if p.endswith("/*") else p
    if not well_formed_namespace(body):
        raise ValueError(
            f"bad namespace pattern {p!r}: use an exact namespace like 'research/shared' "
            "or a subtree like 'research/*' (segments of A-Z a-z 0-9 _ . : @ -; "
            "no empty, '.', '..' or wildcard segments; '*' only as the whole last segment)"
        )
    return p


def namespace_matches(pattern: str, namespace: str) -> bool:
    """Whether a sharing-rule pattern covers ``namespace``; compared byte for byte, never normalised.

    ``prefix/*`` covers every well-formed namespace strictly below ``prefix/``: one whose
    segments all use the pattern alphabet and are not ``.`` or ``..`` (so ``research/../legal``
    and ``research//x`` are not below ``research/``). Any other pattern covers itself only.
    """
    if pattern.endswith("/*"):
        prefix = pattern[:-1]
        return (
            namespace.startswith(prefix) and len(namespace) > len(prefix) and well_formed_namespace(namespace)
        )
    return namespace == pattern


class RequestScope(StrictSection):
    """Which requests a scoped rule covers: every key given must match the request (an omitted
    key matches any); at least one key. ``task`` is ``"id@version"`` with exactly one ``@``,
    compared as a pair; ``namespace`` is an exact namespace or ``prefix/*`` (as in sharing rules).
    """

    tenant: Annotated[str, StringConstraints(min_length=1)] | None = None
    namespace: str | None = None
    task: Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+$")] | None = None

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, v: str | None) -> str | None:
        return None if v is None else _check_namespace_pattern(v)

    @model_validator(mode="after")
    def _not_empty(self) -> RequestScope:
        if self.tenant is None and self.namespace is None and self.task is None:
            raise ValueError("a scope names at least one of tenant, namespace, task")
        return self

    def matches(self, tenant: str, namespace: str, task_id: str, task_version: str) -> bool:
        """Whether a request with these identities is in scope (byte for byte, never normalised)."""
        if self.tenant is not None and self.tenant != tenant:
            return False
        if self.namespace is not None and not namespace_matches(self.namespace, namespace):
            return False
        return self.task is None or self.task.split("@") == [task_id, task_version]


class SharingRule(StrictSection):
    """Donors in ``donor`` may serve recipients in any of ``recipients`` (with ``scope``: only
    requests in that scope)."""

    donor: str
    recipients: list[str] = Field(min_length=1)
    # Only for requests in this scope (tenant, namespace, task); every request when omitted.
    scope: RequestScope | None = None

    @field_validator("donor")
    @classmethod
    def _donor(cls, v: str) -> str:
        return _check_namespace_pattern(v)

    @field_validator("recipients")
    @classmethod
    def _recipients(cls, v: list[str]) -> list[str]:
        return [_check_namespace_pattern(p) for p in v]


class TaskSection(StrictSection):
    # Groups of "id@version" that may share KV with each other. Exactly one "@": the text is
    # split into an (id, version) pair and compared as a pair (a task id or version with "@" in
    # it cannot be named here, and so is compatible with nothing but itself).
    compatible_groups: list[list[Annotated[str, StringConstraints(pattern=r"^[^@\s]+@[^@\s]+$")]]] = Field(
        default_factory=list
    )
