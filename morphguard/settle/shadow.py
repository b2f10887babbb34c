"""A candidate config run beside the live check on a sampled share of live traffic (`shadow`).

Once a request's decision is recorded, a sampled request is handed to a background task that checks the same
question, passages and answer with the candidate's detector and judge and decides under the candidate's policy, as
`morphguard replay --depth check` does with stored traffic (`policy.replay.Replayer`); a candidate that changes
policy alone decides on the live check's finding instead, as `--depth decide` does, and asks no judge. The response
has left or is leaving by then; nothing here can change it, and whatever the candidate does (errs, hangs, blocks)
stays here: logged, counted, bounded by `shadow.timeout_s` and `shadow.max_in_flight`. Its verdict goes beside the
live decision (`AuditStore.record_shadow`), and where the two disagree the texts are kept for review as a flagged
answer's are.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import Any

from morphguard import telemetry
from morphguard.config import Config, ShadowSettings, overlaid
from morphguard.masking import mask_secrets
from morphguard.models import RagInput
from morphguard.policy.audit import AuditStore
from morphguard.policy.comparison import Outcome
from morphguard.policy.record import DecisionRecord
from morphguard.policy.replay import Depth, Replayer
from morphguard.settle.values import CheckRequest

log = logging.getLogger(__name__)


def _checking(config: Config) -> dict[str, Any]:
    """What of a config decides a check's finding: everything but policy and where things run."""
    return config.model_dump(exclude={"policy", "proxy", "telemetry", "store", "queue", "review", "shadow"})


class Shadow:
    def __init__(self, live: Config, audit: AuditStore | None) -> None:
        self.settings = live.shadow
        candidate = overlaid(live, self.settings.candidate, source="shadow.candidate")
        candidate = candidate.model_copy(update={"shadow": ShadowSettings()})  # a candidate shadows nothing
        self.candidate = candidate
        # A candidate that changes policy alone decides on the live check's finding; one that changes how answers
        # are checked (detector, judge, a detector's settings) checks them itself.
        depth: Depth = "decide" if _checking(live) == _checking(candidate) else "check"
        self.replayer = Replayer(candidate, depth, retag=live.policy.topics != candidate.policy.topics,
                                 client=f"shadow:{self.settings.name}")
        if depth == "check":
            self.replayer.detector()  # here, where the guard is built off the event loop, not on the first request
        self.audit = audit
        self.running: set[asyncio.Task[None]] = set()
        self._draw = random.Random()

    def offer(self, request: CheckRequest, record: DecisionRecord) -> None:
        """Check this recorded request with the candidate in the background, if it is sampled and there is room.
        Only requests with a context and an answer: the candidate has nothing else to check."""
        if (request.rag is None or not record.answer or record.threshold is None
                or len(self.running) >= self.settings.max_in_flight or self._draw.random() >= self.settings.sample):
            return
        row = {**record.model_dump(), "id": 0, "review": None}
        task = asyncio.get_running_loop().create_task(self._run(row, request.rag))
        self.running.add(task)
        task.add_done_callback(self.running.discard)

    async def _run(self, row: dict[str, Any], rag: RagInput) -> None:
        name = self.settings.name
        started = time.perf_counter()
        try:
            outcome = await asyncio.wait_for(self.replayer.outcome(row, rag), self.settings.timeout_s)
            await asyncio.to_thread(self._store, row, outcome)
        except Exception as exc:  # the candidate's failure is the shadow's alone
            log.warning("shadow %s: request %s not compared: %s", name, row["request_id"],
                        mask_secrets(f"{type(exc).__name__}: {exc}"))
            telemetry.shadow_checked(name, "failed")
            return
        telemetry.shadow_checked(name, "disagree" if outcome.changed else "agree", would_flag=bool(outcome.flagged),
                                 would_block=outcome.blocks, seconds=time.perf_counter() - started,
                                 input_tokens=outcome.input_tokens, output_tokens=outcome.output_tokens)

    def _store(self, row: dict[str, Any], outcome: Outcome) -> None:
        if self.audit is None:
            return
        texts = ({"question": row["question"], "answer": row["answer"], "context": row["context"]}
                 if outcome.changed else None)
        self.audit.record_shadow(row["request_id"], self.settings.name, outcome.changed, outcome.action,
                                 outcome.model_dump(), texts)

    async def drain(self) -> None:
        """Wait for the candidate checks under way (at shutdown, so that what they found is stored)."""
        if self.running:
            await asyncio.wait(set(self.running), timeout=self.settings.timeout_s)
