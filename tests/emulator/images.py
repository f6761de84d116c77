"""The node images the emulators boot from (test and bench support, never product code).

The *stock* image (:func:`emulator.base.stock_image_python`) has a Python >= 3.11 with torch and
Ray and no spotwise, named to the node by ``SPOTWISE_PYTHON`` as a DL image's is found. The GCP
image here is stricter, as GCP's own default (``common-cu124-ubuntu-2204-py310``, Ubuntu 22.04) is:

* its ``python3`` is 3.10 and no ``python3.11``/``3.12``/``3.13`` is installed: a node must install
  one before it can make its venv;
* its ``apt-get`` has empty package lists until ``apt-get update`` (cloud images ship without
  them): ``apt-get install python3.11`` then answers ``E: Unable to locate package python3.11``;
* at first boot cloud-init and unattended-upgrades hold apt's locks for a while: ``apt-get update``
  then fails at once on ``/var/lib/apt/lists/lock`` (``DPkg::Lock::Timeout`` does not apply to it),
  and ``apt-get install`` fails on ``/var/lib/dpkg/lock-frontend`` unless given
  ``-o DPkg::Lock::Timeout=N`` (apt >= 1.9.11), with which it waits. Sources: apt's merge request
  adding the option (salsa.debian.org/apt-team/apt, commit de9762d5), and the reports of the
  lists lock failing ``apt-get update`` on first boot regardless (docker/docker-install#366,
  ChainSafe/forest-iac#290, ipspace/netlab#2473);
* ``apt-get install python3.11 python3.11-venv`` (from jammy-updates) makes ``python3.11`` exist:
  here the stock image's Python, so the node still finds torch and Ray.

Every file lives under the node's own directory; nothing touches the machine's real apt.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

#: what the GCP emulator's nodes boot from
UBUNTU_2204_PY310 = "ubuntu-2204-py310"
#: the image's Python 3.10 (its ``python3``): a real 3.10 where this machine has one
_PY310 = ("/root/.pyenv/versions/3.10.13/bin/python3.10", "/usr/bin/python3.10")

_APT = r'''#!/bin/bash
# Ubuntu 22.04's apt-get as a fresh cloud image has it (tests/emulator/images.py)
R=__ROOT__
now() { date +%s; }
held() { [ -f "$1" ] && [ "$(now)" -lt "$(cat "$1")" ]; }
wait_s=0; args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -o) case "$2" in DPkg::Lock::Timeout=*) wait_s="${2#*=}" ;; esac; shift 2 ;;
    -*) shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "${args[0]:-}" in
  update)
    if held "$R/lists.lock"; then
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1042 (apt-get)" >&2
      echo "E: Unable to lock directory /var/lib/apt/lists/" >&2; exit 100
    fi
    echo "Reading package lists..."; touch "$R/lists.ready"; exit 0 ;;
  install)
    while held "$R/dpkg.lock"; do
      if [ "$wait_s" -le 0 ]; then
        echo "E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1187 (unattended-upgr)" >&2
        echo "E: Unable to acquire the dpkg frontend lock (/var/lib/dpkg/lock-frontend), is another process using it?" >&2
        exit 100
      fi
      echo "Waiting for cache lock: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 1187 (unattended-upgr)"
      sleep 1; wait_s=$((wait_s - 1))
    done
    for p in "${args[@]:1}"; do
      if [ ! -f "$R/lists.ready" ] || ! grep -qx "$p" "$R/archive"; then
        echo "E: Unable to locate package $p" >&2; exit 100
      fi
    done
    for p in "${args[@]:1}"; do
      case "$p" in python3.11) printf '#!/bin/bash\nexec %s "$@"\n' "$(cat "$R/python3.11")" >"$R/bin/python3.11"
                               chmod 755 "$R/bin/python3.11" ;;
      esac
    done
    exit 0 ;;
  *) echo "E: Invalid operation ${args[0]:-}" >&2; exit 100 ;;
esac
'''


def py310_image(root: Path, *, stock_python: Path, lock_s: float = 3.0,
                archive: tuple[str, ...] = ("python3.11", "python3.11-venv")) -> Path:
    """Make the Ubuntu 22.04 image of one node under ``root``; the directory the node's ``PATH``
    starts with. ``lock_s``: how long from now the first-boot locks are
    held; ``archive``: the packages its archive has (once the lists are fetched)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    py310 = next((p for p in _PY310 if os.access(p, os.X_OK)), None) or shutil.which("python3.10")
    assert py310, "the emulated Ubuntu 22.04 image needs a Python 3.10 on this machine"
    (bin_dir / "python3").write_text(f'#!/bin/bash\nexec {py310} "$@"\n')
    for v in ("3.11", "3.12", "3.13"):          # not installed: what a shell says to a missing command
        (bin_dir / f"python{v}").write_text(f'#!/bin/bash\necho "python{v}: command not found" >&2\nexit 127\n')
    (bin_dir / "apt-get").write_text(_APT.replace("__ROOT__", str(root)))
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    (root / "python3.11").write_text(str(stock_python))
    (root / "archive").write_text("".join(f"{p}\n" for p in archive))
    until = str(int(time.time() + lock_s))
    (root / "lists.lock").write_text(until)
    (root / "dpkg.lock").write_text(until)
    return bin_dir
