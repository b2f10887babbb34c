"""Streams under way, journaled beside the audit trail so that a process that dies mid-stream does not take their
rows with it.

Each process appends to a file of its own (`<folder>/<pid>-<random>.jsonl`), locked for the process's life: a line
when a stream's first text goes out (the request), the characters of answer text released since (at most every
`RELEASED_EVERY_S`, so the figure a crash leaves is a lower bound), and a line once the stream's row is written;
whenever no stream is open the file is emptied, so it holds only streams under way.
Lines go straight to the operating system (no buffer of ours), so they survive the process being killed. The next
start of a proxy on the same trail (`left_behind`) finds the files no live process holds and records each stream
they leave open as not checked, `stream_interrupted`, with what the client had received (`released_chars`).
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any, BinaryIO

from morphguard.settle.outage import Outage

log = logging.getLogger(__name__)

RELEASED_EVERY_S = 0.25


class StreamJournal:
    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.path = folder / f"{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        self._file: BinaryIO = open(self.path, "ab", buffering=0)  # noqa: SIM115 - held for the process's life
        fcntl.flock(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._outage = Outage("stream journal", log)
        self._open = 0  # streams begun and not ended: at none, the file is emptied (it holds nothing to recover)

    def open(self, request: dict[str, Any]) -> OpenStream:
        """A stream whose first text is about to go out (`request`: `CheckRequest.to_dict()`)."""
        self._write({"start": request})
        self._open += 1
        return OpenStream(self, request["request_id"])

    def _ended(self, request_id: str) -> None:
        self._open -= 1
        if self._open == 0 and not self._file.closed:
            try:
                self._file.truncate(0)  # appends go on at the new end
            except OSError as exc:
                self._outage.failed(exc)
            return
        self._write({"end": request_id})

    def _write(self, line: dict[str, Any]) -> None:
        """A line, or none where the disk refuses it (full, read-only): a stream never fails for its journal, which
        only speaks for it after a crash; the audit store's own outage on that disk is what gets reported."""
        if self._file.closed:
            return
        try:
            self._file.write(json.dumps(line).encode() + b"\n")
        except OSError as exc:
            self._outage.failed(exc)
        else:
            self._outage.ok()

    def close(self) -> None:
        """At a clean stop: every stream has ended or has its row on the way (shutdown waits for those)."""
        if not self._file.closed:
            self._file.close()
            with suppress(OSError):  # a read-only disk: the next start finds it empty of open streams
                self.path.unlink(missing_ok=True)

    @staticmethod
    def left_behind(folder: Path) -> list[tuple[Path, list[tuple[dict[str, Any], int]]]]:
        """The files of dead processes, each with the streams it left open: the request (as
        `CheckRequest.to_dict()`) and the characters of answer text its client had received. Remove a file
        (`forget`) once its streams are recorded."""
        if not folder.is_dir():
            return []
        found = []
        for path in sorted(folder.glob("*.jsonl")):
            with open(path, "rb") as file:
                try:
                    fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # a live process's
                    continue
                opened: dict[str, tuple[dict[str, Any], int]] = {}
                for raw in file:
                    try:
                        line = json.loads(raw)
                    except ValueError:  # the line the process was writing when it died
                        continue
                    if "start" in line:
                        opened[line["start"]["request_id"]] = (line["start"], 0)
                    elif "end" in line:
                        opened.pop(line["end"], None)
                    elif line.get("id") in opened:
                        opened[line["id"]] = (opened[line["id"]][0], int(line["released"]))
            found.append((path, list(opened.values())))
        return found

    @staticmethod
    def forget(path: Path) -> None:
        path.unlink(missing_ok=True)


class OpenStream:
    """One stream's lines in the journal."""

    def __init__(self, journal: StreamJournal, request_id: str) -> None:
        self.journal, self.request_id = journal, request_id
        self._released = 0
        self._noted_at = time.monotonic()
        self._ended = False

    def due(self) -> bool:
        """Whether to note what was released now (at most every `RELEASED_EVERY_S`)."""
        return time.monotonic() - self._noted_at >= RELEASED_EVERY_S

    def released(self, chars: int) -> None:
        """The client has `chars` characters of the answer text now."""
        if chars != self._released:
            self.journal._write({"id": self.request_id, "released": chars})
            self._released = chars
        self._noted_at = time.monotonic()

    def ended(self) -> None:
        """The stream's row is written (or it ended before its first text went out)."""
        if not self._ended:
            self._ended = True
            self.journal._ended(self.request_id)
