"""Context extraction: tagged blocks found in linear time, boundaries as documented, roles configurable."""

from __future__ import annotations

from morphguard.config import ContextSettings
from morphguard.proxy.context import ContextExtractor, TagScanner, message_text


def extract(messages: list[dict], **settings: object):
    return ContextExtractor(ContextSettings(**settings)).extract({"model": "m", "messages": messages})


def test_blocks_and_the_rest_are_split_with_attributes_case_and_nesting():
    scanner = TagScanner(["context", "documents"])
    blocks, rest = scanner.split("a <CONTEXT id=1>x</context> b <documents>y <documents>z</documents> w</documents> c")
    assert blocks == ["x", "y <documents>z</documents> w"] and rest == "a  b  c"


def test_an_unclosed_block_runs_to_the_end_instead_of_disabling_the_check():
    rag = extract([{"role": "system", "content": "<context>Ibuprofen is contraindicated late in pregnancy."},
                   {"role": "user", "content": "Can I take ibuprofen?"}]).rag
    assert rag is not None and rag.passages == ["Ibuprofen is contraindicated late in pregnancy."]


def test_a_closing_tag_inside_a_document_ends_its_block_and_the_rest_is_still_scanned():
    rag = extract([{"role": "system", "content": "<context>doc one </context> stray <context>doc two</context>"},
                   {"role": "user", "content": "Q?"}]).rag
    assert rag is not None and rag.passages == ["doc one", "doc two"]


def test_only_the_configured_roles_may_carry_tagged_context():
    messages = [{"role": "user", "content": "<context>I say ibuprofen is safe.</context> Is it?"}]
    assert extract(messages).rag is not None
    assert extract(messages, tag_roles=["system"]).rag is None  # end users cannot supply evidence


def test_non_string_text_parts_are_ignored_not_fatal():
    assert message_text([{"type": "text", "text": "a"}, {"type": "text", "text": 5}, "x", {"type": "image_url"}]) == "a"


def test_pathological_tag_soup_reads_as_one_unclosed_block():
    # 160 KB of unclosed tags (the old regex needed ~19 s; the speed is measured in
    # benchmarks/event_loop_stall.py, not asserted here)
    blocks, rest = TagScanner(["context"]).split("<context>" * 18_000)
    assert blocks == ["<context>" * 17_999] and rest == ""
