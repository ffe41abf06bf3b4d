"""A process kubelet: the node of the real control plane `scripts/control-plane up` starts.

It is what a kubelet and a container runtime do, minus images and cgroups, for a single node:

- registers its Node (Ready, an InternalIP on the pod bridge, a pod CIDR) and renews its Lease;
- binds every pending pod that has no node and no scheduling gate to itself (`pods/binding`:
  there is no scheduler) and runs the pods bound to it;
- gives each pod a network namespace with a veth on the bridge and an address of the node's pod
  CIDR (no route out of the subnet: the host does not forward), so the fixed ports KubeRay gives
  every Ray pod never collide, and Endpoints accept the addresses;
- runs each container as a process in that network namespace and a mount namespace of its own,
  where every volume is bind-mounted at its mountPath (emptyDir, configMap, secret, downwardAPI,
  projected service-account tokens from the TokenRequest API, PVCs at their PV's directory,
  hostPath), with the pod's own /tmp, /dev/shm, /etc/hosts, /etc/resolv.conf and hostname;
- init containers first, one after the other, then the containers; exec, httpGet and tcpSocket
  probes with their timing; restart policies; `pods/status` as a kubelet writes it;
- ends a deleted pod as a kubelet does: preStop hooks, SIGTERM, the grace period, SIGKILL, then
  the final delete;
- serves container logs to the API server (`kubectl logs`, `submitter logs`) on :10250;
- answers DNS for Services (`<svc>.<ns>.svc.cluster.local`, with the usual search path) with
  their endpoints' addresses (there is no kube-proxy, so a ClusterIP resolves to its endpoints);
- provisions the default StorageClass's volumes as directories on this machine.

The image: every `image:` maps to this checkout's virtual environment (its `bin` first on PATH)
with what the project's Dockerfile puts in the image (WORKDIR and HOME /home/ray, the GPT-2 BPE
ranks at /opt/submitter/gpt2.tiktoken, PYTHONUNBUFFERED). Not done: images, cgroups (resource
limits are not enforced), users (`runAsUser` is not applied: processes run as root), seccomp,
capabilities, service links other than KUBERNETES_SERVICE_*, ephemeral containers, exec/attach.
"""
