"""Triton kernels for the Lynx codec (GPU hot path; CPU tests run them under TRITON_INTERPRET=1)."""
