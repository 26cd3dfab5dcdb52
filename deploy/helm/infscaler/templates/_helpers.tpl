{{/* The release's base name: <release>-infscaler, or the release alone when it already says infscaler. */}}
{{- define "infscaler.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- if eq .Release.Name .Chart.Name -}}
{{- .Release.Name | trunc 30 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 30 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "infscaler.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The group's nodeSelector as nodeAffinity matchExpressions (ctx: the group). */}}
{{- define "infscaler.groupExpressions" -}}
{{- range $k, $v := .nodeSelector }}
- key: {{ $k }}
  operator: In
  values: [{{ $v | quote }}]
{{- end }}
{{- end -}}
