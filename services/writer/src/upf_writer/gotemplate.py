"""Go's ``text/template`` as ntfy's template mode runs it (``X-Template: yes``): pure, no I/O.

ntfy renders a publish's message and title with Go's template package over the request body decoded as
JSON (``json.Unmarshal`` into ``any``: objects are maps, every number a float64). This is that language
with the same results for what such a template can do with JSON data: text and ``{{ }}`` actions with
``{{-``/``-}}`` trimming and comments; pipelines (``|``), parentheses, variables (``$``, ``$x :=``,
``$x =``); fields (``.a.b``, on maps, a missing key giving ``<no value>``); literals; ``if``/``else if``/
``else``, ``range`` (with ``$i, $v :=``, ``else``, ``break``, ``continue``), ``with`` (and ``else with``);
``block``; the built-in functions but ``call`` (which ntfy refuses, with ``template`` and ``define``). Values print
as Go's ``fmt`` prints them (``map[a:1 b:x]``, ``[1 2]``, floats in Go's shortest form: ``1.2345678e+07``).

``block`` runs its body on its pipeline's value (nothing can redefine it). A template that runs past
``MAX_STEPS`` actions and nodes fails as ntfy's 100 ms timeout does (40045).
"""

from __future__ import annotations

import decimal
import functools
import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import quote_plus

__all__ = ["TemplateError", "render", "DISALLOWED"]

DISALLOWED = re.compile(r"\{\{-?\s*(call|template|define)\b", re.MULTILINE)
"""ntfy's ``templateDisallowedRegex``: such a template is refused before anything else (40044)."""
MAX_STEPS = 200_000


class TemplateError(Exception):
    """``parse``: the template is not valid (ntfy's 40043); ``exec``: it failed while running (40045)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind


class _Missing:
    """Go's invalid ``reflect.Value``: a missing map key (prints ``<no value>``; a field of it is too)."""

    __slots__ = ()


MISSING: Any = _Missing()


def render(template: str, data: Any, limit: int) -> str:
    """``template`` run over ``data`` (JSON-decoded, numbers as floats); raises :class:`TemplateError`,
    or :class:`OverflowError` once the output passes ``limit`` characters."""
    nodes = _Parser(_lex(template)).parse()
    root = MISSING if data is None else data  # Go's Execute with nil data: dot is the invalid value
    out = _Exec(limit)
    out.run(nodes, root, [("$", root)])
    return "".join(out.parts)


# --- lexing -----------------------------------------------------------------------------------------
_TOKEN = re.compile(
    r"""\s*(?:
    (?P<str>"(?:\\.|[^"\\\n])*")
  | (?P<raw>`[^`]*`)
  | (?P<chr>'(?:\\.|[^'\\\n])+')
  | (?P<num>[+-]?(?:0[xX][0-9a-fA-F_]+|(?:\d[\d_]*)?\.?\d[\d_]*(?:[eE][+-]?\d+)?))
  | (?P<var>\$\w*)
  | (?P<field>(?:\.[^\W\d]\w*)+)
  | (?P<dot>\.)
  | (?P<ident>[^\W\d]\w*)
  | (?P<op>:=|=|\||\(|\)|,)
  )""",
    re.VERBOSE,
)
_CHAIN = re.compile(r"(?:\.[^\W\d]\w*)+")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "a": "\a", "b": "\b", "f": "\f", "v": "\v"}
_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3}|.)")


def _unquote(body: str) -> str:
    def one(m: re.Match[str]) -> str:
        e = m.group(1)
        if e[0] in "xuU":
            return chr(int(e[1:], 16))
        if e[0].isdigit():
            return chr(int(e, 8))
        if e not in _ESCAPES:
            raise TemplateError("parse", f"unknown escape sequence: \\{e}")
        return _ESCAPES[e]

    return _ESCAPE.sub(one, body)


def _lex(text: str) -> list[tuple[str, Any]]:
    """Items: ("text", str) and ("action", [(kind, value), ...]), with trim markers applied."""
    items: list[tuple[str, Any]] = []
    pos = 0
    trim_next = False
    while True:
        start = text.find("{{", pos)
        chunk = text[pos:] if start < 0 else text[pos:start]
        if trim_next:
            chunk = chunk.lstrip(" \t\r\n")
        i = (start + 2) if start >= 0 else -1
        if start >= 0 and text[i : i + 1] == "-" and text[i + 1 : i + 2] in (" ", "\t", "\r", "\n"):
            chunk = chunk.rstrip(" \t\r\n")
            i += 2
        if chunk:
            items.append(("text", chunk))
        if start < 0:
            return items
        tokens, pos, trim_next = _lex_action(text, i)
        if tokens is not None:
            items.append(("action", tokens))


def _lex_action(text: str, i: int) -> tuple[list[tuple[str, Any]] | None, int, bool]:
    if text.startswith("/*", i):  # a comment: the whole action (Go wants it right after the delimiter)
        end = text.find("*/", i)
        if end < 0:
            raise TemplateError("parse", "unclosed comment")
        after = text[end + 2 :]
        stripped = after.lstrip(" \t\r\n")
        if stripped.startswith("-}}") and len(stripped) < len(after):
            return None, end + 2 + (len(after) - len(stripped)) + 3, True
        if after.startswith("}}"):
            return None, end + 4, False
        raise TemplateError("parse", "comment ends before closing delimiter")
    tokens: list[tuple[str, Any]] = []
    while True:
        ws = i
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if text.startswith("-}}", i) and i > ws:
            return tokens, i + 3, True
        if text.startswith("}}", i):
            return tokens, i + 2, False
        m = _TOKEN.match(text, i)
        if m is None or m.end() == i:
            if i >= len(text):
                raise TemplateError("parse", "unclosed action")
            raise TemplateError("parse", f"unexpected {text[i]!r} in command")
        kind = m.lastgroup
        assert kind is not None
        value = m.group(kind)
        i = m.end()
        if kind == "var":
            chain = _CHAIN.match(text, i)
            fields = chain.group(0)[1:].split(".") if chain else []
            if chain:
                i = chain.end()
            tokens.append(("var", (value, fields)))
        elif kind == "field":
            tokens.append(("field", value[1:].split(".")))
        elif kind == "str":
            tokens.append(("lit", _unquote(value[1:-1])))
        elif kind == "raw":
            tokens.append(("lit", value[1:-1].replace("\r", "")))
        elif kind == "chr":
            s = _unquote(value[1:-1])
            if len(s) != 1:
                raise TemplateError("parse", "malformed character constant")
            tokens.append(("lit", ord(s)))
        elif kind == "num":
            tokens.append(("lit", _number(value)))
        elif kind == "op" and value == ")":
            tokens.append(("op", ")"))
            chain = _CHAIN.match(text, i)
            if chain:  # (pipeline).field
                tokens.append(("chain", chain.group(0)[1:].split(".")))
                i = chain.end()
        else:
            tokens.append((kind, value))


def _number(text: str) -> int | float:
    t = text.replace("_", "")
    try:
        if re.fullmatch(r"[+-]?0[xX][0-9a-fA-F]+", t):
            return int(t, 16)
        if re.fullmatch(r"[+-]?\d+", t):
            return int(t, 8) if len(t.lstrip("+-")) > 1 and t.lstrip("+-")[0] == "0" else int(t)
        return float(t)
    except ValueError:
        raise TemplateError("parse", f"bad number syntax: {text!r}") from None


# --- parsing ----------------------------------------------------------------------------------------
# Nodes: ("text", s) | ("action", pipe) | ("if"|"with", pipe, body, else_body) | ("range", pipe, body,
# else_body) | ("block", pipe, body) | ("break",) | ("continue",). A pipe: (decl names, "=" or ":=" or "", [command]); a
# command: [operand]; an operand: ("field", names) | ("var", name, names) | ("dot",) | ("lit", v) |
# ("fn", name) | ("nil",) | ("pipe", pipe, names).
_FUNCS = frozenset({"and", "or", "not", "len", "index", "slice", "print", "printf", "println", "eq", "ne", "lt", "le",
                    "gt", "ge", "html", "js", "urlquery"})  # fmt: skip
_KEYWORDS = frozenset({"if", "else", "end", "range", "with", "break", "continue", "define", "template", "block"})


class _Parser:
    def __init__(self, items: list[tuple[str, Any]]) -> None:
        self.items = items
        self.i = 0
        self.vars: list[str] = ["$"]
        self.loops = 0

    def parse(self) -> list[Any]:
        nodes, stop = self._list()
        if stop is not None:
            raise TemplateError("parse", f"unexpected {{{{{stop[0][1]}}}}}")
        return nodes

    def _list(self) -> tuple[list[Any], list[tuple[str, Any]] | None]:
        """Nodes up to an ``end`` or ``else`` action (returned, for the caller), or the end of input."""
        nodes: list[Any] = []
        while self.i < len(self.items):
            kind, value = self.items[self.i]
            self.i += 1
            if kind == "text":
                nodes.append(("text", value))
                continue
            if not value:
                raise TemplateError("parse", "missing value for command")
            head = value[0]
            word = head[1] if head[0] == "ident" else None
            if word in ("end", "else"):
                return nodes, value
            if word in ("if", "with", "range"):
                nodes.append(self._control(word, value[1:]))
            elif word in ("break", "continue"):
                if not self.loops or len(value) > 1:
                    raise TemplateError("parse", f"{{{{{word}}}}} outside {{{{range}}}}")
                nodes.append((word,))
            elif word == "block":
                nodes.append(self._block(value[1:]))
            elif word in ("define", "template"):  # refused before parsing (DISALLOWED); kept for safety
                raise TemplateError("parse", f"{word} is not supported")
            else:
                nodes.append(("action", self._pipe(value, decl_ok=True)))
        return nodes, None

    def _control(self, word: str, tokens: list[tuple[str, Any]]) -> Any:
        mark = len(self.vars)
        pipe = self._pipe(tokens, decl_ok=True, range_decl=word == "range")
        self.loops += word == "range"
        body, stop = self._list()
        self.loops -= word == "range"
        else_body: list[Any] = []
        if stop is None:
            raise TemplateError("parse", f"unexpected EOF in {word}")
        if stop[0][1] == "else":
            if len(stop) > 1:  # else if (in an if), else with (in a with): a control closed by the one end
                if stop[1] != ("ident", word) or word == "range":
                    raise TemplateError("parse", "unexpected else chain")
                else_body = [self._control(word, stop[2:])]
                del self.vars[mark:]
                return (word, pipe, body, else_body)
            else_body, stop = self._list()
            if stop is None or stop[0][1] != "end" or len(stop) > 1:
                raise TemplateError("parse", f"expected end in {word}")
        elif len(stop) > 1:
            raise TemplateError("parse", "unexpected tokens after end")
        del self.vars[mark:]
        return (word, pipe, body, else_body)

    def _block(self, tokens: list[tuple[str, Any]]) -> Any:
        """``{{block "name" pipeline}}T{{end}}``: a template defined and run at once with the pipeline's
        value as its data. No template can be defined otherwise (ntfy refuses ``define``), so it is T
        run on that value, in a scope of its own (``$`` is the value; outer variables are not seen)."""
        if not tokens or tokens[0][0] != "lit" or not isinstance(tokens[0][1], str):
            raise TemplateError("parse", "block needs a name")
        pipe = self._pipe(tokens[1:], decl_ok=False)
        outer, loops = self.vars, self.loops
        self.vars, self.loops = ["$"], 0
        body, stop = self._list()
        self.vars, self.loops = outer, loops
        if stop is None or stop[0][1] != "end" or len(stop) > 1:
            raise TemplateError("parse", "expected end in block")
        return ("block", pipe, body)

    def _pipe(self, tokens: list[tuple[str, Any]], *, decl_ok: bool, range_decl: bool = False) -> Any:
        names: list[str] = []
        op = ""
        t = tokens
        if decl_ok and t and t[0][0] == "var" and not t[0][1][1]:
            if len(t) > 1 and t[1] == ("op", ":=") or len(t) > 1 and t[1] == ("op", "="):
                names, op, t = [t[0][1][0]], t[1][1], t[2:]
            elif range_decl and len(t) > 3 and t[1] == ("op", ",") and t[2][0] == "var" and t[3][0] == "op":
                if t[3][1] != ":=" and t[3][1] != "=":
                    raise TemplateError("parse", "expected := or =")
                names, op, t = [t[0][1][0], t[2][1][0]], t[3][1], t[4:]
        for name in names:
            if op == "=" and name not in self.vars:
                raise TemplateError("parse", f"undefined variable {name}")
        commands: list[list[Any]] = [[]]
        depth_tokens = t
        j = 0
        while j < len(depth_tokens):
            kind, value = depth_tokens[j]
            if kind == "op" and value == "|":
                if not commands[-1]:
                    raise TemplateError("parse", "missing command")
                commands.append([])
                j += 1
                continue
            operand, j = self._operand(depth_tokens, j)
            commands[-1].append(operand)
        if not commands[-1]:
            raise TemplateError("parse", "missing value for command")
        for cmd in commands[1:]:
            if cmd[0][0] in ("lit", "nil"):
                raise TemplateError("parse", "non executable command in pipeline stage")
        if op == ":=":
            self.vars.extend(names)
        return (names, op, commands)

    def _operand(self, t: list[tuple[str, Any]], j: int) -> tuple[Any, int]:
        kind, value = t[j]
        if kind == "field":
            return ("field", value), j + 1
        if kind == "var":
            name, fields = value
            if name not in self.vars:
                raise TemplateError("parse", f"undefined variable {name!r}")
            return ("var", name, fields), j + 1
        if kind == "dot":
            return ("dot",), j + 1
        if kind == "lit":
            return ("lit", value), j + 1
        if kind == "ident":
            if value in ("true", "false"):
                return ("lit", value == "true"), j + 1
            if value == "nil":
                return ("nil",), j + 1
            if value in _KEYWORDS or value not in _FUNCS:
                raise TemplateError("parse", f"function {value!r} not defined")
            return ("fn", value), j + 1
        if kind == "op" and value == "(":
            depth, k = 1, j + 1
            while k < len(t) and depth:
                if t[k] == ("op", "("):
                    depth += 1
                elif t[k] == ("op", ")"):
                    depth -= 1
                k += 1
            if depth:
                raise TemplateError("parse", "unclosed left paren")
            inner = self._pipe(t[j + 1 : k - 1], decl_ok=False)
            chain: list[str] = []
            if k < len(t) and t[k][0] == "chain":
                chain = t[k][1]
                k += 1
            return ("pipe", inner, chain), k
        raise TemplateError("parse", f"unexpected {value!r} in operand")


# --- running ----------------------------------------------------------------------------------------
class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Exec:
    def __init__(self, limit: int) -> None:
        self.parts: list[str] = []
        self.size = 0
        self.limit = limit
        self.steps = 0

    def _step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise TemplateError("exec", "template ran too long")

    def write(self, s: str) -> None:
        self.size += len(s)
        if self.size > self.limit:
            raise OverflowError
        self.parts.append(s)

    def run(self, nodes: list[Any], dot: Any, scope: list[tuple[str, Any]]) -> None:
        for node in nodes:
            self._step()
            kind = node[0]
            if kind == "text":
                self.write(node[1])
            elif kind == "action":
                value = self.pipe(node[1], dot, scope)
                if not node[1][0]:  # a declaration prints nothing
                    self.write(_print_top(value))
            elif kind == "if" or kind == "with":
                mark = len(scope)
                value = self.pipe(node[1], dot, scope)
                if _truth(value):
                    self.run(node[2], value if kind == "with" else dot, scope)
                else:
                    self.run(node[3], dot, scope)
                del scope[mark:]
            elif kind == "range":
                self._range(node, dot, scope)
            elif kind == "block":
                value = self.pipe(node[1], dot, scope)
                self.run(node[2], value, [("$", value)])
            elif kind == "break":
                raise _Break
            else:
                raise _Continue

    def _range(self, node: Any, dot: Any, scope: list[tuple[str, Any]]) -> None:
        names, op, commands = node[1]
        mark = len(scope)
        value = _unwrap(self.pipe(([], "", commands), dot, scope))
        if isinstance(value, dict):
            pairs: list[tuple[Any, Any]] = [(k, value[k]) for k in sorted(value)]
        elif isinstance(value, list):
            pairs = list(enumerate(value))
        elif type(value) is int:
            pairs = [(i, i) for i in range(value)]
        elif value is MISSING:
            pairs = []
        else:
            raise TemplateError("exec", f"range can't iterate over {_print_top(value)}")
        if not pairs:
            self.run(node[3], dot, scope)
            return
        for key, item in pairs:
            self._step()
            if len(names) == 2:
                self._bind(scope, op, names[0], key)
                self._bind(scope, op, names[1], item)
            elif names:
                self._bind(scope, op, names[0], item)
            try:
                self.run(node[2], item, scope)
            except _Break:
                break
            except _Continue:
                pass
            finally:
                del scope[mark:]

    @staticmethod
    def _bind(scope: list[tuple[str, Any]], op: str, name: str, value: Any) -> None:
        if op == ":=":
            scope.append((name, value))
            return
        for i in range(len(scope) - 1, -1, -1):
            if scope[i][0] == name:
                scope[i] = (name, value)
                return

    def pipe(self, pipe: Any, dot: Any, scope: list[tuple[str, Any]]) -> Any:
        names, op, commands = pipe
        value: Any = _NO_FINAL
        for cmd in commands:
            value = self.command(cmd, dot, scope, value)
        value = _unwrap(value)
        for name in names:
            self._bind(scope, op, name, value)
        return value

    def command(self, cmd: list[Any], dot: Any, scope: list[tuple[str, Any]], final: Any) -> Any:
        self._step()
        head = cmd[0]
        if head[0] == "fn":
            return self.call(head[1], cmd[1:], dot, scope, final)
        if len(cmd) > 1 or final is not _NO_FINAL:
            raise TemplateError("exec", "can't give argument to non-function")
        if head[0] == "nil":
            raise TemplateError("exec", "nil is not a command")
        return self.operand(head, dot, scope)

    def operand(self, op: Any, dot: Any, scope: list[tuple[str, Any]]) -> Any:
        kind = op[0]
        if kind == "lit":
            return op[1]
        if kind == "dot":
            return dot
        if kind == "nil":
            return None
        if kind == "field":
            return _fields(dot, op[1])
        if kind == "var":
            for name, value in reversed(scope):
                if name == op[1]:
                    return _fields(value, op[2]) if op[2] else value
            raise TemplateError("exec", f"undefined variable: {op[1]}")
        if kind == "pipe":
            value = self.pipe(op[1], dot, scope)
            return _fields(value, op[2]) if op[2] else value
        raise TemplateError("exec", f"{op[1]} is not a value")  # a function name as an argument

    def call(self, name: str, args: list[Any], dot: Any, scope: list[tuple[str, Any]], final: Any) -> Any:
        """A built-in function. Its arguments are Go's ``any``: a missing key or a JSON null is nil (so
        ``print .missing`` is ``<nil>``, where ``{{.missing}}`` is ``<no value>``). A function name as
        an argument is that function called without arguments, as in Go."""

        def arg(a: Any) -> Any:
            v = self.command([a], dot, scope, _NO_FINAL) if a[0] == "fn" else self.operand(a, dot, scope)
            return None if v is MISSING else v

        gets: list[Callable[[], Any]] = [functools.partial(arg, a) for a in args]
        if final is not _NO_FINAL:
            gets.append(lambda: None if final is MISSING else final)
        if name == "and" or name == "or":  # the first empty (and) or non-empty (or) one, or the last
            if not gets:
                raise TemplateError("exec", f"wrong number of args for {name}")
            value: Any = None
            for get in gets:  # short-circuit, as from Go 1.18
                value = get()
                if _truth(value) != (name == "and"):
                    return value
            return value
        return _BUILTINS[name]([get() for get in gets])


_NO_FINAL: Any = object()


def _unwrap(value: Any) -> Any:
    """What Go's pipeline does to an ``interface{}`` result: a JSON null becomes the invalid value."""
    return MISSING if value is None else value


def _fields(value: Any, names: list[str]) -> Any:
    for name in names:
        if value is MISSING:
            return MISSING
        if value is None:
            raise TemplateError("exec", f"nil pointer evaluating interface {{}}.{name}")
        if not isinstance(value, dict):
            raise TemplateError("exec", f"can't evaluate field {name} in type {_go_type(value)}")
        value = value.get(name, MISSING)
    return value


def _go_type(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float64"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "[]interface {}"
    return "interface {}"


def _truth(v: Any) -> bool:
    if v is MISSING or v is None:
        return False
    if isinstance(v, (bool, int, float, str, list, dict)):
        return bool(v)
    return True


_BASIC = frozenset({"bool", "int", "float64", "string"})


def _kind(v: Any) -> str:
    """Go's basic kind for comparisons: a basic type's name, "invalid" (nil) or "other"."""
    if v is MISSING or v is None:
        return "invalid"
    name = _go_type(v)
    return name if name in _BASIC else "other"


def _eq(args: list[Any]) -> bool:
    if len(args) < 2:
        raise TemplateError("exec", "missing argument for comparison")
    a, k1 = args[0], _kind(args[0])
    for b in args[1:]:
        k2 = _kind(b)
        if k1 != k2:
            if k1 != "invalid" and k2 != "invalid":
                raise TemplateError("exec", "incompatible types for comparison")
            continue
        if k1 == "other":
            raise TemplateError("exec", "non-comparable type")
        if k1 == "invalid" or a == b:
            return True
    return False


_ORDERED = frozenset({"int", "float64", "string"})


def _ordered(op: Callable[[Any, Any], bool]) -> Callable[[list[Any]], bool]:
    def cmp(args: list[Any]) -> bool:
        if len(args) != 2:
            raise TemplateError("exec", "wrong number of args for comparison")
        k1, k2 = _kind(args[0]), _kind(args[1])
        if k1 not in _ORDERED or k2 not in _ORDERED:
            raise TemplateError("exec", "invalid type for comparison")
        if k1 != k2:
            raise TemplateError("exec", "incompatible types for comparison")
        return op(args[0], args[1])

    return cmp


def _index(args: list[Any]) -> Any:
    if not args:
        raise TemplateError("exec", "wrong number of args for index")
    value = args[0]
    for key in args[1:]:
        if isinstance(value, dict):
            if not isinstance(key, str):
                raise TemplateError("exec", "value has type int; should be string")
            value = value.get(key, MISSING)
        elif isinstance(value, (list, str)):
            if type(key) is not int:
                raise TemplateError("exec", f"cannot index slice/array with type {_go_type(key)}")
            seq = value.encode("utf-8") if isinstance(value, str) else value
            if not 0 <= key < len(seq):
                raise TemplateError("exec", f"index out of range: {key}")
            value = seq[key]
        elif value is MISSING or value is None:
            raise TemplateError("exec", "index of untyped nil")
        else:
            raise TemplateError("exec", f"can't index item of type {_go_type(value)}")
    return value


def _slice(args: list[Any]) -> Any:
    if not args:
        raise TemplateError("exec", "wrong number of args for slice")
    value, idx = args[0], args[1:]
    if not isinstance(value, (list, str)) or len(idx) > 2 or any(type(i) is not int for i in idx):
        raise TemplateError("exec", "can't slice item")
    seq = value.encode("utf-8") if isinstance(value, str) else value
    lo = idx[0] if idx else 0
    hi = idx[1] if len(idx) > 1 else len(seq)
    if not 0 <= lo <= hi <= len(seq):
        raise TemplateError("exec", "slice index out of range")
    part = seq[lo:hi]
    return part.decode("utf-8", "replace") if isinstance(part, bytes) else part


def _len(args: list[Any]) -> int:
    if len(args) != 1:
        raise TemplateError("exec", "wrong number of args for len")
    v = args[0]
    if isinstance(v, str):
        return len(v.encode("utf-8"))
    if isinstance(v, (list, dict)):
        return len(v)
    raise TemplateError("exec", f"len of type {_go_type(v)}")


def _sprint(args: list[Any]) -> str:
    """fmt.Sprint: a space between operands when neither is a string."""
    out = []
    for i, a in enumerate(args):
        if i and not isinstance(a, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(_print_value(a))
    return "".join(out)


_VERB = re.compile(r"%([-+# 0]*)(\d+|\*)?(?:\.(\d+|\*)?)?([a-zA-Z%])")


def _sprintf(args: list[Any]) -> str:
    if not args or not isinstance(args[0], str):
        raise TemplateError("exec", "printf needs a format string")
    fmt, values = args[0], list(args[1:])
    out: list[str] = []
    pos = 0
    for m in _VERB.finditer(fmt):
        out.append(fmt[pos : m.start()])
        pos = m.end()
        flags, width, prec, verb = m.groups()
        if verb == "%":
            out.append("%")
            continue
        if not values:
            out.append(f"%!{verb}(MISSING)")
            continue
        v = values.pop(0)
        text = _format_verb(verb, v, prec)
        if width and width != "*":
            w = int(width)
            text = text.ljust(w) if "-" in flags else (text.rjust(w, "0") if "0" in flags else text.rjust(w))
        out.append(text)
    out.append(fmt[pos:])
    if values:
        out.append("%!(EXTRA " + ", ".join(f"{_go_type(v)}={_print_value(v)}" for v in values) + ")")
    return "".join(out)


def _format_verb(verb: str, v: Any, prec: str | None) -> str:
    """One ``printf`` operand as Go's fmt formats it, ``%!verb(type=value)`` for a verb that does not
    fit its type; a slice's or map's elements each with the verb."""
    if verb in "sv" and isinstance(v, list):
        return "[" + " ".join(_element(verb, x) for x in v) + "]"
    if verb in "sv" and isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_element(verb, v[k])}" for k in sorted(v)) + "]"
    if v is None or v is MISSING:
        return "<nil>" if verb == "v" else f"%!{verb}(<nil>)"
    if verb == "v":
        return _print_value(v)
    if isinstance(v, str):
        if verb == "s":
            return v
        if verb == "q":
            return '"' + "".join(_quoted(c, '"') for c in v) + '"'
        if verb in "xX":
            return v.encode("utf-8").hex() if verb == "x" else v.encode("utf-8").hex().upper()
    elif isinstance(v, bool):
        if verb == "t":
            return "true" if v else "false"
    elif isinstance(v, int):
        if verb in "dxXob":
            return {"d": str(v), "x": f"{v:x}", "X": f"{v:X}", "o": f"{v:o}", "b": f"{v:b}"}[verb]
        if verb == "q":
            return "'" + _quoted(chr(v), "'") + "'" if 0 <= v <= 0x10FFFF else "'\ufffd'"
        if verb == "c" and 0 <= v <= 0x10FFFF:
            return chr(v)
    elif isinstance(v, float) and verb in "feEgG":
        if verb in "gG" and prec is None:
            return _go_float(v)
        p = 6 if prec is None else (int(prec) if prec != "*" else 6)
        return format(v, f".{p}{verb}")
    return f"%!{verb}({_go_type(v)}={_print_value(v)})"


def _element(verb: str, x: Any) -> str:
    return "<nil>" if x is None else _format_verb(verb, x, None)


_QUOTE_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
    "\\": "\\\\",
}


def _quoted(c: str, quote: str) -> str:
    """One character as Go's strconv.Quote (or QuoteRune) writes it."""
    if c == quote:
        return "\\" + c
    if c in _QUOTE_ESCAPES:
        return _QUOTE_ESCAPES[c]
    if c.isprintable():
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x80 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def _html(args: list[Any]) -> str:
    s = _sprint(args) if not (len(args) == 1 and isinstance(args[0], str)) else args[0]
    return (
        s.replace("&", "&amp;")
        .replace("'", "&#39;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&#34;")
        .replace("\x00", "\ufffd")
    )


def _js(args: list[Any]) -> str:
    s = _sprint(args) if not (len(args) == 1 and isinstance(args[0], str)) else args[0]
    out = []
    for ch in s:
        if ch in "\\'\"":
            out.append("\\" + ch)
        elif ch in "<>&=":
            out.append(f"\\u{ord(ch):04X}")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


_BUILTINS: dict[str, Callable[[list[Any]], Any]] = {
    "not": lambda a: not _truth(a[0]) if len(a) == 1 else _wrong("not"),
    "len": _len,
    "index": _index,
    "slice": _slice,
    "print": _sprint,
    "printf": _sprintf,
    "println": lambda a: " ".join(_print_value(v) for v in a) + "\n",
    "eq": _eq,
    "ne": lambda a: not _eq(a) if len(a) == 2 else _wrong("ne"),
    "lt": _ordered(lambda x, y: x < y),
    "le": _ordered(lambda x, y: x <= y),
    "gt": _ordered(lambda x, y: x > y),
    "ge": _ordered(lambda x, y: x >= y),
    "html": _html,
    "js": _js,
    "urlquery": lambda a: quote_plus(_sprint(a), safe="-_.~"),
}


def _wrong(name: str) -> Any:
    raise TemplateError("exec", f"wrong number of args for {name}")


# --- printing as Go's fmt ---------------------------------------------------------------------------
def _print_top(v: Any) -> str:
    """An action's value as text/template prints it: an invalid value (a missing key, a JSON null)
    is ``<no value>``."""
    return "<no value>" if v is MISSING or v is None else _print_value(v)


def _print_value(v: Any) -> str:
    if v is MISSING:
        return "<no value>"
    if v is None:
        return "<nil>"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, str):
        return v
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return _go_float(v)
    if isinstance(v, list):
        return "[" + " ".join(_print_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "map[" + " ".join(f"{k}:{_print_value(v[k])}" for k in sorted(v)) + "]"
    if isinstance(v, bytes):  # an index of a string: a byte, printed as Go prints a uint8
        return str(v)
    return str(v)


def _go_float(f: float) -> str:
    """``strconv.FormatFloat(f, 'g', -1, 64)``, as ``%v`` prints a float64: the shortest digits, in
    exponent form from an exponent of 6 (or below -4) on."""
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "+Inf" if f > 0 else "-Inf"
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    d = decimal.Decimal(repr(f))
    sign, digits, exponent = d.as_tuple()
    ds = "".join(map(str, digits)).rstrip("0") or "0"
    assert isinstance(exponent, int)
    dp = len(digits) + exponent  # the decimal point's place after the first digit
    exp = dp - 1
    minus = "-" if sign else ""
    if exp < -4 or exp >= 6:
        mant = ds[0] + ("." + ds[1:] if len(ds) > 1 else "")
        return f"{minus}{mant}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if dp <= 0:
        return f"{minus}0.{'0' * -dp}{ds}"
    if dp >= len(ds):
        return minus + ds + "0" * (dp - len(ds))
    return f"{minus}{ds[:dp]}.{ds[dp:]}"
