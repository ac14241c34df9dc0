"""The backend-neutral IR: affine indices, buffers and graph steps, fused kernels."""
