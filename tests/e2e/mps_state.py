"""Whether an MPS control daemon runs on this host, as tuttid judges it at start (gpu/probe.cc
FindMps): its control pipe in $CUDA_MPS_PIPE_DIRECTORY, else /tmp/nvidia-mps. Without MPS the GPU
time-slices tuttid's kernels against the engine's. No torch: bench/ssd_array.py imports it too."""
import os


def mps_running():
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or "/tmp/nvidia-mps"
    return os.path.exists(os.path.join(pipe, "control"))
