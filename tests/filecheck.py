"""A small FileCheck: match ``CHECK`` lines in order against text (e.g. printed IR).

    from filecheck import filecheck           # tests/ is on sys.path (tests/conftest.py)

    filecheck(print_module(m), '''
        // CHECK: graph @attn
        // CHECK-NEXT: rms_norm
        // CHECK-NOT: all_reduce
        // CHECK: return
    ''')

Directives (anything before ``CHECK`` on the line, such as ``//`` or ``#``, is ignored, so the
checks can live in comments of an IR file):

- ``CHECK: pat``      pat occurs at or after the end of the previous match;
- ``CHECK-NEXT: pat`` pat occurs on the line right after the line of the previous match;
- ``CHECK-NOT: pat``  pat does not occur between the previous match and the next match (or the
  end of the text).

A pattern is literal text, surrounding whitespace stripped, where a run of blanks matches any
run of blanks and ``{{regex}}`` embeds a Python regular expression (``%{{[0-9]+}} = add``).
A failure raises AssertionError saying which check failed and showing the text it looked at.
"""
from __future__ import annotations

import re

_DIRECTIVE = re.compile(r"\bCHECK(-NEXT|-NOT)?:(.*)$")


def _regex(pat: str) -> re.Pattern:
    parts = re.split(r"\{\{(.*?)\}\}", pat.strip())
    out = []
    for i, p in enumerate(parts):
        if i % 2:
            out.append(f"(?:{p})")
        else:
            out.append(r"[ \t]+".join(re.escape(w) for w in re.split(r"[ \t]+", p)))
    return re.compile("".join(out))


def parse_checks(checks: str) -> list[tuple[str, str, int]]:
    """``(kind, pattern, line number)`` for each directive of ``checks``; kind is ``CHECK``,
    ``CHECK-NEXT`` or ``CHECK-NOT``."""
    out = []
    for n, line in enumerate(checks.splitlines(), 1):
        m = _DIRECTIVE.search(line)
        if m:
            out.append(("CHECK" + (m.group(1) or ""), m.group(2).strip(), n))
    return out


def filecheck(text: str, checks: str) -> None:
    """Match the directives of ``checks`` in order against ``text`` (see the module docstring).

    Raises:
        ValueError: ``checks`` has no directive, a pattern is empty, or CHECK-NEXT comes first.
        AssertionError: a directive is not satisfied.
    """
    directives = parse_checks(checks)
    if not directives:
        raise ValueError("no CHECK, CHECK-NEXT or CHECK-NOT line in the checks")
    pos, prev_line_end, nots = 0, None, []

    def fail(kind, pat, n, why, start):
        shown = text[start:start + 600]
        raise AssertionError(f"{kind}: {pat!r} (check line {n}) {why}; text from offset "
                             f"{start}:\n{shown}" + ("\n[...]" if len(text) > start + 600 else ""))

    def check_nots(end):
        for _, pat, n in nots:
            m = _regex(pat).search(text, pos, end)
            if m:
                fail("CHECK-NOT", pat, n, f"matched {m.group(0)!r} at line "
                     f"{text.count(chr(10), 0, m.start()) + 1}", pos)
        nots.clear()

    for kind, pat, n in directives:
        if not pat:
            raise ValueError(f"empty pattern in {kind} (check line {n})")
        rx = _regex(pat)
        if kind == "CHECK-NOT":
            nots.append((kind, pat, n))
            continue
        if kind == "CHECK-NEXT":
            if prev_line_end is None:
                raise ValueError(f"CHECK-NEXT (check line {n}) without a CHECK before it")
            if prev_line_end >= len(text):
                fail(kind, pat, n, "has no next line: the previous match is on the last line",
                     pos)
            start = prev_line_end + 1
            end = text.find("\n", start)
            end = len(text) if end < 0 else end
            m = rx.search(text, start, end)
            if not m:
                fail(kind, pat, n, "does not match the next line", start)
        else:
            m = rx.search(text, pos)
            if not m:
                fail(kind, pat, n, "not found", pos)
        check_nots(m.start())
        pos = m.end()
        line_end = text.find("\n", max(pos - 1, m.start()))
        prev_line_end = len(text) if line_end < 0 else line_end
    check_nots(len(text))
