"""Built-in ops. Importing this package registers every op with ``fusionc.ir.registry``.

Graph IR (decoder stages): :mod:`.elementwise`, :mod:`.norm`, :mod:`.linear`, :mod:`.shape`,
:mod:`.rope`, :mod:`.attention`, :mod:`.comm`.
"""
from fusionc.ir.ops import attention, comm, elementwise, linear, norm, rope, shape  # noqa: F401
