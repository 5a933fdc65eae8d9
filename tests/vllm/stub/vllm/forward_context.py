from dataclasses import dataclass, field
from typing import Any


@dataclass
class ForwardContext:
    no_compile_layers: dict = field(default_factory=dict)
    attn_metadata: Any = None
    virtual_engine: int = 0
