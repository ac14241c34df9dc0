"""Stage 2: an exported FX graph lowered to fused kernels, GEMM steps and extern calls."""
