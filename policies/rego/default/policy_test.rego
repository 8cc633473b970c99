# Unit tests for policy.rego: each gate passing and failing, missing facts,
# span approval and boundaries. Run: semgov policy test policies/rego/default
package semgov.reuse_test

import data.semgov.reuse
import rego.v1

# A candidate that passes every gate: 110 prefix tokens (system) approved; 60
# shifted evidence tokens (shifted spans are off by default: not approved) and 30
# shifted question tokens (never approved); 110 of 200 recipient tokens.
base_input := {
	"schema": "semgov.policy_input/v1",
	"now": "2026-11-29T10:00:00Z",
	"now_ns": 1795946400000000000,
	"request": {
		"request_id": "r-17",
		"tenant": "acme",
		"namespace": "research/entity-042",
		"task": {"id": "extract_financials", "version": "1"},
		"response_contract": {"id": "financials", "schema_sha256": "abababababababababababababababababababababababababababababababab"},
		"prompt_tokens": 200,
	},
	"candidate": {
		"donor_id": "r-03",
		"similarity": 0.9,
		"prompt_tokens": 210,
		"key_id": "k1",
		"has_text": false,
	},
	"facts": {
		"provenance": {
			"key_status": "trusted",
			"signature_valid": true,
			"payload_valid": true,
			"payload_error": null,
			"donor_id_matches": true,
			"token_hash_matches": true,
			"segments_hash_matches": true,
			"text_hash_matches": true,
		},
		"donor": {
			"tenant": "acme",
			"namespace": "research/entity-042",
			"task": {"id": "extract_financials", "version": "1"},
			"response_contract": {"id": "financials", "schema_sha256": "abababababababababababababababababababababababababababababababab"},
			"created_at": "2026-11-28T10:00:00Z",
			"expires_at": "2026-12-05T10:00:00Z",
			"created_at_ns": 1795860000000000000,
			"expires_at_ns": 1796464800000000000,
			"policy_version": "default@1",
			"visibility": "tenant",
		},
		"pii": {
			"provenance_scanned": true,
			"provenance_entities": [],
			"text_scanned": false,
			"text_entities": [],
		},
		"tokens": {
			"recipient_length": 200,
			"donor_length": 210,
			"common_prefix": 110,
			"spans": [
				span(0, 0, 110, "prefix", "system", "system"),
				span(110, 120, 60, "shifted", "evidence", "evidence"),
				span(170, 180, 30, "shifted", "question", "question"),
			],
		},
		"errors": {},
	},
}

span(rs, ds, n, kind, rrole, drole) := {
	"recipient_start": rs,
	"donor_start": ds,
	"length": n,
	"kind": kind,
	"recipient_role": rrole,
	"donor_role": drole,
}

# An approved span with its realization plan: `recompute` leading tokens are computed, not copied
# (prefix spans 0; shifted spans: `quality`, where a rule turns them on; none by default).
approved(rs, ds, n, kind, recompute) := {
	"recipient_start": rs, "donor_start": ds, "length": n, "kind": kind, "recompute": recompute,
}

patched(patch) := object.union(base_input, patch)

with_donor(patch) := patched({"facts": {"donor": patch}})

with_provenance(patch) := patched({"facts": {"provenance": patch}})

with_pii(patch) := patched({"facts": {"pii": patch}})

with_tokens(n, spans) := patched({"facts": {"tokens": {"recipient_length": n, "spans": spans}}})

gates_of(ds) := {d.gate | some d in ds}

donor_gates := {"tenant", "namespace", "expiry", "policy_version", "task", "response_contract"}

# --- whole decision ---------------------------------------------------------

test_base_allows if {
	ds := reuse.deny with input as base_input
	count(ds) == 0
	reuse.allow with input as base_input
}

test_base_approved_spans if {
	spans := reuse.approved_spans with input as base_input
	spans == [approved(0, 0, 110, "prefix", 0)]
}

# Shifted spans where quality turns them on: the first 16 and the last 256 tokens (before the
# question) computed, so the approved span ends early and states its head; one the plan leaves
# nothing of is not approved.
test_shifted_spans_on_end_early_by_the_tail if {
	long := with_tokens(500, [
		span(0, 0, 110, "prefix", "system", "system"),
		span(110, 120, 300, "shifted", "evidence", "evidence"),
		span(410, 420, 60, "shifted", "evidence", "evidence"),
	])
	spans := reuse.approved_spans with input as long with reuse.quality_allow_shifted as true
	spans == [approved(0, 0, 110, "prefix", 0), approved(110, 120, 44, "shifted", 16)]
	ds := reuse.deny with input as long with reuse.quality_allow_shifted as true
	count(ds) == 0
}

test_shifted_spans_on_by_a_quality_rule_for_its_task_only if {
	rules := [{"task": "extract_financials", "allow_shifted": true, "shifted_recompute_tail_tokens": 0, "min_recompute_tokens": 0}]
	spans := reuse.approved_spans with input as base_input with reuse.quality_rules as rules
	spans == [approved(0, 0, 110, "prefix", 0), approved(110, 120, 60, "shifted", 0)]
	other := patched({"request": {"task": {"id": "summarize_risks", "version": "1"}}})
	reuse.approved_spans == [approved(0, 0, 110, "prefix", 0)] with input as other with reuse.quality_rules as rules
}

test_deny_entries_are_gate_and_detail if {
	ds := reuse.deny with input as with_donor({"tenant": "globex", "namespace": "other"})
	count(ds) == 2
	every d in ds {
		object.keys(d) == {"gate", "detail"}
		is_string(d.detail)
	}
}

test_metadata if {
	reuse.metadata == {"name": "default", "version": "1"}
}

test_facts_config if {
	reuse.facts_config == {
		"min_span_tokens": 32,
		"scan_donor_text": true,
		"pii_min_score": 0.4,
		"phone_regions": ["US", "GB", "FR", "IL", "IN", "CA", "BR"],
		"pii_entities": ["CREDIT_CARD", "EMAIL_ADDRESS", "IBAN_CODE", "IP_ADDRESS", "PHONE_NUMBER", "US_SSN"],
	}
}

# --- tenant -----------------------------------------------------------------

test_tenant_other_tenant_fails if {
	ds := reuse.deny with input as with_donor({"tenant": "globex"})
	gates_of(ds) == {"tenant"}
	allowed := reuse.allow with input as with_donor({"tenant": "globex"})
	allowed == false
}

test_tenant_public_donor_of_other_tenant_fails if {
	ds := reuse.deny with input as with_donor({"tenant": "globex", "visibility": "public"})
	gates_of(ds) == {"tenant"}
}

test_tenant_public_donor_of_same_tenant_passes if {
	ds := reuse.deny with input as with_donor({"visibility": "public"})
	count(ds) == 0
}

test_tenant_public_donor_passes_when_allowed if {
	ds := reuse.deny with input as with_donor({"tenant": "globex", "visibility": "public"})
		with reuse.allow_public_donors as true
	count(ds) == 0
}

# --- namespace --------------------------------------------------------------

test_namespace_other_fails if {
	ds := reuse.deny with input as with_donor({"namespace": "research/entity-043"})
	gates_of(ds) == {"namespace"}
}

test_namespace_parent_fails if {
	ds := reuse.deny with input as with_donor({"namespace": "research"})
	gates_of(ds) == {"namespace"}
}

test_namespace_sharing_rule_passes if {
	ds := reuse.deny with input as with_donor({"namespace": "research/common"})
		with reuse.namespace_sharing as [{"donor": "research/common", "recipients": ["research/*"]}]
	count(ds) == 0
}

test_namespace_patterns if {
	reuse.namespace_matches("research/*", "research/entity-042")
	reuse.namespace_matches("research/*", "research/a/b")
	not reuse.namespace_matches("research/*", "research")
	not reuse.namespace_matches("research/*", "research/")
	not reuse.namespace_matches("research/*", "researchers/a")
	reuse.namespace_matches("research/common", "research/common")
	not reuse.namespace_matches("research/common", "research/common/x")
	not reuse.namespace_matches("research/*", "research/../legal")
	not reuse.namespace_matches("research/*", "research/./x")
	not reuse.namespace_matches("research/*", "research//x")
	not reuse.namespace_matches("research/*", "research/x/")
	not reuse.namespace_matches("research/*", "research/*")
	not reuse.namespace_matches("research/*", "research/caf\u00e9")
}

# --- provenance -------------------------------------------------------------

test_provenance_revoked_key_fails if {
	ds := reuse.deny with input as with_provenance({"key_status": "revoked"})
	gates_of(ds) == {"provenance"}
}

test_provenance_unknown_key_fails if {
	ds := reuse.deny with input as with_provenance({"key_status": "unknown", "signature_valid": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_bad_signature_fails if {
	ds := reuse.deny with input as with_provenance({"signature_valid": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_donor_id_mismatch_fails if {
	ds := reuse.deny with input as with_provenance({"donor_id_matches": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_token_hash_mismatch_fails if {
	ds := reuse.deny with input as with_provenance({"token_hash_matches": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_segments_hash_mismatch_fails if {
	ds := reuse.deny with input as with_provenance({"segments_hash_matches": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_text_hash_mismatch_fails if {
	ds := reuse.deny with input as with_provenance({"text_hash_matches": false})
	gates_of(ds) == {"provenance"}
}

test_provenance_missing_binding_fact_fails if {
	ds := reuse.deny with input as json.remove(base_input, ["facts/provenance/segments_hash_matches"])
	gates_of(ds) == {"provenance"}
}

test_provenance_missing_signature_fact_fails if {
	ds := reuse.deny with input as json.remove(base_input, ["facts/provenance/signature_valid"])
	gates_of(ds) == {"provenance"}
}

# --- null donor: invalid payload --------------------------------------------

null_donor_input := patched({"facts": {
	"donor": null,
	"provenance": {
		"payload_valid": false,
		"payload_error": "tenant: Input should be a valid string",
		"donor_id_matches": false,
		"token_hash_matches": false,
		"segments_hash_matches": false,
		"text_hash_matches": false,
	},
}})

test_null_donor_fails_every_donor_gate if {
	ds := reuse.deny with input as null_donor_input
	gates_of(ds) == donor_gates | {"provenance"}
	allowed := reuse.allow with input as null_donor_input
	allowed == false
}

test_null_donor_alone_fails_donor_gates if {
	ds := reuse.deny with input as with_donor(null)
	gates_of(ds) == donor_gates
}

# --- expiry -----------------------------------------------------------------

test_expiry_now_equals_created_passes if {
	ds := reuse.deny with input as patched({"now_ns": 1795860000000000000})
	count(ds) == 0
}

test_expiry_created_in_future_fails if {
	ds := reuse.deny with input as patched({"now_ns": 1795859999999999000})
	gates_of(ds) == {"expiry"}
}

test_expiry_now_equals_expires_fails if {
	ds := reuse.deny with input as patched({"now_ns": 1796464800000000000})
	gates_of(ds) == {"expiry"}
}

test_expiry_just_before_expires_passes if {
	ds := reuse.deny with input as patched({"now_ns": 1796464799999999000})
	count(ds) == 0
}

# Max age 30d = 2592000 s: created 1795860000, so now 1798452000 is exactly 30d.
long_lived(now) := patched({"now_ns": now, "facts": {"donor": {"expires_at_ns": 1800000000000000000}}})

test_expiry_age_equals_max_age_fails if {
	ds := reuse.deny with input as long_lived(1798452000000000000)
	gates_of(ds) == {"expiry"}
}

test_expiry_age_below_max_age_passes if {
	ds := reuse.deny with input as long_lived(1798451999999999999)
	count(ds) == 0
}

# --- policy_version ---------------------------------------------------------

test_policy_version_other_fails if {
	ds := reuse.deny with input as with_donor({"policy_version": "default@2"})
	gates_of(ds) == {"policy_version"}
}

test_policy_version_listed_passes if {
	ds := reuse.deny with input as with_donor({"policy_version": "default@0"})
		with reuse.accepted_policy_versions as ["default@0"]
	count(ds) == 0
}

# --- pii --------------------------------------------------------------------

test_pii_declared_forbidden_fails if {
	ds := reuse.deny with input as with_pii({"provenance_entities": ["US_SSN"]})
	gates_of(ds) == {"pii"}
}

test_pii_found_in_text_fails if {
	ds := reuse.deny with input as with_pii({"text_scanned": true, "text_entities": ["EMAIL_ADDRESS"]})
	gates_of(ds) == {"pii"}
}

test_pii_other_entity_passes if {
	ds := reuse.deny with input as with_pii({"provenance_entities": ["PERSON"]})
	count(ds) == 0
}

test_pii_never_scanned_fails if {
	ds := reuse.deny with input as with_pii({"provenance_scanned": false, "text_scanned": false})
	gates_of(ds) == {"pii"}
}

test_pii_scanned_text_only_passes if {
	ds := reuse.deny with input as with_pii({"provenance_scanned": false, "text_scanned": true})
	count(ds) == 0
}

# --- fact errors: semgov reports the gate as error; the policy must deny ----

test_pii_fact_error_denies if {
	inp := patched({"facts": {"pii": null, "errors": {"pii": "RuntimeError: scanner failed"}}})
	ds := reuse.deny with input as inp
	gates_of(ds) == {"pii"}
	allowed := reuse.allow with input as inp
	allowed == false
}

test_pii_facts_missing_without_error_denies if {
	ds := reuse.deny with input as patched({"facts": {"pii": null}})
	gates_of(ds) == {"pii"}
}

test_tokens_fact_error_denies_and_approves_nothing if {
	inp := patched({"facts": {"tokens": null, "errors": {"tokens": "ValueError: bad segments"}}})
	ds := reuse.deny with input as inp
	gates_of(ds) == {"token_verification"}
	spans := reuse.approved_spans with input as inp
	spans == []
}

test_provenance_fact_error_denies if {
	inp := patched({"facts": {"provenance": null, "donor": null, "errors": {"provenance": "boom"}}})
	ds := reuse.deny with input as inp
	gates_of(ds) == donor_gates | {"provenance"}
}

# --- task -------------------------------------------------------------------

test_task_other_version_fails if {
	ds := reuse.deny with input as with_donor({"task": {"id": "extract_financials", "version": "2"}})
	gates_of(ds) == {"task"}
}

test_task_compatible_group_passes if {
	ds := reuse.deny with input as with_donor({"task": {"id": "extract_financials", "version": "2"}})
		with reuse.compatible_task_groups as [["extract_financials@1", "extract_financials@2"]]
	count(ds) == 0
}

# --- response_contract ------------------------------------------------------

test_response_contract_id_differs_fails if {
	ds := reuse.deny with input as with_donor({"response_contract": {"id": "risk_summary"}})
	gates_of(ds) == {"response_contract"}
}

test_response_contract_hash_differs_fails if {
	h := "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"
	ds := reuse.deny with input as with_donor({"response_contract": {"schema_sha256": h}})
	gates_of(ds) == {"response_contract"}
}

# --- similarity -------------------------------------------------------------

test_similarity_at_min_passes if {
	ds := reuse.deny with input as patched({"candidate": {"similarity": 0.6}})
	count(ds) == 0
}

test_similarity_below_min_fails if {
	ds := reuse.deny with input as patched({"candidate": {"similarity": 0.5999999999999999}})
	gates_of(ds) == {"similarity"}
}

# --- token_verification -----------------------------------------------------

test_tokens_exactly_64_and_half_passes if {
	ds := reuse.deny with input as with_tokens(128, [span(0, 0, 64, "prefix", "system", "system")])
	count(ds) == 0
}

test_tokens_63_fails if {
	ds := reuse.deny with input as with_tokens(126, [span(0, 0, 63, "prefix", "system", "system")])
	gates_of(ds) == {"token_verification"}
}

test_tokens_fraction_below_half_fails if {
	ds := reuse.deny with input as with_tokens(129, [span(0, 0, 64, "prefix", "system", "system")])
	gates_of(ds) == {"token_verification"}
}

test_tokens_no_spans_fails if {
	inp := with_tokens(200, [])
	ds := reuse.deny with input as inp
	gates_of(ds) == {"token_verification"}
	spans := reuse.approved_spans with input as inp
	spans == []
}

test_tokens_empty_recipient_fails if {
	ds := reuse.deny with input as with_tokens(0, [])
	gates_of(ds) == {"token_verification"}
}

test_tokens_only_unapproved_spans_fail if {
	ds := reuse.deny with input as with_tokens(100, [span(0, 5, 100, "shifted", "question", "question")])
	gates_of(ds) == {"token_verification"}
}

# --- span approval: prefix vs shifted ---------------------------------------

test_prefix_span_approved_in_any_role if {
	spans := reuse.approved_spans with input as with_tokens(100, [
		span(0, 0, 10, "prefix", "question", "question"),
		span(10, 10, 5, "prefix", "instruction", "other"),
	])
	spans == [approved(0, 0, 10, "prefix", 0), approved(10, 10, 5, "prefix", 0)]
}

test_shifted_span_in_question_not_approved if {
	spans := reuse.approved_spans with input as with_tokens(100, [
		span(0, 3, 40, "shifted", "question", "question"),
		span(40, 43, 40, "shifted", "evidence", "question"),
		span(80, 83, 40, "shifted", "instruction", "system"),
	])
	spans == []
}

test_shifted_span_length_boundary if {
	spans := reuse.approved_spans with input as with_tokens(200, [
		span(0, 7, 31, "shifted", "evidence", "evidence"),
		span(31, 38, 32, "shifted", "system", "evidence"),
	])
		with reuse.quality_allow_shifted as true
		with reuse.shifted_recompute_tail_tokens as 0
		with reuse.shifted_recompute_percent as 20
		with reuse.min_recompute_tokens as 16
	spans == [approved(31, 38, 32, "shifted", 16)]
}

test_shifted_spans_not_approved_when_disallowed if {
	spans := reuse.approved_spans with input as base_input
		with reuse.allow_shifted as false
		with reuse.quality_allow_shifted as true
		with reuse.shifted_recompute_tail_tokens as 0
	spans == [approved(0, 0, 110, "prefix", 0)]
}
