"""The ``filter`` and ``dataNodeSelector`` query parameters of a GET: the part of Jex (TS 32.161) this service
evaluates, and a 400 naming it for anything else.

A filter is one or more alternatives joined by ``|``; an MOI in the scope is selected when any alternative
holds for it. An alternative is a node path, optionally starting with ``/`` or ``//``, whose last node may
carry conditions in brackets::

    MLTrainingProcess                                    every process in the scope
    MLTrainingRequest=R1                                 that request
    SubNetwork=SN1/MLTrainingFunction=TF1/MLTrainingReport   the reports under that function
    MLTrainingFunction=TF1/MLTrainingReport              the same (leading nodes need not start at the root)
    MLTrainingRequest[requestStatus="FINISHED"]          the finished requests
    //MLTrainingProcess[progressStatus/status!="RUNNING" and priority>=1]

A node path matches an MOI whose LDN ends with its last node (a class alone matches every id) under its
leading nodes, which name consecutive RDNs above it from the root or from any node below it
(:func:`sluice.service.store._filter_matches`). A condition compares an attribute of the node
(``requestStatus``, or ``attributes/requestStatus``; ``a/b`` reads member ``b`` of attribute ``a``; ``id``
is the node's id) with a literal — a string in double or single quotes, a number, ``true``, ``false`` or
``null`` — by ``=``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` (order comparisons hold between two numbers or two
strings only); an attribute path alone holds when the attribute is present. Conditions combine with
``and``, ``or`` (``and`` binds tighter), ``not(...)`` and parentheses. A class this service does not hold, an
attribute its class does not define, or any other syntax is a 400 whose reason says what is supported.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

from sluice.service.nrm import READ_ONLY, WRITABLE, MnSError

CLASSES = ("SubNetwork", "MLTrainingFunction", "MLModelRepository", "MLTrainingRequest", "MLTrainingProcess",
           "MLTrainingReport", "MLModel", "NtfSubscriptionControl")
OPS = ("!=", "<=", ">=", "=", "<", ">")
_TOKEN = re.compile(r"\s*(?:(?P<str>\"[^\"]*\"|'[^']*')|(?P<num>-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)"
                    r"|(?P<op>!=|<=|>=|=|<|>)|(?P<paren>[()])|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:/[A-Za-z_][A-Za-z0-9_]*)*))")
SUPPORTED = ('supported: node paths such as MLTrainingProcess or MLTrainingRequest=R1, alternatives joined by |, and '
             'conditions on the last node such as MLTrainingRequest[requestStatus="FINISHED"] with = != < <= > >=, '
             'and, or, not(...) and parentheses')

Cond = Callable[[dict[str, Any], str], bool]


def _bad(param: str, why: str) -> MnSError:
    return MnSError(400, f"{param}: {why}; {SUPPORTED}", bad_query_params=[param])


_WRITTEN = {"SubNetwork": frozenset({"userLabel"})}
"""Attributes the service writes on a container the bundle defines no class for."""


@cache
def attributes_of(cls: str) -> frozenset[str]:
    """The attributes class ``cls`` defines: the bundle's ``<Class>-Attr``, or the ``attributes`` member of its
    ``<Class>-Single`` (through ``allOf`` and ``$ref``), and what the service writes."""
    from sluice.service.schema import load_bundle

    schemas = load_bundle()["components"]["schemas"]
    names = _properties(schemas, schemas.get(f"{cls}-Attr") or {})
    for part in _parts(schemas, schemas.get(f"{cls}-Single") or {}):
        attrs = (part.get("properties") or {}).get("attributes")
        if isinstance(attrs, dict):
            names |= _properties(schemas, attrs)
    return frozenset(names | _WRITTEN.get(cls, frozenset()) | WRITABLE.get(cls, frozenset())
                     | READ_ONLY.get(cls, frozenset()))


def _parts(schemas: dict[str, Any], schema: dict[str, Any]) -> list[dict[str, Any]]:
    """``schema`` and every schema it is made of through ``allOf`` and ``$ref``, each once."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        ref = node.get("$ref")
        if isinstance(ref, str):
            name = ref.rpartition("/")[2]
            if name in seen or name not in schemas:
                continue
            seen.add(name)
            node = schemas[name]
        out.append(node)
        stack.extend(n for n in node.get("allOf") or [] if isinstance(n, dict))
    return out


def _properties(schemas: dict[str, Any], schema: dict[str, Any]) -> set[str]:
    return {name for part in _parts(schemas, schema) for name in part.get("properties") or {}}


def _value(attrs: dict[str, Any], rid: str, path: str) -> tuple[bool, Any]:
    if path == "id":
        return True, rid
    node: Any = attrs
    for part in path.split("/"):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _compare(op: str, left: Any, right: Any) -> bool:
    if op in ("=", "!="):
        return (left == right and type(left) is type(right) or _num(left) and _num(right) and left == right) == (
            op == "=")
    if not (_num(left) and _num(right) or isinstance(left, str) and isinstance(right, str)):
        return False
    return {"<": left < right, "<=": left <= right, ">": left > right, ">=": left >= right}[op]


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


class _Parser:
    """Recursive descent over the tokens of one condition (the text between the brackets)."""

    def __init__(self, text: str, cls: str, param: str) -> None:
        self.cls, self.param, self.toks, pos = cls, param, [], 0
        while pos < len(text.rstrip()):
            m = _TOKEN.match(text, pos)
            if m is None:
                raise _bad(param, f"cannot read the condition at {text[pos:pos + 20]!r}")
            self.toks.append((m.lastgroup, m.group(m.lastgroup)))
            pos = m.end()
        self.i = 0

    def peek(self) -> tuple[str, str] | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> tuple[str, str]:
        tok = self.peek()
        if tok is None:
            raise _bad(self.param, "the condition ends too early")
        self.i += 1
        return tok

    def parse(self) -> Cond:
        cond = self.disjunction()
        if self.peek() is not None:
            raise _bad(self.param, f"unexpected {self.peek()[1]!r} in the condition")
        return cond

    def disjunction(self) -> Cond:
        parts = [self.conjunction()]
        while self.peek() == ("name", "or"):
            self.take()
            parts.append(self.conjunction())
        return parts[0] if len(parts) == 1 else (lambda a, rid: any(p(a, rid) for p in parts))

    def conjunction(self) -> Cond:
        parts = [self.term()]
        while self.peek() == ("name", "and"):
            self.take()
            parts.append(self.term())
        return parts[0] if len(parts) == 1 else (lambda a, rid: all(p(a, rid) for p in parts))

    def term(self) -> Cond:
        kind, text = self.take()
        if (kind, text) == ("name", "not") and self.peek() == ("paren", "("):
            self.take()
            inner = self.disjunction()
            self.expect(")")
            return lambda a, rid: not inner(a, rid)
        if (kind, text) == ("paren", "("):
            inner = self.disjunction()
            self.expect(")")
            return inner
        if kind != "name":
            raise _bad(self.param, f"expected an attribute, got {text!r}")
        path = self.attribute(text)
        if self.peek() is None or self.peek()[0] != "op":
            return lambda a, rid: _value(a, rid, path)[0]
        op = self.take()[1]
        value = self.literal()
        return lambda a, rid: (lambda got: got[0] and _compare(op, got[1], value))(_value(a, rid, path))

    def expect(self, text: str) -> None:
        if self.take()[1] != text:
            raise _bad(self.param, f"expected {text!r} in the condition")

    def attribute(self, text: str) -> str:
        path = text.removeprefix("attributes/")
        known = attributes_of(self.cls)
        if path != "id" and path.split("/")[0] not in known:
            raise _bad(self.param, f"{self.cls} has no attribute {path.split('/')[0]!r}; its attributes are id, "
                       f"{', '.join(sorted(known))}")
        return path

    def literal(self) -> Any:
        kind, text = self.take()
        if kind == "str":
            return text[1:-1]
        if kind == "num":
            return float(text) if any(c in text for c in ".eE") else int(text)
        if kind == "name" and text in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[text]
        raise _bad(self.param, f"expected a value (a quoted string, a number, true, false or null), got {text!r}")


@dataclass(frozen=True)
class Alternative:
    path: str
    """The node path, as :func:`sluice.service.store._filter_matches` reads it."""
    cond: Cond | None


@dataclass(frozen=True)
class Filter:
    alternatives: tuple[Alternative, ...]

    def matches(self, row: Any, path_match: Callable[[str, str], bool]) -> bool:
        """Whether MOI ``row`` is selected; ``path_match(path, ldn)`` matches a node path."""
        from sluice.service.nrm import id_of

        return any(path_match(alt.path, row.dn) and (alt.cond is None or alt.cond(row.attributes, id_of(row.dn)))
                   for alt in self.alternatives)


def _alternative(text: str, param: str) -> Alternative:
    body, cond_text = text, None
    if "[" in text:
        body, _, rest = text.partition("[")
        if not rest.endswith("]"):
            raise _bad(param, f"{text!r}: a condition is closed by ']' at the end of the last node")
        cond_text = rest[:-1]
        if "[" in cond_text or "]" in cond_text:
            raise _bad(param, f"{text!r}: conditions go on the last node only, one bracket pair")
    path = body.strip().lstrip("/")
    nodes = [n.strip() for n in path.split("/")]
    if not path or any(not n for n in nodes):
        raise _bad(param, f"{text!r} has an empty node")
    for node in nodes:
        cls, _, rid = node.partition("=")
        if cls not in CLASSES:
            raise _bad(param, f"no class {cls!r} here; this service holds {', '.join(CLASSES)}")
        if "=" in node and not re.fullmatch(r"[A-Za-z0-9_.\-~:]+", rid):
            raise _bad(param, f"{node!r} is not Class=id")
    cond = None if cond_text is None else _Parser(cond_text, nodes[-1].partition("=")[0], param).parse()
    return Alternative("/".join(nodes), cond)


def parse_filter(text: str | None, param: str = "filter") -> Filter | None:
    """The filter of query parameter ``param``; None selects everything; 400 (see the module docstring)."""
    if text is None or not text.strip():
        return None
    alternatives = []
    for alt in _split(text):
        alternatives.append(_alternative(alt.strip(), param))
    return Filter(tuple(alternatives))


def _split(text: str) -> list[str]:
    """``text`` split at each ``|`` outside quotes and brackets."""
    out, cur, depth, quote = [], "", 0, ""
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "\"'":
            quote = ch
        elif ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        elif ch == "|" and depth == 0:
            out.append(cur)
            cur = ""
            continue
        cur += ch
    return [*out, cur]
