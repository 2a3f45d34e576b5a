"""Lynx core: progressive KV codec, prioritized transfer and speculation policy.

Engine-agnostic: nothing here imports SGLang or Triton at module level.
"""

__version__ = "0.1.0"
