"""The upstream's SSE body cut into lines: CR, LF and CRLF (also split across chunks), and UTF-8 split across chunks."""

import asyncio

import pytest

from morphguard.proxy.errors import ProxyError
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


def lines_of(chunks: list[bytes], limit: int = 4_000_000) -> list[str]:
    async def collect() -> list[str]:
        response = UpstreamResponse(_Response(chunks), limit)  # type: ignore[arg-type]
        return [line async for line in response.lines()]

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


@pytest.mark.parametrize("size", [100, 1_000, 100_000])
def test_a_line_longer_than_the_limit_is_a_502_before_it_is_held_whole(size):
    """Cut in chunks of `size` bytes: the error comes once the limit is passed, never after the whole line."""
    line = b"data: " + b"x" * 5_000
    taken: list[int] = []

    class _Counting(_Body):
        async def iter_any(self):
            for chunk in self.chunks:
                taken.append(len(chunk))
                yield chunk

    response = _Response([])
    response.content = _Counting([line[i:i + size] for i in range(0, len(line), size)] + [b"\n", b"data: [DONE]\n"])
    with pytest.raises(ProxyError) as raised:
        asyncio.run(_drain(UpstreamResponse(response, 2_048)))  # type: ignore[arg-type]
    assert raised.value.status == 502 and raised.value.code == "upstream_malformed"
    assert sum(taken) <= 2_048 + size  # read no further than the limit and the chunk that passed it


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"])
def test_lines_up_to_the_limit_pass_whatever_ends_them(ending):
    exact = b"d" * 2_048
    assert lines_of([exact[:1_000], exact[1_000:] + ending, b"tail"], limit=2_048) == [exact.decode(), "tail"]
    assert lines_of([exact + ending + b"next" + ending], limit=2_048) == [exact.decode(), "next"]
    with pytest.raises(ProxyError):
        lines_of([exact + b"d" + ending], limit=2_048)


async def _drain(response: UpstreamResponse) -> None:
    async for _ in response.lines():
        pass
