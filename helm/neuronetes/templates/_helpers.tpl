{{/* Labels of every object: app.kubernetes.io/*, plus the component when given. */}}
{{- define "neuronetes.labels" -}}
app.kubernetes.io/name: neuronetes
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component's pods. */}}
{{- define "neuronetes.selector" -}}
app.kubernetes.io/name: neuronetes
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The NeuroNetes image (tag: the chart's appVersion unless set). */}}
{{- define "neuronetes.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The ServiceAccount name of a component (docs/rbac.md): the one source is files/rbac.yaml. */}}
{{- define "neuronetes.serviceAccount" -}}
{{- $rbac := .root.Files.Get "files/rbac.yaml" | fromYaml -}}
{{- (index $rbac.components .component).serviceAccount -}}
{{- end -}}

{{/* The user name the API server gives a component's ServiceAccount. */}}
{{- define "neuronetes.serviceAccountUser" -}}
system:serviceaccount:{{ .root.Release.Namespace }}:{{ include "neuronetes.serviceAccount" . }}
{{- end -}}

{{/* Spread a Deployment's replicas over nodes when the cluster has several (preferred only: a
one-node cluster still runs them all). */}}
{{- define "neuronetes.spread" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "neuronetes.selector" . | nindent 12 }}
{{- end -}}

{{/* The shared scheduling values of a pod: nodeSelector, tolerations, affinity (with a default). */}}
{{- define "neuronetes.placement" -}}
{{- with .values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if .values.affinity }}
affinity:
  {{- toYaml .values.affinity | nindent 2 }}
{{- else if .spread }}
affinity:
  {{- include "neuronetes.spread" . | nindent 2 }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
