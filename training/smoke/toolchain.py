"""Before any compiled case: is there a C compiler and Python's headers?

Triton (inductor's GPU backend) builds a small C helper the first time it compiles, with the
compiler in `CC`, else gcc, else clang from PATH (not `cc`), against `Python.h`. A machine with only
Python and pip has neither, and every compiled case would fail deep inside inductor with
"Failed to find C compiler". `toolchain_problem` is pure (fed the facts) and names the package
to install for the distribution the machine runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from typing import Mapping, Optional

#: What Triton looks for on PATH when CC is unset, in its order.
COMPILERS = ("gcc", "clang")

#: The package names by distribution family (/etc/os-release ID or ID_LIKE).
INSTALL = {
    "debian": "apt-get install -y gcc python3-dev",
    "rhel": "dnf install -y gcc python3-devel",
    "fedora": "dnf install -y gcc python3-devel",
    "suse": "zypper install -y gcc python3-devel",
    "alpine": "apk add gcc musl-dev python3-dev",
    "arch": "pacman -S --noconfirm gcc",
}


def distro_family(os_release: Mapping[str, str]) -> Optional[str]:
    """debian | rhel | fedora | suse | alpine | arch from /etc/os-release's ID and ID_LIKE."""
    words = f"{os_release.get('ID', '')} {os_release.get('ID_LIKE', '')}".replace('"', "").lower().split()
    for word in words:
        if word in ("ubuntu", "debian"):
            return "debian"
        if word in ("rhel", "centos", "rocky", "almalinux", "amzn"):
            return "rhel"
        if word in INSTALL:
            return word
        if word.startswith("opensuse") or word == "sles":
            return "suse"
    return None


def install_command(os_release: Mapping[str, str], python_version: str) -> str:
    """The command that installs a C compiler and this Python's headers here."""
    family = distro_family(os_release)
    if family == "debian":  # python3-dev is the distribution's Python; another needs its own
        return f"apt-get install -y gcc python{python_version}-dev"
    return INSTALL.get(family or "", "install a C compiler (gcc or clang) and Python's "
                                     "development headers (Python.h) with your package manager")


def toolchain_problem(compiler: Optional[str], python_h: bool, os_release: Mapping[str, str],
                      python_version: str) -> Optional[str]:
    """One line saying what compiled cases lack and how to install it, or None."""
    lacking = [what for what, ok in (("a C compiler", compiler), ("Python's headers (Python.h)", python_h))
               if not ok]
    if not lacking:
        return None
    return (f"torch.compile (Triton) needs {' and '.join(lacking)}, which this machine lacks: "
            f"{install_command(os_release, python_version)}")


def read_os_release(path: str = "/etc/os-release") -> dict[str, str]:
    try:
        with open(path) as f:
            pairs = (line.strip().split("=", 1) for line in f if "=" in line)
            return {k: v.strip('"') for k, v in pairs}
    except OSError:
        return {}


def find_compiler(environ: Mapping[str, str] = os.environ) -> Optional[str]:
    """The compiler Triton would use: $CC, else the first of COMPILERS on PATH."""
    cc = environ.get("CC")
    if cc:
        return shutil.which(cc)
    return next((p for p in map(shutil.which, COMPILERS) if p), None)


def include_dirs() -> list[str]:
    """Where Triton looks for Python.h: the default install scheme's include directory, with
    Debian's `posix_local` (/usr/local/include/...) read as `posix_prefix` (/usr/include/...),
    as triton/runtime/build.py does; both are tried."""
    dirs = []
    for scheme in (sysconfig.get_default_scheme(), "posix_prefix"):
        try:
            path = sysconfig.get_paths(scheme="posix_prefix" if scheme == "posix_local" else scheme)["include"]
        except KeyError:
            continue
        if path not in dirs:
            dirs.append(path)
    return dirs


def problem_here() -> Optional[str]:
    """`toolchain_problem` for this machine and this Python."""
    headers = any(os.path.exists(os.path.join(d, "Python.h")) for d in include_dirs())
    return toolchain_problem(find_compiler(), headers, read_os_release(),
                             f"{sys.version_info[0]}.{sys.version_info[1]}")
