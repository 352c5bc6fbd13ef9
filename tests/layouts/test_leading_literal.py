"""The literal prefilter in layout detection (``registry._leading_literal``): a pattern is compiled only when some
module path holds the text every match of it starts with. The text must be a true necessary condition of a
match, for the registry's patterns and for any pattern a user registers."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapterdoc.layouts import registry as R

PIECES = [
    "a",
    "b",
    "_",
    ".",
    r"\.",
    r"\d",
    "^",
    "$",
    "?",
    "*",
    "+",
    "|",
    "(",
    ")",
    "(?:",
    "[",
    "]",
    "[^",
    "{2}",
    "\\",
    "(?#",
    "(?i)",
    "(?x)",
    "(?i:",
    " ",
    "#",
]
TEXT = st.text(alphabet="ab_.1", max_size=8)


@pytest.mark.parametrize(
    "rx,expected",
    [
        (r"^model\.layers\.\d+\.", (True, "model.layers.")),
        (r"\.mlp\.(experts|shared)(\.|$)", (False, ".mlp.")),
        (r"(^|\.)mtp\.", (False, "")),  # a group first
        (r"^ab?c", (True, "a")),  # `b` is optional
        (r"^ab*", (True, "a")),
        (r"^ab{2}", (True, "a")),
        (r"abc+", (False, "abc")),  # `+`: at least one `c`
        (r"^a|b", (True, "")),  # a top-level alternation: anything may match
        (r"a[]|]b", (False, "a")),  # `|` in a class (with a leading `]` member)
        (r"a[^]|]b|c", (False, "")),  # `|` after the class is top level
        (r"^(?:thinker\.)?model", (True, "")),
        (r"\Amodel", (False, "")),  # an escaped letter is no literal
        (r"^\d+\.x", (True, "")),
        (r"xyz(?#()|mlp", (False, "")),  # a comment is no group: the `|` after it is top level
        (r"^modelX(?#)?", (True, "")),  # the `?` after a comment makes the `X` optional
        (r"MLP(?i)", (False, "")),  # Python 3.10: flags anywhere apply to the whole pattern
        (r"^model(?x) \.", (True, "")),
        (r"^ab(?i:c)", (True, "")),
        (r"^ab(?:c)", (True, "ab")),  # a plain group is fine
    ],
)
def test_the_leading_literal_of_a_pattern(rx: str, expected: tuple[bool, str]) -> None:
    assert R._leading_literal(rx) == expected


def test_every_registry_pattern_s_literal_is_a_necessary_condition() -> None:
    """Over the registry's own patterns and module paths of every layout's shape."""
    paths = [
        "model.layers.0.self_attn.q_proj",
        "model.language_model.layers.3.mlp.experts.1.down_proj",
        "thinker.model.language_model.layers.0.mlp.experts",
        "layers.2.attn.Wqkv",
        "model.visual.blocks.0.attn.qkv",
        "language_model.layers.0.ple_block.proj",
        "head.dense",
        "model.layers.1.linear_attn.in_proj_qkv",
    ]
    seen = 0
    for layout in R.LAYOUTS.values():
        for rx in (*layout.requires, *layout.forbids, *(s[0] for s in layout.signals)):
            anchored, literal = R._leading_literal(rx)
            seen += bool(literal)
            for p in paths:
                if re.search(rx, p):
                    assert p.startswith(literal) if anchored else literal in p, (rx, p)
    assert seen >= 10  # most of the registry's patterns have one: the prefilter does skip compiles


@settings(max_examples=600, deadline=None)
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=8), st.lists(TEXT, min_size=1, max_size=6))
def test_a_match_always_holds_the_literal(pieces: list[str], texts: list[str]) -> None:
    rx = "".join(pieces)
    try:
        pattern = re.compile(rx)
    except re.error:
        return
    anchored, literal = R._leading_literal(rx)
    for t in texts:
        if pattern.search(t) and literal:
            assert t.startswith(literal) if anchored else literal in t, (rx, t, literal)


def test_every_registry_pattern_compiles() -> None:
    """Detection compiles a pattern only when a module path holds its literal, so an invalid pattern would otherwise
    show only on the adapters that hold it."""
    for layout in R.LAYOUTS.values():
        for rx in (*layout.requires, *layout.forbids, *(s[0] for s in layout.signals)):
            re.compile(rx)
        if layout.hint:
            re.compile(layout.hint, re.IGNORECASE)


def test_detection_skips_the_compile_of_a_pattern_no_path_can_match(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the prefilter is for, seen from outside: a count of 0 without compiling the pattern (and a pattern a
    path can match is compiled, so the spy does see compiles)."""
    compiled: list[str] = []
    real = re.compile

    def spy(pattern: str, flags: int = 0) -> re.Pattern[str]:
        compiled.append(pattern)
        return real(pattern, flags)

    monkeypatch.setattr(re, "compile", spy)
    shapes = R._shapes(["model.layers.0.self_attn.q_proj"])
    skipped, matched = r"^nowhere_seen_before\.layers\.\d+\.(x|y)$", r"^model\.layers\.\d+\.self_attn\."
    assert R._count(skipped, shapes) == 0
    assert R._count(matched, shapes) == 1
    assert compiled == [matched]
