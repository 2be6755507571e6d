{{/* The tenant's name: nameOverride, else the release name. It names the
AgentTenant, its Service (a DNS label) and, with an inline agent, the Agent. */}}
{{- define "bindery-tenant.name" -}}
{{- $name := default .Release.Name .Values.nameOverride }}
{{- if not (regexMatch "^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$" $name) }}
{{- fail (printf "the tenant name %q (the release name, or nameOverride) must be a DNS label: at most 63 lower-case letters, digits and '-', starting with a letter and not ending with '-' (it names the tenant's Service)" $name) }}
{{- end }}
{{- $name }}
{{- end }}

{{/* The Agent the tenant runs. */}}
{{- define "bindery-tenant.agentName" -}}
{{- if and .Values.agent .Values.agentRef }}
{{- fail (printf "give agentRef (the name of an existing Agent, here %q) or an inline agent (an Agent spec, rendered as an Agent named like the tenant), not both" .Values.agentRef) }}
{{- end }}
{{- if .Values.agent }}
{{- include "bindery-tenant.name" . }}
{{- else }}
{{- default (include "bindery-tenant.name" .) .Values.agentRef }}
{{- end }}
{{- end }}

{{- define "bindery-tenant.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: bindery-tenant
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: bindery
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Where the owner token is: the given Secret key, or the one the operator
generates. Returns "NAME KEY". */}}
{{- define "bindery-tenant.ownerToken" -}}
{{- with .Values.ownerTokenSecretRef }}
{{- printf "%s %s" .name .key }}
{{- else }}
{{- printf "%s-owner-token token" (include "bindery-tenant.name" .) }}
{{- end }}
{{- end }}
