"""Admission of custom resources: an object checked against its CRD
version's ``openAPIV3Schema`` and CEL rules (``x-kubernetes-validations``,
evaluated with cel-python), its unknown fields pruned (or refused when the
client asks for strict field validation), with the API server's words for
each cause.

Pure logic: the emulator (emulator.py) calls ``admit`` before it stores an
object of a custom resource.
"""

import json
import re
from typing import Any

import celpy

TYPES = {'object': dict, 'array': list, 'string': str, 'boolean': bool}

_programs: dict[str, Any] = {}  # CEL rule -> compiled program
_cel = celpy.Environment()
# (CEL rule, its message, the value as JSON) -> the error it gives, or None: cel-python takes
# milliseconds a rule, and an object's spec is checked again on every write of
# its status. Bounded: emptied when full.
_verdicts: dict[tuple[str, str, str], str | None] = {}
VERDICTS_KEPT = 100_000


class Invalid(Exception):
    """The object breaks its schema: ``causes`` are (field, message) pairs."""

    def __init__(self, causes: list[tuple[str, str]]):
        super().__init__('; '.join(m for _, m in causes))
        self.causes = causes


class UnknownFields(Exception):
    """Strict field validation and fields the schema does not declare."""

    def __init__(self, fields: list[str]):
        super().__init__(', '.join(fields))
        self.fields = fields


def _shown(value: Any) -> str:
    """A value as the API server quotes it in an ``Invalid value:``."""
    if isinstance(value, dict):
        return '"object"'
    if isinstance(value, list):
        return '"array"'
    return json.dumps(value)


def _type_ok(schema: dict[str, Any], value: Any) -> bool:
    if schema.get('x-kubernetes-int-or-string'):
        return isinstance(value, (int, str)) and not isinstance(value, bool)
    kind = schema.get('type')
    if kind is None:
        return True
    if kind == 'integer':
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == 'number':
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, TYPES.get(kind, object))


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return 'boolean'
    if isinstance(value, int):
        return 'integer'
    if isinstance(value, float):
        return 'number'
    if isinstance(value, str):
        return 'string'
    if isinstance(value, list):
        return 'array'
    if isinstance(value, dict):
        return 'object'
    return 'null'


def _junctors(schema: dict[str, Any], value: Any, path: str) -> list[tuple[str, str]]:
    """oneOf, anyOf, allOf, not: with what the API server says when they fail."""
    causes = []
    def passes(sub: dict[str, Any]) -> bool:
        return not _walk(sub, value, path, [], prune=False)
    if 'oneOf' in schema:
        valid = sum(passes(s) for s in schema['oneOf'])
        if valid != 1:
            found = 'none valid' if valid == 0 else f'{valid} valid alternatives'
            causes.append((path, f'{path}: Invalid value: {_shown(value)}: {path} in body must validate one and only one'
                                 f' schema (oneOf). Found {found}'))
    if 'anyOf' in schema and not any(passes(s) for s in schema['anyOf']):
        causes.append((path, f'{path}: Invalid value: {_shown(value)}: {path} in body must validate at least one schema (anyOf)'))
    for sub in schema.get('allOf') or []:
        causes.extend(_walk(sub, value, path, [], prune=False))
    if 'not' in schema and passes(schema['not']):
        causes.append((path, f'{path}: Invalid value: {_shown(value)}: {path} in body should not validate the schema'))
    return causes


def _cel_rules(schema: dict[str, Any], value: Any, path: str) -> list[tuple[str, str]]:
    causes = []
    for rule in schema.get('x-kubernetes-validations') or []:
        text = rule.get('rule', '')
        if 'oldSelf' in text:
            continue  # transition rules: the emulator keeps no old object here
        key = (text, rule.get('message') or '', json.dumps(value, sort_keys=True))
        if key not in _verdicts:
            if len(_verdicts) >= VERDICTS_KEPT:
                _verdicts.clear()
            _verdicts[key] = _evaluate(text, rule, value)
        if (message := _verdicts[key]) is not None:
            at = path + (rule.get('fieldPath') or '')
            causes.append((at, f'{at}: Invalid value: {_shown(value)}: {message}'))
    return causes


def _evaluate(text: str, rule: dict[str, Any], value: Any) -> str | None:
    """What a failing CEL rule says about ``value``; None when it holds."""
    program = _programs.get(text)
    if program is None:
        program = _programs[text] = _cel.program(_cel.compile(text))
    try:
        if program.evaluate({'self': celpy.json_to_cel(value)}):
            return None
    except celpy.CELEvalError as e:
        return f'evaluation error: {e}'
    return rule.get('message') or f'failed rule: {text}'


def _walk(schema: dict[str, Any], value: Any, path: str, unknown: list[str], prune: bool) -> list[tuple[str, str]]:
    """The causes against ``schema`` at ``path``; unknown fields are pruned
    from ``value`` in place (and listed in ``unknown``) when ``prune``."""
    if value is None:
        if schema.get('nullable'):
            return []
        if schema.get('type') or schema.get('x-kubernetes-int-or-string'):
            return [(path, f'{path}: Invalid value: "null": {path} in body must be of type {schema.get("type", "string")}: "null"')]
        return []
    if not _type_ok(schema, value):
        kind = 'integer,string' if schema.get('x-kubernetes-int-or-string') else schema['type']
        return [(path, f'{path}: Invalid value: "{_type_name(value)}": {path} in body must be of type {kind}: "{_type_name(value)}"')]
    causes: list[tuple[str, str]] = []
    if 'enum' in schema and value not in schema['enum']:
        supported = ', '.join(json.dumps(v) for v in schema['enum'])
        causes.append((path, f'{path}: Unsupported value: {json.dumps(value)}: supported values: {supported}'))
    if isinstance(value, str):
        if 'maxLength' in schema and len(value) > schema['maxLength']:
            causes.append((path, f'{path}: Too long: may not be more than {schema["maxLength"]} bytes'))
        if 'minLength' in schema and len(value) < schema['minLength']:
            causes.append((path, f'{path}: Invalid value: {json.dumps(value)}: {path} in body should be at least'
                                 f' {schema["minLength"]} chars long'))
        if 'pattern' in schema and not re.search(schema['pattern'], value):
            causes.append((path, f'{path}: Invalid value: {json.dumps(value)}: {path} in body should match'
                                 f" '{schema['pattern']}'"))
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if 'minimum' in schema and value < schema['minimum']:
            causes.append((path, f'{path}: Invalid value: {value}: {path} in body should be greater than or equal'
                                 f' to {schema["minimum"]}'))
        if 'maximum' in schema and value > schema['maximum']:
            causes.append((path, f'{path}: Invalid value: {value}: {path} in body should be less than or equal'
                                 f' to {schema["maximum"]}'))
    if isinstance(value, list):
        if 'maxItems' in schema and len(value) > schema['maxItems']:
            causes.append((path, f'{path}: Too many: {len(value)}: must have at most {schema["maxItems"]} items'))
        if 'minItems' in schema and len(value) < schema['minItems']:
            causes.append((path, f'{path}: Invalid value: {len(value)}: {path} in body should have at least'
                                 f' {schema["minItems"]} items'))
        for i, item in enumerate(value):
            causes.extend(_walk(schema.get('items') or {}, item, f'{path}[{i}]', unknown, prune))
    if isinstance(value, dict):
        for field in schema.get('required') or []:
            if field not in value:
                causes.append((f'{path}.{field}', f'{path}.{field}: Required value'))
        properties = schema.get('properties')
        extra = schema.get('additionalProperties')
        for key in list(value):
            at = f'{path}.{key}' if path else key
            if properties is not None and key in properties:
                causes.extend(_walk(properties[key], value[key], at, unknown, prune))
            elif isinstance(extra, dict):
                causes.extend(_walk(extra, value[key], at, unknown, prune))
            elif properties is not None and not schema.get('x-kubernetes-preserve-unknown-fields') \
                    and not schema.get('x-kubernetes-embedded-resource') and extra is not True:
                if prune:
                    unknown.append(at)
                    del value[key]
    causes.extend(_junctors(schema, value, path))
    if not causes:  # as the API server, CEL rules run on values that passed the schema
        causes.extend(_cel_rules(schema, value, path))
    return causes


def admit(schema: dict[str, Any], obj: dict[str, Any], strict: bool) -> dict[str, Any]:
    """``obj`` pruned of undeclared fields, or ``Invalid``/``UnknownFields``.
    The metadata is the API server's own business and is not walked."""
    unknown: list[str] = []
    causes = []
    for key, value in obj.items():
        if key in ('apiVersion', 'kind', 'metadata'):
            continue
        sub = (schema.get('properties') or {}).get(key)
        if sub is None:
            if not schema.get('x-kubernetes-preserve-unknown-fields'):
                unknown.append(key)
            continue
        causes.extend(_walk(sub, value, key, unknown, prune=True))
    for field in schema.get('required') or []:
        if field not in obj:
            causes.append((field, f'{field}: Required value'))
    for key in [k for k in unknown if '.' not in k]:
        obj.pop(key, None)
    if unknown and strict:
        raise UnknownFields(unknown)
    if causes:
        raise Invalid(causes)
    return obj
