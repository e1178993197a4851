{{/* The KubeSchedulerConfiguration of the gpu-scheduler (neuronetes.devcluster.config.scheduler_config
renders the same for the dev cluster; tests/unit/test_chart.py compares them). Arguments: root,
url (the extender's), managed (the extended resources the extender manages). */}}
{{- define "neuronetes.schedulerConfig" -}}
{{- $ks := .root.Values.scheduler.kubeScheduler -}}
{{- $le := $ks.leaderElection -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  qps: {{ $ks.clientConnection.qps }}
  burst: {{ $ks.clientConnection.burst }}
leaderElection:
  leaderElect: true
  leaseDuration: {{ $le.leaseDuration }}
  renewDeadline: {{ $le.renewDeadline }}
  retryPeriod: {{ $le.retryPeriod }}
  resourceLock: leases
  resourceNamespace: {{ .root.Release.Namespace }}
  resourceName: neuronetes-scheduler
percentageOfNodesToScore: 100
# One profile only: extenders apply to every profile of a kube-scheduler.
profiles:
  - schedulerName: neuronetes-scheduler
    percentageOfNodesToScore: 100
    pluginConfig:
      - name: NodeResourcesFit
        args:
          apiVersion: kubescheduler.config.k8s.io/v1
          kind: NodeResourcesFitArgs
          scoringStrategy:
            type: MostAllocated
            resources:
              - {name: cpu, weight: 1}
              - {name: memory, weight: 1}
              - {name: neuronetes.io/gpu, weight: 3}
              - {name: neuronetes.io/gpu-memory, weight: 2}
extenders:
  - urlPrefix: {{ .url }}
    enableHTTPS: false
    httpTimeout: {{ $ks.extenderTimeout }}
    nodeCacheCapable: true
    ignorable: false
    managedResources:
      {{- range .managed }}
      - {name: {{ . }}, ignoredByScheduler: false}
      {{- end }}
    filterVerb: filter
    prioritizeVerb: prioritize
    weight: {{ $ks.extenderWeight }}
    preemptVerb: preempt
  # Bind on its own entry: its long timeout (the gang barrier) must not become the filter's.
  - urlPrefix: {{ .url }}
    enableHTTPS: false
    httpTimeout: {{ $ks.bindTimeout }}
    nodeCacheCapable: true
    ignorable: false
    bindVerb: bind
{{- end -}}
