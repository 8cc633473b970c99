"""semgov for vLLM (issue 19): so far, the scope middleware for vLLM's OpenAI server (docs/vllm.md)."""
