"""The cluster simulator: the executable specification of tile IR.

``simulate_kernel`` runs a kernel CTA by CTA in numpy, every CTA of a cluster in lockstep between
cluster-wide synchronisation points, with private shared memory, distributed shared memory reached
only through the collectives, and values stored in the kernel's dtypes. ``simulate`` runs a whole
module: graph ops through the interpreter, ``launch`` ops through the kernel simulator.
"""
from fusionc.sim.simulator import simulate, simulate_kernel

__all__ = ["simulate", "simulate_kernel"]
