{{/* The chart's name, or nameOverride. */}}
{{- define "bindery-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: fullnameOverride, else the release name when it
contains the chart's name, else RELEASE-CHART. */}}
{{- define "bindery-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "bindery-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "bindery-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bindery-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "bindery-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: bindery
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "bindery-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "bindery-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* REPOSITORY@DIGEST, else REPOSITORY:TAG with the tag defaulting to appVersion.
Call with (dict "image" .Values.image "root" .). */}}
{{- define "bindery-operator.imageRef" -}}
{{- if .image.digest }}
{{- printf "%s@%s" .image.repository .image.digest }}
{{- else }}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}
{{- end }}

{{/* Leader election is on with more than one replica. */}}
{{- define "bindery-operator.leaderElect" -}}
{{- if gt (int .Values.replicas) 1 }}true{{ end }}
{{- end }}

{{- define "bindery-operator.leaseName" -}}
{{- default (include "bindery-operator.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
What the operator does in the namespaces it watches, and nothing more
(operator/src/controller.rs, events.rs; tests/tests/it/charts.rs checks this
list against what the operator asked of a real API server, its audit log):
*/}}
{{- define "bindery-operator.rules" -}}
# AgentTenants and Agents: the controllers list and watch them; a reconcile
# reads its tenant afresh (get), and writes only the status of tenants and
# of Agents (server-side apply on the status subresource).
- apiGroups: ["bindery.dev"]
  resources: ["agenttenants"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["bindery.dev"]
  resources: ["agents"]
  verbs: ["list", "watch"]
- apiGroups: ["bindery.dev"]
  resources: ["agenttenants/status", "agents/status"]
  verbs: ["patch"]
# Never asked for by the operator itself: the Role of a tenant with budgets
# grants its pods get and patch on that tenant's status (they write the
# budgets' use there), and the API server lets the operator grant only
# what it holds (patch, above, and this get).
- apiGroups: ["bindery.dev"]
  resources: ["agenttenants/status"]
  verbs: ["get"]
# Owned objects carry an ownerReference with blockOwnerDeletion, which
# clusters with the OwnerReferencesPermissionEnforcement admission plugin
# (OpenShift) allow only to who may update the owner's finalizers.
- apiGroups: ["bindery.dev"]
  resources: ["agenttenants/finalizers"]
  verbs: ["update"]
# What a tenant owns, applied server-side (an apply that creates is
# authorized as create too), and deleted once the tenant no longer asks for
# it (found by the tenant's label; only objects it controls). Deployments
# are read for the rollout status; ConfigMaps for the key names of those a
# tenant references. Each kind is got (its metadata) before an apply that
# changes it: an object of the tenant's names that the tenant does not
# control is left alone, never taken over.
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "serviceaccounts", "persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# A tenant whose agents have an approval webhook or a budget: a Role letting
# its pods' ServiceAccount create Events (and, with a budget, get and patch
# its own AgentTenant's status; nothing else) and its RoleBinding, owned and
# applied like the kinds above, deleted once no agent has either. The API
# server lets the operator grant only what it holds itself: Events create,
# below, and agenttenants/status get and patch, above.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Secrets: got and watched by metadata only (PartialObjectMetadata: their
# key names from managedFields, never their values), and the generated
# owner-token and peer-certificate Secrets created once. RBAC has no verb
# for metadata alone: a metadata get, list or watch needs get, list and
# watch. No update, patch or delete: the operator never changes a Secret.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch", "create"]
# Warnings a human must see, on the AgentTenant or Agent (events.k8s.io,
# through kube-runtime's Recorder): one Event per problem, patched to count
# a problem that comes back.
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end }}
