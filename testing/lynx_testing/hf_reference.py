"""Greedy decoding with transformers: the independent reference for real-model tests.

Loads the same safetensors folder SGLang serves and records, at every step,
the two most likely tokens with their log-probabilities, so a parting from the
reference can be judged a near-tie or a bug (`lynx_testing.exactness`).
"""

from __future__ import annotations

import os
from pathlib import Path

from lynx_testing.exactness import TopTwo


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

    def next_top2(self, ids: list[int]) -> TopTwo:
        """The two most likely tokens after `ids` (one forward pass), best first."""
        torch = self._torch
        with torch.no_grad():
            logits = self.model(torch.tensor([ids])).logits[0, -1]
        return _greedy_step(torch, logits)[1]


def _greedy_step(torch, logits) -> tuple[int, TopTwo]:
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    values, indices = logprobs.topk(2)
    token = int(torch.argmax(logits))
    return token, ((int(indices[0]), float(values[0])), (int(indices[1]), float(values[1])))


def _as_list(value) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)
