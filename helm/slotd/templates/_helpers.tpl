{{- define "slotd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "slotd.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "slotd.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "slotd.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "slotd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "slotd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "slotd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "slotd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "slotd.image" -}}
{{- $repo := required "image.repository is required: your application's image with slotd installed" .Values.image.repository -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The shutdown grace in seconds; the schema limits it to whole seconds or minutes. */}}
{{- define "slotd.graceSeconds" -}}
{{- $grace := toString .Values.shutdownGrace -}}
{{- if hasSuffix "m" $grace -}}
{{- mul (atoi (trimSuffix "m" $grace)) 60 -}}
{{- else -}}
{{- atoi (trimSuffix "s" $grace) -}}
{{- end -}}
{{- end -}}

{{- define "slotd.secretName" -}}
{{- default (include "slotd.fullname" .) .Values.database.existingSecret -}}
{{- end -}}

{{- define "slotd.checkDatabase" -}}
{{- if not (or .Values.database.url .Values.database.existingSecret) -}}
{{- fail "set database.url (and optionally database.readUrl) or database.existingSecret: slotd on Kubernetes needs a PostgreSQL it can share between pods" -}}
{{- end -}}
{{- end -}}

{{/* Database URLs, from the chart's Secret or an existing one. */}}
{{- define "slotd.databaseEnv" -}}
- name: SLOTD_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .root.Values.database.urlKey }}
{{- if or .root.Values.database.readUrl .root.Values.database.existingSecret }}
- name: SLOTD_DATABASE_URL_READ
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .root.Values.database.readUrlKey }}
      {{- if not .root.Values.database.readUrl }}
      # An existing secret may or may not carry a read replica; without it reads use the primary.
      optional: true
      {{- end }}
{{- end }}
{{- end -}}

{{- define "slotd.commonEnv" -}}
- name: SLOTD_APP
  value: {{ required "app is required: the module:attribute of your slotd.Registry" .Values.app | quote }}
- name: SLOTD_LOG_FORMAT
  value: {{ .Values.config.logFormat | quote }}
- name: SLOTD_SCHEMA
  value: {{ .Values.schema | quote }}
# Only used by the embedded PostgreSQL, which never runs here; pointed at the writable /tmp.
- name: SLOTD_HOME
  value: /tmp/slotd
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "slotd.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ .Values.runAsUser }}
runAsGroup: {{ .Values.runAsGroup }}
fsGroup: {{ .Values.runAsGroup }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "slotd.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}
