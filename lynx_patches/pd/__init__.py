"""The `lynx` PD transfer backend for SGLang: anchor and residual KV streams over `lynx.transfer`."""
