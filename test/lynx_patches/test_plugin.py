"""The plugin is discovered, parses through SGLang's real parser, and proves its hooks live."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace
from importlib.metadata import entry_points

import pytest
from lynx.config import LynxConfig
from lynx.options import options

from lynx_patches.hooks import all_hooks
from lynx_patches.selfcheck import Hook, LynxHookError, instance_attributes, is_applied, missing, unresolved, verify
from lynx_patches.targets import USED


@pytest.fixture(scope="module")
def plugins_loaded():
    from sglang.srt.plugins import load_plugins

    load_plugins()


def _parse(argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(argv)


def test_entry_points_name_the_lynx_plugin_and_platform():
    general = {ep.name: ep.value for ep in entry_points(group="sglang.srt.plugins")}
    platforms = {ep.name: ep.value for ep in entry_points(group="sglang.srt.platforms")}
    assert general["lynx"] == "lynx_patches.hooks:register"
    assert platforms["lynx_cpu"] == "lynx_patches.platform:activate"


def test_every_hook_is_applied_after_load_plugins(plugins_loaded):
    assert missing(all_hooks()) == []
    for hook in all_hooks():
        assert is_applied(hook.target, hook.fn), hook.target


def test_selfcheck_names_a_hook_that_is_not_applied(plugins_loaded):
    stray = Hook("sglang.srt.server_args.ServerArgs.add_cli_args", lambda *a: None, "AFTER")
    gone = Hook("sglang.srt.server_args.NoSuchThing.method", lambda *a: None, "AFTER")
    assert missing([stray, gone]) == [stray.target, gone.target]
    with pytest.raises(LynxHookError, match="NoSuchThing"):
        verify([gone])


def test_lynx_flag_parses_through_the_launch_server_parser(plugins_loaded, model_path):
    server_args = _parse(
        ["--model-path", str(model_path), "--lynx", "--lynx-mode", "int8", "--lynx-preset", "int16"]
    )
    assert server_args._lynx == LynxConfig(mode="int8", preset="int16")


def test_without_lynx_flag_no_config_is_attached(plugins_loaded, model_path):
    server_args = _parse(["--model-path", str(model_path)])
    assert getattr(server_args, "_lynx", None) is None


def test_lynx_config_reaches_subprocesses_by_pickle(plugins_loaded, model_path):
    import pickle

    server_args = _parse(["--model-path", str(model_path), "--lynx", "--lynx-mode", "bf16"])
    assert pickle.loads(pickle.dumps(server_args))._lynx == LynxConfig(mode="bf16")


_HOOK_FAILED = """
from types import SimpleNamespace
from sglang.srt.plugins.hook_registry import HookRegistry
from lynx_patches import targets
# A broken hook from another plugin makes SGLang skip the whole target.
HookRegistry.register(targets.SCHEDULER_INIT, print, SimpleNamespace(value="broken"))
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
prepare_server_args(["--model-path", MODEL, "--lynx"])
"""


@pytest.fixture(scope="module")
def launcher_runs(model_path) -> dict[str, subprocess.Popen]:
    """SGLang's launcher run three ways, all at once (each spends its time importing SGLang)."""
    launch = [sys.executable, "-m", "sglang.launch_server"]
    commands = {
        "help": [*launch, "--help"],
        "bad-mode": [*launch, "--model-path", str(model_path), "--lynx", "--lynx-mode", "fp3"],
        "hook-failed": [sys.executable, "-c", _HOOK_FAILED.replace("MODEL", repr(str(model_path)))],
    }
    runs = {name: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name, cmd in commands.items()}  # fmt: skip
    yield runs
    for run in runs.values():
        run.kill()
        run.wait()


def _finished(run: subprocess.Popen) -> tuple[int, str, str]:
    out, err = run.communicate(timeout=300)
    return run.returncode, out, err


@pytest.mark.slow
def test_help_lists_every_lynx_option_with_its_default(launcher_runs):
    _, out, _ = _finished(launcher_runs["help"])
    flat = " ".join(out.split())
    assert "--lynx " in out
    for opt in options():
        assert opt.flag in out
        if not opt.is_switch:
            assert f"(default: {opt.default})" in flat, opt.flag


@pytest.mark.slow
def test_unknown_lynx_value_is_a_clear_error_not_a_traceback(launcher_runs):
    returncode, _, err = _finished(launcher_runs["bad-mode"])
    assert returncode == 2
    assert "argument --lynx-mode: invalid choice: 'fp3'" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--lynx-preset", "3+x"], "--lynx-preset: unknown codec preset '3+x'"),
        (["--lynx-chunk-bytes", "12"], "--lynx-chunk-bytes must be in"),
        (["--lynx-link-gbps", "fast"], "argument --lynx-link-gbps: invalid float value"),
        (["--disaggregation-mode", "decode"], "--lynx-secret-file"),
        (["--lynx-loopback", "--disaggregation-mode", "prefill", "--lynx-insecure"], "--lynx-loopback"),
        (["--disaggregation-mode", "decode", "--lynx-insecure", "--pp-size", "2"], "with --pp-size 1"),
    ],
)
def test_bad_lynx_options_exit_2_with_a_one_line_error(plugins_loaded, model_path, monkeypatch, capsys, extra, message):
    monkeypatch.setenv("LYNX_SECRET", "")
    with pytest.raises(SystemExit) as exit_info:
        _parse(["--model-path", str(model_path), "--lynx", *extra])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.slow
def test_server_refuses_lynx_when_a_hook_failed_to_apply(launcher_runs):
    """SGLang only logs a hook it could not apply; --lynx must then stop with an error."""
    returncode, _, err = _finished(launcher_runs["hook-failed"])
    assert returncode == 2, err
    assert "Lynx hooks were not applied to: " + "sglang.srt.managers.scheduler" in err
    assert "error: Lynx hooks were not applied" in err.splitlines()[-1]


def test_every_sglang_name_lynx_uses_resolves_on_the_installed_sglang():
    assert unresolved(USED) == []


def test_a_missing_name_parameter_or_instance_attribute_is_named():
    missing = [
        "sglang.srt.disaggregation.common.conn.CommonKVManager.renamed_in_a_later_release",
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation(forward_batch, is_speculative)",
        "sglang.srt.managers.schedule_batch.Req().renamed_token_offset",
        "sglang.srt.managers.scheduler.Scheduler().renamed_waiting_queue",
    ]
    present = [
        "sglang.srt.managers.tp_worker.TpModelWorker.forward_batch_generation(forward_batch, is_verify)",
        "sglang.srt.managers.schedule_batch.Req().send_token_offset",
        "sglang.srt.managers.scheduler.Scheduler().waiting_queue",
    ]
    assert unresolved([*present, *missing]) == missing


@dataclass
class _Declared:
    field: int
    with_default: int = 0


class _Slotted:
    __slots__ = ("slot",)


class _Assigning(_Declared):
    def __init__(self, other) -> None:
        self.plain = 1
        self.first, (self.second, *self.rest) = 1, (2, 3)
        other.not_mine = 4

    def later(self) -> None:
        self.annotated: int = 5

    @property
    def derived(self) -> int:
        return self.plain


def test_instance_attributes_come_from_fields_slots_and_assignments_to_self():
    names = instance_attributes(_Assigning)
    assert {"field", "with_default", "plain", "first", "second", "rest", "annotated", "derived"} <= names
    assert "not_mine" not in names
    assert "slot" in instance_attributes(_Slotted)


class _RenamedSleeper:
    """SGLang's `IdleSleeper` as a release that renamed its `poller` would define it."""

    def __init__(self, sockets) -> None:
        self.socket_poller = None


def test_lynx_refuses_to_start_naming_an_attribute_sglang_no_longer_sets(plugins_loaded, monkeypatch):
    from sglang.srt.managers.scheduler_components import idle_sleeper

    from lynx_patches.hooks import verify_hooks

    verify_hooks()
    monkeypatch.setattr(idle_sleeper, "IdleSleeper", _RenamedSleeper)
    with pytest.raises(LynxHookError, match=r"idle_sleeper\.IdleSleeper\(\)\.poller\b"):
        verify_hooks()


def test_no_hook_patches_an_sglang_class_the_lynx_backend_subclasses():
    """What the lynx backend needs of SGLang's PD base classes, its subclasses override."""
    from lynx_patches.pd.conn import LynxKVReceiver, LynxKVSender
    from lynx_patches.pd.manager import LynxKVManager

    lynx = (LynxKVManager, LynxKVSender, LynxKVReceiver)
    bases = {f"{c.__module__}.{c.__qualname__}" for cls in lynx for c in cls.__mro__}
    assert "sglang.srt.disaggregation.common.conn.CommonKVManager" in bases
    assert [h.target for h in all_hooks() if h.target.rsplit(".", 1)[0] in bases] == []


def test_a_lynx_scheduler_refuses_to_start_when_sglang_lacks_a_name_lynx_uses(plugins_loaded, monkeypatch):
    from sglang.srt.managers.scheduler_components import idle_sleeper

    from lynx_patches.hooks import scheduler_init

    monkeypatch.setattr(idle_sleeper, "IdleSleeper", _RenamedSleeper)
    scheduler_init(object(), SimpleNamespace())  # no --lynx: nothing to check
    with pytest.raises(LynxHookError, match=r"IdleSleeper\(\)\.poller"):
        scheduler_init(object(), server_args=SimpleNamespace(_lynx=LynxConfig()))


@pytest.mark.slow
def test_importing_the_plugin_package_imports_neither_sglang_nor_the_hook_table():
    """SGLang imports `lynx_patches` while it resolves its platform; the package must not import it back."""
    loaded = "sorted(m for m in sys.modules if m.startswith(('sglang', 'lynx_patches.')))"
    code = f"import sys, lynx_patches; print({loaded})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
