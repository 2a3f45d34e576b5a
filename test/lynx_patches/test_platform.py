"""The lynx_cpu platform: chosen on this accelerator-less machine, CPU-safe defaults."""

import importlib
import os
from types import SimpleNamespace

import pytest

# SGLang resolves its platform when it is first imported, loading this plugin's
# entry point; imported first, `lynx_patches.platform` would be half-initialized then.
from sglang.srt.platforms import current_platform

from lynx_patches.platform import (
    PADDED_LOADER_MODULES,
    PLATFORM_CLASS,
    THREADS_BIND_ENV,
    LynxCpuPlatform,
    activate,
    threads_bind,
)


def _args(**overrides):
    base = {
        "attention_backend": None,
        "sampling_backend": None,
        "disaggregation_mode": "null",
        "disaggregation_decode_retraction_backup": None,
        "page_size": None,
        "tp_size": 1,
        "dp_size": 1,
        "pp_size": 1,
        "base_gpu_id": 0,
        "gpu_id_step": 1,
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
    ("entries", "cpus", "expected"),
    [
        (2, [0, 1], "0|1"),
        (2, [0, 1, 2, 3, 4, 5, 6, 7], "0,1,2,3|4,5,6,7"),
        (3, [0, 1, 2, 3, 4, 5, 6, 7], "0,1|2,3,4|5,6,7"),
        (2, [5], "5|5"),
        (4, [0, 1], "0|1|0|1"),
    ],
)
def test_threads_bind_shares_the_cpus_among_entries(entries, cpus, expected):
    assert threads_bind(entries, cpus) == expected


def test_threads_bind_refuses_no_entries_or_no_cpus():
    with pytest.raises(ValueError, match="at least one entry"):
        threads_bind(0, [0])
    with pytest.raises(ValueError, match="at least one entry"):
        threads_bind(2, [])


def test_tp2_on_one_numa_node_gets_a_threads_bind_for_both_ranks(monkeypatch):
    monkeypatch.delenv(THREADS_BIND_ENV, raising=False)
    monkeypatch.setattr("sglang.srt.utils.common.get_cpu_ids_by_node", lambda: ["0,1"])
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    LynxCpuPlatform().apply_server_args_defaults(_args(tp_size=2))
    assert os.environ[THREADS_BIND_ENV] == "0|1"


def test_threads_bind_covers_device_ids_from_the_base_gpu_id(monkeypatch):
    monkeypatch.delenv(THREADS_BIND_ENV, raising=False)
    monkeypatch.setattr(
        "sglang.srt.utils.common.get_cpu_ids_by_node", lambda: ["0,1,2,3"]
    )
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    LynxCpuPlatform().apply_server_args_defaults(_args(tp_size=2, base_gpu_id=2))
    assert len(os.environ[THREADS_BIND_ENV].split("|")) == 4


@pytest.mark.parametrize(
    ("numa_nodes", "tp_size", "preset"),
    [(["0,1"], 1, None), (["0", "1"], 2, None), (["0,1"], 2, "1|0")],
)
def test_threads_bind_is_left_alone_when_sglang_needs_none_or_the_user_set_it(
    monkeypatch, numa_nodes, tp_size, preset
):
    if preset is None:
        monkeypatch.delenv(THREADS_BIND_ENV, raising=False)
    else:
        monkeypatch.setenv(THREADS_BIND_ENV, preset)
    monkeypatch.setattr(
        "sglang.srt.utils.common.get_cpu_ids_by_node", lambda: numa_nodes
    )
    LynxCpuPlatform().apply_server_args_defaults(_args(tp_size=tp_size))
    assert os.environ.get(THREADS_BIND_ENV) == preset


def test_workers_load_weights_through_sglangs_padded_cpu_loaders(monkeypatch):
    modules = [importlib.import_module(name) for name in PADDED_LOADER_MODULES]
    for module in modules:
        monkeypatch.setattr(module, "_is_cpu", False)
    LynxCpuPlatform().init_backend()
    assert all(module._is_cpu is True for module in modules)


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
