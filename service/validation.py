"""Pydantic validation errors as one-line messages that name the field and its allowed values.

'beam_size: Input should be less than or equal to 8 (allowed: an integer from 1 to 8)'. Used by
the HTTP error handlers and by tasks that validate free-form parameters (OIP `parameters`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

MAX_LISTED_ERRORS = 3


def field_rules(*models: type[BaseModel]) -> dict[str, str]:
    """Allowed values of each request field, from the JSON schema, for validation messages."""
    rules: dict[str, str] = {}
    for model in models:
        for name, prop in model.model_json_schema().get("properties", {}).items():
            rule = _rule(prop)
            if rule:
                rules.setdefault(name, rule)
    return rules


def describe_validation(errors: Sequence[Mapping[str, Any]], rules: Mapping[str, str], prefix: str = "") -> str:
    parts = []
    for err in errors[:MAX_LISTED_ERRORS]:
        loc = [p for p in err.get("loc", ()) if p != "body"]
        where = (prefix + _path(loc)).rstrip(".") or "body"
        msg = str(err.get("msg", "invalid value"))
        if err.get("type") in ("model_attributes_type", "dict_type", "model_type") and not loc:
            msg = "must be a JSON object"
        elif err.get("type") == "missing" and not loc:
            msg = "missing: send a JSON object"
        rule = rules.get(str(loc[0])) if len(loc) == 1 else None
        parts.append(f"{where}: {msg}" + (f" (allowed: {rule})" if rule else ""))
    more = len(errors) - MAX_LISTED_ERRORS
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


def _path(loc: Sequence[Any]) -> str:
    out = ""
    for p in loc:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out


def _rule(prop: dict[str, Any]) -> str:
    if "anyOf" in prop:
        parts = [_rule(p) for p in prop["anyOf"] if p.get("type") != "null"]
        return " or ".join(p for p in parts if p)
    kind = prop.get("type")
    if "enum" in prop or "const" in prop:
        values = prop.get("enum", [prop.get("const")])
        return "one of " + ", ".join(repr(v) for v in values)
    if kind in ("integer", "number"):
        noun = "an integer" if kind == "integer" else "a number"
        lo = prop.get("minimum", prop.get("exclusiveMinimum"))
        hi = prop.get("maximum", prop.get("exclusiveMaximum"))
        lo_word = "above" if "exclusiveMinimum" in prop else ">="
        if lo is not None and hi is not None and "exclusiveMinimum" not in prop and "exclusiveMaximum" not in prop:
            return f"{noun} from {lo} to {hi}"
        return noun + (f" {lo_word} {lo}" if lo is not None else "") + (f" <= {hi}" if hi is not None else "")
    if kind == "array":
        return "a list" + (f" of at least {prop['minItems']} item(s)" if "minItems" in prop else "")
    if kind == "string":
        return "a string" + (f" matching {prop['pattern']}" if "pattern" in prop else "")
    if kind == "boolean":
        return "true or false"
    return ""
