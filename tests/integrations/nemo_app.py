"""A NeMo Guardrails app, run by NeMo's own Python (`.venv-nemo`): `python nemo_app.py CONFIG_FOLDER`, a JSON list of
conversations on stdin (each: NeMo messages, the context ones included), one JSON line out per conversation: the bot's
reply and NeMo's output variables."""

from __future__ import annotations

import asyncio
import json
import sys

from nemoguardrails import LLMRails, RailsConfig


async def main() -> None:
    rails = LLMRails(RailsConfig.from_path(sys.argv[1]))
    for messages in json.loads(sys.stdin.read()):
        result = await rails.generate_async(messages=messages, options={"output_vars": True})
        print(json.dumps({"content": result.response[-1]["content"], "output": result.output_data}), flush=True)


asyncio.run(main())
