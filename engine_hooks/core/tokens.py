"""Context tokens verified one way everywhere: one key set, one function, one result.

The SGLang hook, the vLLM middleware and the vLLM connector all read a request's context token
through :func:`verify_context` with the :class:`~semgov.context.ContextKeys` that
:func:`load_context_keys` builds from the same settings. A component cannot hold a key set of its
own, so two components can never disagree about one token (issue 31).

A token that is present and does not verify is logged (``semgov context token refused`` with the
reason), counted (``semgov:context_tokens_refused_total{reason}``), and reported to the caller as
refused: callers give such a request an isolated scope of its own, never a shared anonymous one.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from engine_hooks.core.settings import ContextSettings, HookConfigError, HookSettings, read_context_key
from semgov.context import (
    MAX_PREVIOUS_KEYS,
    ContextError,
    ContextKeys,
    RequestContext,
    bounded_repr,
    has_token_prefix,
    parse_context_token,
)
from semgov.log import get_logger

__all__ = ["Verdict", "load_context_keys", "verify_context"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one token is: a verified context, refused (present and not trusted), or absent."""

    context: RequestContext | None
    refused: str | None = None
    """Why a token that was sent is not trusted (None: it verified, or nothing was sent)."""


def load_context_keys(settings: HookSettings | ContextSettings) -> ContextKeys:
    """The one key set of this deployment (raises :class:`HookConfigError` naming the variable)."""
    key = read_context_key(settings.context_key)
    previous: tuple[bytes, ...] = ()
    if settings.context_key_previous is not None:
        old = read_context_key(settings.context_key_previous, "SEMGOV_CONTEXT_KEY_PREVIOUS")
        if old == key:
            raise HookConfigError(
                f"SEMGOV_CONTEXT_KEY_PREVIOUS={settings.context_key_previous}: the same key as "
                "SEMGOV_CONTEXT_KEY (a rotation's previous key must be the old one)"
            )
        previous = (old,)
    if not settings.context_audience:
        raise HookConfigError(
            "SEMGOV_CONTEXT_AUDIENCE is not set: name this deployment "
            "(context tokens carry it as their aud claim)"
        )
    assert len(previous) <= MAX_PREVIOUS_KEYS
    return ContextKeys(key, settings.context_audience, previous, settings.context_max_lifetime_s)


def verify_context(
    keys: ContextKeys,
    token: object,
    lora_id: object = None,
    *,
    dedicated: bool = False,
    now: float | None = None,
) -> Verdict:
    """The verdict on ``token`` (the request's ``extra_key``, or ``kv_transfer_params``' token),
    bound to the server-side ``lora_id``. ``dedicated``: the value came from a field that holds
    only tokens (vLLM's ``kv_transfer_params.semgov_context``), so anything there that does not
    verify is a refusal; SGLang's ``extra_key`` may hold a client's own text, refused only when it
    starts like a token. Never raises, whatever the client sent."""
    if token is None:
        return Verdict(None)
    try:
        return Verdict(
            parse_context_token(keys, token, lora_id=lora_id, now=time.time() if now is None else now)
        )
    except ContextError as e:
        if not dedicated and not has_token_prefix(token):
            # NOTE: an extra_key that is not a token at all (SGLang clients may send their own):
            # not a refusal; it is isolated by what it sent, as before.
            return Verdict(None)
        _count(e.kind)
        get_logger().warning("semgov context token refused", reason=str(e)[:200], kind=e.kind)
        return Verdict(None, str(e)[:200])
    except Exception as e:  # noqa: BLE001 - a parser bug must not take the scheduler loop down
        _count("error")
        get_logger().warning(
            "semgov context token parser failed",
            error=type(e).__name__,
            token=bounded_repr(token),
            lora_id=bounded_repr(lora_id),
        )
        return Verdict(None, f"parser failed ({type(e).__name__})")


def _count(kind: str) -> None:
    try:
        from engine_hooks.core.metrics import hook_metrics

        hook_metrics().context_refused.labels(kind).inc()
    except Exception:  # noqa: BLE001 - a metric must never cost the request
        pass
