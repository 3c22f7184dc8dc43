"""Parse IR text (graph IR and tile IR) into nodes, with errors at line:column.

One LALR grammar (``grammar.lark``) covers both levels; the parse tree is turned into nodes here,
resolving ``%names`` to the values in scope and checking attributes against the op registry.
Every failure is a :class:`fusionc.errors.ParseError` or :class:`~fusionc.errors.VerifyError`;
nothing else escapes, whatever the input.
"""
from __future__ import annotations

import difflib
import functools
import json
from pathlib import Path

import lark
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedEOF, UnexpectedInput

from fusionc.errors import FusionError, Loc, ParseError, VerifyError
from fusionc.ir.nodes import Graph, Module, Op, SymbolRef, Value
from fusionc.ir.registry import FUNC_KINDS, Ident, all_ops, func_kind, lookup
from fusionc.ir.types import DType, TensorType

_PUNCT = {"LPAR": "'('", "RPAR": "')'", "LBRACE": "'{'", "RBRACE": "'}'", "LSQB": "'['",
          "RSQB": "']'", "COMMA": "','", "COLON": "':'", "EQUAL": "'='", "MINUS": "'-'",
          "VALUE": "a %value", "SYMBOL": "an @name", "IDENT": "a name", "INT": "an integer",
          "FLOAT": "a number", "STRING": "a string", "FUNC_KIND": "'graph' or 'kernel'",
          "RETURN": "'return'", "$END": "end of input"}


@functools.cache
def _lark() -> lark.Lark:
    text = (Path(__file__).with_name("grammar.lark")).read_text()
    return lark.Lark(text, parser="lalr", propagate_positions=True, maybe_placeholders=False)


def parse_module(text: str, filename: str | None = None, verify: bool = True) -> Module:
    """Parse a module from IR text.

    Args:
        text: IR text (any string; bad input raises a fusionc error).
        filename: shown in error locations.
        verify: run the verifier on the result (default).
    Raises:
        ParseError: text that does not follow the grammar, unknown op or dtype.
        VerifyError: undefined values, bad attributes, ill-typed ops (when ``verify``).
    """
    try:
        tree = _lark().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(e, text, filename) from None
    except (LarkError, RecursionError) as e:  # defensive: lark internals
        raise ParseError(f"cannot parse: {type(e).__name__}", loc=Loc(filename, 1, 1)) from None
    from fusionc.ir.verifier import verify_module
    try:
        module = _Builder(filename, verify).module(tree)
        if verify:
            verify_module(module)
    except RecursionError:
        raise ParseError("IR nested too deeply", loc=Loc(filename, 1, 1),
                         valid="fewer levels of nested regions or lists") from None
    return module


def _syntax_error(e: UnexpectedInput, text: str, filename: str | None) -> ParseError:
    line, col = getattr(e, "line", 1), getattr(e, "column", 1)
    loc = Loc(filename, line if isinstance(line, int) and line > 0 else 1,
              col if isinstance(col, int) and col > 0 else 1)
    if isinstance(e, UnexpectedCharacters):
        got = repr(e.char)
        expected = e.allowed or set()
    elif isinstance(e, UnexpectedEOF):
        got, expected = "end of input", e.expected or set()
    else:
        tok = getattr(e, "token", None)
        got = "end of input" if tok is None or tok.type == "$END" else repr(str(tok))
        expected = getattr(e, "expected", None) or set()
    if got == "end of input":  # lark places it at the last token; point at the end instead
        loc = Loc(filename, text.count("\n") + 1, len(text) - text.rfind("\n"))
    names = sorted({_PUNCT.get(n, n.lower()) for n in expected})
    return ParseError(f"unexpected {got}", loc=loc,
                      valid=("expected " + ", ".join(names)) if names else None)


class _Builder:
    """Turns a parse tree into nodes. Scopes map value names to values."""

    def __init__(self, filename: str | None, verify: bool = True):
        # verify: also check what the verifier would, where only the parser knows the column
        self.filename, self.verify = filename, verify

    def loc(self, node) -> Loc:
        if isinstance(node, lark.Token):
            return Loc(self.filename, node.line or 1, node.column or 1)
        meta = node.meta
        return Loc(self.filename, getattr(meta, "line", 1), getattr(meta, "column", 1))

    def module(self, tree) -> Module:
        return Module(tuple(self.item(t) for t in tree.children))

    def item(self, t) -> Graph:
        kind_tok, sym = t.children[0], t.children[1]
        kind = func_kind(str(kind_tok))
        if kind is None:
            raise ParseError(f"unknown item kind '{kind_tok}'", loc=self.loc(kind_tok),
                             valid=", ".join(FUNC_KINDS))
        attrs, params, stmts, ret = (), [], [], None
        for c in t.children[2:]:
            if c.data == "attr_dict":
                attrs = kind.make_attrs(self.attr_dict(c), self.loc(c))
            elif c.data == "param":
                params.append(self.param(c, params))
            elif c.data == "stmt":
                stmts.append(c)
            else:
                ret = c
        scope = {p.name: p for p in params}
        body = tuple(self.stmt(s, scope) for s in stmts)
        outputs = tuple(self.use(tok, scope) for tok in ret.children)
        return Graph(str(sym)[1:], tuple(params), body, outputs, kind.name, attrs, self.loc(t))

    def param(self, c, params: list) -> Value:
        """A parameter ``%name: type``; with ``verify``, VerifyError at the name for a second
        parameter of that name."""
        tok = c.children[0]
        name = str(tok)[1:]
        if self.verify and any(p.name == name for p in params):
            raise VerifyError(f"value %{name} is defined twice", loc=self.loc(tok),
                              valid="a fresh name (SSA: one definition per value)")
        return Value(name, self.type(c.children[1], name))

    def use(self, tok, scope) -> Value:
        name = str(tok)[1:]
        if name not in scope:
            raise VerifyError(f"use of undefined value %{name}", loc=self.loc(tok),
                              valid="a value defined earlier in this graph or a parameter")
        return scope[name]

    def stmt(self, t, scope) -> Op:
        ch = t.children
        i = next(k for k, c in enumerate(ch) if isinstance(c, lark.Token) and c.type == "IDENT")
        name_tok = ch[i]
        name = str(name_tok)
        d = lookup(name)
        if d is None:
            close = difflib.get_close_matches(name, all_ops(), n=3)
            raise ParseError(f"unknown op '{name}'", loc=self.loc(name_tok),
                             valid=("did you mean " + ", ".join(close)) if close else
                             "one of " + ", ".join(sorted(all_ops())))
        results = ch[:i]
        operands, attrs, types, regions = [], {}, [], []
        for c in ch[i + 1:]:
            if isinstance(c, lark.Token):
                operands.append(self.use(c, scope))
            elif c.data == "attr_dict":
                attrs = self.attr_dict(c)
            elif c.data == "type":
                types.append(self.type(c))
            else:
                regions = [self.region(r, scope) for r in c.children]
        loc = self.loc(name_tok)
        if len(types) != len(results):
            raise ParseError(f"{len(results)} results but {len(types)} types", op=name, loc=loc,
                             valid="one type per result after ':'")
        res = tuple(Value(str(r)[1:], ty) for r, ty in zip(results, types))
        op = Op(name, res, tuple(operands), d.make_attrs(attrs, loc), tuple(regions), loc)
        for r in res:
            scope[r.name] = r
        return op

    def region(self, t, scope) -> tuple[Op, ...]:
        inner = dict(scope)
        return tuple(self.stmt(s, inner) for s in t.children)

    def attr_dict(self, t) -> dict:
        out = {}
        for e in t.children:
            key = str(e.children[0])
            if key in out:
                raise ParseError(f"attribute '{key}' given twice", loc=self.loc(e.children[0]))
            out[key] = self.value(e.children[1])
        return out

    def value(self, v):
        if isinstance(v, lark.Token):  # a lone child rule collapsed to its token
            return self.value(lark.Tree({"INT": "int", "FLOAT": "float", "IDENT": "ident",
                                         "STRING": "string", "SYMBOL": "symbol"}[v.type], [v]))
        kind, ch = v.data, v.children
        if kind == "int":
            return self.int(ch[0])
        if kind == "float":
            return float(ch[0])
        if kind == "ident":
            return Ident(ch[0])
        if kind == "neg_ident":
            return Ident("-" + ch[0])
        if kind == "symbol":
            return SymbolRef(str(ch[0])[1:])
        if kind == "string":
            try:
                return json.loads(str(ch[0]))
            except ValueError:
                raise ParseError("bad string literal", loc=self.loc(ch[0]),
                                 valid='a JSON string: no control characters, escapes such as '
                                       '\\" \\\\ \\n \\t \\u00e9') from None
        return tuple(self.value(x) for x in ch)

    def int(self, tok) -> int:
        try:
            return int(tok)
        except ValueError:
            raise ParseError(f"integer too long: {str(tok)[:20]}...", loc=self.loc(tok)) from None

    def type(self, t, name: str | None = None) -> TensorType:
        dt_tok = t.children[0]
        try:
            dtype = DType(str(dt_tok))
        except ValueError:
            raise ParseError(f"unknown dtype '{dt_tok}'", loc=self.loc(dt_tok),
                             valid=", ".join(d.value for d in DType)) from None
        dims, toks = [], []
        for d in t.children[1:]:
            tok = d if isinstance(d, lark.Token) else d.children[0]
            dims.append(self.int(tok) if tok.type == "INT" else str(tok))
            toks.append(tok)
        out = TensorType(dtype, tuple(dims))
        for d, tok in zip(dims, toks):   # parameters (results: the verifier's inference)
            if self.verify and name is not None and isinstance(d, int) and d < 1:
                raise VerifyError(f"bad dimension {d} in {out} of %{name}", loc=self.loc(tok),
                                  valid="positive integers or symbol names such as B")
        return out


def parse_file(path: str | Path, verify: bool = True) -> Module:
    """Parse the IR text in ``path`` (errors carry the file name)."""
    p = Path(path)
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = ("no such file" if isinstance(e, FileNotFoundError) else "a folder"
               if p.is_dir() else getattr(e, "strerror", None) or str(e))
        raise ParseError(f"cannot read {p}: {why}",
                         valid="a DSL file (.py) or an IR file (.fir)") from None
    return parse_module(text, str(p), verify)


__all__ = ["parse_module", "parse_file", "FusionError"]
