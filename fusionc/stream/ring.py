"""The shared-memory ring of a streamed kernel (design v2 §2): geometry and mbarrier protocol.

A ring has ``stages`` stages. Stage ``s`` holds one unit's tiles: ``rows`` weight rows and
``xrows`` activation rows (the batch bucket, padded to 8) of a 256-byte K chunk, each copied by
2D TMA (``cp.async.bulk.tensor``, a tensor map per tensor built at bind time) as two boxes of
128-byte rows in the 128-byte swizzle: the 16-byte chunk ``c`` of row ``r`` of a box lies at
chunk ``c ^ (r % 8)``, so the eight rows one ldmatrix phase reads fall into distinct banks.
Boxes start at multiples of 1024 bytes (the swizzle's period). Rows and columns past the tensor
(N, K and batch tails) arrive as zeros, and the full boxes count towards the barrier's bytes.

Protocol, for the ``j``-th unit a CTA streams (``j = 0, 1, ...``), ``s = stage_of(j)``:
- the producer waits until the consumers released the stage's previous fill
  (``empty[s]`` at parity ``empty_parity(j)``; fills ``j < stages`` skip this wait), arms
  ``full[s]`` with the stage's byte count (``mbarrier.arrive.expect_tx``) and issues the copies;
- every consumer warp waits on ``full[s]`` at parity ``full_parity(j)``, reads the stage, and
  arrives on ``empty[s]`` (count: the consumer warps).
An mbarrier's phase ``k`` completes once per fill, so the parity of fill ``j`` is ``(j // S) & 1``
(``S`` stages). The simulator checks every wait against this (:mod:`fusionc.sim.grid`).
"""
from __future__ import annotations

from dataclasses import dataclass

BARRIER_BYTES = 8          # one mbarrier (b64)
ROW_BYTES = 256            # one tile row: a K chunk of 256 bytes, two swizzled 128-byte boxes
BOX_ROW_BYTES = 128        # the 128-byte swizzle's row (CU_TENSOR_MAP_SWIZZLE_128B)
BOX_ALIGN = 1024           # boxes start at multiples of the swizzle period
TMA_STRIDE_ALIGN = 16      # a tensor map's global strides are multiples of 16 bytes


def tma_rows(cols, itemsize: int) -> bool:
    """Whether TMA can copy rows of ``cols`` elements of ``itemsize`` bytes (a static row whose
    bytes are a multiple of 16: CUDA driver API, cuTensorMapEncodeTiled); else the plain-load
    path."""
    return isinstance(cols, int) and (cols * itemsize) % TMA_STRIDE_ALIGN == 0


def matrix_lead(rank: int, role: str) -> int:
    """How many leading dims of a streamed tensor form the rows of its 2D view (the tensor
    map's and the simulator's): a weight ``[.., N, K]`` (one ``[N, K]`` matrix per head for a
    block-diagonal linear) is ``[prod(leading), K]``; an activation or output ``[B, ...]`` is
    ``[B, prod(rest)]``. ``role``: ``"w"`` or ``"x"``."""
    return rank - 1 if role == "w" else 1


def head_column(g: int, rows: int, head_rows: int, head_cols: int) -> int:
    """The first activation column group ``g``'s tiles read: 0, or for a block-diagonal
    linear (``head_linear``: head ``h`` owns weight rows ``[h·head_rows, +head_rows)`` and
    activation columns ``[h·head_cols, +k)``) ``h·head_cols`` with ``h = g·rows //
    head_rows``. The simulator and :func:`head_column_c` (codegen) share this."""
    return (g * rows // head_rows) * head_cols if head_rows else 0


def head_column_c(g: str, rows: int, head_rows: int, head_cols: int) -> str:
    """:func:`head_column` as C (``g``: the group's expression)."""
    return f"({g}) * {rows} / {head_rows} * {head_cols} + " if head_rows else ""


def stage_of(j: int, stages: int) -> int:
    """The stage of a CTA's ``j``-th streamed unit."""
    return j % stages


def full_parity(j: int, stages: int) -> int:
    """The parity a consumer waits for on ``full[stage_of(j)]`` (fill ``j`` landed)."""
    return (j // stages) & 1


def empty_parity(j: int, stages: int) -> int:
    """The parity the producer waits for on ``empty[stage_of(j)]`` before fill ``j`` (the
    release of fill ``j - stages``); only for ``j >= stages``."""
    return (j // stages - 1) & 1


def full_parity_c(j: str, stages: int, offset: int = 0) -> str:
    """:func:`full_parity` as a C expression of the unit index ``j`` (codegen's copy of the
    same formula; ``offset``: the ops' ``parity_offset``)."""
    return f"({j} / {stages} + {offset}) & 1"


def empty_parity_c(j: str, stages: int, offset: int = 0) -> str:
    """:func:`empty_parity` as a C expression of ``j`` (only for ``j >= stages``)."""
    return f"({j} / {stages} - 1 + {offset}) & 1"


def pad_rows(n: int) -> int:
    """Rows of a box: a multiple of 8 (the swizzle period is 8 rows of 128 bytes)."""
    return -(-n // 8) * 8


def swizzle(row: int, chunk: int) -> int:
    """Where 16-byte chunk ``chunk`` (0..7) of box row ``row`` lies in the 128-byte swizzle."""
    return chunk ^ (row % 8)


@dataclass(frozen=True)
class RingGeometry:
    """Byte layout of a ring: ``stages`` stages of (``rows`` + ``pad_rows(xrows)``) rows of
    256 bytes (weight box 0 | weight box 1 | activation box 0 | activation box 1), then
    ``2·stages`` mbarriers (full, then empty); ``ALIGN_SLACK`` bytes let the kernel round the
    ring's start up to 1024.

    Attributes:
        stages: ring depth (2..16).
        rows, xrows: weight rows and activation rows of one stage.
        cols: elements per row (a K chunk of 256 bytes).
        itemsize: bytes per element.
    """

    stages: int
    rows: int
    xrows: int
    cols: int
    itemsize: int
    ALIGN_SLACK = BOX_ALIGN

    @property
    def box_cols(self) -> int:
        """Elements of one box row (128 bytes)."""
        return BOX_ROW_BYTES // self.itemsize

    @property
    def xbox_rows(self) -> int:
        """Rows of an activation box (``xrows`` padded to the swizzle's 8-row period)."""
        return pad_rows(self.xrows)

    def box_offset(self, part: str, half: int) -> int:
        """Byte offset in a stage of box ``half`` (0, 1) of part ``w`` or ``x``."""
        if part == "w":
            return half * self.rows * BOX_ROW_BYTES
        return 2 * self.rows * BOX_ROW_BYTES + half * self.xbox_rows * BOX_ROW_BYTES

    @property
    def stage_bytes(self) -> int:
        """Bytes of one stage: weight and activation rows of 256 bytes."""
        return (self.rows + self.xbox_rows) * ROW_BYTES

    @property
    def data_bytes(self) -> int:
        """Bytes of every stage (without the mbarriers)."""
        return self.stages * self.stage_bytes

    @property
    def copy_bytes(self) -> int:
        """Bytes one fill moves (the full barrier's transaction count): four whole boxes."""
        return self.stage_bytes

    @property
    def total_bytes(self) -> int:
        """Shared memory of the ring, mbarriers and alignment slack included."""
        return self.ALIGN_SLACK + self.data_bytes + 2 * self.stages * BARRIER_BYTES
