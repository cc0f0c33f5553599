#!/usr/bin/env bash
# Test the Arm (aarch64 NEON) build of dflash/engine/csrc on an x86-64 Debian 12 machine: a
# cross compiler builds it, qemu-user runs an aarch64 Python with PyPI's aarch64 torch wheel.
# Slow (import torch: ~30 s) but exact: the guest runs real NEON code. Timings mean nothing.
#
#   scripts/arm_kernels.sh setup          one-time, idempotent (root: apt; ~1.4 GB under $ROOT)
#   scripts/arm_kernels.sh run ARGS...    the aarch64 python with ARGS, in the checkout, e.g.
#     run -m pytest -q -p no:cacheprovider tests/engine/test_attention.py tests/engine/test_layer_ops.py
#
# Under `run`, native.module() builds itself as on an Arm machine: torch's cpp_extension calls
# $CXX (the host's cross g++, run natively) and imports the result in the guest.
# $ROOT: DFLASH_ARM_ROOT (default ~/.cache/dflash-arm); the checkout: DFLASH_CHECKOUT
# (default this script's); QEMU_CPU=neoverse-n1 emulates a core without SVE and BF16.
set -euo pipefail

ROOT=${DFLASH_ARM_ROOT:-$HOME/.cache/dflash-arm}
CHECKOUT=${DFLASH_CHECKOUT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
TORCH_VERSION=${DFLASH_ARM_TORCH:-2.13.0}  # the venv's torch; PyPI's aarch64 wheel of it is CUDA's
SYSROOT=$ROOT/sysroot SITE=$ROOT/site
PIP=(python3 -m pip install -q --upgrade --no-warn-conflicts --target "$SITE" --only-binary=:all: --python-version 3.11
  --implementation cp --platform manylinux_2_28_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64)

setup() {
  # cross compiler, qemu-user and ninja (for torch's cpp_extension)
  command -v aarch64-linux-gnu-g++ >/dev/null && command -v qemu-aarch64 >/dev/null && command -v ninja >/dev/null ||
    { apt-get update -q && apt-get install -y -q g++-aarch64-linux-gnu qemu-user ninja-build; }
  # Debian's aarch64 Python 3.11 and the libraries it and torch need, unpacked into a sysroot
  # (not installed: python3.11:arm64 would replace the host's python3.11)
  if [ ! -x "$SYSROOT/usr/bin/python3.11" ]; then
    dpkg --print-foreign-architectures | grep -qx arm64 || { dpkg --add-architecture arm64 && apt-get update -q; }
    mkdir -p "$ROOT/debs" "$SYSROOT"
    (cd "$ROOT/debs" && apt-get download -q $(printf '%s:arm64 ' libc6 libgcc-s1 libstdc++6 libgomp1 gcc-12-base \
      python3.11-minimal libpython3.11-minimal libpython3.11-stdlib libpython3.11-dev zlib1g libexpat1 libffi8 \
      libssl3 libbz2-1.0 liblzma5 libsqlite3-0 libncursesw6 libtinfo6 libreadline8 libuuid1 libdb5.3 libnsl2 \
      libtirpc3 libcrypt1 libgssapi-krb5-2 libkrb5-3 libk5crypto3 libkrb5support0 libkeyutils1 libcom-err2 \
      libselinux1 libpcre2-8-0 libzstd1 libacl1 libmd0))
    for deb in "$ROOT"/debs/*.deb; do dpkg -x "$deb" "$SYSROOT"; done
  fi
  # torch's cpuinfo parses /proc/cpuinfo, which qemu 7.2 passes through from the x86 host
  # (a segfault in cpuinfo_arm_linux_init); qemu -L reads files under the sysroot first
  local cpus i
  cpus=$(nproc --all)
  mkdir -p "$SYSROOT/proc"
  for ((i = 0; i < cpus; i++)); do
    printf 'processor\t: %d\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop sha3 asimddp sha512 asimdfhm dit uscat ilrcpc flagm ssbs sb dcpodp flagm2 frint i8mm bf16\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x1\nCPU part\t: 0xd40\nCPU revision\t: 1\n\n' "$i"
    mkdir -p "$SYSROOT/sys/devices/system/cpu/cpu$i/regs/identification"
    echo 0x00000000411fd401 >"$SYSROOT/sys/devices/system/cpu/cpu$i/regs/identification/midr_el1"
  done >"$SYSROOT/proc/cpuinfo"
  # aarch64 wheels: torch, what torch.utils.cpp_extension and the tests import (the venv's versions)
  if [ ! -e "$SITE/.installed" ]; then
    local pins=() freeze=$ROOT/venv-pins.txt
    if [ -x "$CHECKOUT/.venv/bin/pip" ]; then
      "$CHECKOUT/.venv/bin/pip" freeze 2>/dev/null | grep -E '^[A-Za-z0-9_.-]+==' | grep -v '^torch==' >"$freeze" && pins=(-c "$freeze")
    fi
    { "${PIP[@]}" --no-deps "torch==$TORCH_VERSION" && "${PIP[@]}" "${pins[@]}" filelock typing_extensions sympy \
      networkx jinja2 fsspec setuptools numpy pytest pytest-timeout transformers; } 2>&1 | { grep -v WARNING || true; }
    touch "$SITE/.installed"
  fi
  # The CUDA wheel links libcudart & co. (several GB on PyPI): stubs with their sonames, symbol
  # versions and the symbols torch imports (functions return 100, "no device"; *String and *Name
  # ones a message, as C10_CUDA_CHECK prints one), in the
  # wheel's RUNPATH ($ORIGIN/../../nvidia/cu13/lib). torch.cuda.is_available() is False.
  [ -e "$SITE/nvidia/cu13/lib/libcudart.so.13" ] || python3 - "$SITE/torch" "$SITE/nvidia/cu13/lib" "$SYSROOT" <<'EOF'
import os, re, subprocess, sys
torch, out, sysroot = sys.argv[1:]
def elf(flag, f):
    return subprocess.run(["aarch64-linux-gnu-readelf", flag, "-W", f], capture_output=True, text=True).stdout
lib = os.path.join(torch, "lib")
ours = [os.path.join(lib, f) for f in os.listdir(lib) if ".so" in f] + [os.path.join(torch, f) for f in os.listdir(torch) if f.startswith("_C.")]
system = [os.path.join(sysroot, d, f) for d in ("lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu") for f in os.listdir(os.path.join(sysroot, d)) if ".so" in f]
defined, loose, need, syms = set(), {}, {}, {}  # loose: unversioned imports; need: stub -> versions
for f in ours + system + [os.path.join(sysroot, "usr/bin/python3.11")]:
    owner, current = {}, None  # version name -> the library it is needed from
    for line in elf("-V", f).splitlines():
        if m := re.search(r"File: (\S+)", line): current = m.group(1)
        if (m := re.search(r"Name: (\S+)", line)) and current: owner[m.group(1)] = current
    if f in ours:
        for name in re.findall(r"\(NEEDED\).*\[(.+)\]", elf("-d", f)):
            if name.startswith(("libcu", "libnccl", "libnvrtc", "libnvshmem")) and not os.path.exists(os.path.join(lib, name)):
                need.setdefault(name, set())
    for p in map(str.split, elf("--dyn-syms", f).splitlines()):
        if len(p) < 8: continue
        name, _, version = p[7].partition("@")
        if p[6] != "UND": defined.add(name)
        elif f in ours and p[4] == "GLOBAL" and not version: loose[name] = p[3]
        elif f in ours and owner.get(version.lstrip("@")) in need:
            need[owner[version.lstrip("@")]].add(version.lstrip("@"))
            syms.setdefault(owner[version.lstrip("@")], {})[name] = (version.lstrip("@"), p[3])
os.makedirs(out, exist_ok=True)
loose = {n: (None, t) for n, t in loose.items() if n not in defined}
for so, versions in need.items():  # every stub also defines the unversioned imports no library has
    table = {**loose, **syms.get(so, {})}
    body = lambda n: "adrp x0, msg\n add x0, x0, :lo12:msg" if n.endswith(("String", "Name")) else "mov w0, #100"
    asm = ['.section .rodata\nmsg: .asciz "a stub of scripts/arm_kernels.sh: no CUDA here"'] + [
        f".data\n.globl {n}\n.type {n},%object\n.size {n},256\n{n}: .zero 256" if t == "OBJECT" else
        f".text\n.globl {n}\n.type {n},%function\n{n}: {body(n)}\n ret" for n, (v, t) in table.items()]
    script = [f"{v} {{ global: {' '.join(n + ';' for n, (vv, t) in table.items() if vv == v)} }};" for v in sorted(versions)]
    base = os.path.join(out, so)
    open(base + ".S", "w").write("\n".join(asm) + "\n")
    open(base + ".map", "w").write("\n".join(script) + "\n")
    subprocess.run(["aarch64-linux-gnu-gcc", "-shared", "-nostdlib", "-o", base, base + ".S", "-Wl,-soname," + so]
                   + (["-Wl,--version-script," + base + ".map"] if versions else []), check=True)
print("stubs:", " ".join(sorted(need)))
EOF
  # `python`: the guest interpreter; as sys.executable it lets the guest start guest subprocesses
  # (no binfmt_misc here). qemu's -0 sets argv[0]; the prefix is found from the wrapper's folder.
  cat >"$SYSROOT/usr/bin/python" <<EOF
#!/bin/sh
exec qemu-aarch64 -L "$SYSROOT" -0 "\$0" "$SYSROOT/usr/bin/python3.11" "\$@"
EOF
  chmod +x "$SYSROOT/usr/bin/python"
  PYTHONPATH=$SITE "$SYSROOT/usr/bin/python" -c "import torch, platform; print('aarch64 ok:', platform.machine(), torch.__version__, torch.ones(2) @ torch.ones(2))"
}

run() {
  cd "$CHECKOUT"
  # CXX runs on the host: torch's cpp_extension builds aarch64 modules with it from inside the guest
  # (CPLUS_INCLUDE_PATH: the aarch64 pyconfig.h); its build cache stays apart from the host's
  PYTHONPATH="$SITE:$CHECKOUT${PYTHONPATH:+:$PYTHONPATH}" CXX=aarch64-linux-gnu-g++ \
    CPLUS_INCLUDE_PATH="$SYSROOT/usr/include" TORCH_EXTENSIONS_DIR="$ROOT/torch_extensions" CUDA_HOME="$ROOT/no-cuda" \
    exec "$SYSROOT/usr/bin/python" "$@"
}

case ${1:-} in
  setup | run) cmd=$1 && shift && "$cmd" "$@" ;;
  *) sed -n '2,13p' "$0" >&2 && exit 2 ;;
esac
