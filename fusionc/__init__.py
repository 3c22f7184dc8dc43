"""fusionc: a compiler of fused cluster kernels for LLM decode on NVIDIA Hopper (sm_90a).

Decoder stages written in a small Python DSL are traced to graph IR, lowered to tile IR with
explicit cluster collectives (ClusterReduce, ClusterGather over distributed shared memory), fused
into single kernels, emitted as CUDA through Jinja templates and compiled with NVRTC.
See DESIGN.md (shared) and README.md.
"""
__version__ = "0.1.0"

from fusionc import errors  # noqa: E402,F401
