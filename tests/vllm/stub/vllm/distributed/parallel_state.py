"""vLLM's tensor-parallel group queries. The harness sets the rank of each worker process."""
_TP = {"rank": 0, "world_size": 1}


def set_tensor_model_parallel(rank, world_size):  # stub only: vLLM sets these at init
    _TP["rank"], _TP["world_size"] = rank, world_size


def get_tensor_model_parallel_rank():
    return _TP["rank"]


def get_tensor_model_parallel_world_size():
    return _TP["world_size"]
