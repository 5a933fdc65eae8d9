"""Stand-in for vLLM (tests only): see tests/vllm/stub/README.md."""
__version__ = "0.13.0+tutti-stub"
