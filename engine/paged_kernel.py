"""Decode attention read in place from the paged KV pool on CPU: paged_attention.c, built when the
engine loads.

Without it a decode bucket's blocks are gathered into a padded tensor for SDPA, every layer of every
step: a fresh allocation holding the bucket's whole context, written and read again. A decode
step of 8 sequences at 2,048 tokens of context is 1.5x faster with the kernel (bench/engine_bench.py).
PyTorch has no paged-attention op for CPU, and torch.utils.cpp_extension takes 24 s to build
against its headers on 2 cores; the kernel is plain C, built in well under a second by the system's
compiler and called through ctypes. Its OpenMP loop runs on the runtime torch has loaded (the loader
reuses a loaded libgomp.so.1), so torch.set_num_threads sizes its team too.
"""

import ctypes
import functools
import logging
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_attention.c")
# -march=native: built where it runs. -ffast-math lets the softmax's expf vectorize (glibc's libmvec)
# and the dot products reassociate, as SDPA's own kernels do; it is not given to the link, where gcc
# would add crtfastmath.o, whose constructor turns on flush-to-zero for the whole process, torch too.
COMPILE = ("-c", "-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC")
LINK = ("-shared", "-fopenmp")


@functools.cache
def _library() -> ctypes.CDLL | None:
    compiler = shutil.which("cc")
    if compiler is None:
        logger.warning("no C compiler (cc): decode attention gathers the KV blocks for SDPA instead")
        return None
    with tempfile.TemporaryDirectory() as folder:
        object_path, path = Path(folder) / "paged_attention.o", Path(folder) / "paged_attention.so"
        for command in (
            [compiler, *COMPILE, str(SOURCE), "-o", str(object_path)],
            [compiler, *LINK, str(object_path), "-o", str(path), "-lm"],
        ):
            built = subprocess.run(command, capture_output=True, text=True)
            if built.returncode != 0:
                logger.warning("paged_attention.c did not build; decode attention gathers for SDPA:\n%s", built.stderr)
                return None
        try:
            library = ctypes.CDLL(str(path))
        except OSError as error:  # e.g. a temporary folder mounted noexec
            logger.warning("the paged attention kernel did not load (%s); decode attention gathers for SDPA", error)
            return None
    library.paged_decode_supports.argtypes = [ctypes.c_int64] * 3
    library.paged_decode_attention.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 5 + [ctypes.c_float]
    library.paged_decode_attention.restype = None
    return library


def serves(device: torch.device, dtype: torch.dtype, num_heads: int, head_dim: int, block_size: int) -> bool:
    """Whether the kernel builds here and fits the model: float32 on CPU, within its buffers."""
    if device.type != "cpu" or dtype != torch.float32:
        return False
    library = _library()
    return library is not None and bool(library.paged_decode_supports(num_heads, head_dim, block_size))


def decode_attention(
    q: torch.Tensor,
    out: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    table_starts: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> None:
    """Writes rows [0, len(context_lens)) of `out` [tokens, heads, head_dim], from the same rows of
    `q`: row r reads the block table at `block_tables[table_starts[r]]`, up to `context_lens[r]` keys."""
    library = _library()
    assert library is not None
    assert q.dtype == out.dtype == k_cache.dtype == v_cache.dtype == torch.float32
    assert all(t.is_contiguous() for t in (q, out, k_cache, v_cache, block_tables, table_starts, context_lens))
    assert block_tables.dtype == table_starts.dtype == context_lens.dtype == torch.int64
    _, block_size, num_kv_heads, head_dim = k_cache.shape
    library.paged_decode_attention(
        q.data_ptr(),
        out.data_ptr(),
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        block_tables.data_ptr(),
        table_starts.data_ptr(),
        context_lens.data_ptr(),
        len(context_lens),
        num_kv_heads,
        q.shape[1] // num_kv_heads,
        head_dim,
        block_size,
        scale,
    )
