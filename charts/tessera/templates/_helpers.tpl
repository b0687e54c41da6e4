{{/*
Labels of every object: the six app.kubernetes.io labels (those of config/'s
kustomization) and helm.sh/chart. Call with (dict "ctx" $ "component" "controller").
*/}}
{{- define "tessera.labels" -}}
{{ include "tessera.podLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .ctx.Chart.Name .ctx.Chart.Version | quote }}
{{- end }}

{{/* Labels of a Pod template: those of its object but helm.sh/chart. */}}
{{- define "tessera.podLabels" -}}
{{ include "tessera.selector" . }}
app.kubernetes.io/instance: {{ .ctx.Release.Name | quote }}
app.kubernetes.io/part-of: tessera
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service | quote }}
{{- end }}

{{/* A selector: name and component only, as in config/ (selectors are immutable). */}}
{{- define "tessera.selector" -}}
app.kubernetes.io/name: tessera
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* An image reference from {repository, tag}; tag defaults to the appVersion. */}}
{{- define "tessera.image" -}}
{{ .image.repository }}:{{ .image.tag | default .ctx.Chart.AppVersion }}
{{- end }}

{{/* image and imagePullPolicy lines of a container. Call with (dict "ctx" $ "image" ...). */}}
{{- define "tessera.containerImage" -}}
image: {{ include "tessera.image" . | quote }}
{{- with .image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{/* The global flags of the tessera binary, as YAML list items (empty: none). */}}
{{- define "tessera.logArgs" -}}
{{- $args := list }}
{{- with .Values.logLevel }}{{ $args = append $args (printf "--log-level=%s" .) }}{{ end }}
{{- with .Values.logFormat }}{{ $args = append $args (printf "--log-format=%s" .) }}{{ end }}
{{- with $args }}{{ toYaml . }}{{ end }}
{{- end }}

{{/* What every container that can be restricted runs with. */}}
{{- define "tessera.restricted" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end }}
