{{/*
Helpers of the submitter chart. Each one reproduces a function of submitter/render.py or
submitter/storage.py (named in its comment); tests/test_helm_chart.py renders this chart with
Helm's own Go code and holds it, object by object, to `submitter render`.

Like manifests/*.yaml.j2, the templates build data and print every value with toJson (JSON
is YAML), so no value can add or change a key. Helpers that return data return JSON text:
callers read it back with fromJson.
*/}}

{{/*
submitter.name: the job name (JobSpec.name): values.name, or the release name when empty.
Checked like JobSpec, since a release name skips the values schema: DNS-1035, at most 47
characters (KubeRay derives longer names from it).
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

{{/*
submitter.namespace: values.namespace; while it is left at JobSpec's default ("default"), the
release namespace (helm -n), so `helm install -n team-a` puts the job in team-a.
*/}}
{{- define "submitter.namespace" -}}
{{- if or (not .Values.namespace) (eq .Values.namespace "default") -}}
{{- .Release.Namespace | default "default" -}}
{{- else -}}
{{- .Values.namespace -}}
{{- end -}}
{{- end -}}

{{/* Object names (render.names): a 63-character cap, as Kubernetes names and labels have. */}}
{{- define "submitter.progressName" -}}
{{- printf "%s-progress" (include "submitter.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "submitter.pvcName" -}}
{{- if .Values.existingPvc -}}
{{- .Values.existingPvc -}}
{{- else -}}
{{- printf "%s-checkpoints" (include "submitter.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* submitter.labels (render.labels), as JSON. managed-by is submitter, as with `submitter apply`. */}}
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
Scalars printed the way Python's str() prints them, so both renderers build the same text.
submitter.str: a quantity or env value, given as a string or (from YAML/--set) an integer.
*/}}
{{- define "submitter.str" -}}
{{- if kindIs "string" . -}}{{ . }}{{- else -}}{{ int64 . }}{{- end -}}
{{- end -}}

{{/*
submitter.pyFloat: a float as Python's repr() prints it (render passes repr(learning_rate)).
Go's %v gives the same shortest digits, but switches to an exponent from 1e+06 (Python from
1e+16) and drops ".0" from whole numbers: those two cases are rewritten here.
*/}}
{{- define "submitter.pyFloat" -}}
{{- $s := printf "%v" (float64 .) -}}
{{- if contains "e" $s -}}
  {{- $mantissa := index (splitList "e" $s) 0 -}}
  {{- $exp := index (splitList "e" $s) 1 | atoi -}}
  {{- if and (ge $exp 6) (lt $exp 16) -}}
    {{- /* d.ddde+XX -> fixed notation: the point moves XX digits right. */ -}}
    {{- $digits := replace "." "" $mantissa -}}
    {{- $point := add $exp 1 | int -}}
    {{- if le (len $digits) $point -}}
      {{- $digits }}{{ repeat (int (sub $point (len $digits))) "0" }}.0
    {{- else -}}
      {{- substr 0 $point $digits }}.{{ substr $point (len $digits) $digits -}}
    {{- end -}}
  {{- else -}}
    {{- $s -}}
  {{- end -}}
{{- else if contains "." $s -}}
  {{- $s -}}
{{- else -}}
  {{- $s }}.0
{{- end -}}
{{- end -}}

{{/*
Path helpers (posixpath semantics, as storage.py uses).
submitter.normpath: posixpath.normpath of an absolute path. Go's clean differs only in keeping
no leading "//" (POSIX lets exactly two leading slashes mean something else, Python keeps them).
*/}}
{{- define "submitter.normpath" -}}
{{- if and (hasPrefix "//" .) (not (hasPrefix "///" .)) -}}/{{- end -}}
{{- clean . -}}
{{- end -}}

{{/* submitter.isUnder (storage._is_under): "true" when path (index . 0) is root (index . 1) or below it. */}}
{{- define "submitter.isUnder" -}}
{{- $path := index . 0 -}}
{{- $root := index . 1 -}}
{{- if or (eq $path $root) (hasPrefix (printf "%s/" (regexReplaceAll "/+$" $root "")) $path) -}}true{{- end -}}
{{- end -}}

{{/* submitter.mount (storage.check_mount): the normalized PVC mount point, or fail. */}}
{{- define "submitter.mount" -}}
{{- $mount := .Values.storageMount -}}
{{- if not (hasPrefix "/" $mount) -}}
{{- fail (printf "storageMount %q is not absolute; use e.g. /mnt/checkpoints" $mount) -}}
{{- end -}}
{{- $norm := include "submitter.normpath" $mount -}}
{{- $system := has $norm (list "/" "/tmp" "/var/tmp" "/dev" "/dev/shm" "/proc" "/sys" "/etc" "/home" "/root" "/usr" "/bin" "/lib" "/opt" "/var" "/run") -}}
{{- range list "/tmp" "/var/tmp" "/dev" "/proc" "/sys" -}}
{{- if include "submitter.isUnder" (list $norm .) -}}{{- $system = true -}}{{- end -}}
{{- end -}}
{{- if $system -}}
{{- fail (printf "storageMount %q is a system or scratch directory; mount the PVC on a dedicated path such as /mnt/checkpoints" $mount) -}}
{{- end -}}
{{- $norm -}}
{{- end -}}

{{/*
submitter.storage (render.storage_decision + storage.check_cluster_storage): where Ray Train
writes, as JSON {"kind": "object-store"|"shared-mount", "path": ...}. Fails, naming the fix, on
any path that would not outlive the job: relative, ~, /tmp, Ray's default results directory,
outside the mount, local://, file:// outside the mount; and on a PVC that is not ReadWriteMany.
*/}}
{{- define "submitter.storage" -}}
{{- $mount := include "submitter.mount" . -}}
{{- $path := .Values.storageMount -}}
{{- if not (kindIs "invalid" .Values.storagePath) -}}{{- $path = .Values.storagePath -}}{{- end -}}
{{- $fix := printf "use a path under the shared mount, e.g. %s/runs, or s3://bucket/runs" $mount -}}
{{- /* urllib.parse.urlsplit: a scheme is letters, digits, + - . up to the first ":". */ -}}
{{- $scheme := "" -}}
{{- if contains "://" $path -}}
{{- $scheme = regexFind "^[a-zA-Z][a-zA-Z0-9+.-]*:" $path | trimSuffix ":" | lower -}}
{{- end -}}
{{- $rest := $path -}}
{{- if $scheme -}}{{- $rest = substr (len $scheme | add1 | int) (len $path) $path -}}{{- end -}}
{{- $netloc := "" -}}
{{- if hasPrefix "//" $rest -}}{{- $netloc = regexFind "^//[^/?#]*" $rest | trimPrefix "//" -}}{{- end -}}
{{- $urlPath := trimPrefix (printf "//%s" $netloc) $rest -}}
{{- $decision := dict -}}
{{- if has $scheme (list "s3" "s3a" "gs" "gcs" "abfs" "abfss" "az" "adl" "hdfs" "viewfs" "oss" "cos") -}}
  {{- if not $netloc -}}
  {{- fail (printf "storagePath %q names no bucket; use e.g. %s://bucket/runs" $path $scheme) -}}
  {{- end -}}
  {{- $decision = dict "kind" "object-store" "path" $path -}}
{{- else if eq $scheme "file" -}}
  {{- $local := include "submitter.normpath" ($urlPath | default "/") -}}
  {{- if or $netloc (not (include "submitter.isUnder" (list $local $mount))) -}}
  {{- fail (printf "storagePath %q is a file:// path outside the shared mount %s: it lives on the pod's own disk and is deleted with the pod; use %s/... or s3://..." $path $mount $mount) -}}
  {{- end -}}
  {{- $decision = dict "kind" "shared-mount" "path" $local -}}
{{- else if eq $scheme "local" -}}
  {{- fail (printf "storagePath %q: local:// is each node's own disk, so workers' checkpoints are scattered and deleted with the pods; use %s/... or s3://bucket/runs" $path $mount) -}}
{{- else if $scheme -}}
  {{- fail (printf "storagePath %q: unsupported scheme %s://; use an object store (s3://, gs://, abfss://, ...) or a path under %s" $path $scheme $mount) -}}
{{- else -}}
  {{- /* storage._refuse_ephemeral_text, then the mount. */ -}}
  {{- if hasPrefix "~" $path -}}
  {{- fail (printf "storagePath %q starts with '~', which Ray and the pod do not expand (and a home directory is not durable in a pod); %s" $path $fix) -}}
  {{- end -}}
  {{- if not (hasPrefix "/" $path) -}}
  {{- fail (printf "storagePath %q is relative; Ray Train fails on relative paths deep inside a run; %s" $path $fix) -}}
  {{- end -}}
  {{- $norm := include "submitter.normpath" $path -}}
  {{- range list "/home/ray/ray_results" "/root/ray_results" -}}
  {{- if include "submitter.isUnder" (list $norm .) -}}
  {{- fail (printf "storagePath %q is Ray's default results directory on the pod's ephemeral disk; %s" $path $fix) -}}
  {{- end -}}
  {{- end -}}
  {{- range list "/tmp" "/var/tmp" "/dev/shm" -}}
  {{- if include "submitter.isUnder" (list $norm .) -}}
  {{- fail (printf "storagePath %q is under %s, which is scratch space that does not survive a restart; %s" $path . $fix) -}}
  {{- end -}}
  {{- end -}}
  {{- if not (include "submitter.isUnder" (list $norm $mount)) -}}
  {{- fail (printf "storagePath %q is outside the shared mount %s: it would live on the pod's own disk, which KubeRay deletes after the job; use %s/... (or move the mount with storageMount), or s3://bucket/runs" $path $mount $mount) -}}
  {{- end -}}
  {{- $decision = dict "kind" "shared-mount" "path" $norm -}}
{{- end -}}
{{- if and (eq $decision.kind "shared-mount") (ne .Values.storageAccessMode "ReadWriteMany") -}}
{{- fail (printf "storageAccessMode %s lets only one node mount the volume, but the Ray head and every worker write checkpoints; use a ReadWriteMany StorageClass (NFS, EFS, Filestore, CephFS...) or an object-store storagePath (s3://, gs://)" .Values.storageAccessMode) -}}
{{- end -}}
{{- toJson $decision -}}
{{- end -}}

{{/* submitter.int: an integer value (float64 when it came from YAML or JSON) as digits. */}}
{{- define "submitter.int" -}}
{{- int64 . -}}
{{- end -}}

{{/*
submitter.entrypoint (render.training_args joined by spaces): the `python -m training` command.
The values schema admits only shell-safe text for these fields, so nothing needs quoting.
*/}}
{{- define "submitter.entrypoint" -}}
{{- $v := .Values -}}
{{- $storage := include "submitter.storage" . | fromJson -}}
{{- $replicas := int64 $v.replicas -}}
{{- $gpus := int64 $v.gpuPerPod -}}
{{- $workers := $replicas -}}
{{- if gt $gpus 0 -}}{{- $workers = mul $replicas $gpus -}}{{- end -}}
{{- $lr := float64 $v.learningRate -}}
{{- if not (gt $lr 0.0) -}}
{{- fail (printf "learningRate must be a positive number, got %v" $v.learningRate) -}}
{{- end -}}
{{- $args := list "python" "-m" "training"
                  "--name" (include "submitter.name" .)
                  "--storage-path" $storage.path
                  "--num-workers" (toString $workers) -}}
{{- if gt $gpus 0 -}}{{- $args = append $args "--use-gpu" -}}{{- end -}}
{{- $args = concat $args (list "--model" $v.model
                               "--epochs" (include "submitter.int" $v.epochs)
                               "--batch-size-per-worker" (include "submitter.int" $v.batchSizePerWorker)
                               "--learning-rate" (include "submitter.pyFloat" $lr)
                               "--max-failures" (include "submitter.int" $v.maxFailures)
                               "--num-to-keep" (include "submitter.int" $v.numToKeep)
                               "--seed" (include "submitter.int" $v.seed)) -}}
{{- if not (kindIs "invalid" $v.maxStepsPerEpoch) -}}
{{- $args = concat $args (list "--max-steps-per-epoch" (include "submitter.int" $v.maxStepsPerEpoch)) -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.data) -}}
{{- $args = concat $args (list "--data" $v.data) -}}
{{- else -}}
{{- $args = concat $args (list "--dataset" $v.dataset) -}}
{{- if not (kindIs "invalid" $v.datasetConfig) -}}
{{- $args = concat $args (list "--dataset-config" $v.datasetConfig) -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "invalid" $v.bpeFile) -}}
{{- $args = concat $args (list "--bpe-file" $v.bpeFile) -}}
{{- end -}}
{{- if $v.fsdp -}}{{- $args = append $args "--fsdp" -}}{{- end -}}
{{- if $v.allowEphemeralStorage -}}{{- $args = append $args "--allow-ephemeral-storage" -}}{{- end -}}
{{- join " " $args -}}
{{- end -}}

{{/* submitter.env (render.context "env"): the Ray containers' environment, as JSON. */}}
{{- define "submitter.env" -}}
{{- $env := list (dict "name" "PYTHONUNBUFFERED" "value" "1")
                 (dict "name" "SUBMITTER_PROGRESS_CONFIGMAP" "value" (include "submitter.progressName" .))
                 (dict "name" "SUBMITTER_NAMESPACE" "valueFrom" (dict "fieldRef" (dict "fieldPath" "metadata.namespace"))) -}}
{{- $user := .Values.env | default dict -}}
{{- range $key := keys $user | sortAlpha -}}
{{- $env = append $env (dict "name" $key "value" (include "submitter.str" (get $user $key))) -}}
{{- end -}}
{{- toJson $env -}}
{{- end -}}

{{/*
The checkpoint PVC is mounted at the same path on the head and every worker; an object-store
storagePath needs no PVC. /dev/shm is a memory volume for Ray's object store. Both as JSON.
*/}}
{{- define "submitter.volumeMounts" -}}
{{- $mounts := list -}}
{{- if eq (include "submitter.storage" . | fromJson).kind "shared-mount" -}}
{{- $mounts = list (dict "name" "checkpoints" "mountPath" .Values.storageMount) -}}
{{- end -}}
{{- append $mounts (dict "name" "dshm" "mountPath" "/dev/shm") | toJson -}}
{{- end -}}

{{- define "submitter.volumes" -}}
{{- $volumes := list -}}
{{- if eq (include "submitter.storage" . | fromJson).kind "shared-mount" -}}
{{- $claim := dict "claimName" (include "submitter.pvcName" .) -}}
{{- $volumes = list (dict "name" "checkpoints" "persistentVolumeClaim" $claim) -}}
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
