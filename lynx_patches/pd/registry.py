"""Make `lynx` a `--disaggregation-transfer-backend` of SGLang and hand it the KV pool."""

from __future__ import annotations

from lynx_patches import targets
from lynx_patches.pd.conn import LynxKVBootstrapServer, LynxKVReceiver, LynxKVSender
from lynx_patches.pd.manager import LynxKVManager
from lynx_patches.selfcheck import Hook, LynxHookError

BACKEND_VALUE = "lynx"
MANAGER_ATTR = "_lynx_manager"


def install_backend_choice() -> None:
    """Add `lynx` to the CLI choices and to the `TransferBackend` enum (idempotent)."""
    from sglang.srt.disaggregation.utils import TransferBackend
    from sglang.srt.server_args import add_disagg_transfer_backend_choices

    if BACKEND_VALUE in TransferBackend._value2member_map_:
        return
    add_disagg_transfer_backend_choices([BACKEND_VALUE])
    member = object.__new__(TransferBackend)
    member._name_ = "LYNX"
    member._value_ = BACKEND_VALUE
    TransferBackend._value2member_map_[BACKEND_VALUE] = member
    TransferBackend._member_map_["LYNX"] = member
    TransferBackend._member_names_.append("LYNX")
    type.__setattr__(TransferBackend, "LYNX", member)


def backend_installed() -> bool:
    from sglang.srt.disaggregation.utils import TransferBackend

    try:
        return TransferBackend(BACKEND_VALUE).value == BACKEND_VALUE
    except ValueError:
        return False


def get_kv_class(original, transfer_backend, class_type):
    """AROUND `get_kv_class`: the Lynx classes for the `lynx` backend."""
    if getattr(transfer_backend, "value", None) != BACKEND_VALUE:
        return original(transfer_backend, class_type)
    from sglang.srt.disaggregation.base import KVArgs
    from sglang.srt.disaggregation.utils import KVClassType

    return {
        KVClassType.KVARGS: KVArgs,
        KVClassType.MANAGER: LynxKVManager,
        KVClassType.SENDER: LynxKVSender,
        KVClassType.RECEIVER: LynxKVReceiver,
        KVClassType.BOOTSTRAP_SERVER: LynxKVBootstrapServer,
    }[class_type]


def init_kv_manager(original, queue):
    """AROUND `{Prefill,Decode}..._init_kv_manager`: give a Lynx manager its KV pool; remember it."""
    manager = original(queue)
    if isinstance(manager, LynxKVManager):
        scheduler = require(queue, "scheduler")
        manager.attach_pool(require(queue, "token_to_kv_pool"), require(scheduler, "model_config"))
        setattr(scheduler, MANAGER_ATTR, manager)
    return manager


def manager_of(scheduler):
    """The scheduler's `LynxKVManager`, or None (not disaggregated, or another backend)."""
    return getattr(scheduler, MANAGER_ATTR, None)


def send_kv_metadata(original, queue, decode_req, kv_indices, page_size, *args, **kwargs):
    """AROUND `DecodePreallocQueue._send_kv_metadata`: a Lynx receiver's `send_metadata` gets the
    exact number of tokens to receive (SGLang passes it only the pages that hold them); SGLang
    hands this method's keyword arguments on to `send_metadata`."""
    if isinstance(decode_req.kv_receiver, LynxKVReceiver):
        prefix = int(kwargs.get("decode_prefix_len") or 0)
        kwargs["lynx_num_tokens"] = len(decode_req.req.origin_input_ids) - prefix
    return original(queue, decode_req, kv_indices, page_size, *args, **kwargs)


def require(obj, name: str):
    """``obj.name``; a LynxHookError naming the SGLang attribute if this SGLang lacks it."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise LynxHookError(
            f"SGLang's {type(obj).__name__} has no attribute {name!r}; Lynx needs SGLang 0.5.23"
        ) from None


HOOKS = (
    Hook(targets.GET_KV_CLASS, get_kv_class, "AROUND"),
    Hook(targets.PREFILL_INIT_KV_MANAGER, init_kv_manager, "AROUND"),
    Hook(targets.DECODE_INIT_KV_MANAGER, init_kv_manager, "AROUND"),
    Hook(targets.DECODE_SEND_KV_METADATA, send_kv_metadata, "AROUND"),
)
