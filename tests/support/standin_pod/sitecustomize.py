"""kubelet's service-account mount, for a KubeRay stand-in pod (tests/support/kuberay_standin.py).

On this directory's PYTHONPATH, every Python process of a stand-in pod (`ray start`, the raylet's
workers, actors, the driver) finds the kubernetes client's in-cluster files under the pod's own
root ($STANDIN_POD_ROOT/var/run/secrets/kubernetes.io/serviceaccount) instead of the machine's,
and speaks http (the API emulator serves no TLS). Nothing else changes: `load_incluster_config`
still reads KUBERNETES_SERVICE_HOST/PORT and the token file, and a pod whose template does not
mount the token has no file there, exactly as in a cluster. The patch is applied lazily, when
`kubernetes.config.incluster_config` is first imported, so processes that never talk to the API
pay nothing.
"""

import importlib.abc
import importlib.util
import os
import sys

_MODULE = "kubernetes.config.incluster_config"


def _patch(module):
    mount = os.path.join(os.environ["STANDIN_POD_ROOT"], "var/run/secrets/kubernetes.io/serviceaccount")
    module.SERVICE_TOKEN_FILENAME = os.path.join(mount, "token")
    module.SERVICE_CERT_FILENAME = os.path.join(mount, "ca.crt")
    original = module.InClusterConfigLoader._set_config

    def _set_config(self, client_configuration):
        original(self, client_configuration)
        client_configuration.host = client_configuration.host.replace("https://", "http://", 1)

    module.InClusterConfigLoader._set_config = _set_config


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


if os.environ.get("STANDIN_POD_ROOT"):
    sys.meta_path.insert(0, _Finder())
