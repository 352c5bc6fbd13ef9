"""Training data: the bundled rows, the offline tokenizer, chat/masked/pooled encodings, padding and sharding."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from adapterdoc.errors import ConfigError, InputNotFoundError
from adapterdoc.train import data as D


@pytest.fixture(scope="module")
def ds() -> D.Dataset:
    return D.load_dataset()


@pytest.fixture(scope="module")
def tok(ds: D.Dataset):
    return D.build_tokenizer(ds.train + ds.val)


def test_bundled_rows_have_both_splits_and_structured_answers(ds: D.Dataset) -> None:
    assert len(ds.train) == 36 and len(ds.val) == 12
    assert ds.classes == ["cancel", "order", "return", "track"]
    assert {r.category for r in ds.val} == set(ds.classes)
    for r in ds.train + ds.val:
        assert set(r.answer) == {"intent", "item", "qty", "color", "city", "day"}
        assert json.loads(r.answer_text) == r.answer


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ("{not json", "line 2 is not JSON"),
        ('["a"]', "line 2 is not a JSON object"),
        ('{"split": "train", "answer": {"a": 1}}', "line 2: `prompt`"),
        ('{"split": "train", "prompt": "p", "answer": "text"}', "line 2: `answer`"),
        ('{"prompt": "p", "answer": {"a": 1}}', "line 2: `split`"),
    ],
)
def test_bad_rows_are_refused_with_the_line(tmp_path, line: str, why: str) -> None:
    p = tmp_path / "d.jsonl"
    p.write_text('{"split": "train", "prompt": "p", "answer": {"a": 1}}\n' + line + "\n")
    with pytest.raises(ConfigError, match=why):
        D.load_rows(p)


def test_missing_file_and_no_training_rows(tmp_path) -> None:
    with pytest.raises(InputNotFoundError):
        D.load_rows(tmp_path / "nope.jsonl")
    p = tmp_path / "d.jsonl"
    p.write_text('{"split": "val", "prompt": "p", "answer": {"a": 1}}\n')
    with pytest.raises(ConfigError, match="no row has split 'train'"):
        D.load_dataset(p)


def test_tokenizer_is_deterministic_offline_and_fits_every_tiny_vocab(ds: D.Dataset) -> None:
    D._train_tokenizer.cache_clear()
    a = D.build_tokenizer(ds.train + ds.val).to_str()
    D._train_tokenizer.cache_clear()
    tok = D.build_tokenizer(ds.train + ds.val)
    assert tok.to_str() == a
    assert tok.get_vocab_size() == D.TOKENIZER_VOCAB < 1000
    for i, s in enumerate(D.SPECIALS):
        assert tok.token_to_id(s) == i


def test_chat_encoding_supervises_exactly_the_answer(ds: D.Dataset, tok) -> None:
    for row in ds.train[:5]:
        ex = D.encode_chat(tok, row)
        assert ex.input_ids[0] == D.BOS
        first = next(i for i, v in enumerate(ex.labels) if v != D.IGNORE)
        assert all(v == D.IGNORE for v in ex.labels[:first])
        assert ex.labels[first:] == ex.input_ids[first:]
        assert ex.input_ids[first - 1] == tok.token_to_id("Ċ")  # the newline after <|assistant|>
        assert D.ASSISTANT in ex.input_ids[:first]
        answer = tok.decode(ex.input_ids[first:], skip_special_tokens=False)
        assert answer == row.answer_text + "<|end|>"
        assert tok.decode(ex.input_ids[1:first], skip_special_tokens=False) == D.prompt_text(row)


def test_masked_encoding_hides_answer_tokens_deterministically(ds: D.Dataset, tok) -> None:
    row = ds.train[0]
    ex = D.encode_masked(tok, row, seed=3)
    again = D.encode_masked(tok, row, seed=3)
    assert ex.input_ids == again.input_ids and ex.labels == again.labels
    masked = [i for i, t in enumerate(ex.input_ids) if t == D.MASK]
    assert masked and masked == [i for i, v in enumerate(ex.labels) if v != D.IGNORE]
    answer = [t for t in tok.encode(row.answer_text, add_special_tokens=False).ids]
    prompt_len = ex.input_ids.index(D.EOS) + 1
    for i in masked:
        assert ex.labels[i] == answer[i - prompt_len]
    assert len(masked) == max(1, round(D.MASK_FRACTION * len(answer)))
    assert D.encode_masked(tok, row, seed=4).labels != ex.labels


def test_pooled_encoding_and_collate_padding(ds: D.Dataset, tok) -> None:
    pooled = [D.encode_pooled(tok, r, ds.classes) for r in ds.val[:3]]
    assert [ds.classes[e.target] for e in pooled] == [r.category for r in ds.val[:3]]
    b = D.collate(pooled)
    assert "targets" in b and "labels" not in b
    chat = [D.encode_chat(tok, r) for r in ds.train[:4]]
    b = D.collate(chat)
    width = max(len(e.input_ids) for e in chat)
    assert tuple(b["input_ids"].shape) == (4, width)
    for i, e in enumerate(chat):
        n = len(e.input_ids)
        assert b["attention_mask"][i, :n].all() and not b["attention_mask"][i, n:].any()
        assert (b["input_ids"][i, n:] == D.PAD).all()
        assert (b["labels"][i, n:] == D.IGNORE).all()
        assert b["labels"][i, :n].tolist() == e.labels


@given(n=st.integers(0, 40), count=st.integers(1, 5))
def test_shards_are_equal_length_and_cover_every_row_once(n: int, count: int) -> None:
    examples = [D.Example(f"r{i}", [i]) for i in range(n)]
    shards = [D.shard(examples, k, count) for k in range(count)]
    assert len({len(s) for s in shards}) == 1
    real = sorted(e.row_id for s in shards for e in s if e.weight == 1.0)
    assert real == sorted(e.row_id for e in examples)
    for k, s in enumerate(shards):
        own = len(examples[k::count])
        assert all(e.weight == 1.0 for e in s[:own]) and all(e.weight == 0.0 for e in s[own:])


def test_the_reference_rows_are_package_data() -> None:
    """Read through importlib.resources from inside the package, so a wheel install has them (not from fixtures/)."""
    import adapterdoc

    pkg = Path(adapterdoc.__file__).resolve().parent
    assert Path(str(D.DEFAULT_DATA)).resolve() == pkg / "data" / "smoke.jsonl"
    ds = D.load_dataset()
    assert len(ds.train) >= 32 and len(ds.val) >= 8
    assert {r.category for r in ds.val} <= set(ds.classes)  # the pooled head can score every val row
    assert len({r.id for r in ds.train + ds.val}) == len(ds.train) + len(ds.val)
