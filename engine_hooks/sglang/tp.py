"""Tensor parallelism: one decision on rank 0, the same plan on every rank, one audit trail.

With ``--tp-size N`` SGLang runs N schedulers in lockstep, one per rank, each with its own tree
cache and its own shard of the KV pool (a slice of the KV heads). Their trees, allocators and
queues stay identical because every input reaches every rank (rank 0 broadcasts the requests)
and every scheduling step is a deterministic function of them. Governance adds inputs that are
*not* deterministic: when a decision finishes, when an allow record is durable, when a donor's
registration completes, and the clock its deadlines are measured on. If two ranks saw different
values, one rank would admit a request with realized KV while another prefills it cold, and
their forwards would no longer match.

So only rank 0 (the *leader*) runs the :class:`~engine_hooks.core.governor.Governor`: the
decision process, signing, the audit log. At the start of every prefill round that has work
(:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.sync_round`), it broadcasts a
:class:`RoundSync` over SGLang's own TP CPU process group (``gloo``): its clock, the donor
registry changes since the last round, the decisions that finished (the chosen allow, its donor
and the donor's live length) and the allow records that became durable. Every rank, the leader
included, applies the same message the same way, and between two messages every semgov choice
is a function of state that is identical on all ranks (the round's clock, the tree, the queue).
SGLang does the same for grammar readiness (``GrammarManager.get_ready_grammar_requests``).

The other ranks (*followers*) hold a :class:`FollowerGovernor`: the registry replayed from the
leader's messages (each donor's tokens from the follower's own copy of the same finished
request), no policy, no keys, no audit log. Each rank copies its own KV shard; a realization
counts only if every rank's copy succeeded (:meth:`TpLink.all`, one ``all_reduce``), otherwise
every rank frees what it took and the request runs cold. Donors submitted and not yet settled by
the leader are bounded per tenant, identically on every rank (:class:`PendingDonors`), so a burst
of finished requests never makes ranks disagree about them. A donor the leader adds is used only
from the next round on; should a follower still hold no copy of it, every rank forgets that
round's new donors (no reuse from them, nothing else changes). A message a follower cannot
otherwise apply (a request it does not know, a donor that differs) turns semantic reuse off on
every rank, audited by the leader: ranks never guess.

NOTE: the message is pickled: it travels only between the server's own scheduler processes, over
the process group SGLang itself broadcasts pickled requests on; nothing a client sends is
unpickled.
"""

from __future__ import annotations

import pickle
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist

from engine_hooks.core.decisions import PendingDecision
from engine_hooks.core.donors import DonorSpec, LiveDonor, pop_donor
from engine_hooks.core.settings import HookSettings
from engine_hooks.core.tokens import Verdict, load_context_keys, verify_context
from semgov.context import ContextKeys, RequestContext
from semgov.decide import SignedDecision
from semgov.log import get_logger

__all__ = ["Choice", "DonorOp", "FollowerGovernor", "RoundSync", "TpLink"]

_MAX_SPECS = 8192  # NOTE: all tenants' pending donors together (each tenant: its own quota below it)


@dataclass(frozen=True, slots=True)
class DonorOp:
    """One change of the leader's donor registry, in order: ``add`` carries what a follower checks
    its own copy of the donor against; ``drop`` (a registered donor leaves) and ``forget`` (its
    registration failed: it never joins) only the id."""

    kind: Literal["add", "drop", "forget"]
    donor_id: str
    scope: str = ""
    cache_key: str = ""
    n_tokens: int = 0


@dataclass(frozen=True, slots=True)
class Choice:
    """A finished decision, as the leader resolved it: the request (server-side serial, and its
    rid only as a cross-check), the allow chosen (None: cold) and its donor's live length."""

    serial: int
    rid: str
    decisions: int
    had_candidates: bool
    allowed: int
    chosen: SignedDecision | None
    donor_id: str | None
    donor_len: int
    durable: bool
    # NOTE: every allowed donor rank 0 measured in its tree, in order, with the live length it
    # found: a tree walk can split nodes and reorder eviction, so every rank walks the same.
    probed: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class RoundSync:
    """What every rank applies at the start of a prefill round (see the module docstring)."""

    now: float  # the leader's time.monotonic(): every rank's deadlines are measured on it
    audit_broken: str | None
    donor_ops: tuple[DonorOp, ...] = ()
    choices: tuple[Choice, ...] = ()
    durable: tuple[int, ...] = ()  # serials whose chosen allow record became durable
    disabled: str | None = None  # the leader could not build the round: reuse goes off everywhere


class TpLink:
    """The TP group's CPU process group (SGLang's ``GroupCoordinator.cpu_group``): a broadcast
    from rank 0 and an "any rank says so" reduction. Every rank must call both in the same order."""

    def __init__(self, group: Any) -> None:
        self.group = group.cpu_group
        self.rank = int(group.rank_in_group)
        self.size = int(group.world_size)
        self.src = int(group.ranks[0])  # NOTE: torch.distributed wants the global rank of rank 0

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (pickled: server processes only, see the module NOTE)."""
        if self.leader:
            data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
            size = torch.tensor([len(data)], dtype=torch.int64)
            dist.broadcast(size, src=self.src, group=self.group)
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
            dist.broadcast(buf, src=self.src, group=self.group)
            return obj
        size = torch.zeros(1, dtype=torch.int64)
        dist.broadcast(size, src=self.src, group=self.group)
        buf = torch.empty(int(size.item()), dtype=torch.uint8)
        dist.broadcast(buf, src=self.src, group=self.group)
        return pickle.loads(buf.numpy().tobytes())  # noqa: S301 - rank 0 of this server, see above

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is True on any rank."""
        t = torch.tensor([1 if flag else 0], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def all(self, flag: bool) -> bool:
        """True on every rank only if ``flag`` is True on every rank."""
        return not self.any(not flag)

    def any_each(self, flags: tuple[bool, ...]) -> tuple[bool, ...]:
        """For each flag, True on every rank if it is True on any rank (one ``all_reduce``)."""
        t = torch.tensor([1 if f else 0 for f in flags], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return tuple(bool(x) for x in t.tolist())


class PendingDonors:
    """Finished requests submitted as donors that rank 0 has not yet settled (an ``add``: registered;
    a ``forget``: its registration failed), bounded per tenant and in all.

    Every rank holds one and changes it at the same points of the same schedule (a request's
    release; a round message), so every rank admits and refuses the same donors: rank 0 never
    registers a donor a follower refused or dropped, and one tenant's burst of finished requests
    fills only that tenant's quota (its further requests are simply not donors).
    """

    def __init__(self, per_tenant: int, total: int = _MAX_SPECS) -> None:
        self.per_tenant, self.total = per_tenant, total
        self._specs: OrderedDict[str, DonorSpec] = OrderedDict()
        self._by_tenant: dict[str, int] = {}
        self.refused = 0

    def admit(self, spec: DonorSpec) -> bool:
        """Keep ``spec`` until it is settled; False (counted) when its tenant's quota or the total is
        full."""
        tenant = spec.context.tenant
        if len(self._specs) >= self.total or self._by_tenant.get(tenant, 0) >= self.per_tenant:
            self.refused += 1
            return False
        self._specs[spec.donor_id] = spec
        self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
        return True

    def settle(self, donor_id: str) -> DonorSpec | None:
        """Rank 0 registered the donor or gave it up: hand back (and stop holding) its spec."""
        spec = self._specs.pop(donor_id, None)
        if spec is not None:
            tenant = spec.context.tenant
            left = self._by_tenant[tenant] - 1
            if left:
                self._by_tenant[tenant] = left
            else:
                del self._by_tenant[tenant]
        return spec

    def __len__(self) -> int:
        return len(self._specs)


class FollowerGovernor:
    """What a non-leader rank's cache asks of its governor: contexts (verified with the same key,
    so tree keys match), and the leader's donor registry, replayed. It decides, signs and audits
    nothing: decisions arrive in :class:`RoundSync` messages, events are the leader's to write."""

    audit_failures = 0

    def __init__(self, settings: HookSettings, context_keys: ContextKeys) -> None:
        self.settings = settings
        self.context_keys = context_keys
        self.context_key = context_keys.current
        self.audit_broken: str | None = None
        self.pending = PendingDonors(settings.tp_pending_donors_per_tenant)
        self.missed: list[str] = []  # NOTE: adds this rank held no copy of, since the cache last looked
        self._donors: dict[str, LiveDonor] = {}
        self._by_scope: dict[str, OrderedDict[str, None]] = {}

    @classmethod
    def from_settings(cls, settings: HookSettings) -> FollowerGovernor:
        """The same context keys as the leader's (tree keys and scopes must match on every rank)."""
        return cls(settings, load_context_keys(settings))

    def context_of(self, extra_key: object, lora_id: object = None) -> RequestContext | None:
        return self.verdict_of(extra_key, lora_id).context

    def verdict_of(self, token: object, lora_id: object = None, *, dedicated: bool = False) -> Verdict:
        return verify_context(self.context_keys, token, lora_id, dedicated=dedicated)

    # ---- the registry, as the leader's messages say ------------------------------------------

    def submit_donor(self, spec: DonorSpec) -> bool:
        """Keep this rank's copy of a finished request until the leader settles it (False: over its
        tenant's quota, as on every rank: not a donor)."""
        return self.pending.admit(spec)

    def replay(self, ops: tuple[DonorOp, ...]) -> list[str]:
        """Apply the leader's registry changes, in order. Returns what could not be applied.

        An ``add`` of a donor this rank holds no copy of is not a problem: it is listed in
        :attr:`missed`, and every rank forgets that round's new donors before any is used
        (:meth:`~engine_hooks.sglang.cache.GovernedRadixCache.sync_round`).
        """
        problems: list[str] = []
        for op in ops:
            if op.kind == "drop":
                self.drop_donor(op.donor_id)
                continue
            if op.kind == "forget":
                self.pending.settle(op.donor_id)
                continue
            spec = self.pending.settle(op.donor_id)
            if spec is None:
                self.missed.append(op.donor_id)
                get_logger().warning(
                    "semgov TP follower has no copy of a donor: forgotten", donor_id=op.donor_id
                )
                continue
            scope = spec.context.scope(self.context_key, spec.cache_salt)
            if (scope, spec.cache_key, len(spec.token_ids)) != (op.scope, op.cache_key, op.n_tokens):
                problems.append(f"donor {op.donor_id} differs on this rank (scope, tree key or length)")
                continue
            self.drop_donor(op.donor_id)
            entry = LiveDonor(op.donor_id, scope, spec.cache_key, spec.cache_salt, spec.token_ids)
            self._donors[op.donor_id] = entry
            self._by_scope.setdefault(scope, OrderedDict())[op.donor_id] = None
        return problems

    def donor(self, donor_id: str) -> LiveDonor | None:
        return self._donors.get(donor_id)

    def drop_donor(self, donor_id: str) -> None:
        pop_donor(self._donors, self._by_scope, donor_id)

    def release_scope(self, ctx: RequestContext, cache_salt: str | None) -> int:
        """A calibration run released a scope: the leader drops its donors, and this rank replays
        the drops from the leader's next round message."""
        return 0

    def forget_all_donors(self) -> None:
        for donor_id in list(self._donors):
            self.drop_donor(donor_id)

    def has_donors(self, ctx: RequestContext, cache_salt: str | None) -> bool:
        return bool(self._by_scope.get(ctx.scope(self.context_key, cache_salt)))

    def donor_count(self) -> int:
        return len(self._donors)

    def drain_donors(self) -> int:
        return 0  # NOTE: the registry changes only through replay()

    # ---- decisions and events: the leader's ----------------------------------------------------

    def decide_later(
        self, request_id: str, ctx: RequestContext, cache_salt: str | None, token_ids: Any
    ) -> PendingDecision:
        """A placeholder the leader's :class:`Choice` resolves (never done here)."""
        return PendingDecision(request_id, ctx, cache_salt, (), None)

    def decision_durable(self, decision_id: str, timeout: float) -> bool:
        return False  # NOTE: durability arrives in RoundSync.durable

    def event(self, kind: str, **fields: Any) -> None:
        """Nothing: the leader audits every rank's shared story once."""

    def not_realized(self, reason: str, **fields: Any) -> None:
        """Nothing: the leader says why an allow was not acted on."""

    def wait_idle(self, timeout: float = 30.0) -> bool:
        return True

    def wait_registrations(self, timeout: float = 30.0) -> bool:
        return True

    def close(self) -> None:
        return None
