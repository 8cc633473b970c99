# Similarity-only reuse, for benchmarks: the arm semgov is measured against.
#
# What a semantic cache without governance does: any donor candidate whose similarity is at least
# 0.6 gives every token-identical span token verification found (prefix or shifted, whatever the
# segment roles), copied whole (no recompute). No tenant, namespace, provenance, expiry, PII, task
# or contract gate: in a serving engine the candidates are already limited to the request's own
# tenant and namespace by the engine's scope, so this is "reuse whatever looks similar in scope".
# Never deploy it.
package semgov.reuse

import rego.v1

metadata := {"name": "similarity_only", "version": "1"}

facts_config := {
	"min_span_tokens": 32,
	"scan_donor_text": false,
	"pii_min_score": 0.4,
	"phone_regions": ["US"],
	"pii_entities": ["EMAIL_ADDRESS"],
}

similarity_min := 0.6

default allow := false

allow if count(deny) == 0

deny contains {"gate": "similarity", "detail": sprintf("similarity %v < %v", [input.candidate.similarity, similarity_min])} if {
	input.candidate.similarity < similarity_min
}

deny contains {"gate": "token_verification", "detail": "no verified tokens to reuse"} if {
	count(approved_spans) == 0
}

approved_spans := [out |
	some s in input.facts.tokens.spans
	out := {
		"recipient_start": s.recipient_start,
		"donor_start": s.donor_start,
		"length": s.length,
		"kind": s.kind,
		"recompute": 0,
	}
]
