"""Facts of design v2's streamed persistent kernels, defined once for the simulator and codegen.

- :mod:`.schedule`: work units over a persistent grid (which CTA runs which unit, which CTAs
  contribute to a group of units, where their partial sums go);
- :mod:`.ring`: the shared-memory ring that TMA bulk copies fill (stage geometry, bytes, the
  mbarrier phase and parity of every fill).
"""
from fusionc.stream.ring import RingGeometry, full_parity, empty_parity, stage_of  # noqa: F401
from fusionc.stream.schedule import UnitSchedule  # noqa: F401
