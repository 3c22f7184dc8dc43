"""The unit schedule's C expressions (templates/lib/stream.cuh.j2, the flush emitter) agree
with fusionc.stream.UnitSchedule on every small shape: unit ranges, the CTA of a unit, the
contributors of a group and their workspace slots."""
import re

from fusionc.paths import templates_dir
from fusionc.stream.ring import RingGeometry, swizzle
from fusionc.stream.schedule import UnitSchedule


def _c_function(name: str):
    """The return expression of a one-line FC_DEVICE int function, as a Python function."""
    src = (templates_dir() / "lib" / "stream.cuh.j2").read_text()
    m = re.search(name + r"\(int (\w+), int count, int grid\) \{\s*return (.*?);\s*\}", src, re.S)
    arg, body = m.group(1), m.group(2)
    body = re.sub(r"static_cast<(int|long long)>", "", body).replace("/", "//")
    return lambda v, count, grid: eval(body, {}, {arg: v, "count": count, "grid": grid})


def test_c_schedule_matches_python():
    start, cta = _c_function("fc_unit_start"), _c_function("fc_unit_cta")
    for count in range(1, 41):
        for group in range(1, count + 1):
            for grid in range(1, count + 1):
                s = UnitSchedule(count, group, grid)
                assert [start(c, count, grid) for c in range(grid + 1)] == \
                    [s.start(c) for c in range(grid + 1)]
                for g in range(s.groups):
                    first, last = g * group, min(count, (g + 1) * group) - 1
                    c0, c1 = cta(first, count, grid), cta(last, count, grid)
                    assert range(c0, c1 + 1) == s.contributors(g)
                    # the flush emitter's slots (fusionc/codegen/ops_stream.py)
                    slot0 = 2 * c0 + (0 if g == start(c0, count, grid) // group else 1)
                    assert slot0 == s.slot(c0, g)
                    assert all(2 * c == s.slot(c, g) for c in range(c0 + 1, c1 + 1))
                    for c in s.contributors(g):
                        assert set(s.units(c)) & set(s.group_units(g))


def test_c_swizzle_matches_the_ring():
    """fc_swz (the consumers' shared-memory addresses) against fusionc.stream.ring: chunk c of
    row r lies in box c // 8 at chunk swizzle(r, c % 8)."""
    src = (templates_dir() / "lib" / "stream.cuh.j2").read_text()
    body = re.search(r"fc_swz\(int r, int c\) \{\s*return (.*?);", src, re.S).group(1)
    for box_rows in (8, 16, 64):
        geo = RingGeometry(4, 64, box_rows, 128, 2)
        for r in range(box_rows):
            for c in range(16):
                got = eval(body, {}, {"r": r, "c": c, "BOX_ROWS": box_rows})
                want = (c // 8) * box_rows * 128 + r * 128 + 16 * swizzle(r, c % 8)
                assert got == want
        assert geo.box_offset("x", 1) - geo.box_offset("x", 0) == geo.xbox_rows * 128
