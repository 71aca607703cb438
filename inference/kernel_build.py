"""Build chatui's C kernels ahead of time (``chatui build-kernels``).

The runtime builds them on first use anyway (``q8kernel.load_kernel``), which costs the first
start a few seconds of compiling; building ahead of time moves that to install time and shows
a compiler error to the person who can fix it instead of a log line and a slower fallback.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from . import q8kernel
from .kernel_abi import KernelABIError


class KernelBuildError(Exception):
    """The kernels could not be built or do not load; ``str(exc)`` is one sentence for the
    user."""


def build_all(force: bool = False) -> list[Path]:
    """Build (or with ``force`` rebuild) every kernel library this machine uses, check that
    each loads and matches ``kernel_abi``, and return their paths (already built ones too).

    Raises:
        KernelBuildError: no compiler, not an x86-64 CPU, a compiler error, or a library that
            does not match this code.
    """
    try:
        plan = q8kernel.plan_build()
    except q8kernel.KernelUnavailable as exc:
        raise KernelBuildError(f"Cannot build chatui's kernels: {exc}.") from None
    try:
        if force or not plan.path.is_file():
            q8kernel.compile_library(plan.cc, plan.path, plan.openmp, defines=plan.defines)
        q8kernel.open_library(plan.path, plan.openmp)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()
        last = detail[-1] if detail else f"exit status {exc.returncode}"
        raise KernelBuildError(f"The C compiler {plan.cc} failed on chatui's kernels: {last}") \
            from None
    except subprocess.TimeoutExpired:
        raise KernelBuildError(f"The C compiler {plan.cc} took over two minutes; try again "
                               "on a less busy machine.") from None
    except KernelABIError as exc:
        raise KernelBuildError(f"The built kernels do not match this chatui ({exc}); "
                               "rebuild them with --force.") from None
    except OSError as exc:
        raise KernelBuildError(f"Cannot write or load the kernels at {plan.path} "
                               f"({exc.strerror or exc}); set CHATUI_CACHE_DIR to a writable "
                               "directory.") from None
    return [plan.path]
