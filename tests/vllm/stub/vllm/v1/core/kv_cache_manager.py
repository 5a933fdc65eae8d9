from dataclasses import dataclass


@dataclass
class KVCacheBlocks:
    """vLLM's allocation result: blocks[i] are the KVCacheBlock objects of group i (here: their
    ids)."""
    blocks: tuple

    def get_block_ids(self):
        return tuple(list(g) for g in self.blocks)

    def get_unhashed_block_ids(self):
        return list(self.blocks[0])
