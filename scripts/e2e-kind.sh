#!/usr/bin/env bash
# End to end on kind, as on a 4-vCPU GitHub runner: cluster -> image (docker save + kind load
# image-archive) -> KubeRay operator (Helm) -> tiny CPU job -> a worker pod deleted mid-run ->
# the job still succeeds from its last checkpoint -> delete -> the PVC and the checkpoints stay.
#
#   scripts/e2e-kind.sh        # KEEP_CLUSTER=1 keeps the cluster; LOGS_DIR=... where logs go on failure
#
# Needs: docker, kind, kubectl, helm, and this project installed (pip install -e .).
set -euo pipefail

CLUSTER=${CLUSTER:-submitter-e2e}
IMAGE=submitter-gpt2:e2e  # = tests/e2e/tiny-job.yaml's image (imagePullPolicy: Never)
KUBERAY_VERSION=${KUBERAY_VERSION:-1.7.0}
JOB=e2e-tiny
NS=default
PVC=e2e-checkpoints
NODE=${CLUSTER}-control-plane
NODE_DIR=/data/${PVC}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOGS_DIR=${LOGS_DIR:-${ROOT}/kind-logs}
JOB_FILE=${ROOT}/tests/e2e/tiny-job.yaml
WORK=$(mktemp -d)
export KUBECONFIG=${WORK}/kubeconfig

log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { echo "e2e FAILED: $*" >&2; exit 1; }
on_exit() {
  local rc=$?
  if [[ $rc -ne 0 ]] && kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "failure (exit $rc): cluster state and logs to ${LOGS_DIR}"
    mkdir -p "$LOGS_DIR"
    { kubectl get rayjobs,rayclusters,pods,pvc,networkpolicies -A -o wide
      kubectl describe rayjob "$JOB" -n "$NS"
      kubectl get events -A --sort-by=.lastTimestamp; } >"${LOGS_DIR}/state.txt" 2>&1 || true
    submitter logs "$JOB" -n "$NS" >"${LOGS_DIR}/job.log" 2>&1 || true
    docker exec "$NODE" sh -c "find ${NODE_DIR} -name events.jsonl -exec cat {} +" \
      >"${LOGS_DIR}/events.jsonl" 2>/dev/null || true
    kind export logs "${LOGS_DIR}/kind" --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
  exit $rc
}
trap on_exit EXIT

for tool in docker kind kubectl helm submitter; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "no Docker engine" >&2; exit 2; }
df -h / | tail -n 1

log "kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 180s

log "image $IMAGE (CPU target)"
docker build --target cpu -t "$IMAGE" "$ROOT"
# kind's load of a docker-image fails with Docker's containerd image store ("content digest ... not
# found", kind#3795); an archive works with every store. Removed at once: disk is scarce.
docker save "$IMAGE" -o "${WORK}/image.tar"
kind load image-archive "${WORK}/image.tar" --name "$CLUSTER"
rm -f "${WORK}/image.tar"
df -h / | tail -n 1

log "KubeRay operator $KUBERAY_VERSION"
helm repo add kuberay https://ray-project.github.io/kuberay-helm/ >/dev/null
helm repo update kuberay >/dev/null
helm install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
  --namespace kuberay-system --create-namespace --wait --timeout 5m

log "a ReadWriteMany volume (hostPath on the single kind node) for the checkpoints"
docker exec "$NODE" sh -c "mkdir -p ${NODE_DIR} && chown 1000:100 ${NODE_DIR}"
kubectl apply -f - <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: ${PVC}}
spec:
  capacity: {storage: 1Gi}
  accessModes: [ReadWriteMany]
  storageClassName: ""
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: ${NODE_DIR}, type: Directory}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: ${PVC}, namespace: ${NS}}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: ""
  volumeName: ${PVC}
  resources: {requests: {storage: 1Gi}}
YAML

log "submit (server dry run, then for real)"
submitter submit -f "$JOB_FILE" --dry-run=server
submitter submit -f "$JOB_FILE"

log "a second identical submit changes nothing (the spec's generation, not the resourceVersion: the operator writes status)"
generation=$(kubectl get rayjob "$JOB" -n "$NS" -o jsonpath='{.metadata.generation}')
submitter submit -f "$JOB_FILE"
[[ "$(kubectl get rayjob "$JOB" -n "$NS" -o jsonpath='{.metadata.generation}')" == "$generation" ]] \
  || fail "the second submit changed the RayJob's spec"

log "wait for the first checkpoint, then delete a worker pod mid-run"
checkpoints() { docker exec "$NODE" sh -c "find ${NODE_DIR} -maxdepth 3 -type d -name 'checkpoint_*' | wc -l"; }
deadline=$((SECONDS + 900))
until [[ "$(checkpoints)" -ge 1 ]]; do
  ((SECONDS < deadline)) || fail "no checkpoint within 15 minutes"
  state=$(kubectl get rayjob "$JOB" -n "$NS" -o jsonpath='{.status.jobStatus}' 2>/dev/null || true)
  [[ "$state" != SUCCEEDED && "$state" != FAILED ]] || fail "job ended ($state) before the first checkpoint: lengthen it"
  sleep 2
done
worker=$(kubectl get pods -n "$NS" -l "submitter.dev/job=${JOB},ray.io/node-type=worker" \
  -o jsonpath='{.items[0].metadata.name}')
[[ -n "$worker" ]] || fail "no worker pod to delete"
kubectl delete pod "$worker" -n "$NS" --wait=false
echo "deleted worker pod ${worker} after $(checkpoints) checkpoint(s)"
state=$(kubectl get rayjob "$JOB" -n "$NS" -o jsonpath='{.status.jobStatus}')
[[ "$state" == RUNNING ]] || fail "the job was ${state:-not running} when the worker was deleted: lengthen it"

log "watch to success (KubeRay recreates the worker; Ray Train restarts from the checkpoint)"
submitter watch "$JOB" -n "$NS" --timeout 20m
submitter status "$JOB" -n "$NS"
events=$(docker exec "$NODE" sh -c "find ${NODE_DIR} -name events.jsonl -exec cat {} +")
grep -q '"worker_group_restarted"' <<<"$events" || fail "no worker_group_restarted event after the kill"
grep '"worker_group_restarted"' <<<"$events" | grep -qv '"resumed_from": *null' \
  || fail "the restarted worker group did not resume from a checkpoint"

log "delete: the job goes, the PVC and the checkpoints stay"
submitter delete "$JOB" -n "$NS"
# KubeRay's finalizer keeps the RayJob until its cluster is gone: wait for the deletion itself.
kubectl wait --for=delete "rayjob/${JOB}" -n "$NS" --timeout=180s
kubectl get pvc "$PVC" -n "$NS"
echo "checkpoints kept: $(checkpoints)"
[[ "$(checkpoints)" -ge 1 ]] || fail "no checkpoints under ${NODE_DIR}"

log "e2e passed"
