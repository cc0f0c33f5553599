"""Every instruction set of our kernels (dflash.engine.native.ISAS, csrc/vec.h) compiles
wherever a compiler for it is at hand: the sets this CPU runs are built and tested against the
references (the `kernel_isa` fixture), the others are compiled here: x86-64's with the host's
compiler on an x86-64 machine, NEON with an aarch64 compiler (Debian's g++-aarch64-linux-gnu
on x86-64, as scripts/arm_kernels.sh installs; that script also runs the NEON tests)."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sysconfig

import pytest
from torch.utils.cpp_extension import include_paths

from dflash.engine import native

X86 = platform.machine().lower() in ("x86_64", "amd64")


def compiler_for(isa: str) -> str | None:
    host = shutil.which(os.environ.get("CXX", "c++"))
    if isa == "neon":
        return shutil.which("aarch64-linux-gnu-g++") if X86 else host
    return host if X86 else None


@pytest.mark.parametrize("isa", [isa for isa in native.ISAS if isa not in native.cpu_isas()])
def test_the_instruction_sets_this_cpu_does_not_run_compile(isa):
    compiler = compiler_for(isa)
    if compiler is None:
        pytest.skip(f"no compiler for {isa} here")
    includes = [f"-isystem{path}" for path in [*include_paths(), sysconfig.get_paths()["include"]]]
    command = [compiler, "-std=c++20", "-fsyntax-only", "-DTORCH_EXTENSION_NAME=check", *native.compile_flags(isa)]
    result = subprocess.run([*command, *includes, os.path.join(native.SOURCE_DIR, "module.cpp")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_flags_select_one_block_of_the_vector_layer():
    """A build without an instruction set's macro is refused by vec.h (never a silent default)."""
    compiler = compiler_for("avx2")
    if compiler is None:
        pytest.skip("no x86-64 compiler here")
    includes = [f"-isystem{path}" for path in include_paths()]
    source = '#include "vec.h"\nint main() { return dflash_vec::W; }\n'
    result = subprocess.run(
        [compiler, "-std=c++20", "-fsyntax-only", f"-I{native.SOURCE_DIR}", *includes, "-x", "c++", "-"],
        input=source,
        capture_output=True,
        text=True,
    )
    assert result.returncode != 0 and "define one of DFLASH_ISA_" in result.stderr
