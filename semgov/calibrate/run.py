"""One calibration run against a running engine: each sampled pair measured in the team's server.

Per pair (:meth:`ServerRun.measure`), in a scope of its own (the run's id and the pair's number,
:func:`semgov.context.calibration_namespace`), greedy, with the run's context claims:

1. the **donor** (the candidate's prompt; one output token: its prompt's KV is what is reused);
2. the recipient **cold** (no reuse at all, an exact-prefix key of its own: nothing, not even the
   engine's own prefix cache, serves it), twice for the first ``floor_runs`` pairs (the floor);
3. the recipient **governed**, once per ``--methods`` plan: decided by the server's live policy
   plus one quality rule turning shifted reuse on with that plan (its records name the revision
   ``<live>+calibrate:<plan>``); never entered into the tree, so each plan starts from the donor;
4. **release**: the engine drops the pair's donors (also on an error, and first thing on
   ``--resume`` for a pair that was started and not finished).

A trial counts only when the server's own audit log has the recipient's allow decision and a
``realization`` of it (:mod:`semgov.calibrate.audit`); the answers are compared the way the
response contract says (:mod:`semgov.contracts`). Each finished pair is appended to
``OUT/progress.jsonl`` as it ends, so ``--resume`` continues where a run stopped.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semgov.calibrate.audit import Outcome, ServerAudit
from semgov.calibrate.engines import Answer, Call, Engine
from semgov.calibrate.sample import Case
from semgov.context import CalibrationClaim
from semgov.errors import SemgovError
from semgov.policy.calibration import TRIAL_MARK, Trial

PROGRESS = "progress.jsonl"
RUN_FILE = "run.json"


@dataclass(frozen=True)
class RunConfig:
    """What a run measures and how long it may take."""

    methods: tuple[str, ...]
    max_new_tokens: int = 16
    floor_runs: int = 3
    audit_wait_s: float = 30.0
    budget_s: float | None = None
    revisions: frozenset[str] = (
        frozenset()
    )  # live revisions the server may decide with (--policy's, --rego's)


class Compare:
    """How two answers of one request are compared: the response contract's way (``contracts``
    given), else token for token. Without text from the server, token for token too (said once)."""

    def __init__(self, contracts: Any | None, log: Callable[[str], None]) -> None:
        self.contracts = contracts
        self.log = log
        self._said = False

    def __call__(self, contract: dict[str, str], cold: Answer, warm: Answer) -> dict[str, Any]:
        changed = cold.output_ids != warm.output_ids
        exact = {"regressed": changed, "changed_answer": changed, "changed_values": changed,
                 "detail": "token for token", "lost": [], "gained": []}  # fmt: skip
        if self.contracts is None:
            return exact
        spec = self.contracts.spec(contract)
        if cold.text is None or warm.text is None:
            if spec.compare != "exact" and not self._said:
                self._said = True
                self.log("the server returns no text (started with --skip-tokenizer-init?): answers compared "
                         "token for token, not by their required values")  # fmt: skip
            return exact
        c = spec.compare_answers(cold.text, warm.text, cold_ids=cold.output_ids, warm_ids=warm.output_ids)
        return {
            "regressed": c.regressed,
            "changed_answer": c.answer_changed,
            "changed_values": c.values_changed,
            "detail": c.detail,
            "lost": list(c.lost),
            "gained": list(c.gained),
        }


class ServerRun:
    """Measures sampled pairs in a server (:meth:`measure`), appending each to ``OUT/progress.jsonl``."""

    def __init__(
        self,
        engine: Engine,
        audit: ServerAudit,
        compare: Compare,
        config: RunConfig,
        out: Path,
        run_id: str,
        log: Callable[[str], None],
    ) -> None:
        self.engine, self.audit, self.compare, self.cfg = engine, audit, compare, config
        self.out, self.run_id, self.log = out, run_id, log

    # ---- one pair ------------------------------------------------------------------------------

    def _call(
        self, case: Case, k: int, what: str, role: str, plan: str | None = None, *, donor: bool = False
    ) -> Call:
        req = case.request
        cand = req.candidates[case.candidate]
        prompt = cand.prompt if donor else req.prompt
        payload: dict[str, Any] = dict(cand.provenance.payload)
        task = payload["task"] if donor else req.task.model_dump()
        contract = payload["response_contract"] if donor else req.response_contract.model_dump()
        ids = prompt.token_ids.tolist()
        segs = [(s.role, s.start, s.end) for s in prompt.segments] if prompt.segments else None
        if role == "release":
            ids, segs = ids[:1], None
        return Call(
            rid=f"semgov-cal-{self.run_id}-{k}-{what}",
            ids=ids,
            segments=segs,
            tenant=req.tenant,
            namespace=req.namespace,  # NOTE: one namespace for the pair: the engine's scope is per namespace
            task={"id": str(task["id"]), "version": str(task["version"])},
            contract={"id": str(contract["id"]), "schema_sha256": str(contract["schema_sha256"])},
            claim=CalibrationClaim(f"{self.run_id}-{k}", role, plan),
            max_new_tokens=1 if role in ("donor", "release") else self.cfg.max_new_tokens,
        )

    def release(self, case: Case, k: int) -> None:
        """Ask the engine to drop pair ``k``'s donors (``release``)."""
        self.engine.send(self._call(case, k, "release", "release"))

    @contextmanager
    def _released(self, case: Case, k: int) -> Iterator[None]:
        try:
            yield
        finally:
            try:
                self.release(case, k)
            except SemgovError as e:
                self.log(f"pair {k}: its release failed ({e}); its donors expire with the engine's LRU")

    def measure(self, case: Case, k: int) -> dict[str, Any]:
        """Every request of pair ``k``; the row :func:`trials_of` reads."""
        t0 = time.monotonic()
        contract = case.request.response_contract.model_dump()
        with self._released(case, k):
            self.engine.send(self._call(case, k, "donor", "donor", donor=True))
            cold = self.engine.send(self._call(case, k, "cold", "cold"))
            cold2 = None
            if k < self.cfg.floor_runs:
                cold2 = self.engine.send(self._call(case, k, "cold2", "cold"))
            methods: dict[str, Any] = {}
            plans = self.cfg.methods if case.kind == "shifted" else self.cfg.methods[:1]
            for j, plan in enumerate(plans):
                methods[plan] = self._governed(case, k, j, plan, cold, contract)
        return {
            "case": k,
            "state": "done",
            "request_id": case.request.request_id,
            "candidate": case.candidate,
            "kind": case.kind,
            "task": case.request.task.id,
            "contract": case.request.response_contract.id,
            "tokens": len(case.request.prompt.token_ids),
            "cold": {
                "rid": cold.rid,
                "output_ids": list(cold.output_ids),
                "text": cold.text,
                "cached_tokens": cold.cached_tokens,
            },
            "cold_cold_identical": None if cold2 is None else cold2.output_ids == cold.output_ids,
            "methods": methods,
            "seconds": round(time.monotonic() - t0, 2),
        }

    def _governed(
        self, case: Case, k: int, j: int, plan: str, cold: Answer, contract: dict[str, str]
    ) -> dict[str, Any]:
        """One governed recipient (retried once when the server had no decision for it: its donor
        may still have been registering)."""
        for attempt in ("", "-retry"):
            warm = self.engine.send(self._call(case, k, f"m{j}{attempt}", "recipient", plan))
            seen = self.audit.outcome(warm.rid, expect_decision=True, wait_s=self.cfg.audit_wait_s)
            if seen.decisions:
                break
            time.sleep(1.0)
        self._check_revision(seen, plan, warm.rid)
        counted, why = _counted(case.kind, seen, warm)
        return {
            "rid": warm.rid,
            "decisions": [d.get("decision") for d in seen.decisions],
            "approved": seen.approved_tokens,
            "realized": seen.realized_tokens,
            "cached_tokens": warm.cached_tokens,
            "failed": sorted(set(seen.failed.values())),
            "counted": counted,
            "why_not": why,
            "output_ids": list(warm.output_ids),
            "text": warm.text,
            **self.compare(contract, cold, warm),
        }

    def _check_revision(self, seen: Outcome, plan: str, rid: str) -> None:
        """A recipient's decisions name the live revision the run calibrates, with its plan; any
        other means the server runs another policy than ``--policy`` (the run stops)."""
        want = {f"{r}{TRIAL_MARK}{plan}" for r in self.cfg.revisions}
        got = seen.revisions()
        if want and got and not got <= want:
            raise SemgovError(
                f"the server decided {rid} under revision {sorted(got)[0]}, not {sorted(want)[0]}: it runs "
                "another policy than --policy (or --rego) names; calibrate the policy the server runs"
            )


def _counted(kind: str, seen: Outcome, warm: Answer) -> tuple[bool, str | None]:
    """Whether a governed run is a trial, and why not: the server allowed it and realized reuse (a
    prefix pair's exact hit is the engine's own, counted from its ``cached_tokens``)."""
    if not seen.decisions:
        if kind == "prefix" and (warm.cached_tokens or 0) > 0:
            return True, None
        return False, "no decision in the server's audit log (its donor was not a candidate)"
    if not seen.allows:
        return False, "denied by the server"
    if seen.realized_tokens == 0:
        if kind == "prefix" and (warm.cached_tokens or 0) > 0:
            return True, None
        failed = "; ".join(sorted(set(seen.failed.values()))[:2]) or "no realization audited"
        return False, f"allowed, not realized: {failed}"
    return True, None


def trials_of(rows: Sequence[dict[str, Any]]) -> list[Trial]:
    """The trials of measured pairs (what :func:`semgov.policy.calibration.aggregate` counts)."""
    out: list[Trial] = []
    for r in rows:
        for plan, m in r["methods"].items():
            if not m["counted"]:
                continue
            out.append(
                Trial(
                    task=r["task"],
                    contract=r["contract"],
                    kind="shifted" if r["kind"] == "shifted" else "prefix",
                    method=plan if r["kind"] == "shifted" else "as approved",
                    regressed=bool(m["regressed"]),
                    changed_answer=bool(m["changed_answer"]),
                    changed_values=bool(m["changed_values"]),
                )
            )
    return out


# ---- the run's files -------------------------------------------------------------------------------


def cases_sha256(cases: Sequence[Case]) -> str:
    """What a run measures, as one digest: each sampled pair's request id, donor, and prompts'
    token hashes, in order (``--resume`` continues only the run that measures exactly these)."""
    h = hashlib.sha256(b"semgov.calibration-cases/v1\0")
    for c in cases:
        donor = c.request.candidates[c.candidate]
        for raw in (
            c.request.request_id.encode("utf-8", "surrogatepass"),
            donor.donor_id.encode("utf-8", "surrogatepass"),
            array("q", c.request.prompt.token_ids.tolist()).tobytes(),
            array("q", donor.prompt.token_ids.tolist()).tobytes(),
        ):
            h.update(len(raw).to_bytes(8, "big") + raw)
    return "sha256:" + h.hexdigest()


def open_run(
    out: Path, identity: dict[str, Any], resume: bool
) -> tuple[str, dict[int, dict[str, Any]], list[int]]:
    """The run's id, its finished pairs by number and those started and not finished.

    A new run writes ``OUT/run.json``; ``resume`` continues the run there, which must have been made
    with the same ``identity`` (capture, policy, sample, methods, server). Refuses to start over a
    run without ``resume`` (nothing measured is ever overwritten)."""
    out.mkdir(parents=True, exist_ok=True)
    run_file, progress = out / RUN_FILE, out / PROGRESS
    if not resume:
        if run_file.exists():
            raise SemgovError(
                "holds a calibration run already: pass --resume to continue it, or choose another --out",
                source=str(run_file),
            )
        run_id = secrets.token_hex(6)
        run_file.write_text(json.dumps({"run": run_id, **identity}, indent=2) + "\n")
        progress.write_text("")
        return run_id, {}, []
    try:
        saved = json.loads(run_file.read_text())
    except (OSError, ValueError) as e:
        raise SemgovError(f"--resume: no run to continue here ({e})", source=str(run_file)) from e
    differs = sorted(k for k in identity if saved.get(k) != identity[k])
    if differs:
        raise SemgovError(
            f"--resume: this run was made with other {', '.join(differs)}; resume it with the same "
            "settings, or start another run in another --out",
            source=str(run_file),
        )
    done: dict[int, dict[str, Any]] = {}
    started: set[int] = set()
    for line in progress.read_text().splitlines() if progress.exists() else []:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # NOTE: a line cut by a crash mid-write: that pair is measured again
        if row.get("state") == "done":
            done[int(row["case"])] = row
        elif row.get("state") == "started":
            started.add(int(row["case"]))
    return str(saved["run"]), done, sorted(started - set(done))


def append_row(out: Path, row: dict[str, Any]) -> None:
    with (out / PROGRESS).open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
