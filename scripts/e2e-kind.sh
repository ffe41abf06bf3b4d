#!/usr/bin/env bash
# End to end on kind: cluster -> image -> KubeRay operator (Helm) -> tiny CPU job -> watch to
# success -> delete -> the PVC and the checkpoints are still there.
#
#   scripts/e2e-kind.sh            # KEEP_CLUSTER=1 to keep the cluster afterwards
#
# Needs: docker, kind, kubectl, helm, and this project installed (pip install -e .).
set -euo pipefail

CLUSTER=${CLUSTER:-submitter-e2e}
IMAGE=submitter-gpt2:0.1.0  # = submitter.contract.spec.DEFAULT_IMAGE, as in the job file
KUBERAY_VERSION=${KUBERAY_VERSION:-1.7.0}
JOB=e2e-tiny
NS=default
PVC=e2e-checkpoints
NODE_DIR=/data/${PVC}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
export KUBECONFIG=${WORK}/kubeconfig

log() { printf '\n== %s\n' "$*"; }
cleanup() {
  if [[ "${KEEP_CLUSTER:-0}" != 1 ]]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

for tool in docker kind kubectl helm submitter; do
  command -v "$tool" >/dev/null || { echo "missing: $tool" >&2; exit 2; }
done
docker info >/dev/null 2>&1 || { echo "no Docker engine" >&2; exit 2; }

log "kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 120s

log "image $IMAGE"
docker build -t "$IMAGE" "$ROOT"
kind load docker-image "$IMAGE" --name "$CLUSTER"

log "KubeRay operator $KUBERAY_VERSION"
helm repo add kuberay https://ray-project.github.io/kuberay-helm/ >/dev/null
helm repo update kuberay >/dev/null
helm install kuberay-operator kuberay/kuberay-operator --version "$KUBERAY_VERSION" \
  --namespace kuberay-system --create-namespace --wait --timeout 5m

log "a ReadWriteMany volume (hostPath on the single kind node) for the checkpoints"
docker exec "${CLUSTER}-control-plane" sh -c "mkdir -p ${NODE_DIR} && chown 1000:100 ${NODE_DIR}"
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

JOB_FILE=${ROOT}/tests/e2e/tiny-job.yaml  # job e2e-tiny on PVC e2e-checkpoints, image $IMAGE

log "submit (server dry run, then for real; a second identical submit changes nothing)"
submitter submit -f "$JOB_FILE" --dry-run=server
submitter submit -f "$JOB_FILE"
submitter submit -f "$JOB_FILE" | grep -q "rayjob/${JOB} unchanged"

log "watch to success"
submitter watch "$JOB" -n "$NS" --timeout 25m
submitter status "$JOB" -n "$NS"
submitter logs "$JOB" -n "$NS" | tail -n 20

log "delete: the job goes, the PVC and the checkpoints stay"
submitter delete "$JOB" -n "$NS"
if kubectl get rayjob "$JOB" -n "$NS" >/dev/null 2>&1; then echo "RayJob still there" >&2; exit 1; fi
kubectl get pvc "$PVC" -n "$NS"
checkpoints=$(docker exec "${CLUSTER}-control-plane" sh -c "find ${NODE_DIR}/${JOB} -maxdepth 1 -name 'checkpoint_*' | wc -l")
echo "checkpoints kept: ${checkpoints}"
[[ "$checkpoints" -ge 1 ]] || { echo "no checkpoints under ${NODE_DIR}/${JOB}" >&2; exit 1; }

log "e2e passed"
