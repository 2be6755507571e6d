"""Kubernetes' protobuf encoding of request bodies, decoded into the JSON
shape the emulator stores, for the kinds clients send that way.

client-go's typed clients (helm's release storage and its
``--create-namespace``, ``kubectl create secret``) send built-in kinds as
``application/vnd.kubernetes.protobuf``: the magic ``k8s\\0``, then a
``runtime.Unknown`` whose ``typeMeta`` names the kind and whose ``raw`` is
that kind's message. The kinds below are decoded field by field from their
generated.proto (field numbers as in k8s.io/api and k8s.io/apimachinery);
any other kind is refused (``Unsupported``) and the emulator answers 415.

Pure logic: bytes in, a dict out.
"""

import base64
import datetime
from typing import Any, Callable

MAGIC = b'k8s\x00'
MEDIA_TYPE = 'application/vnd.kubernetes.protobuf'


class Unsupported(Exception):
    """A body this module cannot decode: not the envelope, or a kind it does not know."""


def varint(data: bytes, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data):
            raise Unsupported('a varint runs past the end of the body')
        byte = data[at]
        value |= (byte & 0x7f) << shift
        at += 1
        if byte < 0x80:
            return value, at
        shift += 7


def fields(data: bytes) -> list[tuple[int, int | bytes]]:
    """The (field number, value) pairs of one message: varints as ints,
    length-delimited fields as bytes; fixed-width fields (no Kubernetes
    kind here has them) are refused."""
    out, at = [], 0
    while at < len(data):
        key, at = varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(data, at)
        elif wire == 2:
            size, at = varint(data, at)
            value, at = data[at:at + size], at + size
        else:
            raise Unsupported(f'wire type {wire} of field {number}')
        out.append((number, value))
    return out


# A message's schema: field number -> (JSON name, how to decode, repeated).
Schema = dict[int, tuple[str, Callable[[Any], Any], bool]]


def text(value: bytes) -> str:
    return value.decode()


def b64(value: bytes) -> str:
    return base64.b64encode(value).decode()


def boolean(value: int) -> bool:
    return bool(value)


def integer(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value  # int64 as two's complement


def string_map_entry(value: bytes) -> tuple[str, str]:
    entry = dict(fields(value))
    return entry.get(1, b'').decode(), entry.get(2, b'').decode()


def bytes_map_entry(value: bytes) -> tuple[str, str]:
    entry = dict(fields(value))
    return entry.get(1, b'').decode(), b64(entry.get(2, b''))


def time(value: bytes) -> str | None:
    """A metav1.Time (seconds, nanos) as RFC 3339; the zero time is null, as in JSON."""
    seconds = dict(fields(value)).get(1, 0)
    if not seconds:
        return None
    return datetime.datetime.fromtimestamp(integer(seconds), datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def message(schema: Schema) -> Callable[[bytes], dict[str, Any]]:
    """A decoder of one message kind into a dict. Maps are repeated entries;
    gogo-protobuf writes every non-pointer field, so empty strings, zeros
    and zero times are left out, as they are from the JSON encoding."""
    def decode(data: bytes) -> dict[str, Any]:
        obj: dict[str, Any] = {}
        for number, raw in fields(data):
            if number not in schema:
                continue  # a field this emulator has no use for
            name, convert, repeated = schema[number]
            value = convert(raw)
            if convert in (string_map_entry, bytes_map_entry):
                obj.setdefault(name, {})[value[0]] = value[1]
            elif repeated:
                obj.setdefault(name, []).append(value)
            elif value not in ('', 0, None) or convert is boolean:
                obj[name] = value
        return obj
    return decode


owner_reference = message({
    1: ('kind', text, False), 3: ('name', text, False), 4: ('uid', text, False),
    5: ('apiVersion', text, False), 6: ('controller', boolean, False), 7: ('blockOwnerDeletion', boolean, False),
})

object_meta = message({
    1: ('name', text, False), 2: ('generateName', text, False), 3: ('namespace', text, False),
    5: ('uid', text, False), 6: ('resourceVersion', text, False), 7: ('generation', integer, False),
    8: ('creationTimestamp', time, False), 9: ('deletionTimestamp', time, False),
    10: ('deletionGracePeriodSeconds', integer, False),
    11: ('labels', string_map_entry, False), 12: ('annotations', string_map_entry, False),
    13: ('ownerReferences', owner_reference, True), 14: ('finalizers', text, True),
})

preconditions = message({1: ('uid', text, False), 2: ('resourceVersion', text, False)})

# The kinds, by (apiVersion, kind) of the envelope.
KINDS: dict[tuple[str, str], Callable[[bytes], dict[str, Any]]] = {
    ('v1', 'Secret'): message({
        1: ('metadata', object_meta, False), 2: ('data', bytes_map_entry, False), 3: ('type', text, False),
        4: ('stringData', string_map_entry, False), 5: ('immutable', boolean, False),
    }),
    ('v1', 'ConfigMap'): message({
        1: ('metadata', object_meta, False), 2: ('data', string_map_entry, False),
        3: ('binaryData', bytes_map_entry, False), 4: ('immutable', boolean, False),
    }),
    ('v1', 'Namespace'): message({
        1: ('metadata', object_meta, False), 2: ('spec', message({1: ('finalizers', text, True)}), False),
    }),
    # A delete's options, as typed clients send them with the request.
    ('v1', 'DeleteOptions'): message({
        1: ('gracePeriodSeconds', integer, False), 2: ('preconditions', preconditions, False),
        3: ('orphanDependents', boolean, False), 4: ('propagationPolicy', text, False), 5: ('dryRun', text, True),
    }),
}
KINDS['meta.k8s.io/v1', 'DeleteOptions'] = KINDS['v1', 'DeleteOptions']


def decode(body: bytes) -> dict[str, Any]:
    """The object in a protobuf request body, as JSON would have carried it
    (with its apiVersion and kind); ``Unsupported`` if it is not one of KINDS."""
    if not body.startswith(MAGIC):
        raise Unsupported('the body does not start with the k8s protobuf magic')
    envelope = dict(fields(body[len(MAGIC):]))
    type_meta = dict(fields(envelope.get(1, b'')))
    api_version, kind = type_meta.get(1, b'').decode(), type_meta.get(2, b'').decode()
    if envelope.get(3) or envelope.get(4, b'') not in (b'', MEDIA_TYPE.encode()):
        raise Unsupported(f'a {kind} in an envelope with encoding {envelope.get(3)!r}, type {envelope.get(4)!r}')
    decoder = KINDS.get((api_version, kind))
    if decoder is None:
        raise Unsupported(f'{kind} ({api_version or "no apiVersion"})')
    obj = decoder(envelope.get(2, b''))
    return {'apiVersion': api_version, 'kind': kind, **obj}


def known() -> str:
    """The kinds decode() takes, for messages: ``Secret, ConfigMap, Namespace``."""
    return ', '.join(dict.fromkeys(kind for _, kind in KINDS if kind != 'DeleteOptions'))
