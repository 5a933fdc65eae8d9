"""A fake vLLM engine that drives KV connectors through vLLM's interface (see README.md)."""
