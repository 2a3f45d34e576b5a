"""Harness for running and judging Lynx: server launchers, a local PD deployment, prompts,
reference decoding and the exactness rules. Tests, benchmarks and scripts import it; the
product packages (`lynx`, `lynx_patches`, `lynx_kernels`) never do."""
