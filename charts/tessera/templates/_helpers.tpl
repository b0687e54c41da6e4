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

{{/*
A Pod template's metadata: the chart's labels (tessera.podLabels), then the
workload's podLabels, which may not name one of them (app.kubernetes.io/name and
component are the workload's selector, immutable: a user label of that key would
change the Pods' and break or orphan them), and its podAnnotations. Call with
(dict "ctx" $ "component" "node" "values" .Values.node "path" "node").
*/}}
{{- define "tessera.podMetadata" -}}
{{- $own := include "tessera.podLabels" . | fromYaml }}
{{- range $key, $_ := .values.podLabels }}
{{- if hasKey $own $key }}
{{- fail (printf "%s.podLabels: %q is a label the chart sets on the %s Pods itself (app.kubernetes.io/name and app.kubernetes.io/component select them, and a workload's selector cannot change): use another key" $.path $key $.component) }}
{{- end }}
{{- end }}
{{- "" -}}
labels:
  {{- include "tessera.podLabels" . | nindent 2 }}
  {{- with .values.podLabels }}{{ toYaml . | nindent 2 }}{{ end }}
{{- with .values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
The node agent's flags for what mountPods adds to every mount Pod (none with the
defaults: the agent's own, every taint and system-node-critical). Keys Tessera sets
on mount Pods (the agent's would win) and keys under tessera.io/ are refused here.
*/}}
{{- define "tessera.mountPodArgs" -}}
{{- $m := .Values.mountPods }}
{{- $args := list }}
{{- range $key, $value := $m.labels }}
{{- if or (has $key (list "app.kubernetes.io/name" "app.kubernetes.io/component")) (hasPrefix "tessera.io/" $key) }}
{{- fail (printf "mountPods.labels: %q is Tessera's own label of mount Pods (the node agent finds its mount Pods by app.kubernetes.io/name and component; tessera.io/ is Tessera's): its own value would win; use another key" $key) }}
{{- end }}
{{- $args = append $args (printf "--mount-pod-label=%s=%s" $key $value) }}
{{- end }}
{{- range $key, $value := $m.annotations }}
{{- if hasPrefix "tessera.io/" $key }}
{{- fail (printf "mountPods.annotations: %q: annotations under tessera.io/ are Tessera's own: use another key" $key) }}
{{- end }}
{{- $args = append $args (printf "--mount-pod-annotation=%s=%s" $key $value) }}
{{- end }}
{{- if not (kindIs "invalid" $m.tolerations) }}
{{- $args = append $args (printf "--mount-pod-tolerations=%s" (toJson $m.tolerations)) }}
{{- end }}
{{- if not (kindIs "invalid" $m.priorityClassName) }}
{{- $args = append $args (printf "--mount-pod-priority-class-name=%s" $m.priorityClassName) }}
{{- end }}
{{- range $args }}
- {{ toJson . }}
{{- end }}
{{- end }}

{{/* A scrape endpoint's settings from a podMonitor or serviceMonitor value:
interval, and scrapeTimeout, relabelings, metricRelabelings when set. */}}
{{- define "tessera.scrapeSettings" -}}
interval: {{ .interval }}
{{- with .scrapeTimeout }}
scrapeTimeout: {{ . }}
{{- end }}
{{- with .relabelings }}
relabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .metricRelabelings }}
metricRelabelings:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
