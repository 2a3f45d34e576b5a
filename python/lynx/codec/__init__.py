"""Progressive bit-plane KV codec, pure-PyTorch reference.

``encode`` quantizes one layer's K and V and splits the codes by bit
significance into streams (anchor first); ``decode`` rebuilds K and V from any
prefix of those streams. The lower-level functions are the reference the GPU
kernels mirror.
"""

from lynx.codec.bitpack import pack_bits, unpack_bits
from lynx.codec.codec import EncodedKV, decode, encode
from lynx.codec.quant import dequantize_key, dequantize_value, quantize_key, quantize_value
from lynx.codec.spec import CodecSpec
from lynx.codec.stages import merge_stages, split_stages

__all__ = [
    "CodecSpec",
    "EncodedKV",
    "decode",
    "dequantize_key",
    "dequantize_value",
    "encode",
    "merge_stages",
    "pack_bits",
    "quantize_key",
    "quantize_value",
    "split_stages",
    "unpack_bits",
]
