"""Ascend NPU backend (optional, ``aotpack[npu]``): drives torch_npu's AscendC static kernels.

Not available in this release: selecting it fails with a message saying what it needs.
"""
from __future__ import annotations

from aotpack.errors import AotpackError


def create():
    """Raises ``AotpackError``: torch_npu missing, or the backend not shipped yet."""
    try:
        import torch_npu  # noqa: F401
    except ImportError:
        raise AotpackError("backend 'npu' needs torch_npu and CANN >= 9.1.0 on an Ascend NPU "
                           "(pip install 'aotpack[npu]'); use --backend cpu here") from None
    raise AotpackError("backend 'npu' is not available in this aotpack release yet; use --backend cpu")
