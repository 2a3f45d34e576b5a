"""The lynx_cpu platform: chosen on this accelerator-less machine, CPU-safe defaults."""

from types import SimpleNamespace

import pytest

# SGLang resolves its platform when it is first imported, loading this plugin's
# entry point; imported first, `lynx_patches.platform` would be half-initialized then.
from sglang.srt.platforms import current_platform

from lynx_patches.platform import PLATFORM_CLASS, LynxCpuPlatform, activate


def _args(**overrides):
    base = {
        "attention_backend": None,
        "sampling_backend": None,
        "disaggregation_mode": "null",
        "disaggregation_decode_retraction_backup": None,
        "page_size": None,
    }
    return SimpleNamespace(**{**base, **overrides})


def test_activates_on_a_machine_without_accelerator():
    assert activate() == PLATFORM_CLASS


def test_sglang_resolves_its_platform_to_lynx_cpu():
    assert isinstance(current_platform, LynxCpuPlatform)


def test_is_out_of_tree_cpu_with_string_device_and_no_pinned_memory():
    platform = LynxCpuPlatform()
    assert platform.is_out_of_tree() and not platform.is_cpu()
    assert platform.get_device() == "cpu"
    assert platform.is_pin_memory_available() is False


def test_defaults_pick_pure_pytorch_paths():
    args = _args()
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.attention_backend == "torch_native"
    assert args.sampling_backend == "pytorch"
    assert args.disable_overlap_schedule and args.disable_cuda_graph
    assert args.page_size == 1
    assert args.sleep_on_idle


@pytest.mark.parametrize("page_size", [16, 64])
def test_explicit_page_size_is_kept(page_size):
    args = _args(page_size=page_size)
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.page_size == page_size


def test_explicit_backend_choice_is_kept():
    args = _args(attention_backend="flex_attention")
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.attention_backend == "flex_attention"


def test_decode_server_backs_up_retracted_kv_in_plain_cpu_tensors():
    args = _args(disaggregation_mode="decode")
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.disaggregation_decode_retraction_backup == "cpu_tensor"


@pytest.mark.parametrize(
    ("cli", "expected"),
    [((), 1), (("--page-size", "16"), 16), (("--page-size", "64"), 64)],
)
def test_sglang_resolution_keeps_the_page_size_asked_for(model_path, cli, expected):
    """Through SGLang's own argument resolution, of which the platform's defaults are one step."""
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.server_args import prepare_server_args

    args = prepare_server_args(["--model-path", str(model_path), *cli])
    args.resolve_once()
    resolved = {
        name: resolution_result(args, name)
        for name in ("page_size", "attention_backend", "device")
    }
    assert resolved == {
        "page_size": expected,
        "attention_backend": "torch_native",
        "device": "cpu",
    }
