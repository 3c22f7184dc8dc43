"""Kernel arguments packed once into reusable storage for ``cuLaunchKernelEx`` (issue 23).

A launch passes the driver the address of an array of ``void*``, one per kernel parameter,
each pointing at that argument's bytes. :class:`ArgPack` holds that array and the storage behind
it for one kernel at one set of run-time dims (and debug delay): everything but the tensor
pointers is written once, when the pack is built; a launch only writes the pointer slots.

Each :class:`fusionc.codegen.source.KernelParam` kind has a packer in :data:`PACKERS`:
``packer(param, ctx) -> Slot``. A new kind (e.g. a 128-byte ``CUtensorMap`` built from a weight
pointer) slots in by adding one: a constant argument is ``Slot(storage)``; one that follows a
tensor's pointer at every launch is ``Slot(storage, tensor=name, update=fn)`` with
``fn(storage, ptr)`` rewriting the storage (it may remember the last pointer and skip the work
when it has not changed). Plain device pointers (``Slot(None, tensor=name)``) are written in
bulk into one ``uint64`` array, the cheapest per-launch path.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Callable

from fusionc.errors import InputError


@dataclass
class Slot:
    """One kernel argument: ``storage`` (a ctypes object holding its bytes; None for a plain
    device pointer), and for per-launch arguments the IR tensor ``tensor`` whose device pointer
    they follow and ``update(storage, ptr)`` (None: a plain pointer)."""

    storage: object = None
    tensor: str | None = None
    update: Callable | None = None
    address: int | None = None   # where the argument's bytes start (default: the storage's)


@dataclass(frozen=True)
class PackContext:
    """What packers may read: the kernel's source, its workspace and counter pointers, the
    run-time dims and the debug delay ``(rank, ns)``."""

    source: object
    workspace: int
    counters: int
    dims: dict
    delay: tuple


def _tensor(p, ctx) -> Slot:
    return Slot(tensor=p.value.name)


def check_dim(p, dims: dict, source) -> int:
    """The run-time size of dim parameter ``p``; InputError when it is missing or outside
    ``0..max_batch``."""
    n = dims.get(p.symbol)
    mb = source.kernel.attr("max_batch")
    if n is None or not 0 <= n <= mb:
        raise InputError(f"symbolic dim {p.symbol} = {n}", op=source.name,
                         valid=f"0 <= {p.symbol} <= max_batch = {mb}")
    return int(n)


PACKERS: dict[str, Callable[..., Slot]] = {
    "tensor": _tensor,
    "dim": lambda p, ctx: Slot(ctypes.c_int(check_dim(p, ctx.dims, ctx.source))),
    "workspace": lambda p, ctx: Slot(ctypes.c_void_p(ctx.workspace)),
    "counters": lambda p, ctx: Slot(ctypes.c_void_p(ctx.counters)),
    "delay_rank": lambda p, ctx: Slot(ctypes.c_int(int(ctx.delay[0]))),
    "delay_ns": lambda p, ctx: Slot(ctypes.c_ulonglong(int(ctx.delay[1]))),
    "tensormap": lambda p, ctx: _tensormap(p, ctx),
}


def _tensormap(p, ctx) -> Slot:
    from fusionc.runtime.tma import pack_tensormap   # needs the driver: imported on use
    return pack_tensormap(p, ctx)


class ArgPack:
    """The packed arguments of one kernel at one ``PackContext``.

    ``names``: the IR tensors whose pointers a launch gives, in the order :meth:`fill` takes
    them; ``address``: the ``void**`` to pass to ``cuLaunchKernelEx``.
    """

    def __init__(self, params, ctx: PackContext, packers: dict | None = None):
        packers = PACKERS if packers is None else packers
        slots = []
        for p in params:
            if p.kind not in packers:
                raise InputError(f"kernel parameter {p.name} of kind '{p.kind}'",
                                 op=ctx.source.name, valid=", ".join(sorted(packers)))
            slots.append(packers[p.kind](p, ctx))
        plain = [s for s in slots if s.tensor is not None and s.update is None]
        self.custom = [s for s in slots if s.update is not None]
        self.names = tuple(s.tensor for s in plain) + tuple(s.tensor for s in self.custom)
        self._plain = len(plain)
        self.ptrs = (ctypes.c_uint64 * max(len(plain), 1))()
        self.argv = (ctypes.c_void_p * max(len(slots), 1))()
        base, j = ctypes.addressof(self.ptrs), 0
        for i, s in enumerate(slots):
            if s.tensor is not None and s.update is None:
                self.argv[i] = base + 8 * j
                j += 1
            else:
                self.argv[i] = s.address or ctypes.addressof(s.storage)
        self.slots = slots  # keeps the storage alive
        self.address = ctypes.addressof(self.argv)
        self.skip = False   # set by the loader: launches that have nothing to compute
        # fill(ptrs) is `plain_only[:] = ptrs` when every per-launch slot is a plain pointer
        self.plain_only = self.ptrs if plain and not self.custom else None

    def fill(self, ptrs) -> None:
        """Write the device pointers ``ptrs`` (one per :attr:`names`) into their slots."""
        n = self._plain
        if not self.custom:
            if n:
                self.ptrs[:] = ptrs
            return
        if n:
            self.ptrs[:] = ptrs[:n]
        for s, p in zip(self.custom, ptrs[n:]):
            s.update(s.storage, p)

    def values(self) -> list[int]:
        """The packed arguments as integers (for tests and debugging; custom slots of more
        than 8 bytes read as their first 8)."""
        out = []
        for i, s in enumerate(self.slots):
            size = ctypes.sizeof(s.storage) if s.storage is not None else 8
            kind = {4: ctypes.c_int}.get(size, ctypes.c_uint64)
            out.append(kind.from_address(self.argv[i]).value)
        return out
