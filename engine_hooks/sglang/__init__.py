"""semgov's SGLang engine hook (see docs/sglang.md)."""
