{{/* Common labels; every resource of a release carries them. */}}
{{- define "parley.labels" -}}
app.kubernetes.io/name: parley
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "parley.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}

{{/* What every Parley process reads: Settings.from_env() (infra/config/settings.py). */}}
{{- define "parley.envFrom" -}}
- configMapRef:
    name: {{ .Release.Name }}-env
{{- end }}

{{/* Prometheus finds every process by these annotations (the same ports as `parley up`). */}}
{{- define "parley.scrape" -}}
prometheus.io/scrape: "true"
prometheus.io/path: /metrics
prometheus.io/port: {{ . | quote }}
{{- end }}
