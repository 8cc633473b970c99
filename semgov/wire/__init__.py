"""Wire formats: the pydantic models of everything semgov reads and writes, the policy input
document, RFC 3339 time, strict JSON, and the JSON Schemas generated from them."""
