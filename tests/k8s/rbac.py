"""RBAC for the emulator: who sent a request (its bearer token) and whether
the stored Roles, ClusterRoles, RoleBindings and ClusterRoleBindings allow
it, decided as Kubernetes' RBAC authorizer decides, with its 403 message.

Pure logic: the emulator (emulator.py) keeps the objects and the tokens and
calls these functions.
"""

from dataclasses import dataclass
from typing import Any, Iterable

RBAC_GROUP = 'rbac.authorization.k8s.io'
RBAC_KINDS = {'roles': 'Role', 'clusterroles': 'ClusterRole',
              'rolebindings': 'RoleBinding', 'clusterrolebindings': 'ClusterRoleBinding'}


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...]


def service_account_user(namespace: str, name: str) -> User:
    """The user a ServiceAccount's token authenticates as, with its groups."""
    return User(f'system:serviceaccount:{namespace}:{name}',
                ('system:serviceaccounts', f'system:serviceaccounts:{namespace}', 'system:authenticated'))


@dataclass(frozen=True)
class Attributes:
    """What a resource request asks for, as the authorizer sees it."""
    verb: str
    group: str
    resource: str  # the plural, without the subresource
    subresource: str | None
    namespace: str | None
    name: str | None

    @property
    def full_resource(self) -> str:
        return f'{self.resource}/{self.subresource}' if self.subresource else self.resource


def verb_of(method: str, name: str | None, watch: bool) -> str:
    """The RBAC verb of an HTTP method on a resource path."""
    if method == 'GET':
        return 'watch' if watch else ('get' if name else 'list')
    return {'POST': 'create', 'PUT': 'update', 'PATCH': 'patch',
            'DELETE': 'delete' if name else 'deletecollection'}.get(method, method.lower())


def name_of_selector(field_selector: str) -> str | None:
    """A list or watch by ``metadata.name=X`` is authorized for the name X."""
    for term in filter(None, field_selector.split(',')):
        key, _, value = term.replace('==', '=').partition('=')
        if key.strip() == 'metadata.name' and '!' not in key:
            return value.strip()
    return None


def _covers(values: Iterable[str], wanted: str) -> bool:
    values = list(values or [])
    return '*' in values or wanted in values


def rule_allows(rule: dict[str, Any], a: Attributes) -> bool:
    """One PolicyRule against the request (resource rules only)."""
    if not _covers(rule.get('verbs'), a.verb) or not _covers(rule.get('apiGroups'), a.group):
        return False
    resources = rule.get('resources') or []
    if a.subresource:
        matched = (a.full_resource in resources or '*' in resources
                   or f'{a.resource}/*' in resources or f'*/{a.subresource}' in resources)
    else:
        matched = a.resource in resources or '*' in resources
    if not matched:
        return False
    names = rule.get('resourceNames') or []
    return not names or (a.name is not None and a.name in names)


def binds(binding: dict[str, Any], user: User) -> bool:
    """Whether a RoleBinding or ClusterRoleBinding names the user (or one of its groups)."""
    for subject in binding.get('subjects') or []:
        kind, name = subject.get('kind'), subject.get('name')
        if kind == 'ServiceAccount' and user.name == f'system:serviceaccount:{subject.get("namespace")}:{name}':
            return True
        if kind == 'User' and name == user.name:
            return True
        if kind == 'Group' and name in user.groups:
            return True
    return False


def allowed(user: User, a: Attributes, objects: dict[tuple[str, str | None, str], dict[str, Any]]) -> bool:
    """Whether any binding of the user grants the request. ``objects`` holds the
    RBAC objects by (plural, namespace, name)."""
    def rules_of(ref: dict[str, Any], namespace: str | None) -> list[dict[str, Any]]:
        if ref.get('kind') == 'ClusterRole':
            role = objects.get(('clusterroles', None, ref.get('name')))
        else:
            role = objects.get(('roles', namespace, ref.get('name')))
        return (role or {}).get('rules') or []

    for (plural, namespace, _), binding in objects.items():
        if plural == 'clusterrolebindings':
            scope_ok = True
        elif plural == 'rolebindings':
            scope_ok = a.namespace == namespace
        else:
            continue
        if scope_ok and binds(binding, user) and any(
                rule_allows(r, a) for r in rules_of(binding.get('roleRef') or {}, namespace)):
            return True
    return False


def forbidden_message(user: User, a: Attributes) -> str:
    """The API server's words (apiserver's forbiddenMessage and NewForbidden)."""
    qualified = f'{a.resource}.{a.group}' if a.group else a.resource
    subject = f'{qualified} "{a.name}"' if a.name else qualified
    where = f'in the namespace "{a.namespace}"' if a.namespace else 'at the cluster scope'
    return (f'{subject} is forbidden: User "{user.name}" cannot {a.verb} resource "{a.full_resource}"'
            f' in API group "{a.group}" {where}')
