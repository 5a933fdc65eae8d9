"""vLLM's tensor-parallel group queries. The harness sets the rank of each worker process."""
_TP = {"rank": 0, "world_size": 1, "cpu_group": None}


class GroupCoordinator:
    """vLLM's process group wrapper, reduced to what connectors use."""

    def __init__(self, rank_in_group, world_size, cpu_group):
        self.rank_in_group = rank_in_group
        self.world_size = world_size
        self.cpu_group = cpu_group  # a gloo torch.distributed group


def set_tp_cpu_group(group):  # stub only: the harness's workers create it
    _TP["cpu_group"] = group


def get_tp_group() -> GroupCoordinator:
    if _TP["world_size"] > 1 and _TP["cpu_group"] is None:
        raise RuntimeError("tensor parallel group is not initialized")
    return GroupCoordinator(_TP["rank"], _TP["world_size"], _TP["cpu_group"])


def set_tensor_model_parallel(rank, world_size):  # stub only: vLLM sets these at init
    _TP["rank"], _TP["world_size"] = rank, world_size


def get_tensor_model_parallel_rank():
    return _TP["rank"]


def get_tensor_model_parallel_world_size():
    return _TP["world_size"]
