#!/usr/bin/env python3
"""A Kubernetes API emulator for tests: kmock's KubernetesEmulator plus a shim.

    python3 tests/k8s/emulator.py --port 0

serves plain http on 127.0.0.1, prints exactly one line
``listening on http://127.0.0.1:PORT`` on stdout, logs to stderr, and exits
on SIGTERM (or SIGINT). kube-rs and kubectl talk to it through a kubeconfig
that points at that URL with no auth.

kmock 0.8 (pinned in requirements.txt) provides the HTTP server, request
parsing, the discovery endpoints, the resource registry (with its bundled list
of built-in kinds), the object store with per-object history and the error
rendering. This shim fixes what keeps kubectl and kube-rs from working:

  1. ``/api/v1/namespaces[/NAME[/status]]`` parses as Namespaces, not as a
     namespaced path with no resource (list/get/create of Namespaces failed);
     ``default`` and ``kube-system`` exist at start.
  2. Discovery: the core group's ``groupVersion`` is ``v1`` (was ``/v1``);
     built-in kinds are registered from kmock's bundled list; a CRD registers
     (and its deletion unregisters) its served versions with kind, singular,
     short names, scope, verbs and subresources; only registered resources
     are served (others 404 as in Kubernetes); ``/version`` says 1.37.
  3. Objects get ``uid``, ``creationTimestamp``, ``generation`` and
     ``resourceVersion``; resourceVersion is one global counter bumped on
     every write; generation bumps when anything outside metadata and status
     changes. A write that changes nothing bumps nothing and emits no event
     (kmock emitted MODIFIED on every patch: reconcile hot loops).
  4. Writes: POST creates (409 AlreadyExists), PUT replaces (was not routed),
     PATCH takes JSON patch, merge patch, kubectl's strategic merge patch
     (its list directives included) and server-side apply, which creates a
     missing object (kmock answered 404). A stale ``metadata.resourceVersion``
     in a write is a 409 Conflict. A JSON-patch ``test`` of ``null`` passes
     on a missing path, as in Kubernetes (kube-runtime's finalizer helper
     relies on it).
  5. The status subresource: writes to ``/status`` change only ``.status``;
     writes to the main resource keep ``.status`` for kinds that have one.
  6. Deletion honours finalizers (deletionTimestamp first, gone when the last
     finalizer goes); deleting a Namespace or a CRD removes its contents.
  7. Lists carry ``kind: <Kind>List``, ``apiVersion`` and
     ``metadata.resourceVersion``; ``labelSelector`` and equality-only
     ``fieldSelector`` (``a.b=x``, ``a.b!=x``) filter lists and watches
     (kubectl describe lists Events by ``involvedObject.*``; kubectl delete
     and kube-rs ``watch_object`` watch by ``metadata.name``).
  8. Watches are ``application/json`` (was octet-stream), newline-delimited
     ``{"type": ..., "object": ...}`` events, resumed after the
     ``resourceVersion`` given (replayed from an in-memory event log) or
     starting with ADDED for every object when none is given or
     ``sendInitialEvents=true`` asks for them (client-go's watch-lists:
     kubectl wait, helm's --wait), those then ending with the BOOKMARK
     annotated ``k8s.io/initial-events-end``; ``timeoutSeconds`` ends the
     stream.
  9. Errors are ``kind: Status`` objects with the standard ``reason``
     (NotFound, AlreadyExists, Conflict, ...), ``code``, ``message`` and
     ``details``. Protobuf bodies (client-go's typed clients send them:
     helm's release Secrets, ``kubectl create secret``) are decoded
     (protobuf.py) for Secrets, ConfigMaps, Namespaces and DeleteOptions and
     handled as JSON; answers are always JSON, which such clients accept
     too; a protobuf body of any other kind gets a 415 naming the kinds
     decoded.
 10. ``/openapi/v2`` is an empty document: kubectl apply's validation needs
     one to exist (and with nothing in it, validates nothing).
 11. ``kubectl get`` asks for Tables: the name, then a CRD's printer columns
     (or the age), so printer columns show as on a cluster; a column's JSONPath
     may index (``[0]``, ``[*]``) and filter (``[?(@.type=="Ready")]``), and
     shows its first match, as the API server does.
 12. Metadata-only reads: an ``Accept`` of ``as=PartialObjectMetadata[List]``
     (kube-rs ``Api<PartialObjectMeta<K>>``, its metadata watches) gets
     ``PartialObjectMetadata`` objects, metadata only, as from the API server:
     a Secret's data is not sent to whoever watches Secrets that way.
 13. Authentication and RBAC (rbac.py): ``POST .../serviceaccounts/NAME/token``
     (a TokenRequest; ``kubectl create --raw``) gives a bearer token that
     authenticates as ``system:serviceaccount:NS:NAME`` while that
     ServiceAccount exists (an unknown token is a 401). Such a user gets what
     the stored Roles, ClusterRoles, RoleBindings and ClusterRoleBindings grant
     (verbs, ``*``, subresources as ``agenttenants/status``, ``resourceNames``,
     a list or watch by ``metadata.name`` counting as that name) and a 403
     ``Forbidden`` Status in the API server's words otherwise. An apply that
     creates is authorized as ``create`` too, and setting ``blockOwnerDeletion``
     on an ownerReference needs ``update`` on the owner's ``finalizers``
     (the OwnerReferencesPermissionEnforcement admission plugin). Every
     decision is recorded: ``GET /emulator/audit`` lists each (user, verb,
     group, resource, namespace) asked for and whether it was allowed.
 14. Garbage collection by ``ownerReferences``: once an owner is gone, each
     dependent loses its reference to it and is deleted when no other owner
     of it exists (Background, the default; finalizers hold a dependent as
     any deletion). ``propagationPolicy: Foreground`` keeps the owner (a
     deletionTimestamp and the ``foregroundDeletion`` finalizer) until its
     dependents with ``blockOwnerDeletion`` are gone; ``Orphan`` (or
     ``orphanDependents``) removes the references and keeps the dependents.
 15. Admission of custom resources (admission.py): on every write, an object
     is checked against its CRD version's ``openAPIV3Schema`` (types,
     required, enum, lengths, bounds, patterns, oneOf/anyOf/allOf/not,
     nullable, int-or-string) and its CEL rules (``x-kubernetes-validations``,
     with cel-python) and refused with a 422 ``Invalid`` listing each cause
     in the API server's words; fields the schema does not declare are
     pruned, or refused (400) when the client asks for
     ``fieldValidation=Strict`` as kubectl does.
 16. Pods (kubelet.py): each Deployment's pod template becomes Pods (owned
     by the Deployment) whose containers run as local processes of the
     program ``--image NAME=PATH`` maps their image to, with their
     environment (literal, ``secretKeyRef``, ``configMapKeyRef``,
     ``fieldRef``) and volumes (ConfigMap, Secret, emptyDir, PVC) as
     directories bind-mounted at their mount paths in a private mount
     namespace; readiness probes (``httpGet``) are polled and Pod and
     Deployment status written (``readyReplicas``, conditions); a new
     template rolls the Pods. A Service gets a local TCP address that reaches
     its ready Pods, in ``status.loadBalancer.ingress`` (ip and ports).
 17. Scale: requests are forgotten once served (kmock kept every request
     and routed each new one by scanning all of them, which made an
     operator's run quadratic: two minutes for 100 tenants, three seconds
     now); gets, lists and watches are answered from the store directly,
     a list reading only its resource's objects (1000 AgentTenants list in
     about 0.1-0.2 s). Stored objects are never changed in place, so reads
     and watch events share them instead of deep-copying each; copies that
     are needed use a JSON-only copy; a CEL rule's verdict on a value is
     remembered (cel-python takes milliseconds a rule, and a status write
     checks the unchanged spec again); resources are looked up without
     kmock's registry (its key check costs more than the rest of a
     request in Python 3.11). Python answers some hundreds of requests a
     second: operator/benches/reconcile.rs prints the emulator's floor for
     the requests an operator run needs next to the operator's time.

Gaps, by design -- tests must not rely on these:
  - a request without a bearer token acts as a cluster administrator (the
    tests' own kubectl and kube-rs clients), where a real cluster would treat
    it as ``system:anonymous``; tokens do not expire; there are no default
    ClusterRoles (discovery is open to everyone) and no aggregated
    ClusterRoles (``aggregationRule`` is ignored); non-resource URLs are not
    authorized;
  - no admission webhooks and no admission for built-in kinds (their
    objects are stored as sent); no defaulting (a schema's ``default`` is
    not applied); CEL transition rules (``oldSelf``), ``messageExpression``,
    ``format`` and the CEL cost budget are not evaluated; metadata is not
    validated; no conversion: every served version of a CRD stores its own
    objects;
  - server-side apply is a plain merge: no field ownership, no conflicts, no
    managedFields; strategic merge patch knows list merge keys only from
    kubectl's ``$setElementOrder`` directives, otherwise lists are replaced;
  - every kind gets ``metadata.generation`` (Kubernetes sets it for some);
  - garbage collection runs within the request that deletes the owner (or
    that writes a dependent whose owners are all gone already), where a
    cluster's collector catches up a moment later;
  - Pods: no ReplicaSets (a Deployment owns its Pods), no scheduling, no
    images (only mapped programs run; others stay Pending with
    ErrImagePull), no resource limits, security contexts, users or
    read-only root filesystems; a Pod's network is the host's: each gets a
    free loopback address of its own (random in 127.0.0.0/8, as emulators
    may run side by side) and an argument ``0.0.0.0`` becomes that
    address; probes run every 0.2 s whatever their period;
    liveness probes, init containers, ``subPath``, projected and downward-API
    volumes are not run; mounting needs root (``unshare --mount``); mount
    points missing on the host are created there (empty directories such
    as /etc/bindery); volumes do not follow later changes of their
    ConfigMaps and Secrets (a rollout does); no ``kubectl logs`` (container
    output goes to ``--pods-dir``/NS/POD/CONTAINER.log);
  - Services: no cluster IPs or DNS names, a local port per Service port
    instead (``status.loadBalancer``), connections go round robin;
  - no other controllers (Namespaces are removed at once), no
    ``deletecollection``;
  - no pagination (``limit`` is ignored, everything comes in one page), no
    dry-run, no watch bookmarks but the end of a watch-list's initial
    events; the event log that watches resume from is never trimmed (no 410
    Gone); responses are never protobuf, and protobuf request bodies are
    decoded only for the kinds of fix 9, without their ``managedFields``
    (and a Namespace's ``status``);
  - no OpenAPI documents: ``/openapi/v2`` is an empty one and ``/openapi/v3``
    answers 404, so kubectl apply computes patches from its built-in types
    (strategic merge) or, for custom resources, as JSON merge patches;
  - kubectl get shows NAME and AGE for built-in kinds (no per-kind columns);
    printer columns take ``.a.b`` paths with ``[n]``, ``[*]`` and ``==``/``!=``
    filters on a string (``[?(@.a.b=="x")]``) only.
"""

import argparse
import asyncio
import base64
import datetime
import json
import logging
import re
import signal
import sys
import tempfile
import traceback
import uuid
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import parsing

import admission
import kubelet
import protobuf
import rbac

log = logging.getLogger('emulator')

# Fix 1: kmock reads the segment after ``namespaces`` as a namespace, so the
# Namespaces resource itself (``/api/v1/namespaces``, ``.../NAME`` and its
# ``status``/``finalize`` subresources) ends up with no resource at all.
_kmock_parse_path = parsing.parse_path


def _parse_path(path: str) -> parsing.ParsedPath:
    parts = path.strip('/').split('/')
    if parts[:3] == ['api', 'v1', 'namespaces'] and (
            len(parts) <= 4 or (len(parts) == 5 and parts[4] in ('status', 'finalize'))):
        return parsing.ParsedPath(
            group='', version='v1', plural='namespaces',
            name=parts[3] if len(parts) > 3 else None,
            subresource=parts[4] if len(parts) > 4 else None)
    return _kmock_parse_path(path)


parsing.parse_path = _parse_path  # kmock's request parser calls it through the module

NAMESPACES = kmock.resource('', 'v1', 'namespaces')
SECRETS = kmock.resource('', 'v1', 'secrets')
SERVICE_ACCOUNTS = kmock.resource('', 'v1', 'serviceaccounts')
CRDS = kmock.resource('apiextensions.k8s.io', 'v1', 'customresourcedefinitions')
AUDIT_PATH = '/emulator/audit'  # fix 13: not a Kubernetes path
OPENAPI_V2_PROTOBUF = 'application/com.github.proto-openapi.spec.v2.v1.0+protobuf'  # as the API server labels it
FOREGROUND = 'foregroundDeletion'  # fix 14: the finalizer of an owner whose dependents go first
VERBS = ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch']

# Fix 9: the reasons clients match on (kube-rs ErrorResponse.reason, kubectl's messages).
REASONS = {400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed', 409: 'Conflict',
           415: 'UnsupportedMediaType', 422: 'Invalid', 500: 'InternalError'}
STANDARD_REASONS = set(REASONS.values()) | {'AlreadyExists'}


def api_error(code: int, message: str, reason: str | None = None, **details: Any) -> kmock.KubernetesError:
    details = {k: v for k, v in details.items() if v is not None}  # as the API server omits them (kube-rs needs it)
    return kmock.KubernetesError(status=code, reason=reason or REASONS[code], message=message, details=details)


def qualified(res: kmock.resource) -> str:
    """``widgets.example.dev``, ``configmaps``: how Kubernetes names a resource in messages."""
    return f'{res.plural}.{res.group}' if res.group else res.plural


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def clone(value: Any) -> Any:
    """A deep copy of JSON data (dicts, lists, scalars): copy.deepcopy without
    its memo, several times faster (fix 17)."""
    if type(value) is dict:
        return {k: clone(v) for k, v in value.items()}
    if type(value) is list:
        return [clone(v) for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (kmock's merge refuses dict/scalar swaps)."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A merge patch that understands the directives kubectl's client-side apply emits.

    The merge key of a list is known from its ``$setElementOrder/<list>``
    directive (whose items hold only that key); lists without one are replaced.
    """
    if not isinstance(patch, dict):
        return clone(patch)
    if patch.get('$patch') == 'replace':
        return {k: clone(v) for k, v in patch.items() if k != '$patch'}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith('$deleteFromPrimitiveList/'):
            field = key.split('/', 1)[1]
            result[field] = [item for item in result.get(field, []) if item not in value]
        elif key.startswith('$'):
            continue  # $setElementOrder is used with its list below; $retainKeys after the loop
        elif value is None:
            result.pop(key, None)
        elif isinstance(value, list) and (order := patch.get(f'$setElementOrder/{key}')) and all(
                isinstance(item, dict) and len(item) == 1 for item in order):
            merge_key = next(iter(order[0]))
            items = {item.get(merge_key): item for item in result.get(key) or [] if isinstance(item, dict)}
            for item in value:
                if item.get('$patch') == 'delete':
                    items.pop(item.get(merge_key), None)
                else:
                    items[item.get(merge_key)] = strategic_merge_patch(items.get(item.get(merge_key)), item)
            ordered = [item[merge_key] for item in order]
            result[key] = [items[k] for k in ordered if k in items] + [v for k, v in items.items() if k not in ordered]
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    if '$retainKeys' in patch:
        result = {k: v for k, v in result.items() if k in patch['$retainKeys']}
    return result


def json_patch(target: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 JSON patch, except that ``test`` of ``null`` passes on a missing
    path as it does in Kubernetes (python's jsonpatch fails it)."""
    kept = []
    for op in ops:
        if op.get('op') == 'test' and op.get('value') is None:
            try:
                jsonpointer.resolve_pointer(target, op['path'])
            except (jsonpointer.JsonPointerException, KeyError, IndexError):
                continue  # missing counts as null: the test passes
        kept.append(op)
    try:
        return jsonpatch.apply_patch(target, kept, in_place=False)
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as e:
        raise api_error(422, f'the server rejected our request due to an error in our request: {e}')


def lookup(obj: Any, path: str) -> Any:
    for part in path.split('.'):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


def wants_table(request: kmock.Request) -> bool:
    return 'as=Table' in request.headers.get('Accept', '')


def wants_metadata(request: kmock.Request) -> bool:
    return 'as=PartialObjectMetadata' in request.headers.get('Accept', '')


def partial(obj: dict[str, Any]) -> dict[str, Any]:
    """Fix 12: an object as a metadata-only read returns it."""
    return {'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1',
            'metadata': clone(obj.get('metadata') or {})}


AGE_COLUMN = {'name': 'Age', 'type': 'date', 'jsonPath': '.metadata.creationTimestamp'}


# One step of a printer column's JSONPath: ``.field``, ``[n]``, ``[*]`` or ``[?(@.a.b=="x")]``.
JSONPATH_STEP = re.compile(r'''\.([^.\[]+)|\[(\d+|\*)\]|\[\?\(@\.([\w.]+)\s*(==|!=)\s*(["'])(.*?)\5\)\]''')


def jsonpath_first(obj: Any, path: str) -> Any:
    """The first value a printer column's JSONPath selects (the API server shows
    ``results[0][0]``), or None: ``.status.conditions[?(@.type=="Ready")].status``."""
    if not path.startswith(('.', '[')):
        path = '.' + path
    values, at = [obj], 0
    while at < len(path):
        step = JSONPATH_STEP.match(path, at)
        if step is None:
            return None  # beyond what the emulator supports: an empty cell
        at = step.end()
        field, index, key, op, _, wanted = step.groups()
        found = []
        for value in values:
            if field is not None and isinstance(value, dict) and field in value:
                found.append(value[field])
            elif index == '*' and isinstance(value, list):
                found.extend(value)
            elif index is not None and index != '*' and isinstance(value, list) and int(index) < len(value):
                found.append(value[int(index)])
            elif key is not None and isinstance(value, list):
                found.extend(item for item in value
                             if (str(lookup(item, key)) == wanted) == (op == '=='))
        values = found
    return values[0] if values else None


def cell(obj: dict[str, Any], column: dict[str, Any]) -> Any:
    value = jsonpath_first(obj, column['jsonPath'])
    return age(value) if column.get('type') == 'date' and isinstance(value, str) else value


def age(timestamp: str) -> str:
    """How kubectl shows an age: 42s, 5m, 3h, 2d (Kubernetes' HumanDuration, coarser)."""
    then = datetime.datetime.strptime(timestamp, '%Y-%m-%dT%H:%M:%SZ').replace(tzinfo=datetime.UTC)
    seconds = max(0, int((datetime.datetime.now(datetime.UTC) - then).total_seconds()))
    for unit, size, limit in (('s', 1, 120), ('m', 60, 180), ('h', 3600, 48)):
        if seconds < size * limit:
            return f'{seconds // size}{unit}'
    return f'{seconds // 86400}d'


def match_fields(obj: dict[str, Any], selector: str) -> bool:
    """Equality-only field selectors: ``a.b=x``, ``a.b==x``, ``a.b!=x``, comma-joined."""
    for term in filter(None, selector.split(',')):
        negate = '!=' in term
        path, value = term.replace('!=', '=').replace('==', '=').split('=', 1)
        actual = lookup(obj, path.strip())
        if (str(actual if actual is not None else '') == value.strip()) == negate:
            return False
    return True


def match_labels(obj: dict[str, Any], selector: str) -> bool:
    """Label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``."""
    labels = (obj.get('metadata') or {}).get('labels') or {}
    terms, depth, term = [], 0, ''
    for char in selector:  # split on the commas that are not inside (...)
        depth += {'(': 1, ')': -1}.get(char, 0)
        if char == ',' and depth == 0:
            terms.append(term)
            term = ''
        else:
            term += char
    for term in filter(None, (t.strip() for t in terms + [term])):
        words = term.split(None, 1)
        if len(words) == 2 and words[1].split('(', 1)[0].strip() in ('in', 'notin'):
            op, values = words[1].split('(', 1)
            values = {v.strip() for v in values.rstrip(')').split(',')}
            if (labels.get(words[0]) in values) != (op.strip() == 'in'):
                return False
        elif '!=' in term:
            key, value = term.split('!=', 1)
            if labels.get(key.strip()) == value.strip():
                return False
        elif '=' in term:
            key, value = term.replace('==', '=').split('=', 1)
            if labels.get(key.strip()) != value.strip():
                return False
        elif term.startswith('!'):
            if term[1:].strip() in labels:
                return False
        elif term not in labels:
            return False
    return True


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    # Fix 3: one resourceVersion counter for all objects, as in etcd.
    _revision: int = attrs.field(default=0, init=False)
    # Fix 8: every event ever emitted, as (revision, resource, event), to resume watches.
    _events: list[tuple[int, kmock.resource, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _watchers: set[asyncio.Queue] = attrs.field(factory=set, init=False)
    _custom: set[kmock.resource] = attrs.field(factory=set, init=False)  # resources that CRDs serve
    _columns: dict[kmock.resource, list[dict[str, Any]]] = attrs.field(factory=dict, init=False)  # their printer columns
    # Fix 13: bearer tokens -> (namespace, ServiceAccount); the RBAC objects by (plural, namespace, name);
    # what each user asked for, by (user, verb, group, resource, namespace) -> allowed.
    _tokens: dict[str, tuple[str, str]] = attrs.field(factory=dict, init=False)
    _rbac: dict[tuple[str, str | None, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    _audit: dict[tuple[str, str, str, str, str | None], bool] = attrs.field(factory=dict, init=False)
    _requester: rbac.User | None = attrs.field(default=None, init=False)  # who makes the write in progress
    _strict: bool = attrs.field(default=False, init=False)  # and whether it asked for strict field validation
    _schemas: dict[kmock.resource, dict[str, Any]] = attrs.field(factory=dict, init=False)  # fix 15: CRD schemas
    kubelet: Any = attrs.field(default=None, init=False)  # fix 16: told of every event
    _kinds: dict[tuple[str, str, str], kmock.resource] | None = attrs.field(default=None, init=False)  # _by_kind
    # Fix 14: owner uid -> the keys of the objects whose ownerReferences name it.
    _dependents: dict[str, set[tuple[kmock.resource, str | None, str]]] = attrs.field(factory=dict, init=False)
    _uids: dict[str, tuple[kmock.resource, str | None, str]] = attrs.field(factory=dict, init=False)  # of what exists
    # Fix 17: the keys of each resource's objects that exist, so a list reads only its own.
    _keys: dict[kmock.resource, dict[tuple[kmock.resource, str | None, str], None]] = \
        attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.resources.load_bundled()  # fix 2: built-in kinds for discovery
        # Fix 8: kmock streams watches (our _serve_watch below) as octet-stream.
        self[kmock.action.WATCH] << kmock.headers({'Content-Type': 'application/json'}) << self._serve_watch
        # Fix 10: kubectl apply validates against /openapi/v2 and refuses to go on when it is
        # missing. An empty body is a valid, empty protobuf OpenAPI document: nothing to
        # validate against, and patches fall back to kubectl's built-in types (see the gaps).
        self['get /openapi/v2'] << kmock.headers({'Content-Type': OPENAPI_V2_PROTOBUF}) << b''
        for name in ('default', 'kube-system'):  # fix 1
            self._store(NAMESPACES, None, name, None, {'metadata': {'name': name}})

    # --- entry point, errors --------------------------------------------------------------

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if raw_request.path == AUDIT_PATH and raw_request.method == 'GET':  # fix 13
            return aiohttp.web.json_response([
                {'user': user, 'verb': verb, 'group': group, 'resource': resource, 'namespace': namespace,
                 'allowed': ok} for (user, verb, group, resource, namespace), ok in sorted(
                    self._audit.items(), key=lambda e: tuple(str(x) for x in e[0]))])
        if raw_request.content_type == protobuf.MEDIA_TYPE:  # fix 9: kmock would fail to decode it as text
            try:
                raw_request = await as_json(raw_request)
            except protobuf.Unsupported as e:
                return await self._render_error(api_error(
                    415, f'this emulator decodes protobuf bodies of {protobuf.known()} only, not {e};'
                         ' send JSON or YAML (kubectl apply -f or create -f)'))
        return await super().__call__(raw_request)

    async def _render_error(self, exc: Exception) -> aiohttp.web.StreamResponse:
        # Fix 9: kmock's reasons ("Object Not Found", "ValueError") and tracebacks -> Status.
        if isinstance(exc, kmock.KubernetesError) and exc.reason in STANDARD_REASONS:
            code, reason, message, details = exc.status, exc.reason, exc.message, exc.details or {}
        elif isinstance(exc, kmock.KubernetesError) and exc.status in REASONS:  # kmock's own, e.g. unknown URLs
            code, reason, message, details = exc.status, REASONS[exc.status], 'the server could not find the requested resource', {}
        else:
            log.error('internal error: %s', ''.join(traceback.format_exception(exc)))
            code, reason, message, details = 500, 'InternalError', repr(exc), {}
        return aiohttp.web.json_response({
            'kind': 'Status', 'apiVersion': 'v1', 'metadata': {}, 'status': 'Failure',
            'message': message, 'reason': reason, 'details': details, 'code': code,
        }, status=code)

    # --- authentication and authorization (fix 13) ----------------------------------------

    def _authenticate(self, request: kmock.Request) -> rbac.User | None:
        """The user of a bearer token; None (an administrator) without one."""
        header = request.headers.get('Authorization', '')
        if not header:
            return None
        token = header.removeprefix('Bearer ').strip()
        account = self._tokens.get(token)
        if account is None or (SERVICE_ACCOUNTS, account[0], account[1]) not in self.objects \
                or self.objects[SERVICE_ACCOUNTS, account[0], account[1]].deleted:
            raise api_error(401, 'Unauthorized')  # unknown, or its ServiceAccount is gone
        return rbac.service_account_user(*account)

    def _authorize(self, user: rbac.User, request: kmock.Request) -> None:
        res = request.resource
        name = request.name
        if name is None:
            name = rbac.name_of_selector(request.params.get('fieldSelector', ''))
        verb = rbac.verb_of(request.method.value, request.name, request.action == kmock.action.WATCH)
        info = self._known(res)
        namespace = request.namespace if info is None or info.namespaced else None
        self._check(user, rbac.Attributes(verb, res.group, res.plural, request.subresource, namespace, name))

    def _check(self, user: rbac.User, a: rbac.Attributes, prefix: str = '') -> None:
        """Allow, or refuse with the API server's 403; either way, audit it."""
        ok = rbac.allowed(user, a, self._rbac)
        self._audit[user.name, a.verb, a.group, a.full_resource, a.namespace] = \
            ok or self._audit.get((user.name, a.verb, a.group, a.full_resource, a.namespace), False)
        if not ok:
            message = rbac.forbidden_message(user, a)
            if prefix:
                message = prefix + message.split(' is forbidden: ', 1)[1]
            raise api_error(403, message, name=a.name, group=a.group, kind=a.resource)

    def _admit(self, res: kmock.resource, kind: str, name: str, obj: dict[str, Any]) -> None:
        """Fix 15: a custom resource against its CRD's schema and CEL rules, pruned in place."""
        try:
            admission.admit(self._schemas[res], obj, self._strict)
        except admission.UnknownFields as e:
            fields = ', '.join(f'unknown field "{f}"' for f in e.fields)
            raise api_error(400, f'{kind} in version "{res.version}" cannot be handled as a {kind}:'
                                 f' strict decoding error: {fields}')
        except admission.Invalid as e:
            messages = [m for _, m in e.causes]
            said = messages[0] if len(messages) == 1 else '[' + ', '.join(messages) + ']'
            raise api_error(422, f'{kind}.{res.group} "{name}" is invalid: {said}', name=name, group=res.group,
                            kind=kind, causes=[{'reason': 'FieldValueInvalid', 'message': m.removeprefix(f + ': '),
                                                'field': f} for f, m in e.causes])

    def _check_owner_references(self, user: rbac.User, res: kmock.resource, namespace: str | None,
                                name: str, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        """The OwnerReferencesPermissionEnforcement admission plugin: who sets
        blockOwnerDeletion on a reference must be allowed to update the owner's finalizers."""
        before = {(r.get('uid'), r.get('blockOwnerDeletion')) for r in lookup(old, 'metadata.ownerReferences') or []}
        for ref in lookup(new, 'metadata.ownerReferences') or []:
            if not ref.get('blockOwnerDeletion') or (ref.get('uid'), True) in before:
                continue
            group, _, version = (ref.get('apiVersion') or '').rpartition('/')
            owner = self._by_kind().get((group, version, ref.get('kind')))
            if owner is None:
                continue
            prefix = (f'{qualified(res)} "{name}" is forbidden: cannot set blockOwnerDeletion if an ownerReference'
                      " refers to a resource you can't set finalizers on: ")
            self._check(user, rbac.Attributes('update', group, owner.plural, 'finalizers', namespace, ref.get('name')),
                        prefix)

    def _by_kind(self) -> dict[tuple[str, str, str], kmock.resource]:
        """Each registered resource by (group, version, kind), rebuilt after a
        CRD changes the registry (fix 17: kmock's registry is slow to scan)."""
        if self._kinds is None:
            self._kinds = {(r.group, r.version, i.kind): r for r, i in self.resources._resources.items()}
        return self._kinds

    def _token_request(self, namespace: str | None, name: str | None) -> dict[str, Any]:
        """A ServiceAccount's token (TokenRequest), valid while the ServiceAccount exists."""
        if self._get(SERVICE_ACCOUNTS, namespace, name) is None:
            raise self._not_found(SERVICE_ACCOUNTS, name)
        token = uuid.uuid4().hex
        self._tokens[token] = (namespace, name)
        return {'kind': 'TokenRequest', 'apiVersion': 'authentication.k8s.io/v1',
                'metadata': {'name': name, 'namespace': namespace, 'creationTimestamp': None},
                'spec': {'audiences': [], 'expirationSeconds': 3600},
                'status': {'token': token, 'expirationTimestamp': now()}}

    # --- discovery ------------------------------------------------------------------------

    def _get_resources(self) -> list[kmock.resource]:
        # Fix 2: discovery lists what is registered (kmock also adds whatever has objects).
        return list(self.resources)

    async def _serve_version(self, request: kmock.Request) -> Any:
        payload = await super()._serve_version(request)
        if request.resource is not None and request.resource.group == '':
            payload['groupVersion'] = request.resource.version  # fix 2: not "/v1"
        for entry in payload['resources']:
            if '/' in entry['name']:  # fix 2: a subresource is no target for kubectl's short names
                entry.update(shortNames=[], categories=[], verbs=['get', 'patch', 'update'])
        return payload

    async def _serve_server_version(self, request: kmock.Request) -> Any:
        # Fix 2: kmock says v1.26 (k3s); match kubectl and k8s-openapi to avoid skew warnings.
        return {'major': '1', 'minor': '37', 'gitVersion': 'v1.37.0', 'gitCommit': 'emulator',
                'gitTreeState': 'clean', 'buildDate': '2026-01-01T00:00:00Z', 'goVersion': 'go1.25',
                'compiler': 'gc', 'platform': 'linux/amd64'}

    def _known(self, res: kmock.resource | None) -> Any:
        """The registered resource's info, or None. Fix 17: kmock's own lookup
        (``res in self.resources``) checks the key against a typing Protocol
        first, which costs more than the rest of a request in Python 3.11."""
        return self.resources._resources.get(res)

    def _info(self, request: kmock.Request) -> tuple[kmock.resource, Any]:
        res = request.resource
        info = self._known(res) if res is not None and res.plural else None
        if info is None:
            raise api_error(404, 'the server could not find the requested resource')
        return res, info

    def _register_crd(self, crd: dict[str, Any]) -> None:
        self._kinds = None
        spec = crd.get('spec') or {}
        names = spec.get('names') or {}
        for version in spec.get('versions') or []:
            res = kmock.resource(spec.get('group'), version.get('name'), names.get('plural'))
            if not version.get('served', True):
                self._unregister(res)
                continue
            self.resources[res] = kmock.ResourceInfo(
                kind=names.get('kind'),
                singular=names.get('singular') or (names.get('kind') or '').lower(),
                namespaced=spec.get('scope') == 'Namespaced',
                verbs=VERBS + ['deletecollection'],
                shortnames=names.get('shortNames') or [],
                categories=names.get('categories') or [],
                subresources=list((version.get('subresources') or {}).keys()),
            )
            self._custom.add(res)
            self._columns[res] = version.get('additionalPrinterColumns') or []
            schema = (version.get('schema') or {}).get('openAPIV3Schema')
            if schema:
                self._schemas[res] = schema

    def _unregister(self, res: kmock.resource) -> None:
        self._kinds = None
        if res in self._custom:
            del self.resources[res]
            self._custom.discard(res)
            self._columns.pop(res, None)
            self._schemas.pop(res, None)
            for key in [k for k in self.objects if k[0] == res and not self.objects[k].deleted]:
                self._remove(*key)

    # --- reads ----------------------------------------------------------------------------

    # Fix 17: a stored object is never changed in place (every write stores a new
    # dict), so reads, lists and watch events share it; _get hands out a copy to
    # callers that edit what they read, _peek the object itself to those that don't.

    def _peek(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        key = (res, namespace, name)
        if key not in self.objects or (obj := self.objects[key]).deleted:
            return None
        return obj.raw

    def _get(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self._peek(res, namespace, name)
        return None if obj is None else clone(obj)

    def _namespace_of(self, request: kmock.Request, info: Any) -> str | None:
        return request.namespace if info.namespaced else None

    def _selected(self, request: kmock.Request, res: kmock.resource, info: Any, obj: dict[str, Any]) -> bool:
        meta = obj.get('metadata') or {}
        namespace = self._namespace_of(request, info)
        return ((namespace is None or meta.get('namespace') == namespace)
                and (request.name is None or meta.get('name') == request.name)
                and match_labels(obj, request.params.get('labelSelector', ''))
                and match_fields(obj, request.params.get('fieldSelector', '')))

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        res, info = self._info(request)
        obj = self._peek(res, self._namespace_of(request, info), request.name)
        if obj is None:
            raise self._not_found(res, request.name)
        if wants_table(request):
            return self._table(res, [obj])
        return partial(obj) if wants_metadata(request) else obj

    async def _serve_list(self, request: kmock.Request) -> Any:
        # Fix 7: a proper List with its kind and the revision to watch from.
        res, info = self._info(request)
        items = [raw for key in self._keys.get(res, {})
                 if self._selected(request, res, info, raw := self.objects[key].raw)]
        if wants_table(request):
            return self._table(res, items)
        if wants_metadata(request):  # fix 12
            return {
                'kind': 'PartialObjectMetadataList', 'apiVersion': 'meta.k8s.io/v1',
                'metadata': {'resourceVersion': str(self._revision)},
                'items': [partial(obj) for obj in items],
            }
        return {
            'kind': f'{info.kind}List',
            'apiVersion': f'{res.group}/{res.version}' if res.group else res.version,
            'metadata': {'resourceVersion': str(self._revision)},
            'items': items,
        }

    async def _serve_watch(self, request: kmock.Request) -> Any:
        # Fix 8: resume after the given resourceVersion from the log, or start with the current
        # objects; then follow live events. Both are taken in one step (no await in between),
        # so nothing is missed or sent twice.
        res, info = self._info(request)
        since = request.params.get('resourceVersion', '')
        initial = request.params.get('sendInitialEvents') == 'true'  # a watch-list (client-go's reflectors)
        if since in ('', '0') or initial:
            backlog = [{'type': 'ADDED', 'object': self.objects[key].raw}
                       for key in self._keys.get(res, {})]
        else:
            backlog = [event for revision, r, event in self._events if r == res and revision > int(since)]
        if initial and request.params.get('allowWatchBookmarks') == 'true':
            # What the initial events are consistent with, marked as their end.
            backlog.append({'type': 'BOOKMARK', 'object': {
                'kind': 'PartialObjectMetadata' if wants_metadata(request) else info.kind,
                'apiVersion': 'meta.k8s.io/v1' if wants_metadata(request) else
                (f'{res.group}/{res.version}' if res.group else res.version),
                'metadata': {'resourceVersion': str(self._revision),
                             'annotations': {'k8s.io/initial-events-end': 'true'}}}})
        queue: asyncio.Queue = asyncio.Queue()
        self._watchers.add(queue)
        timeout = float(request.params.get('timeoutSeconds') or 0) or None
        table = wants_table(request)
        metadata = wants_metadata(request)  # fix 12

        def render(event: dict[str, Any]) -> dict[str, Any]:
            if table:
                return self._table_event(res, event)
            if metadata:
                return {'type': event['type'], 'object': partial(event['object'])}
            return event

        yield b''  # kmock sends the headers on the first chunk; a watch may see nothing for a while
        try:
            async with asyncio.timeout(timeout):
                for event in backlog:
                    if event['type'] == 'BOOKMARK':
                        yield event
                    elif self._selected(request, res, info, event['object']):
                        yield render(event)
                while (item := await queue.get()) is not None:
                    r, event = item
                    if r == res and self._selected(request, res, info, event['object']):
                        yield render(event)
        except TimeoutError:
            pass  # timeoutSeconds: the client watches again from its last resourceVersion
        finally:
            self._watchers.discard(queue)

    def _table(self, res: kmock.resource, objs: list[dict[str, Any]]) -> dict[str, Any]:
        """Fix 11: server-side printing for kubectl get: the name, then a CRD's printer
        columns (see jsonpath_first) or else the age."""
        columns = self._columns.get(res) or [AGE_COLUMN]
        return {
            'kind': 'Table', 'apiVersion': 'meta.k8s.io/v1',
            'metadata': {'resourceVersion': str(self._revision)},
            'columnDefinitions': [
                {'name': 'Name', 'type': 'string', 'format': 'name', 'description': 'Name', 'priority': 0},
                *({'name': c['name'], 'type': c.get('type', 'string'), 'format': c.get('format', ''),
                   'description': c.get('description', ''), 'priority': c.get('priority', 0)} for c in columns),
            ],
            'rows': [{
                'cells': [obj['metadata']['name'], *(cell(obj, c) for c in columns)],
                'object': {'kind': 'PartialObjectMetadata', 'apiVersion': 'meta.k8s.io/v1',
                           'metadata': obj['metadata']},
            } for obj in objs],
        }

    def _table_event(self, res: kmock.resource, event: dict[str, Any]) -> dict[str, Any]:
        return {'type': event['type'], 'object': self._table(res, [event['object']])}

    def close_watches(self) -> None:
        """End every open watch (at shutdown)."""
        for queue in self._watchers:
            queue.put_nowait(None)

    # --- writes -----------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            return await self._handle_request(request)
        finally:
            self._forget(request)

    async def _read(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """A get, list or watch, answered from the store directly."""
        if request.action != kmock.action.WATCH:
            serve = self._serve_list if request.name is None else self._serve_fetch
            return aiohttp.web.json_response(await serve(request))
        response = aiohttp.web.StreamResponse(status=200, headers={'Content-Type': 'application/json'})
        await response.prepare(request._raw_request)
        async for item in self._serve_watch(request):
            if not isinstance(item, bytes):
                await response.write(json.dumps(item).encode() + b'\n')
        await response.write_eof()
        return response

    def _forget(self, request: kmock.Request) -> None:
        """Fix 17: kmock keeps every request it served, and routes each new one by
        scanning them all (quadratic: minutes for an operator's run over 200
        tenants). A request is forgotten once served."""
        roots, root = [], self
        while root is not None and hasattr(root, '_requests'):
            roots.append(root)
            root = getattr(root, 'fallback', None)
        for kept in [r._requests for r in roots] + [p._requests for r in roots for p in r._payloads]:
            for i, r in enumerate(kept):
                if r is request:
                    del kept[i]
                    break

    async def _handle_request(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        # Fix 4: kmock's write interceptor (merge-only, MODIFIED on every patch, no PUT)
        # is replaced; reads and discovery go through kmock's routing to the _serve_* above.
        user = self._authenticate(request)
        if user is not None and request.resource is not None and request.resource.plural:
            self._authorize(user, request)
        if request.method == kmock.method.GET and request.resource is not None and request.resource.plural \
                and request.action in (kmock.action.FETCH, kmock.action.LIST, kmock.action.WATCH):
            return await self._read(request)  # fix 17: straight to the store, not through kmock's routing
        if request.resource is None or request.method == kmock.method.GET:
            return await super()._handle(request)
        res, info = self._info(request)
        namespace = self._namespace_of(request, info)
        body = self._body(request)
        # _store checks what it may set on this user's behalf; no await until they are reset.
        self._requester, self._strict = user, request.params.get('fieldValidation') == 'Strict'
        try:
            return self._write(request, res, info, namespace, body)
        finally:
            self._requester, self._strict = None, False

    def _write(self, request: kmock.Request, res: kmock.resource, info: Any,
               namespace: str | None, body: Any) -> aiohttp.web.StreamResponse:
        if request.method == kmock.method.POST and request.subresource == 'token' and res == SERVICE_ACCOUNTS:
            return self._respond(201, self._token_request(namespace, request.name))
        if request.method == kmock.method.POST and request.name is None:
            return self._respond(201, self._create(res, info, namespace, body))
        if request.name is not None and request.subresource in (None, 'status'):
            if request.method == kmock.method.PUT:
                return self._respond(200, self._replace(res, namespace, request, body))
            if request.method == kmock.method.PATCH:
                return self._patch(res, info, namespace, request, body)
            if request.method == kmock.method.DELETE and request.subresource is None:
                return self._respond(200, self._delete(res, namespace, request.name, propagation(request, body)))
        raise api_error(405, f'{request.method.value} is not supported on {request.url.path}')

    @staticmethod
    def _respond(code: int, obj: dict[str, Any]) -> aiohttp.web.StreamResponse:
        return aiohttp.web.json_response(obj, status=code)

    @staticmethod
    def _body(request: kmock.Request) -> Any:
        if request.data is not None:
            return request.data
        try:  # server-side apply may send YAML; kmock only parses JSON
            return yaml.safe_load(request.text) if request.text else None
        except yaml.YAMLError as e:
            raise api_error(400, f'the request body is neither JSON nor YAML: {e}')

    def _not_found(self, res: kmock.resource, name: str | None) -> kmock.KubernetesError:
        return api_error(404, f'{qualified(res)} "{name}" not found', name=name, group=res.group, kind=res.plural)

    def _create(self, res: kmock.resource, info: Any, namespace: str | None, body: Any) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise api_error(400, 'the request body must be an object')
        meta = body.setdefault('metadata', {})
        if not meta.get('name') and meta.get('generateName'):
            meta['name'] = meta['generateName'] + uuid.uuid4().hex[:5]
        name = meta.get('name')
        if not name:
            raise api_error(422, 'metadata.name: Required value: name or generateName is required')
        namespace = namespace or (meta.get('namespace') or 'default' if info.namespaced else None)
        if namespace is not None and self._peek(NAMESPACES, None, namespace) is None:
            raise api_error(404, f'namespaces "{namespace}" not found', name=namespace, group='', kind='namespaces')
        if self._peek(res, namespace, name) is not None:
            raise api_error(409, f'{qualified(res)} "{name}" already exists', reason='AlreadyExists',
                            name=name, group=res.group, kind=res.plural)
        return self._store(res, namespace, name, None, body)

    def _replace(self, res: kmock.resource, namespace: str | None,
                 request: kmock.Request, body: Any) -> dict[str, Any]:
        old = self._peek(res, namespace, request.name)
        if old is None:
            raise self._not_found(res, request.name)
        if not isinstance(body, dict):
            raise api_error(400, 'the request body must be an object')
        return self._store(res, namespace, request.name, old, body, request.subresource)

    def _patch(self, res: kmock.resource, info: Any, namespace: str | None,
               request: kmock.Request, body: Any) -> aiohttp.web.StreamResponse:
        content_type = request.headers.get('Content-Type', '').split(';')[0].strip()
        old = self._peek(res, namespace, request.name)  # patches build new dicts
        if not isinstance(body, list if content_type == 'application/json-patch+json' else dict):
            raise api_error(400, f'the request body is not valid {content_type}')
        if content_type == 'application/apply-patch+yaml':
            if not request.params.get('fieldManager'):
                raise api_error(400, 'fieldManager: Required value: is required for apply patch')
            if old is None:  # fix 4: server-side apply creates what is missing
                if request.subresource is not None:
                    raise self._not_found(res, request.name)
                if self._requester is not None:  # fix 13: as the API server does, it takes create too
                    self._check(self._requester, rbac.Attributes(
                        'create', res.group, res.plural, None, namespace, request.name))
                body.setdefault('metadata', {})['name'] = request.name
                return self._respond(201, self._create(res, info, namespace, body))
            new = merge_patch(old, body)  # a plain merge: no field ownership
        elif old is None:
            raise self._not_found(res, request.name)
        elif content_type == 'application/json-patch+json':
            new = json_patch(old, body)
        elif content_type == 'application/merge-patch+json':
            new = merge_patch(old, body)
        elif content_type == 'application/strategic-merge-patch+json' and res not in self._custom:
            new = strategic_merge_patch(old, body)
        else:
            raise api_error(415, f'the body of the request was in an unknown format: {content_type} -'
                                 ' accepted media types include: application/json-patch+json,'
                                 ' application/merge-patch+json, application/apply-patch+yaml')
        return self._respond(200, self._store(res, namespace, request.name, old, new, request.subresource))

    def _store(self, res: kmock.resource, namespace: str | None, name: str,
               old: dict[str, Any] | None, new: dict[str, Any], subresource: str | None = None) -> dict[str, Any]:
        """Write an object the way the API server does (fixes 3, 5, 6); return what is stored."""
        info = self._known(res)
        has_status = 'status' in info.subresources
        new = clone(new)
        meta = new.setdefault('metadata', {})
        if old is None:
            if has_status:
                new.pop('status', None)  # set through /status only
            meta.update(name=name, uid=str(uuid.uuid4()), creationTimestamp=now(), generation=1)
            meta.pop('resourceVersion', None)
            meta.pop('deletionTimestamp', None)
            if namespace is not None:
                meta['namespace'] = namespace
        else:
            old_meta = old['metadata']
            stale = meta.get('resourceVersion')
            if stale and stale != old_meta['resourceVersion']:
                raise api_error(409, f'Operation cannot be fulfilled on {qualified(res)} "{name}": the object has been'
                                     ' modified; please apply your changes to the latest version and try again',
                                name=name, group=res.group, kind=res.plural)
            if subresource == 'status':  # fix 5: only .status changes through /status
                status = new.get('status')
                new = clone(old)
                new.pop('status', None)
                if status is not None:
                    new['status'] = status
            elif has_status:  # fix 5: and .status does not change through the main resource
                new.pop('status', None)
                if 'status' in old:
                    new['status'] = clone(old['status'])
            meta = new.setdefault('metadata', {})
            for field in ('name', 'namespace', 'uid', 'creationTimestamp', 'generation',
                          'resourceVersion', 'deletionTimestamp'):
                meta.pop(field, None)
                if field in old_meta:
                    meta[field] = old_meta[field]
        new['apiVersion'] = f'{res.group}/{res.version}' if res.group else res.version
        new['kind'] = info.kind
        if res in self._schemas:  # fix 15
            self._admit(res, info.kind, name, new)
        if res == NAMESPACES:
            new.setdefault('status', {})['phase'] = 'Active'
        if res == SECRETS and 'stringData' in new:  # write-only: folded into .data, base64-encoded
            new['data'] = dict(new.get('data') or {}, **{
                k: base64.b64encode(v.encode()).decode() for k, v in (new.pop('stringData') or {}).items()})
        if res == CRDS:
            self._register_crd(new)
            new['status'] = crd_status(new, old)  # the CRD controller's part: names accepted, Established
        if self._requester is not None:
            self._check_owner_references(self._requester, res, namespace, name, old, new)

        if old is not None:
            if new == old:  # fix 3: nothing changed, nothing to tell anyone
                return old
            if {k: v for k, v in new.items() if k not in ('metadata', 'status')} != \
                    {k: v for k, v in old.items() if k not in ('metadata', 'status')}:
                meta['generation'] = old['metadata'].get('generation', 1) + 1
        self._revision += 1
        meta['resourceVersion'] = str(self._revision)
        key = (res, namespace, name)
        if res.group == rbac.RBAC_GROUP and res.plural in rbac.RBAC_KINDS:  # fix 13
            self._rbac[res.plural, namespace, name] = new
        for uid in owner_uids(old) - owner_uids(new):  # fix 14
            self._dependents.get(uid, set()).discard(key)
        for uid in owner_uids(new):
            self._dependents.setdefault(uid, set()).add(key)
        self._uids[meta['uid']] = key
        self._keys.setdefault(res, {})[key] = None
        if meta.get('deletionTimestamp') and not meta.get('finalizers'):  # fix 6: the last finalizer went
            self._drop(key, new)
        elif old is None:
            if key in self.objects:
                self.objects[key].history.append(new)
            else:
                self.objects[key] = new
            self._emit(res, 'ADDED', new)
        else:
            self.objects[key].history.append(new)
            self._emit(res, 'MODIFIED', new)
        uids = owner_uids(new)
        if uids and uids != owner_uids(old) and not any(u in self._uids for u in uids):
            self._collect_orphan(key)  # fix 14: every owner it names is gone already
        return new

    def _delete(self, res: kmock.resource, namespace: str | None, name: str,
                policy: str = 'Background') -> dict[str, Any]:
        old = self._get(res, namespace, name)
        if old is None:
            raise self._not_found(res, name)
        meta = old['metadata']
        uid = meta.get('uid')
        if policy == 'Orphan':  # fix 14: the dependents stay, without their reference to it
            for key in list(self._dependents.get(uid, ())):
                self._drop_owner(key, uid)
        elif policy == 'Foreground' and self._dependents.get(uid):
            # Fix 14: it stays (deletionTimestamp, the foregroundDeletion finalizer) until
            # its dependents that block it are gone; they are deleted now.
            if FOREGROUND not in (meta.get('finalizers') or []):
                meta['finalizers'] = (meta.get('finalizers') or []) + [FOREGROUND]
                marked = self._mark(res, namespace, name, old)
            else:
                marked = old
            for key in list(self._dependents.get(uid, ())):
                if (dependent := self._get(*key)) is not None and not lookup(dependent, 'metadata.deletionTimestamp'):
                    self._delete(*key, policy='Foreground')
            self._release_foreground(uid)
            return self._get(res, namespace, name) or marked
        if meta.get('finalizers'):  # fix 6: mark; it goes when its finalizers are removed
            if meta.get('deletionTimestamp'):
                return old
            return self._mark(res, namespace, name, old)
        return self._remove(res, namespace, name)

    def _mark(self, res: kmock.resource, namespace: str | None, name: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Store ``obj`` as being deleted (a deletionTimestamp), waiting for its finalizers."""
        marked = clone(obj)
        marked['metadata'].setdefault('deletionTimestamp', now())
        marked['metadata'].setdefault('deletionGracePeriodSeconds', 0)
        self._revision += 1
        marked['metadata']['resourceVersion'] = str(self._revision)
        self.objects[res, namespace, name].history.append(marked)
        self._emit(res, 'MODIFIED', marked)
        return marked

    # --- garbage collection (fix 14) --------------------------------------------------------

    def _collect(self, gone: dict[str, Any]) -> None:
        """What the garbage collector does once an object is gone: its dependents
        lose their reference to it, and those left with no owner are deleted
        (background); an owner waiting in foreground deletion for it may go."""
        requester, self._requester = self._requester, None  # the collector acts, not the requester
        try:
            uid = lookup(gone, 'metadata.uid')
            for key in list(self._dependents.pop(uid, ())):
                dependent = self._get(*key)
                if dependent is None:
                    continue
                others = [r for r in lookup(dependent, 'metadata.ownerReferences') or []
                          if r.get('uid') != uid and self._owner_exists(r, key[1])]
                if others:
                    self._drop_owner(key, uid)
                elif not lookup(dependent, 'metadata.deletionTimestamp'):
                    self._delete(*key)
            for ref in lookup(gone, 'metadata.ownerReferences') or []:
                self._release_foreground(ref.get('uid'))
        finally:
            self._requester = requester

    def _collect_orphan(self, key: tuple[kmock.resource, str | None, str]) -> None:
        requester, self._requester = self._requester, None
        try:
            if self._get(*key) is not None:
                self._delete(*key)
        finally:
            self._requester = requester

    def _owner_exists(self, ref: dict[str, Any], namespace: str | None) -> bool:
        return ref.get('uid') in self._uids

    def _drop_owner(self, key: tuple[kmock.resource, str | None, str], uid: str) -> None:
        """Remove the reference to owner ``uid`` from the object at ``key``."""
        obj = self._get(*key)
        if obj is None:
            return
        refs = [r for r in lookup(obj, 'metadata.ownerReferences') or [] if r.get('uid') != uid]
        new = clone(obj)
        if refs:
            new['metadata']['ownerReferences'] = refs
        else:
            new['metadata'].pop('ownerReferences', None)
        self._store(*key, obj, new)

    def _release_foreground(self, uid: str | None) -> None:
        """An owner in foreground deletion goes once no dependent blocks it."""
        key = self._uids.get(uid)
        if key is not None:
            owner = self._get(*key)
            finalizers = lookup(owner, 'metadata.finalizers') or []
            if FOREGROUND not in finalizers:
                return
            blocking = [k for k in self._dependents.get(uid, ()) if (d := self._get(*k)) is not None and any(
                r.get('uid') == uid and r.get('blockOwnerDeletion') for r in lookup(d, 'metadata.ownerReferences') or [])]
            if not blocking:
                owner['metadata']['finalizers'] = [f for f in finalizers if f != FOREGROUND]
                self._store(*key, self._get(*key), owner)

    def _remove(self, res: kmock.resource, namespace: str | None, name: str) -> dict[str, Any]:
        """Delete at once, finalizers notwithstanding; with what a Namespace or a CRD holds."""
        gone = self._get(res, namespace, name)
        self._revision += 1
        gone['metadata']['resourceVersion'] = str(self._revision)
        self._drop((res, namespace, name), gone)
        if res == NAMESPACES:
            for key in [k for k in self.objects if k[1] == name and not self.objects[k].deleted]:
                self._remove(*key)
        if res == CRDS:
            spec = gone.get('spec') or {}
            for version in spec.get('versions') or []:
                self._unregister(kmock.resource(spec.get('group'), version.get('name'),
                                                (spec.get('names') or {}).get('plural')))
        return gone

    def _drop(self, key: tuple[kmock.resource, str | None, str], last: dict[str, Any]) -> None:
        self.objects[key].delete()  # kmock's soft deletion keeps the history
        self._rbac.pop((key[0].plural, key[1], key[2]), None)
        for uid in owner_uids(last):
            self._dependents.get(uid, set()).discard(key)
        self._uids.pop(lookup(last, 'metadata.uid'), None)
        self._keys.get(key[0], {}).pop(key, None)
        self._emit(key[0], 'DELETED', last)
        self._collect(last)

    def _emit(self, res: kmock.resource, kind: str, obj: dict[str, Any]) -> None:
        event = {'type': kind, 'object': obj}
        self._events.append((self._revision, res, event))
        for queue in self._watchers:
            queue.put_nowait((res, event))
        if self.kubelet is not None:
            self.kubelet.notice(res, event)


async def as_json(raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.BaseRequest:
    """Fix 9: the request with its protobuf body decoded, as JSON."""
    headers = raw_request.headers.copy()
    headers['Content-Type'] = 'application/json'
    clone = raw_request.clone(headers=headers)  # before the body is read: they share its stream
    obj = protobuf.decode(await raw_request.read())
    clone._read_bytes = json.dumps(obj).encode()  # what its read(), text() and json() return
    return clone


def owner_uids(obj: dict[str, Any] | None) -> set[str]:
    return {r.get('uid') for r in lookup(obj, 'metadata.ownerReferences') or [] if r.get('uid')}


def propagation(request: kmock.Request, body: Any) -> str:
    """Fix 14: a delete's propagationPolicy (query or DeleteOptions body); Background by default."""
    options = body if isinstance(body, dict) else {}
    policy = request.params.get('propagationPolicy') or options.get('propagationPolicy')
    if not policy and options.get('orphanDependents') is True:
        policy = 'Orphan'
    return policy or 'Background'


def crd_status(crd: dict[str, Any], old: dict[str, Any] | None) -> dict[str, Any]:
    spec = crd.get('spec') or {}
    at = (lookup(old, 'status.conditions') or [{}])[0].get('lastTransitionTime') or now()  # stable: no-op writes stay no-ops
    return {
        'acceptedNames': spec.get('names') or {},
        'storedVersions': [v.get('name') for v in spec.get('versions') or [] if v.get('storage')],
        'conditions': [
            {'type': 'NamesAccepted', 'status': 'True', 'reason': 'NoConflicts',
             'message': 'no conflicts found', 'lastTransitionTime': at},
            {'type': 'Established', 'status': 'True', 'reason': 'InitialNamesAccepted',
             'message': 'the initial names have been accepted', 'lastTransitionTime': at},
        ],
    }


async def serve(port: int, images: dict[str, str], pods_dir: Path) -> None:
    async with Emulator() as emulator, kmock.Server(emulator, host='127.0.0.1', port=port) as server:
        emulator.kubelet = kubelet.Kubelet(emulator, images, pods_dir)  # fix 16
        emulator.kubelet.start()
        print(f'listening on http://127.0.0.1:{server.port}', flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        await stop.wait()
        log.info('stopping')
        await emulator.kubelet.stop()
        emulator.close_watches()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n', 1)[0])
    parser.add_argument('--port', type=int, default=0, help='0 (the default) picks a free port')
    parser.add_argument('--image', action='append', default=[], metavar='NAME=PATH',
                        help='run containers of image NAME (with or without its tag) as the program PATH')
    parser.add_argument('--pods-dir', type=Path, help="where Pods' volumes and logs go (default: a temporary directory)")
    args = parser.parse_args()
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format='%(asctime)s %(name)s %(message)s')
    images = dict(i.split('=', 1) for i in args.image)
    with tempfile.TemporaryDirectory(prefix='emulator-pods-') as scratch:
        asyncio.run(serve(args.port, images, args.pods_dir or Path(scratch)))


if __name__ == '__main__':
    main()
