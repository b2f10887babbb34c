"""The stream journal: what a process that died mid-stream leaves for the next start to record."""

from __future__ import annotations

import time

from morphguard.settle import stream_journal
from morphguard.settle.stream_journal import StreamJournal


def test_a_dead_process_leaves_its_open_streams_with_what_they_released(tmp_path, monkeypatch):
    monkeypatch.setattr(stream_journal, "RELEASED_EVERY_S", 0.0)
    journal = StreamJournal(tmp_path)
    ended, cut = journal.open({"request_id": "ended"}), journal.open({"request_id": "cut"})
    cut.released(42)
    ended.released(7)
    ended.ended()
    assert StreamJournal.left_behind(tmp_path) == []  # a live process's file is its own
    journal._file.write(b'{"id": "cut", "rel')  # the line it was writing when it died
    journal._file.close()  # died: the lock goes with it, the file stays
    [(path, streams)] = StreamJournal.left_behind(tmp_path)
    assert streams == [({"request_id": "cut"}, 42)]
    StreamJournal.forget(path)
    assert StreamJournal.left_behind(tmp_path) == []


def test_what_was_released_is_noted_at_most_every_quarter_second(tmp_path):
    journal = StreamJournal(tmp_path)
    stream = journal.open({"request_id": "r"})
    assert not stream.due()  # just opened
    time.sleep(stream_journal.RELEASED_EVERY_S)
    assert stream.due()
    stream.released(5)
    assert not stream.due()
    journal.close()
    assert not journal.path.exists()  # a clean stop leaves nothing to recover


def test_a_journal_folder_that_cannot_be_written_leaves_the_proxy_serving_and_says_so(tmp_path, caplog):
    """A read-only root file system (the hardened containers) must not stop the proxy from starting."""
    from morphguard.settle.trail import _journal

    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    assert _journal(blocked / "audit.streams") is None
    assert "streams are not journaled" in caplog.text
    assert _journal(tmp_path / "audit.streams") is not None
