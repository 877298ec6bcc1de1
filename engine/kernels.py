"""The engine's C kernels for CPU in float32, built when an engine first loads on a machine:
paged_attention.c (decode attention read in place from the KV pool, paged_kernel.py) and
greedy_head.c (the LM head with a greedy pick, greedy_head.py).

PyTorch has neither op for CPU, and torch.utils.cpp_extension takes 24 s to build against its
headers on 2 cores; the kernels are plain C, built in well under a second by the system's compiler
and called through ctypes. Their OpenMP loops run on the runtime torch has loaded (the loader
reuses a loaded libgomp.so.1), so torch.set_num_threads sizes their teams too.
"""

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

# -march=native: built where it runs. -ffast-math lets the softmax's expf vectorize (glibc's libmvec)
# and the dot products reassociate, as SDPA's own kernels do; the greedy pick must see NaN as
# torch.argmax does, so it goes without. It is never given to the link, where gcc would add
# crtfastmath.o, whose constructor turns on flush-to-zero for the whole process, torch too.
SOURCES = {"paged_attention.c": ("-ffast-math",), "greedy_head.c": ()}
COMPILE: tuple[str, ...] = ("-c", "-O3", "-march=native", "-fopenmp", "-fPIC")
LINK = ("-shared", "-fopenmp")
# what the engine does without them
FALLBACK = "decode attention gathers the KV blocks for SDPA, a greedy step takes every logit from the LM head's matmul"
SIGNATURES: dict[str, tuple[list[type], type | None]] = {
    "paged_decode_supports": ([ctypes.c_int64] * 3, ctypes.c_int),
    "paged_decode_attention": (
        [ctypes.c_void_p]
        + [ctypes.c_int64]
        + [ctypes.c_void_p] * 6
        + [ctypes.c_int64] * 5
        + [ctypes.c_float, ctypes.c_int64],
        None,
    ),
    "greedy_head_lanes": ([], ctypes.c_int64),
    "greedy_head_group": ([], ctypes.c_int64),
    "greedy_head_workspace": ([ctypes.c_int64], ctypes.c_int64),
    "greedy_head": ([*[ctypes.c_void_p] * 6, ctypes.c_int64, ctypes.c_void_p, *[ctypes.c_int64] * 4], None),
}


@functools.cache
def library() -> ctypes.CDLL | None:
    """The kernels, or None where there is no C compiler or they do not build (logged): callers
    then take torch's ops. Built once per compiler and CPU, then kept in the user's cache folder:
    building takes 1.8 s on 2 cores, which every engine's start paid."""
    compiler = shutil.which("cc")
    if compiler is None:
        logger.warning("no C compiler (cc) for the engine's CPU kernels: %s", FALLBACK)
        return None
    cache = _cache_folder()
    path = None if cache is None else cache / f"kernels-{_build_key(compiler)}.so"
    if path is not None and path.exists():
        return _load(path)
    with tempfile.TemporaryDirectory() as folder:
        built = _build(compiler, Path(folder))
        if built is None:
            return None
        if path is None:
            return _load(built)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # renamed into place whole: a process building at the same time loads one or the other
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            shutil.copyfile(built, partial)
            os.replace(partial, path)
        except OSError as error:
            logger.info("the engine's CPU kernels are not kept in %s: %s", path.parent, error)
            return _load(built)
    return _load(path)


def _load(path: Path) -> ctypes.CDLL | None:
    try:
        loaded = ctypes.CDLL(str(path))
    except OSError as error:  # e.g. a folder mounted noexec
        logger.warning("the engine's CPU kernels did not load (%s): %s", error, FALLBACK)
        return None
    for name, (argtypes, restype) in SIGNATURES.items():
        function = getattr(loaded, name)
        function.argtypes, function.restype = argtypes, restype
    return loaded


def _build(compiler: str, folder: Path) -> Path | None:
    objects = [folder / Path(source).with_suffix(".o").name for source in SOURCES]
    path = folder / "kernels.so"
    commands = [
        [compiler, *COMPILE, *flags, str(Path(__file__).with_name(source)), "-o", str(object_path)]
        for (source, flags), object_path in zip(SOURCES.items(), objects, strict=True)
    ]
    commands.append([compiler, *LINK, *map(str, objects), "-o", str(path), "-lm"])
    for command in commands:
        built = subprocess.run(command, capture_output=True, text=True)
        if built.returncode != 0:
            logger.warning("the engine's CPU kernels did not build (%s):\n%s", FALLBACK, built.stderr)
            return None
    return path


def _cache_folder() -> Path | None:
    """$XDG_CACHE_HOME/clawdbot, by default ~/.cache/clawdbot; None where that is relative (as the
    XDG spec has it, ignored) or there is no home to expand ~ to."""
    folder = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
    return folder / "clawdbot" if folder.is_absolute() else None


def _build_key(compiler: str) -> str:
    """What the built library depends on: the sources, the flags, the compiler, and the CPU that
    -march=native compiles for (its model and feature flags)."""
    digest = hashlib.sha256()
    for source, flags in SOURCES.items():
        digest.update(Path(__file__).with_name(source).read_bytes())
        digest.update(repr(flags).encode())
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest.update(repr((COMPILE, LINK, compiler, version, platform.machine(), _cpu())).encode())
    return digest.hexdigest()[:16]


def _cpu() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(("model name", "flags", "Features"))))
