"""Cost model of tile-IR kernels on the H200, computed without a GPU (see :mod:`.model`)."""
from fusionc.cost.h200 import H200
from fusionc.cost.model import KernelCost, kernel_cost

__all__ = ["H200", "KernelCost", "kernel_cost"]
