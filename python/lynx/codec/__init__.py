"""Progressive hierarchical KV codec, pure-PyTorch reference.

``encode`` quantizes one layer's K and V into streams (anchor first): the
anchor is a rounded low-bit quantization plus the attention-sink tokens raw,
each later stream refines it; ``decode`` rebuilds K and V from any prefix of
those streams. ``encode_from_pool``/``decode_into_pool``/``upgrade_in_pool``
do the same straight from and into a token-indexed KV pool;
``gather_encode``/``scatter_decode``/``scatter_upgrade`` dispatch those to the
Triton kernels when they apply. The lower-level functions are the reference
the GPU kernels mirror. ``FORMAT_VERSION`` numbers the wire format.
"""

from lynx.codec.bitpack import pack_bits, unpack_bits
from lynx.codec.codec import EncodedKV, decode, encode
from lynx.codec.layout import FORMAT_VERSION
from lynx.codec.pool import (
    decode_into_pool,
    encode_from_pool,
    gather_encode,
    scatter_decode,
    scatter_upgrade,
    select_backend,
    upgrade_in_pool,
)
from lynx.codec.quant import Quantized, dequantize_key, dequantize_value, quantize_key, quantize_value
from lynx.codec.spec import CodecSpec
from lynx.codec.stages import stage_codes, stage_levels

__all__ = [
    "FORMAT_VERSION",
    "CodecSpec",
    "EncodedKV",
    "Quantized",
    "decode",
    "decode_into_pool",
    "dequantize_key",
    "dequantize_value",
    "encode",
    "encode_from_pool",
    "gather_encode",
    "pack_bits",
    "quantize_key",
    "quantize_value",
    "scatter_decode",
    "scatter_upgrade",
    "select_backend",
    "stage_codes",
    "stage_levels",
    "unpack_bits",
    "upgrade_in_pool",
]
