"""Tensor-parallel communication between the GPUs of one node (NVLink peer-to-peer, no
multicast) with NCCL as the fallback: process groups, the all-reduce kernels, the
communicator and the launcher."""
from fusionc.comm.communicator import CommError, Communicator
from fusionc.comm.group import Group

__all__ = ["CommError", "Communicator", "Group"]
