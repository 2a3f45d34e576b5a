"""Everything derived from the shared secret: per-transfer MAC keys and CurveZMQ key pairs.

One secret, configured identically on prefill and decode servers, is the root
of trust. From it:

* ``transfer_key(secret, nonce)``: the key of one transfer's manifest and
  frame MACs. The decode rank draws a fresh random ``nonce`` when it reserves
  a request's slots and sends it (sealed) to the prefill rank, so frames or a
  manifest recorded from an earlier transfer never verify for a later one.
* ``curve_keys(secret)``: the CurveZMQ key pairs of the data path. The
  listener's secret key and the sender's secret key are both derived from the
  shared secret, so only a peer holding it can complete the CURVE handshake:
  an unauthenticated peer cannot make the listener buffer a single byte, and
  every byte on the wire is encrypted and authenticated (XSalsa20-Poly1305).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

MIN_SECRET_BYTES = 16
NONCE_BYTES = 16
_TRANSFER_PERSON = b"lynx-transfer"
_CURVE_SERVER_PERSON = b"lynx-curve-srv"
_CURVE_CLIENT_PERSON = b"lynx-curve-cli"


def check_secret(secret: bytes) -> None:
    """Raise ValueError unless ``secret`` is long enough to authenticate peers."""
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(
            f"the shared secret has {len(secret)} bytes; use at least {MIN_SECRET_BYTES} "
            "(e.g. `openssl rand -hex 32`)"
        )


def new_nonce() -> bytes:
    """A fresh random transfer nonce."""
    return secrets.token_bytes(NONCE_BYTES)


def transfer_key(secret: bytes, nonce: bytes) -> bytes:
    """The 32-byte MAC key of the transfer identified by ``nonce``.

    With an empty secret (``--lynx-insecure``) the key is public: MACs then
    catch corruption, not forgery.
    """
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a transfer nonce has {NONCE_BYTES} bytes, got {len(nonce)}")
    return hashlib.blake2b(nonce, digest_size=32, key=root_key(secret), person=_TRANSFER_PERSON).digest()


@dataclass(frozen=True)
class CurveKeys:
    """Z85-encoded CurveZMQ keys (40 bytes each) of the data path.

    Attributes:
        server_public, server_secret: the listener's (decode side) key pair.
        client_public, client_secret: the sender's (prefill side) key pair.
    """

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def curve_keys(secret: bytes) -> CurveKeys:
    """The data path's CurveZMQ key pairs, derived from ``secret`` (non-empty)."""
    import zmq
    from zmq.utils import z85

    if not secret:
        raise ValueError("CurveZMQ keys need a non-empty shared secret")
    server = z85.encode(hashlib.blake2b(digest_size=32, key=root_key(secret), person=_CURVE_SERVER_PERSON).digest())
    client = z85.encode(hashlib.blake2b(digest_size=32, key=root_key(secret), person=_CURVE_CLIENT_PERSON).digest())
    return CurveKeys(zmq.curve_public(server), server, zmq.curve_public(client), client)


def root_key(secret: bytes) -> bytes:
    """BLAKE2b takes keys up to 64 bytes; longer secrets are hashed down first."""
    if not isinstance(secret, (bytes, bytearray)):
        raise ValueError(f"the secret must be bytes, got {type(secret).__name__}")
    return bytes(secret) if len(secret) <= 64 else hashlib.blake2b(secret, digest_size=64).digest()
