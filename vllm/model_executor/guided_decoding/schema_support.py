"""JSON-schema keywords that xgrammar compiles but does not enforce.

xgrammar (0.2.9) turns a JSON schema into a grammar, and for several keywords it neither
fails nor constrains: the grammar is built without them, so a "valid" constrained output
can break the schema the client sent (``uniqueItems`` gives ``[1, 1]``, a ``pattern`` next
to a ``maxLength`` drops the length, a ``minimum`` without a ``type`` is ignored, a
``required`` name missing from ``properties`` is not required, a ``$ref`` outside the
schema matches anything, ...).
Upstream vLLM refuses a similar list of keywords for its xgrammar backend ("features not
supported by xgrammar"); here :func:`unenforced_keywords` lists each one with where it
sits, and the grammar compiler turns the list into a ValueError (HTTP 400) before anything
is queued.

One exception is made on purpose: ``minLength`` / ``maxLength`` next to an enforced
``format`` are accepted although xgrammar drops the lengths, because pydantic writes them
for every URL field (``HttpUrl``: ``"format": "uri", "minLength": 1, "maxLength": 2083``),
where they bound nothing a reply would reach; next to a ``pattern`` they are refused.

Each rule below was checked against xgrammar 0.2.9 by compiling a schema with the keyword
and matching a string that breaks it: the rule is listed only where that string was
accepted. What xgrammar does enforce (``multipleOf`` on integers, ``minimum`` and friends
on typed numbers, ``minLength`` / ``maxLength`` alone, ``minItems`` / ``maxItems``,
``minProperties`` / ``maxProperties``, the formats of :data:`ENFORCED_FORMATS`,
``patternProperties``, ``propertyNames``, one-branch ``allOf``) is accepted.
"""

from __future__ import annotations

from typing import Any

# String formats xgrammar turns into a grammar; any other format accepts every string.
ENFORCED_FORMATS = frozenset(
    {
        "email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname",
        "uuid", "uri", "uri-reference", "uri-template", "json-pointer",
        "relative-json-pointer",
    }
)  # fmt: skip

# Keywords that never constrain the grammar.
_IGNORED = ("contains", "minContains", "maxContains", "not", "if", "then", "else",
            "dependentRequired", "dependentSchemas", "dependencies")  # fmt: skip

# Keywords that apply to one JSON type and are ignored in a subschema without "type".
_TYPED = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
          "minLength", "maxLength", "pattern", "format", "minItems", "maxItems")  # fmt: skip

# Keywords ignored next to "$ref", "anyOf" or "oneOf" (the reference or the union wins).
_ASSERTIONS = ("type", "properties", "required", "additionalProperties", "items",
               "prefixItems", "enum", "const", "minProperties", "maxProperties",
               *_TYPED)  # fmt: skip

# Where subschemas sit: a map of them, one, or a list of them.
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SCHEMA_ONE = ("additionalProperties", "unevaluatedProperties", "propertyNames", "items",
               "additionalItems", "unevaluatedItems", "contains", "not", "if", "then",
               "else")  # fmt: skip
_SCHEMA_LISTS = ("items", "prefixItems", "allOf", "anyOf", "oneOf")


def unenforced_keywords(schema: Any) -> list[str]:
    """What of ``schema`` xgrammar would silently not enforce, one line per finding
    (``'<keyword> at <JSON pointer>: <why>'``); empty when everything is enforced.

    Only subschema positions are visited (the values of ``properties``, ``items``,
    ``anyOf``, ...), never ``enum``, ``const``, ``default`` or ``examples`` data.
    """
    found: list[str] = []
    _visit(schema, "", found)
    return found


def _visit(node: Any, path: str, found: list[str], implied: str | None = None) -> None:
    """Check ``node`` and its subschemas; ``implied``: the type the position fixes (a
    ``propertyNames`` schema describes strings, with or without ``"type"``)."""
    if not isinstance(node, dict):
        return
    for problem in _node_problems(node, implied):
        found.append(f"{problem[0]} at {path or '/'}: {problem[1]}")
    for key in _SCHEMA_MAPS:
        sub = node.get(key)
        if isinstance(sub, dict):
            for name, child in sub.items():
                _visit(child, f"{path}/{key}/{_escape(name)}", found)
    for key in _SCHEMA_ONE:
        if isinstance(node.get(key), dict):
            implied_here = "string" if key == "propertyNames" else None
            _visit(node[key], f"{path}/{key}", found, implied_here)
    for key in _SCHEMA_LISTS:
        sub = node.get(key)
        if isinstance(sub, list):
            for i, child in enumerate(sub):
                _visit(child, f"{path}/{key}/{i}", found)


def _node_problems(node: dict, implied: str | None = None) -> list[tuple[str, str]]:
    """(keyword, why) for each unenforced keyword of one subschema (not its children);
    ``implied``: its type when the position fixes one."""
    types = _types(node) or ({implied} if implied else set())
    out: list[tuple[str, str]] = []
    if node.get("uniqueItems") is True:
        out.append(("uniqueItems", "items are not kept distinct"))
    out += [(k, "this keyword is not enforced") for k in _IGNORED if k in node]
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) > 1:
        out.append(("allOf", "only a single-branch allOf is enforced"))
    if not types:
        if not ({"enum", "const", "$ref", "anyOf", "oneOf", "allOf"} & node.keys()):
            out += [(k, 'ignored without a "type"') for k in _TYPED if k in node]
    elif "multipleOf" in node and types != {"integer"}:
        out.append(("multipleOf", 'enforced only with "type": "integer"'))
    if "format" in node and (not types or "string" in types):
        if node["format"] not in ENFORCED_FORMATS:
            out.append(("format", f"format {node['format']!r} accepts any string"))
    if "pattern" in node and ("minLength" in node or "maxLength" in node):
        out.append(("minLength/maxLength", "ignored next to pattern"))
    ref = node.get("$ref")
    if isinstance(ref, str) and not (ref == "#" or ref.startswith("#/")):
        out.append(("$ref", f"{ref!r} is not within the schema (#/...): it matches anything"))
    required = node.get("required")
    if isinstance(required, list):
        props = node.get("properties")
        missing = [r for r in required if not (isinstance(props, dict) and r in props)]
        if missing:
            out.append(("required", f"{missing} not in properties are not required"))
    for union in ("$ref", "anyOf", "oneOf"):
        if union in node:
            beside = [k for k in _ASSERTIONS if k in node]
            if beside:
                out.append((", ".join(beside), f"ignored next to {union}"))
    return out


def _types(node: dict) -> set[str]:
    """The node's "type" as a set (a string or a list of strings; empty without one)."""
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _escape(name: str) -> str:
    """A JSON-pointer segment (RFC 6901): ``~`` -> ``~0``, ``/`` -> ``~1``."""
    return str(name).replace("~", "~0").replace("/", "~1")
