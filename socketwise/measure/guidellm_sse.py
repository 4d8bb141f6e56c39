"""GuideLLM's command line, reading streamed responses as Server-Sent Events define lines.

Run by the benchmark runner on a load generator, with GuideLLM's own venv:

    python -m socketwise.measure.guidellm_sse run ARGS...   # as `guidellm run ARGS...`

GuideLLM 0.8.1 reads a streamed completion with httpx's `aiter_lines`, which ends a line
at every boundary `str.splitlines` knows, U+0085, U+2028 and U+2029 among them. vLLM
writes those characters unescaped inside an event's JSON when the model generates them
(a byte-level tokenizer makes U+0085 from two byte tokens), so GuideLLM parsed half an
event, failed with "Unterminated string" and counted a request that the server answered
in full as failed. An event stream's lines end at CR LF, LF or CR only, and here they
do.

GuideLLM's workers are spawned processes, which import this module again as
`__mp_main__`: the fix goes in there too, and only the `__main__` run starts the CLI.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterable, AsyncIterator

# The line ends of an event stream (the HTML standard's "Server-sent events" grammar).
LINE_END = re.compile(r"\r\n|\r|\n")


async def event_stream_lines(texts: AsyncIterable[str]) -> AsyncIterator[str]:
    """The non-blank lines of an event stream that arrives in pieces, the last one even
    without its line end, as GuideLLM's backend reads them. A CR LF cut between two
    pieces reads as a line end and a blank line, skipped as every blank line is."""
    pending = ""
    async for text in texts:
        *lines, pending = LINE_END.split(pending + text)
        for line in lines:
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def patch_guidellm() -> None:
    from guidellm.backends.openai.http import OpenAIHTTPBackend

    def _aiter_lines(self, stream) -> AsyncIterator[str]:
        return event_stream_lines(stream.aiter_text())

    OpenAIHTTPBackend._aiter_lines = _aiter_lines


if __name__ in ("__main__", "__mp_main__"):
    patch_guidellm()

if __name__ == "__main__":
    from guidellm.cli import cli

    cli()
