{{/*
What `pod-checkpointer render` computes from its flags, computed alike from the values,
and what it refuses, refused alike (with its messages, the flag's name given as the
value's). tests/chart.rs in crates/ckpt-e2e compares the two for a table of values.
*/}}

{{/* The strategies the agent image of this chart registers (`pod-checkpointer strategies`). */}}
{{- define "pod-checkpointer.strategies" -}}
{{- toJson (list "grace-period" "immediate" "owner-reference") -}}
{{- end }}

{{/* DNS-1123 label and subdomain (a label in a subdomain has no length limit of its own). */}}
{{- define "pod-checkpointer.isDnsLabel" -}}
{{- if and (le (len .) 63) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" .) }}true{{ end -}}
{{- end }}
{{- define "pod-checkpointer.isDnsSubdomain" -}}
{{- if and (le (len .) 253) (regexMatch "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$" .) }}true{{ end -}}
{{- end }}

{{/* A duration the agent reads: 500ms, 2s, 5m, 1h30m, or 0. */}}
{{- define "pod-checkpointer.isDuration" -}}
{{- if regexMatch "^(0|([0-9]+(ms|s|m|h))+)$" . }}true{{ end -}}
{{- end }}

{{/* The namespaces checkpointed: the given ones trimmed, with the release's, sorted, once each. */}}
{{- define "pod-checkpointer.namespaces" -}}
{{- $all := list .Release.Namespace -}}
{{- range .Values.namespaces -}}
{{- $ns := trim (toString .) -}}
{{- if $ns }}{{ $all = append $all $ns }}{{ end -}}
{{- end -}}
{{- toJson ($all | sortAlpha | uniq) -}}
{{- end }}

{{/* The oldest Kubernetes as major*1000+minor: kubernetesVersion, else the API server's. */}}
{{- define "pod-checkpointer.kubernetesVersion" -}}
{{- $given := trim (toString (.Values.kubernetesVersion | default "")) -}}
{{- $text := $given | default (printf "%s.%s" .Capabilities.KubeVersion.Major .Capabilities.KubeVersion.Minor) -}}
{{- $parts := regexSplit "[.+-]" (trimPrefix "v" (trim $text)) -1 -}}
{{- if or (lt (len $parts) 2) (not (regexMatch "^[0-9]+$" (index $parts 0))) (not (regexMatch "^[0-9]+$" (index $parts 1))) -}}
{{- fail (printf "invalid Kubernetes version %q (use MAJOR.MINOR, e.g. 1.20)" $text) -}}
{{- end -}}
{{- add (mul (int (index $parts 0)) 1000) (int (index $parts 1)) -}}
{{- end }}

{{/* The API server URL, or "" for in-cluster. */}}
{{- define "pod-checkpointer.apiServer" -}}
{{- $url := trim .Values.apiServer -}}
{{- if ne $url "in-cluster" -}}
{{- if or (not (regexMatch "^https://[^/:]" $url)) (regexMatch "\\s" $url) -}}
{{- fail (printf "apiServer: %q is not an https:// URL like https://127.0.0.1:6443 (or \"in-cluster\")" $url) -}}
{{- end -}}
{{- regexReplaceAll "/+$" $url "" -}}
{{- end -}}
{{- end }}

{{/* The node-affinity terms, as a JSON list of {key, value?}. */}}
{{- define "pod-checkpointer.nodeLabels" -}}
{{- $labels := list -}}
{{- if not .Values.onlyNodeLabels -}}
{{- $labels = list (dict "key" "node-role.kubernetes.io/control-plane") (dict "key" "node-role.kubernetes.io/master") (dict "key" "node.kubernetes.io/controller" "value" "true") -}}
{{- end -}}
{{- $name := "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?" -}}
{{- range .Values.nodeLabels -}}
{{- $given := trim (toString .) -}}
{{- $label := dict "key" $given -}}
{{- if contains "=" $given -}}
{{- $split := splitn "=" 2 $given -}}
{{- $label = dict "key" $split._0 "value" $split._1 -}}
{{- end -}}
{{- $key := $label.key -}}
{{- $keyOk := regexMatch (printf "^%s$" $name) $key -}}
{{- if contains "/" $key -}}
{{- $prefixed := splitn "/" 2 $key -}}
{{- $keyOk = and (include "pod-checkpointer.isDnsSubdomain" $prefixed._0) (regexMatch (printf "^%s$" $name) $prefixed._1) -}}
{{- end -}}
{{- if not $keyOk -}}
{{- fail (printf "nodeLabels: %q is not a label key like node.kubernetes.io/controller (KEY or KEY=VALUE)" $key) -}}
{{- end -}}
{{- if and (hasKey $label "value") $label.value (not (regexMatch (printf "^%s$" $name) $label.value)) -}}
{{- fail (printf "nodeLabels: %q is not a label value (at most 63 letters, digits, '-', '_' or '.')" $label.value) -}}
{{- end -}}
{{- if not (has $label $labels) }}{{ $labels = append $labels $label }}{{ end -}}
{{- end -}}
{{- if not $labels -}}
{{- fail "onlyNodeLabels needs at least one nodeLabels entry KEY[=VALUE]" -}}
{{- end -}}
{{- toJson $labels -}}
{{- end }}

{{/* The image: the value trimmed, else this chart's appVersion. */}}
{{- define "pod-checkpointer.image" -}}
{{- $image := trim (.Values.image | default "") | default (printf "ghcr.io/pod-checkpointer/pod-checkpointer:%s" .Chart.AppVersion) -}}
{{- $why := "" -}}
{{- if regexMatch "\\s" $image -}}
{{- $why = "is not an image reference" -}}
{{- else if contains "@" $image -}}
{{- if not (regexMatch "^[^@]+@sha256:[0-9a-f]{64}$" $image) }}{{ $why = "has no valid digest" }}{{ end -}}
{{- end -}}
{{- if $why -}}
{{- fail (printf "image: %q %s, like ghcr.io/pod-checkpointer/pod-checkpointer:0.1.0 or …@sha256:<64 hex digits>" $image $why) -}}
{{- end -}}
{{- $image -}}
{{- end }}

{{/* The memory limit, checked: a quantity of at least the request (32Mi); "" for none. */}}
{{- define "pod-checkpointer.memoryLimit" -}}
{{- $limit := trim (toString (.Values.memoryLimit | default "")) -}}
{{- if $limit -}}
{{- $units := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- $digits := regexFind "^[0-9]+" $limit -}}
{{- $unit := trimPrefix $digits $limit -}}
{{- if or (not $digits) (not (hasKey $units $unit)) (gt (len $digits) 15) -}}
{{- fail (printf "memoryLimit: %q is not a memory quantity like 256Mi or 1Gi" $limit) -}}
{{- end -}}
{{- if lt (mul (int64 $digits) (int64 (get $units $unit))) 33554432 -}}
{{- fail (printf "memoryLimit: %s is below the container's request (32Mi); the agent's RSS is about 12 MiB at idle (BENCHMARKS.md)" $limit) -}}
{{- end -}}
{{- $limit -}}
{{- end -}}
{{- end }}

{{/* Every check render makes that the templates do not make on their way. */}}
{{- define "pod-checkpointer.checks" -}}
{{- $strategies := include "pod-checkpointer.strategies" . | fromJsonArray -}}
{{- if not (has .Values.gcStrategy $strategies) -}}
{{- fail (printf "gcStrategy: unknown strategy %q; registered strategies: %s" .Values.gcStrategy (join ", " $strategies)) -}}
{{- end -}}
{{- if not (include "pod-checkpointer.isDnsLabel" .Release.Namespace) -}}
{{- fail (printf "the release's namespace %q is not a valid namespace name" .Release.Namespace) -}}
{{- end -}}
{{- range include "pod-checkpointer.namespaces" . | fromJsonArray -}}
{{- if not (include "pod-checkpointer.isDnsLabel" .) -}}
{{- fail (printf "namespaces: %q is not a valid namespace name" .) -}}
{{- end -}}
{{- end -}}
{{- if not (hasPrefix "/" .Values.manifestsDir) -}}
{{- fail (printf "manifestsDir: %q is not an absolute path" .Values.manifestsDir) -}}
{{- end -}}
{{- if not (regexMatch "^/.+/[^/]*$" .Values.lockFile) -}}
{{- fail (printf "lockFile: %q is not an absolute path in a directory of its own, like /run/pod-checkpointer/pod-checkpointer.lock" .Values.lockFile) -}}
{{- end -}}
{{- if and .Values.runtimeEndpoint (not (regexMatch "^unix:///.*/" .Values.runtimeEndpoint)) -}}
{{- fail (printf "runtimeEndpoint: %q is not a unix socket like unix:///run/containerd/containerd.sock (or \"\" for none)" .Values.runtimeEndpoint) -}}
{{- end -}}
{{- $ca := trim (toString (.Values.kubeletCa | default "")) -}}
{{- if .Values.runtimeEndpoint -}}
{{- if or $ca .Values.kubeletInsecure -}}
{{- fail "kubeletCa/kubeletInsecure: the kubelet API is read only with runtimeEndpoint \"\"" -}}
{{- end -}}
{{- else if and $ca .Values.kubeletInsecure -}}
{{- fail "kubeletCa and kubeletInsecure exclude each other" -}}
{{- else if $ca -}}
{{- if not (regexMatch "^/.*/" $ca) }}{{ fail (printf "kubeletCa: %q is not an absolute file path" $ca) }}{{ end -}}
{{- else if not .Values.kubeletInsecure -}}
{{- fail "runtimeEndpoint \"\": the agent reads the kubelet's /pods over https with the service-account token; set kubeletCa (the CA of the kubelets' serving certificates) or, knowingly, kubeletInsecure" -}}
{{- end -}}
{{- $priority := trim .Values.priorityClass -}}
{{- if and $priority (not (include "pod-checkpointer.isDnsSubdomain" $priority)) -}}
{{- fail (printf "priorityClass: %q is not a valid PriorityClass name" $priority) -}}
{{- end -}}
{{- range .Values.imagePullSecrets -}}
{{- if not (include "pod-checkpointer.isDnsSubdomain" (trim .)) -}}
{{- fail (printf "imagePullSecrets: %q is not a valid Secret name" (trim .)) -}}
{{- end -}}
{{- end -}}
{{- if not (trim .Values.logLevel) -}}
{{- fail "logLevel must not be empty (the default is \"info\")" -}}
{{- end -}}
{{- if not (has .Values.logFormat (list "text" "json")) -}}
{{- fail (printf "logFormat: %q is neither text nor json" .Values.logFormat) -}}
{{- end -}}
{{- /* What the agent's own config parser refuses. */ -}}
{{- range $what, $value := dict "gracePeriod" .Values.gracePeriod "handoffTimeout" .Values.handoffTimeout -}}
{{- if not (include "pod-checkpointer.isDuration" (trim (toString $value))) -}}
{{- fail (printf "the agent would refuse this config: %s: invalid duration %q (use e.g. 500ms, 2s, 5m, 1h30m)" $what (trim (toString $value))) -}}
{{- end -}}
{{- end -}}
{{- if lt (int64 .Values.revisions) 1 -}}
{{- fail (printf "the agent would refuse this config: revisions: %d would keep no checkpoint: 1 keeps only the newest" (int64 .Values.revisions)) -}}
{{- end -}}
{{- end }}

{{/* The agent's --config file: byte for byte what render writes (the config hash is over it). */}}
{{- define "pod-checkpointer.config" -}}
# pod-checkpointer run --config: the keys are its long flag names (see --help).
# NODE_NAME, POD_NAME, POD_NAMESPACE and HOST_IP come from the pod's environment.
apiVersion: pod-checkpointer.github.io/v1alpha1
kind: AgentConfig
gc-strategy: {{ .Values.gcStrategy | quote }}
checkpoint-grace-period: {{ trim (toString .Values.gracePeriod) | quote }}
revisions: {{ int64 .Values.revisions }}
handoff-timeout: {{ trim (toString .Values.handoffTimeout) | quote }}
namespaces:
{{- range include "pod-checkpointer.namespaces" . | fromJsonArray }}
- {{ . | quote }}
{{- end }}
checkpoint-dir: "/etc/kubernetes"
manifests-dir: {{ .Values.manifestsDir | quote }}
lock-file: {{ .Values.lockFile | quote }}
runtime-endpoint: {{ .Values.runtimeEndpoint | quote }}
{{- if not .Values.runtimeEndpoint }}
{{- with trim (toString (.Values.kubeletCa | default "")) }}
kubelet-ca: {{ . | quote }}
{{- else }}
kubelet-insecure: true
{{- end }}
{{- end }}
metrics-addr: {{ printf "127.0.0.1:%d" (int .Values.metricsPort) | quote }}
health-socket: "/run/pod-checkpointer-health/health.sock"
log-level: {{ trim .Values.logLevel | quote }}
log-format: {{ .Values.logFormat | quote }}
{{ end }}

{{/* The kubeconfig when apiServer names a server: byte for byte what render writes. */}}
{{- define "pod-checkpointer.kubeconfig" -}}
{{- with include "pod-checkpointer.apiServer" . -}}
# The agent's API server (render's --api-server, the chart's apiServer), with the pod's
# service-account token and CA.
apiVersion: v1
kind: Config
clusters:
- name: api
  cluster:
    server: {{ . | quote }}
{{- with trim $.Values.apiServerName }}
    tls-server-name: {{ . | quote }}
{{- end }}
    certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
- name: service-account
  user:
    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
- name: pod-checkpointer
  context:
    cluster: api
    user: service-account
current-context: pod-checkpointer
{{ end -}}
{{- end }}

{{/* The subjects of the roles: the agent's account, the static copy's unless `static` is false, the bound users. */}}
{{- define "pod-checkpointer.subjects" -}}
- kind: ServiceAccount
  name: pod-checkpointer
  namespace: {{ .root.Release.Namespace | quote }}
{{- if .static }}
- kind: ServiceAccount
  name: pod-checkpointer-static
  namespace: {{ .root.Release.Namespace | quote }}
{{- end }}
{{- range .root.Values.bindUsers | sortAlpha | uniq }}
- apiGroup: rbac.authorization.k8s.io
  kind: User
  name: {{ . | quote }}
{{- end }}
{{- end }}

{{- define "pod-checkpointer.labels" -}}
app.kubernetes.io/name: pod-checkpointer
{{- end }}
