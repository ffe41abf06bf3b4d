"""`python -m tests.support.kubelet DIR`: the node of the control plane `scripts/control-plane up DIR` started."""

import sys
from pathlib import Path

from tests.support.kubelet.node import main

main(Path(sys.argv[1]).resolve())
