"""pydantic's validation errors said in a suite's words: the file and line of each, the closest
allowed key for a misspelt one, and what the value should have been, in YAML's terms."""

from __future__ import annotations

import re
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ValidationError

from harness.suite.errors import Locations, SuiteError, field_name
from harness.suite.schema import SuiteSpec, name_as_entry


def _model_holding(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The model whose field ``loc``'s last key is (None where no model holds one)."""
    model: type[BaseModel] = SuiteSpec
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = _field(model, part)
        held = _model_in(field.annotation) if field is not None else None
        if held is None:
            return None
        model = held
    return model


def _field(model: type[BaseModel], key: Any) -> Any:
    """``model``'s field named ``key`` (by name or by alias), or None."""
    return next((f for n, f in model.model_fields.items() if key in (n, f.alias)), None)


def _keys_beside(loc: tuple[Any, ...]) -> list[str]:
    """The keys a suite allows where ``loc``'s last key stands (the fields of the model that holds it)."""
    model = _model_holding(loc)
    if model is None:
        return []
    keys = [f.alias or n for n, f in model.model_fields.items()]
    return [*keys, "include"] if model is SuiteSpec else keys


def _one_value_is_an_item(loc: tuple[Any, ...]) -> bool:
    """Whether the list field at ``loc`` takes a single plain value as an item: numbers and texts, and
    entries that a name stands for (``planners: [greedy]``); not mappings (``models``) or lists."""
    model = _model_holding(loc)
    field = _field(model, loc[-1]) if model is not None and loc else None
    lists = [a for a in (field.annotation, *typing.get_args(field.annotation))
             if typing.get_origin(a) is list] if field is not None else []
    return bool(lists) and _plain_value_fits(typing.get_args(lists[0])[0])


def _plain_value_fits(item: Any) -> bool:
    if typing.get_origin(item) is Annotated:
        return (any(getattr(m, "func", None) is name_as_entry for m in item.__metadata__)
                or _plain_value_fits(typing.get_args(item)[0]))
    return item is Any or item in (int, float, str)


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (through list[...], Optional, Annotated), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _near_key(loc: tuple[Any, ...]) -> str | None:
    """The allowed key closest to the unknown key at ``loc``, when one is near."""
    from harness.plugins import close_names

    near = close_names(str(loc[-1]), _keys_beside(loc), n=1) if loc else []
    return near[0] if near else None


def _unknown_key(loc: tuple[Any, ...]) -> str:
    """The message for a key no suite model has: the closest allowed key when one is near."""
    keys = _keys_beside(loc)
    near = [_near_key(loc)] if _near_key(loc) else []
    hint = f"did you mean {near[0]!r}? " if near else ""
    allowed = f"the keys here are {', '.join(keys)}; " if keys and not near else ""
    return f"unknown field ({hint}{allowed}the suite format is in docs/cli.md, \"Suites\")"


def _yaml_kind(value: Any) -> str:
    """What a YAML value is, in YAML's words."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, str):
        return f"the text {value!r}"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"


# what a suite value should have been, by pydantic's error type (its own words name Python's types)
_EXPECTED = {"list_type": "a list", "string_type": "a text", "int_type": "a whole number",
             "int_parsing": "a whole number", "int_from_float": "a whole number", "float_type": "a number",
             "float_parsing": "a number", "bool_type": "true or false", "bool_parsing": "true or false",
             "dict_type": "a mapping"}

_BOUNDS = {"greater_than": "above", "greater_than_equal": "at least", "less_than": "below",
           "less_than_equal": "at most"}


def validation_error(exc: ValidationError, suite_source: str, locations: Locations) -> SuiteError:
    """pydantic's errors for a suite as one ``SuiteError``: each at its file and line, the first
    one's location on the exception, a misspelt key once (as its "did you mean")."""
    lines = []
    first: tuple[str, int, str] | None = None
    errors = [(tuple("bytes" if p == "bytes_" else p for p in err["loc"]), err) for err in exc.errors()]
    errors.sort(key=lambda e: e[0] not in locations)  # errors at a line of their own first
    # a misspelt required key is one mistake: its "did you mean" line says it, not also "missing"
    meant = {(*loc[:-1], _near_key(loc)) for loc, err in errors if err["type"] == "extra_forbidden"}
    errors = [(loc, err) for loc, err in errors if not (err["type"] == "missing" and loc in meant)]
    for loc, err in errors:
        msg = err["msg"].removeprefix("Value error, ")
        if msg.startswith("[") and "]: " in msg and msg[1:msg.index("]")].isdigit():  # names its item
            item, msg = msg[1:].split("]: ", 1)
            loc = (*loc, int(item))
        at = loc
        while at not in locations and at:
            at = at[:-1]
        source, line = locations.get(at, (suite_source, 1))
        if err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] == "extra_forbidden":
            msg = _unknown_key(loc)
        elif err["type"].startswith("too_short") and "input" in err:
            msg = "must not be empty: the grid would have no cases"
        elif err["type"] == "model_type":  # pydantic's "Input should be a valid dictionary or instance of ..."
            keys = [k for k in _keys_beside((*loc, "")) if k != "include"]
            named = bool(loc) and isinstance(loc[-1], int) and _one_value_is_an_item(loc[:-1])
            msg = (f"{'a name or ' if named else ''}a mapping with the keys {', '.join(keys)}, "
                   f"got {_yaml_kind(err.get('input'))} "
                   "(the suite format is in docs/cli.md, \"Suites\")")
        elif err["type"] in _EXPECTED:
            value = err.get("input")
            one = (err["type"] == "list_type" and isinstance(value, (str, int, float))
                   and not isinstance(value, bool) and _one_value_is_an_item(loc))
            shape = isinstance(value, str) and re.fullmatch(r"\s*\d+(\s*[x,]\s*\d+)+\s*", value)
            write = "[" + ", ".join(re.findall(r"\d+", value)) + "]" if shape else f"[{value}]" if one else ""
            if shape and loc and loc[-1] == "input_sizes":  # a list of sizes
                write = f"[{write}]"
            msg = f"{_EXPECTED[err['type']]}, got {_yaml_kind(value)}" + (f" (write {write})" if write else "")
        elif err["type"] in _BOUNDS and "ctx" in err:  # pydantic's "Input should be greater than 0"
            bound = next(iter(err["ctx"].values()))
            msg = f"must be {_BOUNDS[err['type']]} {bound}, got {_yaml_kind(err.get('input'))}"
        elif err["type"] == "string_pattern_mismatch":
            msg = (f"{err.get('input')!r} is not one plain folder name: letters, digits, '.', '_' and '-', "
                   "starting with a letter or digit")
        name = field_name(loc)
        lines.append(f"{source}:{line}: {name or '(suite)'}: {msg}")
        first = first or (source, line, name)
    assert first is not None
    return SuiteError("\n".join(lines), source=first[0], line=first[1], field=first[2])
