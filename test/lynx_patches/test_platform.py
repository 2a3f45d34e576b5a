"""The lynx_cpu platform: chosen on this accelerator-less machine, CPU-safe defaults."""

from types import SimpleNamespace

from lynx_patches.platform import PLATFORM_CLASS, LynxCpuPlatform, activate


def _args(**overrides):
    base = dict(
        attention_backend=None,
        sampling_backend=None,
        disaggregation_mode="null",
        disaggregation_decode_retraction_backup=None,
    )
    return SimpleNamespace(**{**base, **overrides})


def test_activates_on_a_machine_without_accelerator():
    assert activate() == PLATFORM_CLASS


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


def test_explicit_backend_choice_is_kept():
    args = _args(attention_backend="flex_attention")
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.attention_backend == "flex_attention"


def test_decode_server_backs_up_retracted_kv_in_plain_cpu_tensors():
    args = _args(disaggregation_mode="decode")
    LynxCpuPlatform().apply_server_args_defaults(args)
    assert args.disaggregation_decode_retraction_backup == "cpu_tensor"
