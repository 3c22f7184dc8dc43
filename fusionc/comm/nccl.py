"""The NCCL fallback: the sum through NCCL (CuPy's ``cupy.cuda.nccl``, else an initialized
``torch.distributed`` NCCL group), then the residual add and RMSNorm by fusionc's own kernel on
each rank (the same template with one rank). Used beyond one node (``scope = nccl``) and when
peer-to-peer setup fails."""
from __future__ import annotations

from fusionc.comm.kernel import ITEMSIZE
from fusionc.errors import DeviceError

# nccl.h: ncclFloat16 = 6, ncclFloat32 = 7, ncclBfloat16 = 9; ncclSum = 0.
_NCCL_DTYPE = {"f16": 6, "f32": 7, "bf16": 9}


class NcclBackend:
    """An NCCL communicator over ``group`` (the unique id travels through the group) and a
    ``max_bytes`` buffer for the reduced copy.

    Raises:
        DeviceError: neither CuPy's NCCL nor an NCCL ``torch.distributed`` group is usable.
    """

    def __init__(self, group, max_bytes: int):
        import cupy
        self.group, self.comm, self.torch = group, None, False
        self.buf = cupy.empty(max_bytes, cupy.uint8)  # the reduced copy: no allocation per call
        try:
            from cupy.cuda import nccl
            if not nccl.available:
                raise ImportError("cupy.cuda.nccl is not available")
            uid = nccl.get_unique_id() if group.rank == 0 else None
            uid = group.all_gather(uid)[0]
            self.comm = nccl.NcclCommunicator(group.world, uid, group.rank)
            return
        except Exception as e:  # noqa: BLE001 - try PyTorch next
            why = f"{type(e).__name__}: {e}"
        try:
            import torch.distributed as dist
            if dist.is_initialized() and dist.get_backend() == "nccl":
                self.torch = True
                return
        except ImportError:
            pass
        raise DeviceError(f"no NCCL: CuPy's NCCL failed ({why}) and torch.distributed is not "
                          "initialized with the nccl backend",
                          valid="pip install nvidia-nccl-cu13, or init torch.distributed")

    def all_reduce(self, a, stream) -> None:
        """Sum x over the ranks into ``a.nccl_sum`` (a view of this backend's buffer) on
        ``stream``."""
        import cupy
        n = a.tokens * a.hidden
        item = ITEMSIZE[a.dtype]
        out = self.buf[:n * item].view(cupy.float32 if item == 4 else cupy.int16)
        a.nccl_sum = out
        if self.comm is not None:
            self.comm.allReduce(a.x_ptr, out.data.ptr, n, _NCCL_DTYPE[a.dtype], 0, stream.ptr)
            return
        import torch
        import torch.distributed as dist
        cupy.cuda.runtime.memcpyAsync(out.data.ptr, a.x_ptr, n * item,
                                      cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        tdt = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}[a.dtype]
        with torch.cuda.stream(torch.cuda.ExternalStream(stream.ptr)):
            dist.all_reduce(torch.as_tensor(out, device="cuda").view(tdt))

    def close(self) -> None:
        """Destroy the CuPy NCCL communicator (PyTorch's group belongs to the caller)."""
        if self.comm is not None:
            self.comm.destroy()
            self.comm = None
