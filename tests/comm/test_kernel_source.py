"""The all-reduce kernel family: every variant compiles to an sm_90a cubin with NVRTC (no GPU
needed) without spills; flags use system-scope release/acquire; no NVLink multicast anywhere;
bad sizes are refused on the host with a clear error."""
import re

import pytest

from fusionc.comm.kernel import chunk_for, compile_spec, render, spec_for
from fusionc.errors import InputError

VARIANTS = [(w, d, dt, res, norm, two) for w in (1, 2, 4) for d, dt in ((4096, "f16"),
            (8192, "bf16"), (2048, "f32"), (80, "f16"))
            for res, norm in ((False, False), (True, False), (True, True)) for two in (False, True)
            if not (w == 1 and two)]


@pytest.mark.slow
@pytest.mark.parametrize("args", VARIANTS[::3] + [(2, 4096, "f16", True, True, False),
                                                  (2, 4096, "f16", True, True, True)])
def test_variants_compile_without_spills(args):
    spec = spec_for(*args)
    result, _ = compile_spec(spec)
    stats = result.kernels[spec.name]
    main = args[0] == 2 and args[1] in (4096, 8192) and args[2] != "f32"
    # the production shapes spill nothing; odd ones (80-wide rows, 4 ranks of f32) a few bytes
    assert stats.spills <= (0 if main else 16) and stats.registers * spec.threads <= 65536, stats


def test_flags_are_system_scope_and_there_is_no_multicast():
    src = render(spec_for(2, 4096, "f16", True, True, True))
    assert "st.release.sys.global.u64" in src and "ld.acquire.sys.global.u64" in src
    assert "%globaltimer" in src
    for banned in ("multimem", "cuMulticast", "nvls"):
        assert banned not in src.lower()
    for stmt in re.findall(r"\basm\b\s*(\w*)\s*\(", src):
        assert stmt == "volatile"


@pytest.mark.parametrize("args,match", [
    ((2, 4100, "f16", True, True, False), "multiple of 16 bytes"),
    ((2, 4096, "i32", True, True, False), "dtype"),
    ((2, 4096, "f16", False, True, False), "without the residual"),
    ((9, 4096, "f16", True, True, False), "ranks"),
    ((2, 65536, "f16", True, True, False), "at most 64 KB"),
])
def test_bad_sizes_are_refused(args, match):
    with pytest.raises(InputError, match=match):
        spec_for(*args)


def test_threads_and_chunks_follow_the_row():
    s = spec_for(2, 4096, "f16", True, True, False)
    assert (s.threads, s.vpt, s.chunk) == (512, 1, 8)   # one 16-byte vector per thread, 64 KB
    s = spec_for(2, 16384, "f16", True, True, False)
    assert (s.threads, s.vpt, s.chunk) == (512, 4, 2)


def test_chunks_spread_small_calls_over_every_cta():
    assert [chunk_for(t, 16, 8) for t in (1, 8, 16, 17, 40, 64, 100, 8192)] == \
        [1, 1, 1, 2, 4, 4, 8, 8]


@pytest.mark.parametrize("kw,match", [({"chunk": 1000}, "chunk"), ({"chunk": 0}, "chunk"),
                                      ({"chunk": 2.5}, "chunk")])
def test_bad_chunks_are_refused(kw, match):
    with pytest.raises(InputError, match=match):
        spec_for(2, 4096, "f16", True, True, False, **kw)
    with pytest.raises(InputError, match="integer"):
        spec_for("2", 4096, "f16", True, True, False)
    with pytest.raises(InputError, match="ctas"):
        chunk_for(10, 0, 8)
