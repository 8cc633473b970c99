"""``semgov provenance sign`` and ``semgov provenance verify``: donor provenance outside an engine.

A capture tool or a gateway that registers donors itself signs what it knows about each one
(``semgov.provenance/v1``: tenant, namespace, task, contract, lifetime, policy version, PII scan,
and the hashes binding the prompt's token ids, segments and text) and attaches the envelope to
the candidate it offers. ``verify`` checks an envelope with the one provenance verifier a
decision's provenance gate uses (:func:`semgov.facts.compute.provenance_facts`).

The donor file (``sign``'s input, ``verify --donor``) is one JSON object::

    {"donor_id": "...", "tenant": "...", "namespace": "...",
     "task": {"id": "...", "version": "..."},
     "response_contract": {"id": "...", "schema_sha256": "<64 hex>"},
     "policy_version": "...",
     "prompt": {"token_ids": [...], "segments": [{"role": "system", "start": 0, "end": 42}, ...],
                "text": "... (optional: omitted, the envelope binds no text)"},
     "pii": {"scanned": true, "entities": []},          (optional; default: not scanned)
     "visibility": "tenant",                            (optional)
     "created_at": "RFC 3339", "expires_at": "RFC 3339" (optional: now, and now + --ttl-s)}
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from semgov.errors import InputError

_MAX_BYTES = 64 * 1024 * 1024  # the captured-line limit's default: a donor's prompt fits


def register(sub: Any) -> None:
    p = sub.add_parser(
        "provenance",
        help="sign and verify donor provenance outside an engine",
        description="Sign a donor's provenance (for a capture tool or gateway that registers donors "
        "itself) and verify an envelope as a decision's provenance gate does.",
    )
    ps = p.add_subparsers(dest="provenance_command", metavar="ACTION", required=True)
    s = ps.add_parser(
        "sign",
        help="sign a donor file's provenance",
        description="Write the signed semgov.provenance/v1 envelope of the donor in FILE (format: "
        "`python -c 'import semgov.cli.provenance as m; print(m.__doc__)'`, docs/formats.md).",
    )
    s.add_argument("donor", type=Path, metavar="FILE", help="the donor file (JSON)")
    s.add_argument(
        "--key", required=True, type=Path, metavar="PEM", help="the producer's Ed25519 private key"
    )
    s.add_argument(
        "--keyring",
        type=Path,
        metavar="FILE",
        help="the keyring verifiers use: the envelope names the key by the id this keyring gives it "
        "(refused when the keyring does not hold the key); without it, the key's own ed25519:... id",
    )
    s.add_argument("--ttl-s", type=int, default=3600, help="lifetime when the file has no expires_at (s)")
    s.add_argument("--out", type=Path, metavar="FILE", help="write the envelope here (default: stdout)")
    s.set_defaults(func=run_sign)
    v = ps.add_parser(
        "verify",
        help="verify a provenance envelope",
        description="Check an envelope: key trusted by the keyring (not revoked), signature over the "
        "RFC 8785 payload, payload schema, not expired; with --donor, that it names the donor and "
        "binds exactly its token ids, segments and text. Exit 0 if every check passes, 1 if not.",
    )
    v.add_argument(
        "envelope", type=Path, metavar="FILE", help="the envelope (JSON: payload, key_id, signature)"
    )
    v.add_argument("--keyring", required=True, type=Path, metavar="FILE", help="trusted provenance keys")
    v.add_argument("--donor", type=Path, metavar="FILE", help="the donor file the envelope must bind")
    v.add_argument("--json", action="store_true", help="print the checks as one JSON object")
    v.set_defaults(func=run_verify)


def _load(path: Path) -> dict[str, Any]:
    """One strict JSON object from ``path`` (size-bounded; duplicate keys and NaN refused)."""
    from semgov.intake.capture import strictness_problem

    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", source=str(path)) from e
    if len(raw) > _MAX_BYTES:
        raise InputError(f"larger than {_MAX_BYTES} bytes", source=str(path))
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise InputError(f"not JSON ({type(e).__name__}: {e})", source=str(path)) from e
    problem = strictness_problem(raw)
    if problem is not None:
        raise InputError(f"not strict JSON: {problem}", source=str(path))
    if not isinstance(doc, dict):
        raise InputError("expected one JSON object", source=str(path))
    return doc


def _prompt(doc: dict[str, Any], source: str) -> Any:
    from pydantic import ValidationError

    from semgov.wire.models import Prompt

    try:
        return Prompt.model_validate(doc.get("prompt"))
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        field = ".".join(["prompt", *map(str, err["loc"])])
        raise InputError(err["msg"], source=source, field=field) from e


def _time(doc: dict[str, Any], name: str, default: datetime, source: str) -> datetime:
    from semgov.wire.timefmt import parse_rfc3339

    if name not in doc:
        return default
    try:
        return parse_rfc3339(doc[name], what=name)
    except (InputError, TypeError, ValueError, AttributeError) as e:
        raise InputError(f"not an RFC 3339 time ({e})", source=source, field=name) from e


def run_sign(args: argparse.Namespace) -> int:
    from semgov.signing.keys import Keyring, load_signing_key
    from semgov.signing.provenance import provenance_payload, sign_provenance

    src = str(args.donor)
    doc = _load(args.donor)
    prompt = _prompt(doc, src)
    keyring = Keyring.load(args.keyring) if args.keyring is not None else None
    key = load_signing_key(args.key, keyring)
    if keyring is not None and keyring.get(key.key_id) is None:
        raise InputError(
            f"the keyring {args.keyring} does not hold this key: its verifiers would refuse the signature",
            source=str(args.key),
        )
    now = datetime.now(UTC)
    created = _time(doc, "created_at", now, src)
    expires = _time(doc, "expires_at", created + timedelta(seconds=args.ttl_s), src)
    pii = doc.get("pii", {"scanned": False, "entities": []})
    if not isinstance(pii, dict):
        raise InputError("pii must be an object {scanned, entities}", source=src, field="pii")
    try:
        # NOTE: a missing or mistyped field is refused by the payload's own validation, by name
        f: Any = doc.get
        payload = provenance_payload(
            donor_id=f("donor_id"), tenant=f("tenant"), namespace=f("namespace"),
            task=f("task"), response_contract=f("response_contract"),
            created_at=created, expires_at=expires, policy_version=f("policy_version"),
            token_ids=prompt.token_ids, segments=prompt.segments, text=prompt.text,
            pii_entities=pii.get("entities", []), pii_scanned=pii.get("scanned", False),
            visibility=doc.get("visibility", "tenant"),
        )  # fmt: skip
    except InputError as e:
        raise InputError(e.message, source=src, field=e.field) from e
    except (TypeError, AttributeError) as e:
        raise InputError(f"a field has the wrong type ({e})", source=src) from e
    text = json.dumps(sign_provenance(payload, key), indent=1) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from semgov.facts.compute import DonorDigest, FactContext, provenance_facts
    from semgov.signing.keys import Keyring
    from semgov.wire.models import Prompt, Provenance

    src = str(args.envelope)
    try:
        prov = Provenance.model_validate(_load(args.envelope))
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        raise InputError(err["msg"], source=src, field=".".join(map(str, err["loc"]))) from e
    donor = _load(args.donor) if args.donor is not None else None
    prompt = (
        _prompt(donor, str(args.donor))
        if donor is not None
        else Prompt.model_validate({"token_ids": [], "segments": []})
    )
    ctx = FactContext(Keyring.load(args.keyring))
    donor_id = str(donor.get("donor_id")) if donor is not None else ""
    facts, payload = provenance_facts(prov, ctx, donor_id=donor_id, digest=DonorDigest.of(prompt))
    checks: dict[str, bool | None] = {
        "key_trusted": facts.key_status == "trusted",
        "signature_valid": facts.signature_valid,
        "payload_valid": facts.payload_valid,
        "not_expired": None if payload is None else datetime.now(UTC) < payload.expires_at,
    }
    if donor is not None:
        checks |= {
            "names_the_donor": facts.donor_id_matches,
            "binds_token_ids": facts.token_hash_matches,
            "binds_segments": facts.segments_hash_matches,
            "binds_text": facts.text_hash_matches,
        }
    ok = all(v is True for v in checks.values())
    if args.json:
        out = {"ok": ok, "key_id": prov.key_id, "key_status": facts.key_status, "checks": checks,
               "payload_error": facts.payload_error}  # fmt: skip
        print(json.dumps(out))
    else:
        for name, value in checks.items():
            print(f"{'ok  ' if value else 'FAIL'} {name.replace('_', ' ')}")
        if facts.payload_error:
            print(f"payload: {facts.payload_error}")
        print(f"{src}: {'verified' if ok else 'NOT verified'} (key {prov.key_id}: {facts.key_status})")
    return 0 if ok else 1
