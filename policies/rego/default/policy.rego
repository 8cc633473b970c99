# semgov default reuse policy, in Rego: the same decisions, gate for gate, as
# policies/default/policy.yaml evaluated by the native YAML engine.
# Convention: semgov/policy/rego/loader.py (package semgov.reuse; rules metadata, deny,
# allow, approved_spans, facts_config). Input: schemas/policy_input.schema.json.
#
# Fail closed: every gate denies unless the condition that lets it pass holds,
# so a missing fact (donor claims unknown, a fact that could not be computed)
# denies rather than silently passing.
package semgov.reuse

import rego.v1

# ---------------------------------------------------------------------------
# Parameters: edit these as you would edit policy.yaml.
# ---------------------------------------------------------------------------

metadata := {"name": "default", "version": "1"}

# Provenance policy_version values accepted besides "<name>@<version>" of metadata.
accepted_policy_versions := []

# tenant: donors marked `visibility: public` may serve other tenants.
allow_public_donors := false

# tenant: public donors from other tenants for these requests only, each
# {"tenant": "...", "namespace": "<namespace or prefix/*>", "task": "id@version"}: every key
# given must match the request, at least one key (semgov checks the form at load).
public_donors_for := []

# namespace: explicit cross-namespace sharing rules, each
# {"donor": "<namespace or prefix/*>", "recipients": ["<namespace or prefix/*>", ...]}, with an
# optional "scope" (as in public_donors_for): the rule then covers requests in that scope only.
namespace_sharing := []

# expiry: never reuse a donor older than this many seconds (30d); null for no limit.
max_age_seconds := 2592000

# pii
forbidden_entities := ["CREDIT_CARD", "EMAIL_ADDRESS", "IBAN_CODE", "IP_ADDRESS", "PHONE_NUMBER", "US_SSN"]

pii_scan_donor_text := true

pii_require_scan := true

pii_min_score := 0.4

pii_phone_regions := ["US", "GB", "FR", "IL", "IN", "CA", "BR"]

# task: groups of "id@version" that may share KV with each other.
compatible_task_groups := []

# similarity: can deny, never allows on its own.
similarity_min := 0.6

# token_verification
min_span_tokens := 32

min_approved_tokens := 64

min_approved_fraction := 0.5

allow_shifted := true

reusable_roles := {"system", "evidence"}

# quality: a shifted span's leading min(length, max(min_recompute_tokens,
# ceil(percent * length / 100))) tokens are computed by the engine, not copied
# (the record states the count per span), and so are its last
# shifted_recompute_tail_tokens (the approved span ends that many tokens early; a
# span left with nothing to copy is not approved). The first rule whose task id and
# response contract id match the request (a key left out matches any) replaces
# these defaults; its allow_shifted false forbids shifted spans in its scope, true
# allows them there when quality_allow_shifted (the default for every other request) is
# false, never beyond allow_shifted (the ceiling).
# A rule looks like {"task": "extract_financials", "response_contract": "financials",
# "allow_shifted": false, "shifted_recompute_percent": 20, "min_recompute_tokens": 32,
# "shifted_recompute_tail_tokens": 256}.
# Off by default: see policies/default/policy.yaml (quality) for the evidence.
quality_allow_shifted := false

shifted_recompute_percent := 0

min_recompute_tokens := 16

shifted_recompute_tail_tokens := 256

quality_rules := []

# What semgov measures for this policy (span finder, PII scan). Must be a constant.
facts_config := {
	"min_span_tokens": min_span_tokens,
	"scan_donor_text": pii_scan_donor_text,
	"pii_min_score": pii_min_score,
	"phone_regions": pii_phone_regions,
	"pii_entities": sort(forbidden_entities),
}

# ---------------------------------------------------------------------------
# Decision
# ---------------------------------------------------------------------------

default allow := false

allow if count(deny) == 0

# The fact each gate depends on (semgov/policy/engine.py GATE_FACT). When semgov could
# not compute it, semgov reports the gate as `error`; the policy denies it too,
# so that `allow` stays false.
gate_fact := {
	"tenant": "provenance",
	"namespace": "provenance",
	"provenance": "provenance",
	"expiry": "provenance",
	"policy_version": "provenance",
	"pii": "pii",
	"task": "provenance",
	"response_contract": "provenance",
	"token_verification": "tokens",
}

deny contains {"gate": gate, "detail": concat("", ["fact unavailable: ", fact, " (", msg, ")"])} if {
	some gate
	fact := gate_fact[gate]
	msg := input.facts.errors[fact]
}

# Gates that read the donor's claims from the provenance payload.
donor_gates := ["tenant", "namespace", "expiry", "policy_version", "task", "response_contract"]

donor_known if is_object(input.facts.donor)

donor := input.facts.donor

# No valid provenance payload: the donor's claims are unknown, every gate that
# needs them fails.
deny contains {"gate": gate, "detail": "no valid provenance payload, so the donor's claims are unknown"} if {
	not donor_known
	some gate in donor_gates
}

# --- tenant -----------------------------------------------------------------

tenant_ok if donor.tenant == input.request.tenant

tenant_ok if {
	donor.visibility == "public"
	allow_public_donors == true
}

tenant_ok if {
	donor.visibility == "public"
	some scope in public_donors_for
	request_in_scope(scope)
}

# A scope's keys all match the request; an omitted key matches any. The task is compared as an
# (id, version) pair, never as one string.
request_in_scope(scope) if {
	object.get(scope, "tenant", input.request.tenant) == input.request.tenant
	scope_namespace_ok(scope)
	scope_task_ok(scope)
}

scope_namespace_ok(scope) if not "namespace" in object.keys(scope)

scope_namespace_ok(scope) if namespace_matches(scope.namespace, input.request.namespace)

scope_task_ok(scope) if not "task" in object.keys(scope)

scope_task_ok(scope) if split(scope.task, "@") == [input.request.task.id, input.request.task.version]

deny contains {"gate": "tenant", "detail": detail} if {
	donor_known
	not tenant_ok
	detail := tenant_detail
}

tenant_detail := "public donor from another tenant; policy does not allow public donors" if {
	donor.visibility == "public"
} else := "donor belongs to another tenant"

# --- namespace --------------------------------------------------------------

# An exact namespace, or "prefix/*": any well-formed namespace strictly below "prefix/"
# (segments of [A-Za-z0-9_.:@-], none "." or "..": "research/../legal" is not below
# "research/"). Compared byte for byte, never normalised or case-folded. semgov refuses
# patterns of any other form when it loads the policy (as for policy.yaml).
namespace_matches(pattern, ns) if {
	endswith(pattern, "/*")
	prefix := trim_suffix(pattern, "*")
	startswith(ns, prefix)
	ns != prefix
	well_formed_namespace(ns)
}

well_formed_namespace(ns) if {
	regex.match(`^[A-Za-z0-9_.:@-]+(/[A-Za-z0-9_.:@-]+)*$`, ns)
	not regex.match(`(^|/)\.\.?(/|$)`, ns)
}

namespace_matches(pattern, ns) if {
	not endswith(pattern, "/*")
	ns == pattern
}

namespace_ok if donor.namespace == input.request.namespace

namespace_ok if {
	some rule in namespace_sharing
	namespace_matches(rule.donor, donor.namespace)
	some r in rule.recipients
	namespace_matches(r, input.request.namespace)
	sharing_in_scope(rule)
}

sharing_in_scope(rule) if not "scope" in object.keys(rule)

sharing_in_scope(rule) if request_in_scope(rule.scope)

deny contains {"gate": "namespace", "detail": detail} if {
	donor_known
	not namespace_ok
	detail := sprintf("donor namespace %q differs and no sharing rule covers %q", [donor.namespace, input.request.namespace])
}

# --- provenance -------------------------------------------------------------

provenance := input.facts.provenance

deny contains {"gate": "provenance", "detail": "provenance facts unavailable"} if {
	not is_object(provenance)
}

deny contains {"gate": "provenance", "detail": sprintf("key %q is not in the keyring", [input.candidate.key_id])} if {
	provenance.key_status == "unknown"
}

deny contains {"gate": "provenance", "detail": sprintf("key %q is revoked", [input.candidate.key_id])} if {
	provenance.key_status == "revoked"
}

deny contains {"gate": "provenance", "detail": "key status is not trusted"} if {
	is_object(provenance)
	not provenance.key_status in {"trusted", "unknown", "revoked"}
}

deny contains {"gate": "provenance", "detail": "signature does not verify"} if {
	is_object(provenance)
	not provenance.signature_valid == true
}

deny contains {"gate": "provenance", "detail": "payload invalid"} if {
	is_object(provenance)
	not provenance.payload_valid == true
}

deny contains {"gate": "provenance", "detail": "payload donor_id differs from the candidate's"} if {
	is_object(provenance)
	not provenance.donor_id_matches == true
}

deny contains {"gate": "provenance", "detail": "payload token hash differs from the donor's tokens"} if {
	is_object(provenance)
	not provenance.token_hash_matches == true
}

# NOTE: the segments and text are bound by hash: an unsigned relabelling or text never passes
# (written `not ... == true` so that a missing fact denies too).
deny contains {"gate": "provenance", "detail": "payload segments hash differs from the donor's segments"} if {
	is_object(provenance)
	not provenance.segments_hash_matches == true
}

deny contains {"gate": "provenance", "detail": "the donor's text is not the text signed (payload text_sha256)"} if {
	is_object(provenance)
	not provenance.text_hash_matches == true
}

# --- expiry -----------------------------------------------------------------

# Passes when created_at <= now < expires_at and now - created_at < max age.
expiry_ok if {
	is_number(input.now_ns)
	is_number(donor.created_at_ns)
	is_number(donor.expires_at_ns)
	input.now_ns >= donor.created_at_ns
	input.now_ns < donor.expires_at_ns
	not too_old
}

too_old if {
	max_age_seconds != null
	input.now_ns - donor.created_at_ns >= max_age_seconds * 1000000000
}

deny contains {"gate": "expiry", "detail": detail} if {
	donor_known
	not expiry_ok
	detail := expiry_detail
}

expiry_detail := sprintf("donor created in the future (%s > now %s)", [donor.created_at, input.now]) if {
	input.now_ns < donor.created_at_ns
} else := sprintf("donor expired at %s (now %s)", [donor.expires_at, input.now]) if {
	input.now_ns >= donor.expires_at_ns
} else := sprintf("donor older than policy max age of %vs", [max_age_seconds]) if {
	too_old
} else := "donor validity times unavailable"

# --- policy_version ---------------------------------------------------------

accepted_versions := {concat("@", [metadata.name, metadata.version])} | {v | some v in accepted_policy_versions}

policy_version_ok if donor.policy_version in accepted_versions

deny contains {"gate": "policy_version", "detail": detail} if {
	donor_known
	not policy_version_ok
	detail := sprintf("donor produced under %q; accepted: %v", [donor.policy_version, sort(accepted_versions)])
}

# --- pii --------------------------------------------------------------------

pii := input.facts.pii

deny contains {"gate": "pii", "detail": "PII facts unavailable"} if {
	not is_object(pii)
}

pii_forbidden_found := {e |
	some e in array.concat(pii.provenance_entities, pii.text_entities)
	e in {x | some x in forbidden_entities}
}

deny contains {"gate": "pii", "detail": sprintf("donor carries forbidden PII: %s", [concat(", ", sort(pii_forbidden_found))])} if {
	is_object(pii)
	count(pii_forbidden_found) > 0
}

pii_scanned if pii.provenance_scanned == true

pii_scanned if pii.text_scanned == true

deny contains {"gate": "pii", "detail": "donor was never scanned for PII (provenance unscanned, no text to scan)"} if {
	is_object(pii)
	pii_require_scan == true
	not pii_scanned
}

# --- task -------------------------------------------------------------------

# NOTE: tasks compare as [id, version] pairs, never joined into one string: {id: "qa",
# version: "1@2"} and {id: "qa@1", version: "2"} are different tasks. Group entries are
# "id@version" with exactly one "@" (checked at load), split into the same pairs.
my_task := [input.request.task.id, input.request.task.version]

donor_task := [donor.task.id, donor.task.version]

task_pair(ref) := [parts[0], parts[1]] if {
	parts := split(ref, "@")
	count(parts) == 2
}

task_ok if my_task == donor_task

task_ok if {
	some group in compatible_task_groups
	pairs := {task_pair(ref) | some ref in group}
	my_task in pairs
	donor_task in pairs
}

deny contains {"gate": "task", "detail": detail} if {
	donor_known
	not task_ok
	detail := sprintf("donor task %v differs from %v", [object.get(donor, "task", null), input.request.task])
}

# --- response_contract ------------------------------------------------------

response_contract_ok if {
	donor.response_contract.id == input.request.response_contract.id
	donor.response_contract.schema_sha256 == input.request.response_contract.schema_sha256
}

deny contains {"gate": "response_contract", "detail": detail} if {
	donor_known
	not response_contract_ok
	detail := response_contract_detail
}

response_contract_detail := sprintf("donor contract %q differs from %q", [donor.response_contract.id, input.request.response_contract.id]) if {
	donor.response_contract.id != input.request.response_contract.id
} else := "response contract schema hash differs"

# --- similarity -------------------------------------------------------------

similarity_ok if {
	is_number(input.candidate.similarity)
	input.candidate.similarity >= similarity_min
}

deny contains {"gate": "similarity", "detail": sprintf("similarity %v < %v", [input.candidate.similarity, similarity_min])} if {
	not similarity_ok
}

# --- token_verification and approved spans ----------------------------------

tokens := input.facts.tokens

# --- quality: the first matching rule, else the defaults ----------------------

rule_matches(r) if {
	object.get(r, "task", input.request.task.id) == input.request.task.id
	object.get(r, "response_contract", input.request.response_contract.id) == input.request.response_contract.id
}

matching_rules := [i | some i, r in quality_rules; rule_matches(r)]

quality_rule := quality_rules[matching_rules[0]] if count(matching_rules) > 0 else := {}

shifted_allowed if {
	allow_shifted == true
	object.get(quality_rule, "allow_shifted", quality_allow_shifted) == true
}

recompute_percent := object.get(quality_rule, "shifted_recompute_percent", shifted_recompute_percent)

recompute_min := object.get(quality_rule, "min_recompute_tokens", min_recompute_tokens)

recompute_tail := object.get(quality_rule, "shifted_recompute_tail_tokens", shifted_recompute_tail_tokens)

recompute(s) := 0 if s.kind == "prefix"

recompute(s) := min([s.length, max([recompute_min, ceil((recompute_percent * s.length) / 100)])]) if {
	s.kind == "shifted"
}

tail(s) := 0 if s.kind == "prefix"

tail(s) := min([s.length, recompute_tail]) if s.kind == "shifted"

# A tail that leaves nothing to copy: the span is not approved.
copied(s) if tail(s) == 0

copied(s) if {
	tail(s) > 0
	recompute(s) + tail(s) < s.length
}

# Prefix spans always; shifted ones when allowed (for this request's task and
# contract), long enough, and in reusable roles on both sides.
span_approved(s) if s.kind == "prefix"

span_approved(s) if {
	shifted_allowed
	s.length >= min_span_tokens
	s.recipient_role in reusable_roles
	s.donor_role in reusable_roles
}

approved_spans := [out |
	some s in tokens.spans
	span_approved(s)
	copied(s)
	out := {
		"recipient_start": s.recipient_start,
		"donor_start": s.donor_start,
		"length": s.length - tail(s),
		"kind": s.kind,
		"recompute": recompute(s),
	}
]

# The gate counts every approved, verified token (a planned head or tail included), as the
# YAML engine does.
approved_tokens := sum([s.length | some s in tokens.spans; span_approved(s)])

approved_fraction := approved_tokens / tokens.recipient_length if {
	tokens.recipient_length != 0
} else := 0

deny contains {"gate": "token_verification", "detail": "token facts unavailable"} if {
	not is_object(tokens)
}

deny contains {"gate": "token_verification", "detail": "no verified tokens to reuse"} if {
	is_object(tokens)
	approved_tokens == 0
}

deny contains {"gate": "token_verification", "detail": detail} if {
	is_object(tokens)
	approved_tokens < min_approved_tokens
	detail := sprintf("%v/%v tokens approved; need >= %v tokens", [approved_tokens, tokens.recipient_length, min_approved_tokens])
}

deny contains {"gate": "token_verification", "detail": detail} if {
	is_object(tokens)
	approved_fraction < min_approved_fraction
	detail := sprintf("%v/%v tokens approved; need >= %v of the recipient", [approved_tokens, tokens.recipient_length, min_approved_fraction])
}
