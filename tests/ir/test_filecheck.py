"""Tests of the FileCheck helper (tests/filecheck.py), used by the IR and pass tests."""
from __future__ import annotations

import pytest
from filecheck import filecheck, parse_checks

from fusionc.ir import parse_module, print_module

TEXT = """graph @g(%x: f16[B, 8], %w: f16[8]) {
  %0 = rms_norm(%x, %w) {eps = 1e-05} : f16[B, 8]
  %1 = silu(%0) : f16[B, 8]
  %2 = add(%1, %x) : f16[B, 8]
  return %2
}
"""


def test_check_in_order():
    filecheck(TEXT, """
        // CHECK: graph @g
        // CHECK: rms_norm
        // CHECK: add
        // CHECK: return %2
    """)


def test_check_out_of_order_fails():
    with pytest.raises(AssertionError, match=r"CHECK: 'rms_norm' \(check line 2\) not found"):
        filecheck(TEXT, "CHECK: add\nCHECK: rms_norm")


def test_check_same_line_continues_after_match():
    filecheck(TEXT, "CHECK: rms_norm\nCHECK: eps = 1e-05")
    with pytest.raises(AssertionError, match="not found"):
        filecheck(TEXT, "CHECK: eps\nCHECK: rms_norm")


def test_check_next():
    filecheck(TEXT, "CHECK: rms_norm\nCHECK-NEXT: silu\nCHECK-NEXT: add(%1, %x)")
    with pytest.raises(AssertionError, match="CHECK-NEXT: 'add' .* does not match the next line"):
        filecheck(TEXT, "CHECK: rms_norm\nCHECK-NEXT: add")


def test_check_next_on_last_line():
    with pytest.raises(AssertionError, match="no next line"):
        filecheck("a\nb", "CHECK: b\nCHECK-NEXT: c")
    with pytest.raises(AssertionError, match="does not match the next line"):
        filecheck("a\nb\n", "CHECK: b\nCHECK-NEXT: c")


def test_check_next_needs_a_previous_match():
    with pytest.raises(ValueError, match="without a CHECK"):
        filecheck(TEXT, "CHECK-NEXT: graph")


def test_check_not_between_matches():
    filecheck(TEXT, "CHECK: rms_norm\nCHECK-NOT: all_reduce\nCHECK: add")
    with pytest.raises(AssertionError, match=r"CHECK-NOT: 'silu' \(check line 2\) matched 'silu' "
                                             r"at line 3"):
        filecheck(TEXT, "CHECK: rms_norm\nCHECK-NOT: silu\nCHECK: add")
    # only the range between the two matches counts
    filecheck(TEXT, "CHECK: silu\nCHECK-NOT: silu\nCHECK: return")


def test_check_not_at_start_and_end():
    filecheck(TEXT, "CHECK-NOT: kernel\nCHECK: graph")
    with pytest.raises(AssertionError, match="CHECK-NOT"):
        filecheck(TEXT, "CHECK-NOT: rms_norm\nCHECK: add")
    filecheck(TEXT, "CHECK: add\nCHECK-NOT: rms_norm")
    with pytest.raises(AssertionError, match="CHECK-NOT: 'return'"):
        filecheck(TEXT, "CHECK: add\nCHECK-NOT: return")


def test_patterns_are_literal_with_regex_blocks_and_flexible_blanks():
    filecheck(TEXT, "CHECK: {eps = 1e-05}")  # braces, dots: literal
    filecheck(TEXT, "CHECK: %{{[0-9]+}} = silu(%{{[0-9]+}})")
    filecheck(TEXT, "CHECK: %2   =   add")
    with pytest.raises(AssertionError):
        filecheck(TEXT, "CHECK: f16[B,8]")  # blanks match blanks, not nothing
    with pytest.raises(AssertionError):
        filecheck(TEXT, "CHECK: 1e.05")


def test_failure_shows_the_text_searched():
    with pytest.raises(AssertionError) as e:
        filecheck(TEXT, "CHECK: add\nCHECK: all_reduce")
    assert "text from offset" in str(e.value) and "return %2" in str(e.value)


def test_no_directives_or_empty_pattern_is_a_mistake():
    with pytest.raises(ValueError, match="no CHECK"):
        filecheck(TEXT, "nothing to check here")
    with pytest.raises(ValueError, match="empty pattern"):
        filecheck(TEXT, "CHECK:   ")


def test_parse_checks_ignores_prefixes():
    assert parse_checks("// CHECK: a\n# CHECK-NEXT:  b c \nx CHECK-NOT: d\nCHECKS: e") == [
        ("CHECK", "a", 1), ("CHECK-NEXT", "b c", 2), ("CHECK-NOT", "d", 3)]


def test_checks_in_ir_comments():
    """Checks can sit in comments of the IR file they test: the grammar skips // comments."""
    src = TEXT.replace("{\n", "{\n  // CHECK: rms_norm\n  // CHECK-NEXT: silu\n", 1)
    filecheck(print_module(parse_module(src)), src)
