"""NeMo Guardrails' context block, read by default: the prompt NeMo renders from its own templates (the installed
package's `llm/prompts/*.yml`, as `generate_bot_message` and the `general` task write `relevant_chunks`)."""

from __future__ import annotations

from morphguard.config import ContextSettings
from morphguard.proxy.context import ContextExtractor, NemoBlocks

CHUNKS = "Ibuprofen is contraindicated in the third trimester of pregnancy.\nParacetamol is preferred."

# generate_bot_message (general.yml): the whole prompt is one user message
BOT_MESSAGE = f'''"""
Below is a conversation between a helpful AI assistant and a user.
"""

# This is how a conversation between a user and the bot can go:
user "Hello there!"
  express greeting

# This is some additional context:
```markdown
{CHUNKS}
```

# This is how the bot talks:

# This is the current conversation between the user and the bot:
user "Can pregnant women take ibuprofen for back pain?"
  ask about medicine
bot answer question
'''

# the `general` task of the chat models' templates (openai-chatgpt.yml, llama3.yml): a system message
GENERAL = f"Below is a conversation.\nThis is some relevant context:\n```markdown\n{CHUNKS}\n```"

# openai.yml and deepseek.yml indent the block under their `if`
INDENTED = f"Intro.\n\n  This is some relevant context:\n  ```markdown\n  {CHUNKS}\n  ```\n\nUser: Q?\nAssistant:"


def extract(messages: list[dict], **settings: object):
    return ContextExtractor(ContextSettings(**settings)).extract({"model": "m", "messages": messages})


def test_nemos_bot_message_prompt_yields_its_chunks_as_context():
    got = extract([{"role": "user", "content": BOT_MESSAGE}])
    assert got.source == "tags" and got.rag is not None and got.rag.passages == [CHUNKS]
    assert "```" not in got.rag.question and "additional context" not in got.rag.question
    assert 'user "Can pregnant women take ibuprofen for back pain?"' in got.rag.question


def test_nemos_general_task_block_in_a_system_message_and_the_indented_variant():
    got = extract([{"role": "system", "content": GENERAL}, {"role": "user", "content": "Q?"}])
    assert got.rag is not None and got.rag.passages == [CHUNKS] and got.rag.question == "Q?"
    got = extract([{"role": "user", "content": INDENTED}])
    assert got.rag is not None and got.rag.passages == [CHUNKS]


def test_the_block_counts_only_in_the_roles_that_may_carry_context():
    assert extract([{"role": "user", "content": BOT_MESSAGE}], tag_roles=["system"]).rag is None


def test_a_heading_not_followed_by_the_fence_is_no_block():
    text = "This is some additional context:\nnot fenced\n```markdown\nx\n```"
    assert NemoBlocks().split(text) == ([], text)


def test_an_unclosed_block_runs_to_the_end():
    blocks, rest = NemoBlocks().split("a\n# This is some additional context:\n```markdown\nchunk text")
    assert blocks == ["chunk text"] and rest == "a\n"


def test_hostile_repetition_is_read_in_one_pass():
    # thousands of headings with no closing fence, and thousands of closed empty blocks: each is found once (the
    # speed is not asserted here; the scan never looks back)
    opened = "# This is some additional context:\n```markdown\n" * 20_000
    blocks, rest = NemoBlocks().split(opened)
    assert len(blocks) == 1 and blocks[0] == opened.split("```markdown\n", 1)[1] and rest == ""
    closed = "# This is some additional context:\n```markdown\n```\n" * 20_000
    blocks, rest = NemoBlocks().split(closed)
    assert len(blocks) == 20_000 and set(blocks) == {""} and rest.strip() == ""
