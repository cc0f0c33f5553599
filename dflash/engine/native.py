"""Our C++ kernel module (`csrc/`: the small-row GEMM, decode attention, the layer ops),
built on first use for the instruction set this CPU runs best.

Invariants:
- One source per kernel, written over the vector layer of `csrc/vec.h`, compiled as one
  translation unit (`module.cpp`) per instruction set of `ISAS`; which sets this CPU runs is
  read from /proc/cpuinfo (x86-64) or the machine (aarch64: NEON), fastest first.
- `module()` is the fastest set's module, or the one `$DFLASH_KERNEL_ISA` names; None where
  none builds here (another CPU, no C++ compiler, Windows), and the engine runs the library
  kernels: never an error.
- One build directory per sources and flags, under a flock that dies with its process (a
  killed build never blocks the next).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import platform
import shutil

from dflash.locks import lock_file

log = logging.getLogger(__name__)

#: the instruction sets our kernels are built for (csrc/vec.h), fastest first, and the x86 CPU
#: flags each needs (/proc/cpuinfo's names; the compiler's -m flags are the same names); the
#: aarch64 baseline has NEON
ISAS = {
    "avx512_bf16": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16", "fma"),
    "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"),
    "avx2": ("avx2", "fma"),
    "neon": (),
}
SOURCE_DIR = os.path.join(os.path.dirname(__file__), "csrc")
_SOURCES = ("module.cpp", "small_gemm.cpp", "decode_attention.cpp", "layer_ops.cpp", "vec.h")  # module.cpp includes the rest
ISA_ENV = "DFLASH_KERNEL_ISA"


@functools.cache
def cpu_isas() -> tuple[str, ...]:
    """The instruction sets of `ISAS` this CPU runs, fastest first (none on other CPUs)."""
    machine = platform.machine().lower()
    if machine in ("aarch64", "arm64"):
        return ("neon",)
    if machine not in ("x86_64", "amd64"):
        return ()
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), []))
    except OSError:
        return ()
    return tuple(isa for isa, needs in ISAS.items() if needs and set(needs) <= flags)


@functools.cache
def module():
    """Our kernel module for this CPU: built on first use for the fastest instruction set it
    runs (`$DFLASH_KERNEL_ISA` names a slower one: `avx2` on an AVX-512 CPU), then cached by
    torch under ~/.cache/torch_extensions; None where this CPU or machine cannot build or run
    it, and the engine measures the library kernels only."""
    isas = cpu_isas()
    wanted = os.environ.get(ISA_ENV)
    if wanted:
        if wanted not in isas:
            log.warning("engine: %s=%s is not one this CPU runs (%s)", ISA_ENV, wanted, ", ".join(isas) or "none")
        isas = tuple(isa for isa in isas if isa == wanted)
    why = "no instruction set of ours on this CPU" if not isas else None
    if os.name == "nt":
        why = "they need GCC or Clang"
    elif shutil.which(os.environ.get("CXX", "c++")) is None:
        why = "no C++ compiler"
    for isa in () if why else isas:
        built = build(isa)
        if built is not None:
            return built
        why = "the build failed"
    log.info("engine: our kernels are not used (%s); measuring the library kernels only", why)
    return None


@functools.cache
def build(isa: str):
    """Our kernel module for instruction set `isa` (a key of `ISAS` that this CPU runs),
    built on first use; None if the build fails here."""
    import sys

    from torch.utils.cpp_extension import _get_build_directory, load

    # the `ninja` that pip installed beside this Python, when its bin/ is not on PATH
    os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    log.info("engine: loading our %s kernels (built on first use on a machine: about 15 s)", isa)
    openmp = [] if platform.system() == "Darwin" else ["-fopenmp"]  # Apple's clang has none: one thread there
    flags = ["-O3", *openmp, *compile_flags(isa)]
    try:
        # One build directory per sources and flags: two checkouts with other sources never
        # rebuild over each other. torch's own build lock is a file that a killed build leaves
        # behind, on which every later process would wait forever; a flock dies with its
        # process, so whoever holds ours knows that lock file is stale.
        digest = hashlib.sha256(source_text() + " ".join(flags).encode()).hexdigest()[:12]
        name = f"dflash_kernels_{isa}_{digest}"
        build_dir = _get_build_directory(name, verbose=False)
        with open(os.path.join(build_dir, "dflash-build.lock"), "w") as held:
            lock_file(held)
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(build_dir, "lock"))
            return load(
                name, [os.path.join(SOURCE_DIR, "module.cpp")], extra_cflags=flags, extra_ldflags=openmp, build_directory=build_dir
            )
    except (RuntimeError, OSError, ImportError) as error:  # a compiler or ninja that fails here
        log.warning("engine: could not build our %s kernels (%s)", isa, str(error)[:200])
        return None


def compile_flags(isa: str) -> list[str]:
    """The compiler flags that select instruction set `isa` (csrc/vec.h's macro, x86's -m flags)."""
    return [*(f"-m{flag.replace('_', '')}" for flag in ISAS[isa]), f"-DDFLASH_ISA_{isa.upper()}"]


@functools.cache
def source_text() -> bytes:
    """The bytes of every source file, in order (build directories and kept choices are keyed by them)."""
    text = b""
    for name in _SOURCES:
        with open(os.path.join(SOURCE_DIR, name), "rb") as f:
            text += f.read()
    return text
