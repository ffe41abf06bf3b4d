{{/*
Helpers of the submitter chart: names, labels and the job document. The chart holds little
logic: values pass through to the objects (toJson: JSON is YAML, so no value can add or change
a key), and the settings reach the pod as data, the job document in env SUBMITTER_JOB, which
`python -m training` validates (storage policy included) before it trains.
tests/submitter/test_helm_chart.py renders this chart with Helm's own Go code and holds it,
object by object, to `submitter render`.
*/}}

{{/*
submitter.name: values.name, or the release name when empty. A release name skips the values
schema, so it is checked here: DNS-1035, at most 47 characters (KubeRay derives longer names).
*/}}
{{- define "submitter.name" -}}
{{- $name := .Values.name | default .Release.Name -}}
{{- if gt (len $name) 47 -}}
{{- fail (printf "name %q is %d characters; KubeRay allows at most 47: set name=<a shorter job name>" $name (len $name)) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $name) -}}
{{- fail (printf "name %q is not a valid name: use lower-case letters, digits and '-', starting with a letter and ending with a letter or digit" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* submitter.namespace: the release namespace (helm -n), as for any chart. A values.namespace
     other than "default" (`render -n X --helm-values`) must name the same one: a values file
     never moves the objects out of the release's namespace, it fails with the fix instead. */}}
{{- define "submitter.namespace" -}}
{{- $release := .Release.Namespace | default "default" -}}
{{- if and .Values.namespace (ne .Values.namespace "default") (ne .Values.namespace $release) -}}
{{- fail (printf "the values say namespace %q but the release is in %q: install with helm -n %s, or leave namespace out of the values (helm -n decides)" .Values.namespace $release .Values.namespace) -}}
{{- end -}}
{{- $release -}}
{{- end -}}

{{/* Object names (naming.object_names). */}}
{{- define "submitter.progressName" -}}
{{- printf "%s-progress" (include "submitter.name" .) -}}
{{- end -}}

{{- define "submitter.pvcName" -}}
{{- .Values.existingPvc | default (printf "%s-checkpoints" (include "submitter.name" .)) -}}
{{- end -}}

{{/* submitter.labels (naming.labels plus values.label; the job's own win), as JSON. */}}
{{- define "submitter.labels" -}}
{{- $name := include "submitter.name" . -}}
{{- $labels := deepCopy (.Values.label | default dict) -}}
{{- $_ := set $labels "app.kubernetes.io/name" "submitter" -}}
{{- $_ := set $labels "app.kubernetes.io/instance" $name -}}
{{- $_ := set $labels "app.kubernetes.io/managed-by" "submitter" -}}
{{- $_ := set $labels "submitter.dev/job" $name -}}
{{- toJson $labels -}}
{{- end -}}

{{/* submitter.annotations (naming.annotations plus values.annotation): the job uid is
     sha256("<namespace>/<name>"), its first 16 hex digits. As JSON. */}}
{{- define "submitter.annotations" -}}
{{- $uid := printf "%s/%s" (include "submitter.namespace" .) (include "submitter.name" .) | sha256sum | trunc 16 -}}
{{- $annotations := deepCopy (.Values.annotation | default dict) -}}
{{- $_ := set $annotations "submitter.dev/job-uid" $uid -}}
{{- toJson $annotations -}}
{{- end -}}

{{/* submitter.metadata: name, namespace, labels and annotations of an object. Call: (list $ "<name>"). */}}
{{- define "submitter.metadata" -}}
{{- $root := index . 0 -}}
name: {{ index . 1 | toJson }}
namespace: {{ include "submitter.namespace" $root | toJson }}
labels: {{ include "submitter.labels" $root }}
annotations: {{ include "submitter.annotations" $root }}
{{- end -}}

{{/* submitter.serviceAccount: values.serviceAccount (an existing one), else the job's own. */}}
{{- define "submitter.serviceAccount" -}}
{{- .Values.serviceAccount | default (include "submitter.progressName" .) -}}
{{- end -}}

{{/* submitter.image (JobSpec.resolved_image): values.image, else the project's CPU image, or
     its -gpu variant for a GPU job, pinned to the chart's appVersion. */}}
{{- define "submitter.image" -}}
{{- if .Values.image -}}
{{- .Values.image -}}
{{- else -}}
{{- printf "ghcr.io/submitter-dev/submitter-gpt2:%s%s" .Chart.AppVersion (ternary "-gpu" "" (gt (int64 .Values.gpuPerPod) 0)) -}}
{{- end -}}
{{- end -}}

{{/* submitter.imagePullPolicy (JobSpec.resolved_image_pull_policy): values.imagePullPolicy,
     else Always for a mutable tag (latest or none, no digest), else IfNotPresent. */}}
{{- define "submitter.imagePullPolicy" -}}
{{- if .Values.imagePullPolicy -}}
{{- .Values.imagePullPolicy -}}
{{- else -}}
{{- $image := include "submitter.image" . -}}
{{- $last := regexReplaceAll "^.*/" $image "" -}}
{{- if and (not (contains "@" $image)) (or (not (contains ":" $last)) (hasSuffix ":latest" $last)) -}}
Always
{{- else -}}
IfNotPresent
{{- end -}}
{{- end -}}
{{- end -}}

{{/* submitter.toleration: "KEY[=VALUE]:EFFECT" (checked by the values schema) as a toleration
     (spec.parse_toleration). */}}
{{- define "submitter.toleration" -}}
{{- $effect := regexReplaceAll "^.*:" . "" -}}
{{- $kv := regexReplaceAll ":[^:]*$" . "" -}}
{{- if contains "=" $kv -}}
{{- $parts := splitn "=" 2 $kv -}}
{{- dict "key" $parts._0 "operator" "Equal" "value" $parts._1 "effect" $effect | toJson -}}
{{- else -}}
{{- dict "key" $kv "operator" "Exists" "effect" $effect | toJson -}}
{{- end -}}
{{- end -}}

{{/* submitter.pod (render.pod_settings): the pod-level settings of one pod template, as JSON.
     Call: (list $ "head"|"worker"|"submitter"). */}}
{{- define "submitter.pod" -}}
{{- $root := index . 0 -}}
{{- $role := index . 1 -}}
{{- $v := $root.Values -}}
{{- $gpuWorker := and (eq $role "worker") (gt (int64 $v.gpuPerPod) 0) -}}
{{- $out := dict "serviceAccountName" (include "submitter.serviceAccount" $root) "automountServiceAccountToken" (eq $role "head") -}}
{{- if ne $role "submitter" -}}
{{- $_ := set $out "terminationGracePeriodSeconds" (int64 $v.terminationGracePeriod) -}}
{{- end -}}
{{- $nodeSelector := deepCopy ($v.nodeSelector | default dict) -}}
{{- if and $gpuWorker $v.gpuType -}}
{{- $_ := set $nodeSelector $v.gpuTypeLabel $v.gpuType -}}
{{- end -}}
{{- if $nodeSelector -}}{{- $_ := set $out "nodeSelector" $nodeSelector -}}{{- end -}}
{{- $tolerations := list -}}
{{- range ($v.toleration | default list) -}}
{{- $tolerations = append $tolerations (include "submitter.toleration" . | fromJson) -}}
{{- end -}}
{{- if and $gpuWorker $v.gpuToleration -}}
{{- $tolerations = append $tolerations (include "submitter.toleration" $v.gpuToleration | fromJson) -}}
{{- end -}}
{{- if $tolerations -}}{{- $_ := set $out "tolerations" $tolerations -}}{{- end -}}
{{- if $v.priorityClass -}}{{- $_ := set $out "priorityClassName" $v.priorityClass -}}{{- end -}}
{{- if $v.runtimeClass -}}{{- $_ := set $out "runtimeClassName" $v.runtimeClass -}}{{- end -}}
{{- $secrets := list -}}
{{- range ($v.imagePullSecret | default list) -}}
{{- $secrets = append $secrets (dict "name" .) -}}
{{- end -}}
{{- if $secrets -}}{{- $_ := set $out "imagePullSecrets" $secrets -}}{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* submitter.envFrom: values.envFromSecret as envFrom entries, as JSON. */}}
{{- define "submitter.envFrom" -}}
{{- $out := list -}}
{{- range (.Values.envFromSecret | default list) -}}
{{- $out = append $out (dict "secretRef" (dict "name" .)) -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/*
submitter.onPvc: "true" unless storagePath is an object-store URI, whose checkpoints need no
volume. (Whether a path is durable is the pod's check, with the reason and the fix.)
*/}}
{{- define "submitter.onPvc" -}}
{{- $path := .Values.storagePath | default "" -}}
{{- if or (hasPrefix "file://" $path) (not (regexMatch "^[a-z0-9+.-]+://[^/]" $path)) -}}true{{- end -}}
{{- end -}}

{{/* submitter.document: the job document (JobSpec.document): the values, name and namespace resolved. */}}
{{- define "submitter.document" -}}
{{- $doc := omit (deepCopy .Values) "code" -}}
{{- $_ := set $doc "name" (include "submitter.name" .) -}}
{{- $_ := set $doc "namespace" (include "submitter.namespace" .) -}}
{{- toJson $doc -}}
{{- end -}}

{{/* submitter.env (render.context "env"): the Ray containers' environment, as JSON. */}}
{{- define "submitter.env" -}}
{{- include "submitter.envWith" (list . (.Values.env | default dict)) -}}
{{- end -}}

{{/* GPU workers: NCCL's socket transport tuned for pod networks, unless env/secretEnv sets it
     (submitter/contract/pod_network.py holds the same values). */}}
{{- define "submitter.workerEnv" -}}
{{- $plain := deepCopy (.Values.env | default dict) -}}
{{- $secret := .Values.secretEnv | default dict -}}
{{- if gt (int64 .Values.gpuPerPod) 0 -}}
{{- range $key, $value := dict "NCCL_NSOCKS_PERTHREAD" "4" "NCCL_SOCKET_NTHREADS" "4" -}}
{{- if not (or (hasKey $plain $key) (hasKey $secret $key)) -}}
{{- $_ := set $plain $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- include "submitter.envWith" (list . $plain) -}}
{{- end -}}

{{/* A Ray container's env: the pod's own variables, the given plain ones (sorted), the secret ones. */}}
{{- define "submitter.envWith" -}}
{{- $root := index . 0 -}}
{{- $plain := index . 1 -}}
{{- with $root -}}
{{- $env := list (dict "name" "PYTHONUNBUFFERED" "value" "1")
                 (dict "name" "SUBMITTER_PROGRESS_CONFIGMAP" "value" (include "submitter.progressName" .))
                 (dict "name" "SUBMITTER_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) -}}
{{- range $key := keys $plain | sortAlpha -}}
{{- $env = append $env (dict "name" $key "value" (get $plain $key)) -}}
{{- end -}}
{{- range $key := keys (.Values.secretEnv | default dict) | sortAlpha -}}
{{- $ref := splitn ":" 2 (get $root.Values.secretEnv $key) -}}
{{- $env = append $env (dict "name" $key "valueFrom" (dict "secretKeyRef" (dict "name" $ref._0 "key" $ref._1))) -}}
{{- end -}}
{{- toJson $env -}}
{{- end -}}
{{- end -}}

{{/* The checkpoint PVC on every Ray pod (unless an object store), and /dev/shm in memory. */}}
{{- define "submitter.volumeMounts" -}}
{{- $mounts := list -}}
{{- if include "submitter.onPvc" . -}}
{{- $mounts = list (dict "name" "checkpoints" "mountPath" .Values.storageMount) -}}
{{- end -}}
{{- append $mounts (dict "name" "dshm" "mountPath" "/dev/shm") | toJson -}}
{{- end -}}

{{- define "submitter.volumes" -}}
{{- $volumes := list -}}
{{- if include "submitter.onPvc" . -}}
{{- $volumes = list (dict "name" "checkpoints" "persistentVolumeClaim" (dict "claimName" (include "submitter.pvcName" .))) -}}
{{- end -}}
{{- append $volumes (dict "name" "dshm" "emptyDir" (dict "medium" "Memory")) | toJson -}}
{{- end -}}

{{/* Restricted pod security (manifests/rayjob.yaml.j2): non-root, no escalation, drop ALL. */}}
{{- define "submitter.podSecurityContext" -}}
{"runAsNonRoot": true, "runAsUser": 1000, "runAsGroup": 100, "fsGroup": 100, "seccompProfile": {"type": "RuntimeDefault"}}
{{- end -}}

{{- define "submitter.containerSecurityContext" -}}
{"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}
{{- end -}}
