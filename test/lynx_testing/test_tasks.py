import sys

import pytest

from lynx_testing.tasks import (
    HeldOutText,
    TaskItem,
    heldout_texts,
    mean_string_match_all,
    multikey_item,
    needle_item,
    shakespeare_texts,
    string_match_all,
    variable_tracking_item,
)


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def _tokens(tokenizer, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False))


# string_match_all


def test_score_is_the_fraction_of_answers_found():
    assert string_match_all("VAR AB and VAR CD", ["AB", "CD", "EF", "GH"]) == 0.5
    assert string_match_all("it is 1234567", ["1234567"]) == 1.0


def test_score_ignores_case_and_counts_substrings():
    assert string_match_all("the variables are abcde, fghij", ["ABCDE", "FGHIJ"]) == 1.0
    assert string_match_all("x12345y", ["12345"]) == 1.0


def test_score_of_an_empty_prediction_is_zero():
    assert string_match_all("", ["7"]) == 0.0


def test_repeated_answers_each_count():
    assert string_match_all("only A here", ["a", "a", "b"]) == pytest.approx(2 / 3)


def test_score_refuses_no_answers_or_a_bare_string():
    with pytest.raises(ValueError):
        string_match_all("anything", [])
    with pytest.raises(ValueError):
        string_match_all("anything", "abc")


def test_mean_score_averages_items_and_checks_lengths():
    assert mean_string_match_all(["a b", "c"], [["a", "b"], ["c", "d"]]) == 0.75
    with pytest.raises(ValueError):
        mean_string_match_all(["a"], [["a"], ["b"]])
    with pytest.raises(ValueError):
        mean_string_match_all([], [])


# items


def test_item_rejects_depths_outside_zero_one_and_empty_answers():
    base = dict(
        task="needle", prompt="p", answer_prefix="", context="c", answers=("1",),
        inserted=("s",), depths=(0.5,), target_tokens=10, prompt_tokens=10, seed=0,
    )  # fmt: skip
    TaskItem(**base)
    with pytest.raises(ValueError):
        TaskItem(**{**base, "depths": (1.5,)})
    with pytest.raises(ValueError):
        TaskItem(**{**base, "answers": ()})
    with pytest.raises(ValueError):
        TaskItem(**{**base, "depths": (0.1, 0.2)})


def test_generators_are_deterministic_by_seed(tokenizer):
    assert needle_item(tokenizer, 1024, 0.3, seed=7) == needle_item(tokenizer, 1024, 0.3, seed=7)
    assert needle_item(tokenizer, 1024, 0.3, seed=7) != needle_item(tokenizer, 1024, 0.3, seed=8)
    vt = variable_tracking_item(tokenizer, 1024, seed=3, num_chains=2)
    assert vt == variable_tracking_item(tokenizer, 1024, seed=3, num_chains=2)
    assert vt != variable_tracking_item(tokenizer, 1024, seed=4, num_chains=2)


@pytest.mark.parametrize("target", [1024, 2048, 4096, 8192])
def test_prompt_length_is_within_two_percent_of_the_target(tokenizer, target):
    for item in (
        needle_item(tokenizer, target, 0.5, seed=1),
        needle_item(tokenizer, target, 0.5, seed=1, style="passkey"),
        variable_tracking_item(tokenizer, target, seed=1, num_chains=2, num_hops=3),
    ):
        assert item.prompt_tokens == _tokens(tokenizer, item.prompt)
        assert abs(item.prompt_tokens - target) <= 0.02 * target, item.task


@pytest.mark.parametrize("depth", [0.0, 0.1, 0.25, 0.5, 0.77, 1.0])
def test_needle_sits_at_the_requested_depth_within_two_tokens(tokenizer, depth):
    item = needle_item(tokenizer, 2048, depth, seed=11)
    needle = item.inserted[0]
    before = item.context[: item.context.index(needle)]
    after = item.context[item.context.index(needle) + len(needle) :]
    haystack = _tokens(tokenizer, before) + _tokens(tokenizer, after)
    assert abs(_tokens(tokenizer, before) - depth * haystack) <= 2
    assert item.context.count(needle) == 1


def test_needle_prompt_asks_for_its_value_and_opens_the_answer(tokenizer):
    item = needle_item(tokenizer, 1024, 0.5, seed=5)
    (value,) = item.answers
    assert len(value) == 7 and value.isdigit()
    assert f"is: {value}." in item.inserted[0]
    key = item.inserted[0].split(" for ")[1].split(" is:")[0]
    assert key in item.prompt.rsplit(item.context, 1)[1]
    assert item.prompt.endswith(item.answer_prefix)
    assert item.prompt.startswith(tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True
    ).split("x")[0])  # fmt: skip


def test_passkey_appears_only_in_the_needle(tokenizer):
    item = needle_item(tokenizer, 1024, 0.4, seed=9, style="passkey")
    (value,) = item.answers
    assert item.prompt.count(value) == 2 and value in item.inserted[0]
    with pytest.raises(ValueError):
        needle_item(tokenizer, 1024, 0.4, seed=9, style="riddle")
    with pytest.raises(ValueError):
        needle_item(tokenizer, 1024, 1.2, seed=9)


def test_multikey_asks_for_one_of_several_distinct_keyed_numbers(tokenizer):
    item = multikey_item(tokenizer, 1024, 0.3, seed=5, num_keys=4)
    assert item.task == "multikey" and len(item.inserted) == 4 and len(set(item.inserted)) == 4
    (value,) = item.answers
    keys = [s.split(" for ")[1].split(" is:")[0] for s in item.inserted]
    values = [s.rsplit(" ", 1)[1].rstrip(".") for s in item.inserted]
    assert len(set(keys)) == 4 and len(set(values)) == 4 and value in values
    asked = keys[values.index(value)]
    assert item.prompt.rsplit(item.context, 1)[1].count(asked) == 2  # the question and the answer's opening
    assert item.prompt.count(value) == 1 and item.prompt.endswith(item.answer_prefix)
    positions = [item.context.index(s) for s in item.inserted]
    assert positions == sorted(positions) and list(item.depths) == sorted(item.depths)


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_multikey_puts_the_asked_needle_at_its_depth(tokenizer, depth):
    item = multikey_item(tokenizer, 2048, depth, seed=12)
    (value,) = item.answers
    asked = next(s for s in item.inserted if s.endswith(f"{value}."))
    assert item.depths[item.inserted.index(asked)] == depth
    assert multikey_item(tokenizer, 2048, depth, seed=12) == item
    assert abs(item.prompt_tokens - 2048) <= 0.02 * 2048
    with pytest.raises(ValueError):
        multikey_item(tokenizer, 2048, depth, seed=12, num_keys=1)


def test_variable_chains_resolve_to_the_queried_value_in_context_order(tokenizer):
    item = variable_tracking_item(tokenizer, 2048, seed=21, num_chains=3, num_hops=3)
    assert len(item.inserted) == 3 * 4 and len(item.answers) == 4
    positions = [item.context.index(s) for s in item.inserted]
    assert positions == sorted(positions) and list(item.depths) == sorted(item.depths)
    values = {}
    for statement in item.inserted:  # context order: every right-hand side is already known
        name, rhs = statement.removeprefix("VAR ").removesuffix(".").split(" = ")
        values[name] = values[rhs.removeprefix("VAR ")] if rhs.startswith("VAR ") else rhs
    query = item.answer_prefix.split("value ")[1].split(" ")[0]
    assert sorted(n for n, v in values.items() if v == query) == sorted(item.answers)


def test_a_target_too_short_for_the_question_is_refused(tokenizer):
    with pytest.raises(ValueError, match="no room"):
        needle_item(tokenizer, 40, 0.5, seed=1)


# held-out text


def test_shakespeare_is_read_without_importing_the_package():
    works = shakespeare_texts()
    assert len(works) >= 40
    titles = {source: title for source, title, _ in works}
    assert "Hamlet" in titles["hamlet_gut"]
    assert not any(s.endswith("_gut_f") for s, _, _ in works)
    assert "shksprdata" not in sys.modules and "shakespeare" not in sys.modules


def test_heldout_windows_are_contiguous_real_text_from_distinct_works(tokenizer):
    windows = heldout_texts(tokenizer, 256, 32, count=4, seed=0)
    assert windows == heldout_texts(tokenizer, 256, 32, count=4, seed=0)
    assert len({w.source for w in windows}) == 4
    text = {source: body for source, _, body in shakespeare_texts()}
    for w in windows:
        assert isinstance(w, HeldOutText)
        assert (len(w.context_ids), len(w.continuation_ids)) == (256, 32)
        ids = tokenizer.encode(text[w.source], add_special_tokens=False)
        assert list(w.context_ids + w.continuation_ids) == ids[w.offset : w.offset + 288]


def test_heldout_refuses_impossible_requests(tokenizer):
    with pytest.raises(ValueError):
        heldout_texts(tokenizer, 0, 32, count=1, seed=0)
    with pytest.raises(ValueError):
        heldout_texts(tokenizer, 256, 32, count=1000, seed=0)
