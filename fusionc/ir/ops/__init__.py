"""Built-in ops. Importing this package registers every op with ``fusionc.ir.registry``.

Graph IR (decoder stages): :mod:`.elementwise`, :mod:`.norm`, :mod:`.linear`, :mod:`.shape`,
:mod:`.embedding`, :mod:`.rope`, :mod:`.attention`, :mod:`.chunk` (many new tokens per sequence), :mod:`.mla`
(multi-head latent attention), :mod:`.comm`.
Tile IR (per-CTA programs of cluster kernels): :mod:`.tile_memory`, :mod:`.tile_collective`,
:mod:`.tile_compute`, :mod:`.tile_grid`; streamed persistent kernels (design v2):
:mod:`.tile_stream` (the shared-memory ring), :mod:`.tile_units` (work units, counters), :mod:`.tile_attn_units` and
:mod:`.tile_mla_units` (attention and MLA cores as units); the ``kernel`` item kind in :mod:`fusionc.ir.kernel`.
"""
from fusionc.ir.ops import attention, chunk, comm, elementwise, embedding, linear  # noqa: F401
from fusionc.ir.ops import mla  # noqa: F401
from fusionc.ir.ops import norm, rope, shape, tokens  # noqa: F401
from fusionc.ir.ops import tile_attention, tile_collective, tile_compute, tile_grid  # noqa: F401
from fusionc.ir.ops import tile_memory, tile_units, tile_stream  # noqa: F401
from fusionc.ir.ops import tile_attn_units, tile_mla_units  # noqa: F401
from fusionc.ir import kernel  # noqa: F401,E402
