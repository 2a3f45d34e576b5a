"""Greedy decoding with transformers: the independent reference for real-model tests.

Loads the same safetensors folder SGLang serves and records, at every step,
the two most likely tokens with their log-probabilities, so a parting from the
reference can be judged a near-tie or a bug (`lynx_testing.exactness`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from lynx_testing.exactness import TopTwo

if TYPE_CHECKING:
    import torch


class HFReference:
    """A transformers causal LM in eval mode on the CPU."""

    def __init__(self, model_path: str | Path, dtype: str = "bfloat16") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from transformers import AutoModelForCausalLM

        self._torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=getattr(torch, dtype)
        ).eval()
        self.eos_token_ids = _as_list(self.model.generation_config.eos_token_id)

    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> tuple[list[int], list[TopTwo]]:
        """Greedy continuation of `prompt_ids` (stops after an EOS token), with per-step top-2."""
        torch = self._torch
        with torch.no_grad():
            out = self.model.generate(
                torch.tensor([prompt_ids]),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
                pad_token_id=self.eos_token_ids[0] if self.eos_token_ids else None,
            )
        tokens = out.sequences[0, len(prompt_ids) :].tolist()
        top2 = [_greedy_step(torch, scores[0])[1] for scores in out.scores[: len(tokens)]]
        return tokens, top2


    def greedy_on_transformed_kv(
        self,
        prompt_ids: list[int],
        max_new_tokens: int,
        transform: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[list[int], list[TopTwo]]:
        """Greedy decoding where the prompt's KV is replaced by `transform(k, v)` after prefill.

        This is what a disaggregated decoder computes when the prompt's KV
        crossed the link through a lossy codec: the first token comes from the
        exact prefill, every later token attends to the transformed prompt KV
        (and to the exact KV of generated tokens). `transform` maps one
        layer's ``[tokens, kv_heads, head_dim]`` K and V to new ones.
        """
        torch = self._torch
        tokens, top2 = [], []
        with torch.no_grad():
            out = self.model(torch.tensor([prompt_ids]), use_cache=True)
            cache = out.past_key_values
            for layer in cache.layers:
                k, v = transform(layer.keys[0].transpose(0, 1), layer.values[0].transpose(0, 1))
                layer.keys = k.transpose(0, 1).unsqueeze(0).contiguous()
                layer.values = v.transpose(0, 1).unsqueeze(0).contiguous()
            logits = out.logits[0, -1]
            for _ in range(max_new_tokens):
                token, pair = _greedy_step(torch, logits)
                tokens.append(token)
                top2.append(pair)
                if token in self.eos_token_ids:
                    break
                out = self.model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
                logits = out.logits[0, -1]
        return tokens, top2


def _greedy_step(torch, logits) -> tuple[int, TopTwo]:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, indices = logprobs.topk(2)
    token = int(torch.argmax(logits))
    return token, ((int(indices[0]), float(values[0])), (int(indices[1]), float(values[1])))


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
