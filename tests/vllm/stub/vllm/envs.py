"""vLLM's environment switches (vllm/envs.py) that the connector's code paths read."""
import os


def __getattr__(name):
    if name == "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES":  # default on, as in vLLM
        return bool(int(os.getenv(name, "1")))
    raise AttributeError(name)
