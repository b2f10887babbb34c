"""The upstream's SSE body cut into lines: CR, LF and CRLF (also split across chunks), and UTF-8 split across chunks."""

import asyncio

from morphguard.proxy.upstream import UpstreamResponse


class _Body:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def iter_any(self):
        for chunk in self.chunks:
            yield chunk


class _Response:
    status = 200
    headers: dict[str, str] = {}

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Body(chunks)


def lines_of(chunks: list[bytes]) -> list[str]:
    async def collect() -> list[str]:
        return [line async for line in UpstreamResponse(_Response(chunks)).lines()]  # type: ignore[arg-type]

    return asyncio.run(collect())


def test_every_kind_of_line_break_ends_a_line_wherever_the_chunks_are_cut():
    chunks = [b"data: a", b"bc\r", b"\ndata: d\re", b"f\n", b"\n", b"data: \xc3", b"\xa9t\xc3\xa9\r\n", b"tail"]
    assert lines_of(chunks) == ["data: abc", "data: d", "ef", "", "data: été", "tail"]
    assert lines_of([b"data: x\r"]) == ["data: x"]


def test_a_long_line_dripped_in_small_chunks_arrives_whole():
    """Pieces of an unfinished line are joined once, when its end arrives (re-joining them at every chunk cost the
    square of the line's length, on the event loop)."""
    line = b"data: " + b"x" * 2_000_000
    chunks = [line[i:i + 1_000] for i in range(0, len(line), 1_000)] + [b"\n", b"data: [DONE]\n"]
    assert lines_of(chunks) == [line.decode(), "data: [DONE]"]
