"""The boot step that makes a GPU node's torch use its GPUs, or fails the boot.

Why: a node's venv gets its torch from the image (its site packages stay visible) or, where the
image's Python is too old for spotwise (GCP's ``common-cu124-ubuntu-2204-py310``), from the
package index the wheel's dependencies come from — whatever CUDA build PyPI serves then (a CUDA
12.8 or 13.x one for torch 2.13), chosen without looking at the node's NVIDIA driver. A CUDA 13
torch on a driver 550 (CUDA 12.4) node cannot use the GPUs, and Ray Train would silently train on
the CPU at GPU prices.

The contract of :func:`torch_fit_block` (bash, run after the GPU wait, with ``$VENV``,
``$STATE_DIR`` and ``$NUM_GPUS`` set; ``set -euo pipefail``-safe; nothing when ``NUM_GPUS`` is 0):

1. **The check**, run by ``$VENV/bin/python``: torch imports, ``torch.cuda.is_available()``,
   ``torch.cuda.device_count() >= 1`` and a one-element tensor op runs on ``cuda`` (which also
   catches a build without kernels for this GPU's architecture). At least one GPU, not all that
   ``nvidia-smi`` lists: a build either fits the driver or sees none, so no reinstall could
   make a subset appear; a smaller count (``CUDA_VISIBLE_DEVICES``, a Slurm allocation, a GPU in a
   bad state) is named in the log line and left to Ray. It passes: one log line (torch's version,
   its CUDA, the GPUs it uses, the driver's CUDA version from ``nvidia-smi``'s header) and the
   boot goes on. Torch does not import at all: ``exit 1``.
2. **The refit**, where torch imports but uses no GPU (in a venv spotwise made; where ``$VENV`` is
   the image's own environment, which is never changed, in a fresh venv beside it,
   ``$VENV-spotwise``, that still sees the image's packages and becomes ``$VENV``: the install
   step's ``sw_ours``/``sw_venv``, :data:`~spotwise.provisioner.boot.script.VENV_FUNCTIONS`, which
   every script defines before this one): the driver's CUDA version ``X.Y`` is read
   from ``nvidia-smi``'s header (``CUDA Version: 12.4``). The candidates are the CUDA tags of
   :data:`TORCH_CUDA_TAGS` of major ``X``: those ``<= X.Y`` newest first (the driver's own CUDA,
   then older), then the newer minors of ``X`` nearest first (CUDA's minor-version compatibility:
   a 12.x runtime runs on any 12.y driver >= 525; PyTorch's cu12x wheels rely on it). A candidate
   whose index page (``$TORCH_INDEX/cuNNN/torch/``) lists no wheel of the *same* torch version
   (the venv's, its ``+local`` part dropped) for the venv's Python is skipped at the cost of that
   page; the others are installed, at most :data:`TORCH_FIT_ATTEMPTS` (each a multi-GB
   download), each logged, each followed by the check, the first that passes kept::

       python -m pip install "torch==V+cuNNN" --index-url "$TORCH_INDEX/cuNNN"

   Pinned to the local version ``V+cuNNN``, so pip replaces the installed build (whatever its
   local label) without ``--force-reinstall``. Not ``--no-deps``: a CUDA wheel of torch needs
   the ``nvidia-*`` wheels of its CUDA (cuBLAS, cuDNN, NCCL...), which a build for another CUDA did
   not bring; pip installs the missing ones and keeps the dependencies already satisfied (no
   forced reinstall of sympy, jinja2... that Ray shares). ``--index-url`` alone: the PyTorch index
   of that tag serves torch and those dependencies, so the CUDA libraries come with the build they
   were made for and nothing comes from PyPI (the image's own pip configuration — certificates, a
   proxy, an extra index it names — still applies). ``--no-cache-dir``: the wheel is not kept
   twice on the node's disk.
3. Nothing fits (no CUDA version in ``nvidia-smi``'s header, no listed build of that major,
   every try failed or sees no GPU): ``exit 1`` with one line on stderr naming the driver's CUDA
   version, the torch version and what was tried. A GPU node must never start Ray training on its
   CPU; the orchestrator's join watchdog ends a node whose Ray never joins.

``$TORCH_INDEX`` is :data:`TORCH_INDEX`, or the node's ``SPOTWISE_TORCH_INDEX`` (a mirror; the
tests' ``file://`` index: pip reads ``DIR/cuNNN/torch/index.html`` there, and so does the page
check here). Cloud boot scripts (:mod:`~spotwise.provisioner.boot.script`) and Slurm nodes
(:mod:`~spotwise.provisioner.clouds.slurm.script`) run this one text.
"""

from __future__ import annotations

#: where the node fetches a CUDA build of torch (``SPOTWISE_TORCH_INDEX`` overrides), per tag
#: ``$TORCH_INDEX/cuNNN``
TORCH_INDEX = "https://download.pytorch.org/whl"
#: The CUDA tags of the PyTorch wheel index (``download.pytorch.org/whl/cuNNN``) that torch 2.x
#: releases were built for, newest first: 2.4-2.5 cu118/cu121/cu124, 2.6 cu118/cu124/cu126,
#: 2.7 cu118/cu126/cu128, 2.8 cu126/cu128/cu129, 2.9+ cu126/cu128/cu130 (PyTorch's "previous
#: versions" install page). A tag is major digits then one minor digit. Add a new tag here when
#: PyTorch publishes one; a tag without a build of the node's torch version costs one page fetch.
TORCH_CUDA_TAGS = ("130", "129", "128", "126", "124", "121", "118")
#: builds installed (multi-GB downloads) per boot before the node gives up
TORCH_FIT_ATTEMPTS = 3
#: the bash function :func:`torch_fit_function` defines
FUNCTION = "spotwise_torch_fit"

# Prints "VERSION CUDA GPUS" and exits 0 when torch uses >= 1 GPU, 3 when it uses none, 2 when it
# does not import (its error on stderr: the boot log). In single quotes in bash: none in here.
_PROBE = """import sys
try:
    import torch
except Exception as e:
    print("torch does not import:", repr(e), file=sys.stderr)
    sys.exit(2)
n = 0
try:
    if torch.cuda.is_available() and torch.cuda.device_count() > 0 and torch.ones(1, device="cuda").add(1).item() == 2:
        n = torch.cuda.device_count()
except Exception as e:
    print("torch cannot use CUDA:", repr(e), file=sys.stderr)
print(torch.__version__, torch.version.cuda or "none", n)
sys.exit(0 if n > 0 else 3)"""


def torch_fit_function() -> str:
    """The bash function :data:`FUNCTION`: the check and the refit (see the module's docstring)."""
    assert "'" not in _PROBE
    tags = " ".join(TORCH_CUDA_TAGS)
    n = TORCH_FIT_ATTEMPTS
    return f"""{FUNCTION}() {{
  local index="${{SPOTWISE_TORCH_INDEX:-{TORCH_INDEX}}}" seen="" rc=0 drv="" tv tc tn tv0 tc0 v dmaj dmin t tags="" newer="" list cp page tried="" n=0 fit=""
  index="${{index%/}}"
  torch_probe() {{ seen=$("$VENV/bin/python" -c '{_PROBE}' | tail -n 1); }}
  drv=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\\([0-9][0-9]*\\.[0-9][0-9]*\\).*/\\1/p' | head -n 1) || drv=""
  torch_probe || rc=$?
  read -r tv tc tn _ <<<"$seen"
  if [ "$rc" = 0 ] && [ "${{tn:-0}}" -gt 0 ] 2>/dev/null; then
    echo "spotwise: torch $tv (CUDA $tc) uses $tn GPU(s) of the $NUM_GPUS nvidia-smi lists (driver CUDA ${{drv:-unknown}})"
    return 0
  fi
  if [ "$rc" != 3 ] || [ -z "$tv" ]; then
    echo "spotwise: torch does not work in $VENV on this GPU node (check status $rc; its error is in the boot log)" >&2; exit 1
  fi
  tv0="$tv"; tc0="$tc"; v="${{tv%%+*}}"
  if [ -z "$drv" ]; then
    echo "spotwise: torch $tv0 (CUDA $tc0) uses none of this node's $NUM_GPUS GPU(s) and nvidia-smi names no CUDA version: no build of torch $v can be chosen" >&2; exit 1
  fi
  dmaj="${{drv%%.*}}"; dmin="${{drv#*.}}"
  for t in {tags}; do    # newest first: <= the driver's CUDA newest first, then newer minors nearest first
    [ "${{t%?}}" = "$dmaj" ] || continue
    if [ "${{t#"${{t%?}}"}}" -le "$dmin" ]; then tags="$tags $t"; else newer="$t${{newer:+ $newer}}"; fi
  done
  tags="$tags${{newer:+ $newer}}"; list="${{tags// / cu}}"
  cp=$("$VENV/bin/python" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  echo "spotwise: torch $tv0 (CUDA $tc0) uses none of this node's $NUM_GPUS GPU(s) (driver CUDA $drv); CUDA builds of torch $v to try:${{list:- none}}"
  if ! sw_ours "$VENV"; then
    sw_venv "$VENV/bin/python" "$VENV-spotwise"; VENV="$VENV-spotwise"
    echo "spotwise: the image's venv is left as it is; torch is refitted in $VENV beside it"
  fi
  for t in $tags; do
    [ "$n" -lt {n} ] || break
    page="$index/cu$t/torch/"
    case "$page" in file://*) page="${{page}}index.html" ;; esac
    if ! curl -fsSL --retry 3 --retry-delay 2 -o "$STATE_DIR/torch-index.html" "$page" 2>/dev/null ||
       ! grep -qF -e "torch-$v+cu$t-$cp-" -e "torch-$v%2Bcu$t-$cp-" -e "torch-$v+cu$t-py3-" -e "torch-$v%2Bcu$t-py3-" "$STATE_DIR/torch-index.html"; then
      echo "spotwise: $index/cu$t lists no torch $v for $cp"
      tried="$tried cu$t (not listed)"; continue
    fi
    n=$((n + 1))
    echo "spotwise: installing torch $v+cu$t from $index/cu$t (attempt $n of {n})"
    if ! "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir --index-url "$index/cu$t" "torch==$v+cu$t"; then
      tried="$tried cu$t (install failed)"; continue
    fi
    rc=0; torch_probe || rc=$?
    read -r tv tc tn _ <<<"$seen"
    if [ "$rc" = 0 ] && [ "${{tn:-0}}" -gt 0 ] 2>/dev/null; then fit="cu$t"; break; fi
    echo "spotwise: torch $tv from $index/cu$t uses no GPU either (check status $rc)"
    tried="$tried cu$t (uses no GPU)"
  done
  rm -f "$STATE_DIR/torch-index.html"
  if [ -z "$fit" ]; then
    echo "spotwise: no torch build uses this node's GPUs: driver CUDA $drv, torch $tv0 (CUDA $tc0) uses none; tried from $index:${{tried:- nothing (no CUDA $dmaj.x tag known)}}" >&2; exit 1
  fi
  echo "spotwise: torch $tv (CUDA $tc) uses $tn GPU(s) of the $NUM_GPUS nvidia-smi lists (driver CUDA $drv), installed from $index/$fit"
}}"""


# How many GPUs the node's driver lists (0 where there is no driver): a cloud GPU node polls it
# while its driver comes up (boot/script.py), a Slurm node reads it once (clouds/slurm/script.py).
GPU_COUNT = "nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | wc -l"
# The call, where the function is defined: only a node whose ``$NUM_GPUS`` is above 0 runs it.
CALL = f'if [ "${{NUM_GPUS:-0}}" -gt 0 ]; then {FUNCTION}; fi'


def torch_fit_block() -> str:
    """The function and its call: a node whose ``$NUM_GPUS`` is above 0 runs the check (and the
    refit), one whose count is 0 nothing."""
    return f"{torch_fit_function()}\n{CALL}\n"
