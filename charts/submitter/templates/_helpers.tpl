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

{{/* submitter.namespace: values.namespace; while left at "default", the release namespace (helm -n). */}}
{{- define "submitter.namespace" -}}
{{- if or (not .Values.namespace) (eq .Values.namespace "default") -}}
{{- .Release.Namespace | default "default" -}}
{{- else -}}
{{- .Values.namespace -}}
{{- end -}}
{{- end -}}

{{/* Object names (naming.object_names). */}}
{{- define "submitter.progressName" -}}
{{- printf "%s-progress" (include "submitter.name" .) -}}
{{- end -}}

{{- define "submitter.pvcName" -}}
{{- .Values.existingPvc | default (printf "%s-checkpoints" (include "submitter.name" .)) -}}
{{- end -}}

{{/* submitter.labels (naming.labels), as JSON. */}}
{{- define "submitter.labels" -}}
{{- $name := include "submitter.name" . -}}
{{- dict "app.kubernetes.io/name" "submitter"
         "app.kubernetes.io/instance" $name
         "app.kubernetes.io/managed-by" "submitter"
         "submitter.dev/job" $name | toJson -}}
{{- end -}}

{{/* submitter.metadata: name, namespace and labels of an object. Call: (list $ "<name>"). */}}
{{- define "submitter.metadata" -}}
{{- $root := index . 0 -}}
name: {{ index . 1 | toJson }}
namespace: {{ include "submitter.namespace" $root | toJson }}
labels: {{ include "submitter.labels" $root }}
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
{{- $doc := deepCopy .Values -}}
{{- $_ := set $doc "name" (include "submitter.name" .) -}}
{{- $_ := set $doc "namespace" (include "submitter.namespace" .) -}}
{{- toJson $doc -}}
{{- end -}}

{{/* submitter.env (render.context "env"): the Ray containers' environment, as JSON. */}}
{{- define "submitter.env" -}}
{{- $env := list (dict "name" "PYTHONUNBUFFERED" "value" "1")
                 (dict "name" "SUBMITTER_PROGRESS_CONFIGMAP" "value" (include "submitter.progressName" .))
                 (dict "name" "SUBMITTER_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) -}}
{{- range $key := keys (.Values.env | default dict) | sortAlpha -}}
{{- $env = append $env (dict "name" $key "value" (get $.Values.env $key)) -}}
{{- end -}}
{{- toJson $env -}}
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
