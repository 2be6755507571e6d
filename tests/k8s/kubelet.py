"""The emulator's kubelet and controllers: each Deployment's pod template
becomes Pods whose containers run as local processes, and each Service a
local TCP address that reaches its ready Pods.

A container's image is mapped to a local program (``--image NAME=PATH``);
its volumes (ConfigMap, Secret, emptyDir, PersistentVolumeClaim) are
directories bind-mounted at their mount paths in a private mount namespace
of the process (``unshare --mount``); its environment is built from literal
values (with ``$(VAR)`` of an earlier variable), ``secretKeyRef``,
``configMapKeyRef`` and ``fieldRef``. Each Pod gets a free loopback
address of its own (127.x.y.z, random): an argument ``0.0.0.0`` (listen on
all addresses) becomes that address. Its processes die with the emulator,
however it ends. Readiness probes
(``httpGet``) are polled; Pod and Deployment status follow. A new pod
template (a rollout) starts new Pods and stops the old ones once the new
are ready (``Recreate``: stops them first).
"""

import asyncio
import base64
import ctypes
import datetime
import hashlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import socket
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import kmock

log = logging.getLogger('kubelet')

PODS = kmock.resource('', 'v1', 'pods')
DEPLOYMENTS = kmock.resource('apps', 'v1', 'deployments')
SERVICES = kmock.resource('', 'v1', 'services')
SECRETS = kmock.resource('', 'v1', 'secrets')
CONFIG_MAPS = kmock.resource('', 'v1', 'configmaps')
PROBE_EVERY = 0.2  # seconds; a probe's periodSeconds is not waited for
RESTART_AFTER = 0.5  # seconds before a container that exited runs again
PR_SET_PDEATHSIG = 1  # prctl(2)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%dT%H:%M:%SZ')


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def port_free(ip: str, port: int) -> bool:
    """Whether nothing listens on ``ip:port`` (a listener on every address counts)."""
    with socket.socket() as s:
        try:
            s.bind((ip, port))
        except OSError:
            return False
    return True


def die_with_parent() -> None:
    """In a container's process before it runs: killed when the emulator dies,
    however it dies (a SIGKILLed emulator left its Pods running, holding
    their addresses)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def lookup(obj: Any, path: str) -> Any:
    for part in path.split('.'):
        obj = obj.get(part) if isinstance(obj, dict) else None
    return obj


class NotYet(Exception):
    """A Pod cannot start yet (a missing Secret, ConfigMap or key, an unknown image)."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
        self.message = message


def expand(text: str, env: dict[str, str]) -> str:
    """A literal env value as Kubernetes gives it: ``$(VAR)`` is an earlier
    variable's value (an unknown one stays as written), ``$$`` one ``$``."""
    return re.sub(r'\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)',
                  lambda m: '$' if m.group(0) == '$$' else env.get(m.group(1), m.group(0)), text)


class NoImage(NotYet):
    """No program for a container's image: the Pod never starts."""


@dataclass
class Container:
    name: str
    process: asyncio.subprocess.Process | None = None
    restarts: int = 0
    ready: bool = False
    started: str = ''


@dataclass
class Pod:
    namespace: str
    name: str
    ip: str
    dir: Path
    containers: dict[str, Container] = field(default_factory=dict)
    task: asyncio.Task | None = None
    stopping: bool = False


class Kubelet:
    def __init__(self, emulator: Any, images: dict[str, str], root: Path):
        self.emu = emulator
        self.images = images
        self.root = root
        self.pods: dict[tuple[str, str], Pod] = {}
        self.proxies: dict[tuple[str, str], list[asyncio.base_events.Server]] = {}
        self.rr: dict[tuple[str, str], int] = {}
        self._dirty: set[tuple[str, str, str]] = set()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    # --- from the emulator -----------------------------------------------------------------

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop())

    def notice(self, res: kmock.resource, event: dict[str, Any]) -> None:
        """Called for every event the emulator emits (synchronously: only note it)."""
        meta = event['object'].get('metadata') or {}
        key = (meta.get('namespace'), meta.get('name'))
        if res == DEPLOYMENTS:
            self._mark('deployment', *key)
        elif res == SERVICES:
            self._mark('service', *key)
        elif res == PODS:
            if event['type'] == 'DELETED':
                self._mark('gone', *key)
            for ref in meta.get('ownerReferences') or []:
                if ref.get('kind') == 'Deployment':
                    self._mark('deployment', meta.get('namespace'), ref.get('name'))

    def _mark(self, kind: str, namespace: str | None, name: str | None) -> None:
        if namespace and name:
            self._dirty.add((kind, namespace, name))
            self._wake.set()

    async def stop(self) -> None:
        for pod in list(self.pods.values()):
            await self._stop_pod(pod)
        for servers in self.proxies.values():
            for s in servers:
                s.close()
        if self._task:
            self._task.cancel()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for kind, namespace, name in sorted(dirty):
                try:
                    if kind == 'deployment':
                        self._deployment(namespace, name)
                    elif kind == 'service':
                        await self._service(namespace, name)
                    elif kind == 'gone' and (pod := self.pods.pop((namespace, name), None)):
                        await self._stop_pod(pod)
                except Exception:  # noqa: BLE001 -- one broken object must not stop the others
                    log.exception('kubelet: %s %s/%s', kind, namespace, name)

    # --- the Deployment controller -----------------------------------------------------------

    def _write(self, fn: Any, *args: Any) -> Any:
        """A write on the system's behalf (no requester, no RBAC)."""
        requester, self.emu._requester = self.emu._requester, None
        try:
            return fn(*args)
        finally:
            self.emu._requester = requester

    def _owned_pods(self, deployment: dict[str, Any]) -> list[dict[str, Any]]:
        uid = deployment['metadata']['uid']
        keys = [k for k in self.emu._dependents.get(uid, ()) if k[0] == PODS]
        return [p for k in keys if (p := self.emu._get(*k)) is not None]

    def _deployment(self, namespace: str, name: str) -> None:
        d = self.emu._get(DEPLOYMENTS, namespace, name)
        if d is None or lookup(d, 'metadata.deletionTimestamp'):
            return  # its Pods go with it (garbage collection)
        spec = d.get('spec') or {}
        template = spec.get('template') or {}
        want = spec.get('replicas', 1)
        current_hash = template_hash(template)
        pods = self._owned_pods(d)
        current = [p for p in pods if lookup(p, 'metadata.labels.pod-template-hash') == current_hash]
        old = [p for p in pods if p not in current]
        recreate = lookup(spec, 'strategy.type') == 'Recreate'
        if recreate and old:
            for p in old:
                self._write(self.emu._delete, PODS, namespace, p['metadata']['name'])
            old = []
        for _ in range(want - len(current)):
            current.append(self._create_pod(d, template, current_hash))
        for p in current[want:]:
            self._write(self.emu._delete, PODS, namespace, p['metadata']['name'])
        current = current[:want]
        ready = [p for p in current if self._ready(p)]
        if len(ready) >= want:  # rolled out: the old Pods go
            for p in old:
                self._write(self.emu._delete, PODS, namespace, p['metadata']['name'])
            old = []
        all_ready = len(ready) + sum(self._ready(p) for p in old)
        status = {
            'observedGeneration': d['metadata'].get('generation', 1),
            'replicas': len(current) + len(old),
            'updatedReplicas': len(current),
            'readyReplicas': all_ready,
            'availableReplicas': all_ready,
            'conditions': [
                {'type': 'Available', 'status': 'True' if all_ready >= want else 'False',
                 'reason': 'MinimumReplicasAvailable' if all_ready >= want else 'MinimumReplicasUnavailable',
                 'message': f'{all_ready} of {want} replicas ready'},
                {'type': 'Progressing', 'status': 'True',
                 'reason': 'NewReplicaSetAvailable' if len(ready) >= want else 'ReplicaSetUpdated',
                 'message': f'{len(ready)} of {want} updated replicas ready'},
            ],
        }
        if not all_ready:
            status.pop('readyReplicas')
            status.pop('availableReplicas')
        for c in status['conditions']:  # stable times: an unchanged status is no write
            before = next((x for x in lookup(d, 'status.conditions') or [] if x.get('type') == c['type']), {})
            c['lastTransitionTime'] = before.get('lastTransitionTime') if before.get('status') == c['status'] \
                else now()
            c['lastUpdateTime'] = c['lastTransitionTime']
        if d.get('status') != status:
            new = dict(d, status=status)
            self._write(self.emu._store, DEPLOYMENTS, namespace, name, d, new, 'status')

    @staticmethod
    def _ready(pod: dict[str, Any]) -> bool:
        return any(c.get('type') == 'Ready' and c.get('status') == 'True'
                   for c in lookup(pod, 'status.conditions') or [])

    def _create_pod(self, d: dict[str, Any], template: dict[str, Any], hash_: str) -> dict[str, Any]:
        namespace, name = d['metadata']['namespace'], d['metadata']['name']
        meta = template.get('metadata') or {}
        pod_name = f'{name}-{hash_}-{uuid.uuid4().hex[:5]}'
        body = {
            'apiVersion': 'v1', 'kind': 'Pod',
            'metadata': {
                'name': pod_name, 'namespace': namespace,
                'labels': dict(meta.get('labels') or {}, **{'pod-template-hash': hash_}),
                'annotations': dict(meta.get('annotations') or {}),
                'ownerReferences': [{'apiVersion': 'apps/v1', 'kind': 'Deployment', 'name': name,
                                     'uid': d['metadata']['uid'], 'controller': True,
                                     'blockOwnerDeletion': True}],
            },
            'spec': dict(template.get('spec') or {}, nodeName='emulator'),
        }
        info = self.emu.resources[PODS]
        created = self._write(self.emu._create, PODS, info, namespace, body)
        ip = self._free_address([p.get('containerPort') for c in lookup(body, 'spec.containers') or []
                                 for p in c.get('ports') or []])
        pod = Pod(namespace, pod_name, ip, self.root / namespace / pod_name)
        self.pods[namespace, pod_name] = pod
        pod.task = asyncio.get_running_loop().create_task(self._run_pod(pod))
        return created

    def _free_address(self, ports: list[Any]) -> str:
        """A loopback address for a new Pod, random in 127.0.0.0/8 and with its
        containers' ports free there: other emulators on the machine (tests run
        in parallel), or Pods they left behind, hold addresses of their own."""
        taken = {pod.ip for pod in self.pods.values()}
        for _ in range(100):
            ip = f'127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(1, 254)}'
            if ip not in taken and all(port_free(ip, p) for p in ports if isinstance(p, int)):
                break
        return ip

    # --- the kubelet ----------------------------------------------------------------------

    def _status(self, pod: Pod, phase: str, reason: str = '', message: str = '') -> None:
        obj = self.emu._get(PODS, pod.namespace, pod.name)
        if obj is None or pod.stopping:
            return
        ready = phase == 'Running' and all(c.ready for c in pod.containers.values()) and bool(pod.containers)
        cond = 'True' if ready else 'False'
        before = {c.get('type'): c for c in lookup(obj, 'status.conditions') or []}
        def condition(type_: str, status: str) -> dict[str, Any]:
            old = before.get(type_) or {}
            at = old.get('lastTransitionTime') if old.get('status') == status else now()
            return {'type': type_, 'status': status, 'lastTransitionTime': at}
        status = {
            'phase': phase, 'podIP': pod.ip, 'podIPs': [{'ip': pod.ip}], 'hostIP': '127.0.0.1',
            'conditions': [condition('PodScheduled', 'True'), condition('Initialized', 'True'),
                           condition('ContainersReady', cond), condition('Ready', cond)],
            'containerStatuses': [{
                'name': c.name, 'ready': c.ready, 'restartCount': c.restarts, 'started': c.process is not None,
                'image': self._container(obj, c.name).get('image'), 'imageID': '',
                'state': {'running': {'startedAt': c.started}} if c.process and c.process.returncode is None
                else {'waiting': {'reason': reason or 'ContainerCreating', 'message': message}},
            } for c in pod.containers.values()],
        }
        if reason and phase != 'Running':
            status.update(reason=reason, message=message)
        if obj.get('status') != status:
            self._write(self.emu._store, PODS, pod.namespace, pod.name, obj, dict(obj, status=status), 'status')

    @staticmethod
    def _container(pod: dict[str, Any], name: str) -> dict[str, Any]:
        return next((c for c in lookup(pod, 'spec.containers') or [] if c.get('name') == name), {})

    async def _run_pod(self, pod: Pod) -> None:
        while not pod.stopping:
            obj = self.emu._get(PODS, pod.namespace, pod.name)
            if obj is None:
                return
            try:
                launches = self._prepare(pod, obj)
                break
            except NoImage as e:  # never runs: a Pod's spec does not change
                self._status(pod, 'Pending', e.reason, e.message)
                return
            except NotYet as e:  # a Secret or ConfigMap may yet appear
                self._status(pod, 'Pending', e.reason, e.message)
                await asyncio.sleep(1)
        else:
            return
        for c in launches:
            pod.containers[c[0]] = Container(c[0])
        self._status(pod, 'Running')
        await asyncio.gather(*(self._keep_running(pod, *c) for c in launches))

    def _prepare(self, pod: Pod, obj: dict[str, Any]) -> list[tuple[str, list[str], dict[str, str], list, dict]]:
        """Volumes as directories, and each container's argv, environment, mounts and probe."""
        spec = obj.get('spec') or {}
        programs = {c['name']: self._program(c.get('image') or '') for c in spec.get('containers') or []}
        volumes = {v['name']: self._volume(pod, v) for v in spec.get('volumes') or []}
        launches = []
        for c in spec.get('containers') or []:
            program = programs[c['name']]
            argv = [a.replace('0.0.0.0', pod.ip) for a in (c.get('command') or [program]) + (c.get('args') or [])]
            if c.get('command'):
                argv[0] = program  # the image's program, wherever the image keeps it
            env = {'PATH': os.environ.get('PATH', '/usr/bin:/bin'), 'HOSTNAME': pod.name}
            for e in c.get('env') or []:
                value = self._env_value(pod, obj, e)
                if value is not None:
                    env[e['name']] = expand(value, env) if 'value' in e else value
            mounts = []
            for m in c.get('volumeMounts') or []:
                if m['name'] not in volumes:
                    raise NotYet('CreateContainerConfigError', f'volume "{m["name"]}" is not in the pod')
                mounts.append((volumes[m['name']], m['mountPath'], bool(m.get('readOnly'))))
            probe = (c.get('readinessProbe') or {}).get('httpGet')
            launches.append((c['name'], argv, env, mounts, {'probe': probe, 'ports': c.get('ports') or []}))
        return launches

    def _program(self, image: str) -> str:
        program = self.images.get(image) or self.images.get(image.rsplit(':', 1)[0].rsplit('@', 1)[0])
        if program is None:
            raise NoImage('ErrImagePull', f'the emulator has no program for image "{image}" (--image NAME=PATH)')
        return program

    def _source(self, res: kmock.resource, namespace: str, name: str, optional: bool, kind: str) -> dict | None:
        obj = self.emu._get(res, namespace, name)
        if obj is None and not optional:
            raise NotYet('CreateContainerConfigError', f'{kind} "{name}" not found')
        return obj

    def _env_value(self, pod: Pod, obj: dict[str, Any], e: dict[str, Any]) -> str | None:
        if 'value' in e:
            return str(e['value'])
        source = e.get('valueFrom') or {}
        for ref_name, res, kind, b64 in (('secretKeyRef', SECRETS, 'secret', True),
                                         ('configMapKeyRef', CONFIG_MAPS, 'configmap', False)):
            ref = source.get(ref_name)
            if ref:
                found = self._source(res, pod.namespace, ref['name'], bool(ref.get('optional')), kind)
                data = (found or {}).get('data') or {}
                if ref['key'] not in data:
                    if ref.get('optional') or found is None:
                        return None
                    raise NotYet('CreateContainerConfigError', f'couldn\'t find key {ref["key"]} in {kind.title()}'
                                                               f' {pod.namespace}/{ref["name"]}')
                return base64.b64decode(data[ref['key']]).decode() if b64 else data[ref['key']]
        if 'fieldRef' in source:
            path = source['fieldRef'].get('fieldPath')
            return {'metadata.name': pod.name, 'metadata.namespace': pod.namespace,
                    'status.podIP': pod.ip, 'spec.nodeName': 'emulator',
                    'spec.serviceAccountName': lookup(obj, 'spec.serviceAccountName') or 'default'}.get(path, '')
        return None

    def _volume(self, pod: Pod, v: dict[str, Any]) -> Path:
        if 'persistentVolumeClaim' in v:  # the claim's data outlives the Pod
            path = self.root / pod.namespace / '_claims' / v['persistentVolumeClaim']['claimName']
            path.mkdir(parents=True, exist_ok=True)
            return path
        path = pod.dir / 'volumes' / v['name']
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        for kind, res, key_name, b64 in (('configMap', CONFIG_MAPS, 'name', False), ('secret', SECRETS, 'secretName', True)):
            source = v.get(kind)
            if source is None:
                continue
            found = self._source(res, pod.namespace, source.get(key_name), bool(source.get('optional')), kind.lower())
            data = (found or {}).get('data') or {}
            items = source.get('items') or [{'key': k, 'path': k} for k in data]
            for item in items:
                if item['key'] not in data:
                    raise NotYet('CreateContainerConfigError',
                                 f'{kind} {source.get(key_name)} has no key {item["key"]}')
                file = path / item['path']
                file.parent.mkdir(parents=True, exist_ok=True)
                file.write_bytes(base64.b64decode(data[item['key']]) if b64 else data[item['key']].encode())
                file.chmod(item.get('mode') or source.get('defaultMode') or 0o644)
        return path

    async def _keep_running(self, pod: Pod, name: str, argv: list[str], env: dict[str, str],
                            mounts: list[tuple[Path, str, bool]], extra: dict[str, Any]) -> None:
        container = pod.containers[name]
        # The program is opened before any mount: an emptyDir at /tmp hides it
        # when the workspace (and so the built binary) lives below /tmp.
        script = ['set -e', 'exec 3<"$1"', 'shift']
        # A mount over an ancestor of the Pods' directory (an emptyDir at /tmp)
        # would hide the other volumes' directories: it comes last.
        shadows = lambda m: str(self.root.resolve()).startswith(m[1].rstrip('/') + '/')  # noqa: E731
        for source, target, read_only in sorted(mounts, key=shadows):
            script.append(f'mkdir -p {shlex.quote(target)} && mount --bind {shlex.quote(str(source))} {shlex.quote(target)}')
            if read_only:
                script.append(f'mount -o remount,bind,ro {shlex.quote(target)}')
        script.append('exec /proc/self/fd/3 "$@"')
        logs = pod.dir / f'{name}.log'
        probe_task = asyncio.get_running_loop().create_task(self._probe(pod, container, extra))
        try:
            while not pod.stopping:
                with open(logs, 'ab') as out:
                    container.process = await asyncio.create_subprocess_exec(
                        'unshare', '--mount', '--propagation', 'private', 'sh', '-c', '\n'.join(script), 'sh', *argv,
                        env=env, stdin=asyncio.subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                        preexec_fn=die_with_parent)
                container.started = now()
                self._status(pod, 'Running')
                code = await container.process.wait()
                container.ready = False
                if pod.stopping:
                    break
                log.info('kubelet: %s/%s container %s exited with %s; restarting', pod.namespace, pod.name, name, code)
                container.restarts += 1
                self._status(pod, 'Running')
                await asyncio.sleep(RESTART_AFTER)
        finally:
            probe_task.cancel()

    async def _probe(self, pod: Pod, container: Container, extra: dict[str, Any]) -> None:
        probe = extra['probe']
        if probe is None:  # no probe: ready once started
            container.ready = True
            self._status(pod, 'Running')
            return
        port = probe.get('port')
        if isinstance(port, str):
            port = next((p['containerPort'] for p in extra['ports'] if p.get('name') == port), port)
        url = f'http://{pod.ip}:{port}{probe.get("path") or "/"}'
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while not pod.stopping:
                try:
                    async with session.get(url) as r:
                        ok = 200 <= r.status < 400
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                    ok = False
                ok = ok and container.process is not None and container.process.returncode is None
                if ok != container.ready:
                    container.ready = ok
                    self._status(pod, 'Running')
                await asyncio.sleep(PROBE_EVERY)

    async def _stop_pod(self, pod: Pod) -> None:
        pod.stopping = True
        for c in pod.containers.values():
            if c.process and c.process.returncode is None:
                try:
                    os.killpg(c.process.pid, signal.SIGTERM)
                    await asyncio.wait_for(c.process.wait(), 5)
                except (ProcessLookupError, asyncio.TimeoutError):
                    try:
                        os.killpg(c.process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        if pod.task:
            pod.task.cancel()
        shutil.rmtree(pod.dir, ignore_errors=True)

    # --- Services -------------------------------------------------------------------------

    async def _service(self, namespace: str, name: str) -> None:
        svc = self.emu._get(SERVICES, namespace, name)
        key = (namespace, name)
        if svc is None:
            for s in self.proxies.pop(key, []):
                s.close()
            return
        if key not in self.proxies:
            servers = []
            for port in lookup(svc, 'spec.ports') or []:
                handler = self._proxy_handler(namespace, name, port)
                servers.append(await asyncio.start_server(handler, '127.0.0.1', 0))
            self.proxies[key] = servers
        svc = self.emu._get(SERVICES, namespace, name)
        ingress = [{'ip': '127.0.0.1', 'ports': [
            {'port': s.sockets[0].getsockname()[1], 'protocol': 'TCP'} for s in self.proxies[key]]}]
        if lookup(svc, 'status.loadBalancer.ingress') != ingress:
            new = dict(svc, status={'loadBalancer': {'ingress': ingress}})
            self._write(self.emu._store, SERVICES, namespace, name, svc, new, 'status')

    def _endpoints(self, namespace: str, selector: dict[str, str], target: Any) -> list[tuple[str, int]]:
        found = []
        for (res, ns, _), obj in self.emu.objects.items():
            if res != PODS or ns != namespace or obj.deleted:
                continue
            pod = obj.raw
            labels = lookup(pod, 'metadata.labels') or {}
            if not selector or any(labels.get(k) != v for k, v in selector.items()) or not self._ready(pod):
                continue
            port = target
            if isinstance(target, str):
                port = next((p['containerPort'] for c in lookup(pod, 'spec.containers') or []
                             for p in c.get('ports') or [] if p.get('name') == target), None)
            if port is not None and lookup(pod, 'status.podIP'):
                found.append((lookup(pod, 'status.podIP'), int(port)))
        return sorted(found)

    def _proxy_handler(self, namespace: str, name: str, port: dict[str, Any]) -> Any:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            svc = self.emu._get(SERVICES, namespace, name) or {}
            endpoints = self._endpoints(namespace, lookup(svc, 'spec.selector') or {},
                                        port.get('targetPort', port.get('port')))
            if not endpoints:
                writer.close()
                return
            n = self.rr.get((namespace, name), 0)
            self.rr[namespace, name] = n + 1
            host, target = endpoints[n % len(endpoints)]
            try:
                up_reader, up_writer = await asyncio.open_connection(host, target)
            except OSError:
                writer.close()
                return

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    try:
                        dst.close()
                    except (ConnectionError, OSError):
                        pass
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        return handle
