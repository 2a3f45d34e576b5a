"""The stock-baseline hook: SGLang's MooncakeKVSender takes the host page-index path on lynx_cpu only."""

from types import SimpleNamespace

# SGLang resolves its platform when it is first imported (see test_platform.py).
from sglang.srt.platforms import current_platform

from lynx_patches import stock, targets
from lynx_patches.hooks import all_hooks
from lynx_patches.platform import LynxCpuPlatform


def test_the_hook_is_in_the_table_on_mooncakes_sender():
    (hook,) = [h for h in all_hooks() if h.fn is stock.mooncake_sender_init]
    assert hook.target == targets.MOONCAKE_SENDER_INIT and hook.kind == "AFTER"
    assert hook.target.endswith("mooncake.conn.MooncakeKVSender.__init__")


def test_sglang_declares_the_cuda_path_this_hook_turns_off():
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVSender

    assert MooncakeKVSender.__dict__["supports_host_tensor_indices"] is True


def test_on_lynx_cpu_a_sender_loses_host_tensor_indices():
    assert isinstance(current_platform, LynxCpuPlatform) and stock.on_lynx_cpu()
    sender = SimpleNamespace(supports_host_tensor_indices=True)
    assert stock.mooncake_sender_init(None, sender, "more", "args", kw=1) is None
    assert sender.supports_host_tensor_indices is False


def test_elsewhere_a_sender_keeps_them(monkeypatch):
    monkeypatch.setattr(stock, "on_lynx_cpu", lambda: False)
    sender = SimpleNamespace(supports_host_tensor_indices=True)
    stock.mooncake_sender_init(None, sender)
    assert sender.supports_host_tensor_indices is True
