"""An untrusted endpoint's ``/metrics``: prometheus_client parses the text, loadgen bounds it.

First the text (what is kept, what is dropped, what is refused and how it says so), then
the wire: a body read a chunk at a time up to the cap, and a scraper that turns a body it
cannot use into an error row and goes on.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen.client.prometheus import (
    MAX_ABS,
    MAX_LINE,
    MAX_SAMPLE_BYTES,
    PrometheusTextError,
    fetch_metrics,
    metrics_url,
    parse_samples,
    read_body,
)
from loadgen.client.scrape import ServerMetricsScraper
from loadgen.run_folder import SERVER_METRICS_NAME, load_server_metrics
from loadgen.sim.model import FixedModel
from loadgen.sim.server import SimServer

ENGINES = ("vllm:", "llamacpp:", "sglang:", "tgi_")

# -- the text ---------------------------------------------------------------------------------


def test_samples_are_summed_over_label_sets_without_buckets_created_stamps_or_comments() -> None:
    text = (
        "# HELP vllm:requests Requests.\n"
        "# TYPE vllm:requests counter\n"
        'vllm:requests_total{reason="stop"} 2\n'
        'vllm:requests_total{reason="length"} 3\n'
        "vllm:requests_created 1.7e9\n"
        "# TYPE vllm:ttft_seconds histogram\n"
        'vllm:ttft_seconds_bucket{le="0.1"} 4\n'
        'vllm:ttft_seconds_bucket{le="+Inf"} 5\n'
        "vllm:ttft_seconds_sum 1.5\n"
        "vllm:ttft_seconds_count 5\n"
        "\n"
    )
    assert parse_samples(text) == {
        "vllm:requests_total": 5.0,
        "vllm:ttft_seconds_sum": 1.5,
        "vllm:ttft_seconds_count": 5.0,
    }


def test_a_type_line_does_not_rename_the_samples() -> None:
    # prometheus_client, given the TYPE line, would call this sample tgi_request_success_total
    text = "# HELP tgi_request_success Successes\n# TYPE tgi_request_success counter\ntgi_request_success 17\n"
    assert parse_samples(text, ENGINES) == {"tgi_request_success": 17.0}


def test_only_names_with_the_prefixes_are_kept_and_other_lines_are_never_parsed() -> None:
    text = 'python_info{implementation="CPython" 1\nprocess_open_fds 9\nvllm:num_requests_running 2\n'
    assert parse_samples(text, ENGINES) == {"vllm:num_requests_running": 2.0}
    with pytest.raises(PrometheusTextError):
        parse_samples(text)  # every name: the broken python_info line is parsed, and refused


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ('vllm:x{model_name="a}b"} 3', "vllm:x"),  # a brace inside a quoted label value
        ('vllm:x{a="say \\"hi\\"",b="back\\\\slash",c="new\\nline"} 3', "vllm:x"),
        ('vllm:x{a="a b",b="{",c=","} 3', "vllm:x"),
        ("vllm:x 3 1700000000000", "vllm:x"),  # a timestamp
        ("vllm:x\t3", "vllm:x"),
        ("vllm:x 3\r", "vllm:x"),  # a CRLF line end
        ("  vllm:x 3  ", "vllm:x"),
    ],
)
def test_quoting_escapes_and_spacing_are_read_as_the_format_says(line: str, name: str) -> None:
    assert parse_samples(line + "\n", ENGINES) == {name: 3.0}


@pytest.mark.parametrize(
    "value",
    ["NaN", "+Inf", "-Inf", "1e400", "-1e400", "9" * 400, "-" + "9" * 400, "1e16", "-1e16", "3e308"],
)
def test_a_value_that_is_not_finite_or_is_absurd_is_dropped(value: str) -> None:
    assert parse_samples(f"vllm:x {value}\nvllm:y 1\n") == {"vllm:y": 1.0}


def test_every_believable_count_is_kept_and_sums_stay_finite() -> None:
    text = f'vllm:x{{a="1"}} {int(MAX_ABS)}\nvllm:x{{a="2"}} {MAX_ABS!r}\nvllm:y -{int(MAX_ABS)}\nvllm:z 0.5\n'
    assert parse_samples(text) == {"vllm:x": 2 * MAX_ABS, "vllm:y": -MAX_ABS, "vllm:z": 0.5}


@pytest.mark.parametrize(
    "text",
    [
        "vllm:num_requests_running abc\n",
        "vllm:num_requests_running",  # cut off before the value
        'vllm:x{a="1} 2\n',  # a quote never closed
        "vllm:x{a=1} 2\n",  # an unquoted label value
        'vllm:x{a="1",a="2"} 3\n',  # a label twice
        "vllm:x 1_000\n",
        "vllm:x 1 " + "9" * 400 + "\n",  # a timestamp past float range
        "vllm:ok 1\nvllm:x{\n",  # one bad line refuses the whole body: no partial sums
    ],
)
def test_text_the_parser_refuses_raises_a_prometheus_text_error(text: str) -> None:
    with pytest.raises(PrometheusTextError, match="^not Prometheus text: "):
        parse_samples(text)


def test_the_error_quotes_the_server_only_ascii_escaped_and_short() -> None:
    hostile = "\x1b[31m\x1b]0;pwned\x07<script>\u202egnp.exe\u200f\x00" * 20
    with pytest.raises(PrometheusTextError) as caught:
        parse_samples(f"vllm:{hostile} 1\n")
    message = str(caught.value)
    assert message.isascii() and message.isprintable() and len(message) < 200, message
    assert "\\x1b" in message  # escaped, not dropped: the reader still sees what came


@pytest.mark.parametrize(
    "body",
    [
        "",
        "<!doctype html><html><body><h1>502 Bad Gateway</h1></body></html>\n",
        '{"object": "list", "data": [{"id": "m"}]}\n',
        bytes(range(256)).decode("utf-8", "replace") * 16,
        "\n" * 1000 + "# only comments\n",
    ],
)
def test_a_body_that_is_not_prometheus_text_has_no_engine_samples(body: str) -> None:
    assert parse_samples(body, ENGINES) == {}


def test_a_line_over_max_line_is_skipped_unparsed_and_the_rest_kept() -> None:
    # escaped quotes: the label text on which the parser's work grows with the square
    head = 'vllm:lora_requests_info{running_lora_adapters="'
    huge = head + '\\"' * MAX_LINE + '"} 1'
    fits = head + "a" * (MAX_LINE - len(head) - 4) + '"} 1'
    assert len(fits) == MAX_LINE
    assert parse_samples(f"{huge}\nvllm:y 2\n") == {"vllm:y": 2.0}
    assert parse_samples(f"{fits}\nvllm:y 2\n") == {"vllm:lora_requests_info": 1.0, "vllm:y": 2.0}


def test_more_sample_lines_than_the_parse_budget_are_refused_whole() -> None:
    line = 'vllm:x{model_name="m"} 1\n'
    n = MAX_SAMPLE_BYTES // len(line) + 1
    with pytest.raises(PrometheusTextError, match="KiB of sample lines"):
        parse_samples(line * n)
    buckets = 'vllm:x_bucket{le="1"} 1\n' * n  # skipped lines cost no parsing, so they do not count
    assert parse_samples(buckets + line) == {"vllm:x": 1.0}


def test_names_kept_are_bounded_and_a_kept_name_still_sums() -> None:
    text = "".join(f"vllm:m{i} 1\n" for i in range(50)) + "vllm:m0 1\n"
    assert parse_samples(text, limit=10) == {"vllm:m0": 2.0, **{f"vllm:m{i}": 1.0 for i in range(1, 10)}}


_FRAGMENTS = st.sampled_from(
    ["vllm:x", "tgi_y", "_bucket", "_total", "{", "}", '"', "\\", ",", "=", "a", " ", "\t", "#", "\r", "\x00",
     "\u202e", "1", "-", ".", "e", "9" * 30, "NaN", "+Inf", "1e308", "__name__", 'le="1"', "\n"]
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(_FRAGMENTS, st.text(max_size=4)), max_size=40).map("".join))
def test_any_text_gives_bounded_finite_values_or_a_prometheus_text_error(text: str) -> None:
    try:
        values = parse_samples(text, ENGINES, limit=4)
    except PrometheusTextError as e:
        assert str(e).isascii() and len(str(e)) < 200
        return
    assert len(values) <= 4
    assert all(name.startswith(ENGINES) and not name.endswith("_bucket") for name in values)
    assert all(type(v) is float and abs(v) <= MAX_ABS * (text.count("\n") + 1) for v in values.values())


# -- the wire ---------------------------------------------------------------------------------

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[str]:
    """``handler`` on loopback at ``/metrics``; yields that URL."""
    app = web.Application()
    app.router.add_get("/metrics", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/metrics"
    finally:
        await runner.cleanup()


def test_a_body_that_arrives_in_pieces_is_read_whole() -> None:
    async def pieces(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        await resp.write(b"vllm:num_requests_running 2\n" * 2000)
        await asyncio.sleep(0.05)
        await resp.write(b"vllm:num_requests_waiting 3\n")
        await resp.write_eof()
        return resp

    async def main() -> dict[str, float] | None:
        async with serving(pieces) as url:
            return await fetch_metrics(url)

    assert asyncio.run(main()) == {"vllm:num_requests_running": 4000.0, "vllm:num_requests_waiting": 3.0}


def test_an_endless_body_is_refused_at_the_cap_and_not_read_to_its_end() -> None:
    limit = 256 * 1024 * 1024
    sent = 0
    done = asyncio.Event()

    async def endless(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        resp = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await resp.prepare(request)
        block = b'vllm:num_requests_running{model_name="m"} 1\n' * 4096
        try:
            while sent < limit:
                await resp.write(block)
                sent += len(block)
        except ConnectionError:
            pass  # the client hung up: what this test waits for
        finally:
            done.set()
        return resp

    async def main() -> None:
        async with serving(endless) as url, aiohttp.ClientSession() as http:
            async with http.get(url) as resp:
                with pytest.raises(PrometheusTextError, match="cap: not read further"):
                    await read_body(resp, max_bytes=1024 * 1024)
            await asyncio.wait_for(done.wait(), 30)

    asyncio.run(main())
    assert 1024 * 1024 < sent < limit // 8  # the cap, plus what socket buffers took in


def test_a_declared_length_over_the_cap_is_refused_unread() -> None:
    async def big(request: web.Request) -> web.StreamResponse:
        return web.Response(body=b"vllm:x 1\n" * 20000, content_type="text/plain")

    async def main() -> None:
        async with serving(big) as url, aiohttp.ClientSession() as http, http.get(url) as resp:
            with pytest.raises(PrometheusTextError, match="^body of 180000 bytes is over the 65536-byte cap"):
                await read_body(resp, max_bytes=65536)

    asyncio.run(main())


def _gzipped(body: bytes) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, headers={"Content-Type": "text/plain", "Content-Encoding": "gzip"})

    return handler


def test_a_compressed_body_is_read_and_a_compression_bomb_is_refused_at_the_cap() -> None:
    line = b'vllm:num_requests_running{model_name="m"} 1\n'
    bomb = gzip.compress(line * (16 * 1024 * 1024 // len(line)), compresslevel=9)  # 16 MiB in ~50 KiB
    assert len(bomb) < 256 * 1024

    async def scrape(body: bytes) -> tuple[bool, str | None, float | None]:
        async with serving(_gzipped(body)) as url:
            scraper = ServerMetricsScraper(url, interval_s=10.0)
            ok = await scraper.start()
            running = scraper.rows[0]["running"] if scraper.rows else None
            await scraper.stop()
            return ok, scraper.reason, running

    assert asyncio.run(scrape(gzip.compress(line * 3))) == (True, None, 3.0)
    ok, reason, _ = asyncio.run(scrape(bomb))
    assert not ok and reason is not None and "cap" in reason


def test_fetch_metrics_gives_the_simulators_samples_and_none_for_anything_else() -> None:
    async def html(request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html><body>metrics here</body></html>\n", content_type="text/html")

    async def main() -> tuple[dict[str, float] | None, dict[str, float] | None]:
        sim = SimServer(FixedModel())
        try:
            from_sim = await fetch_metrics(metrics_url(await sim.start()))
        finally:
            await sim.stop()
        async with serving(html) as url:
            return from_sim, await fetch_metrics(url)

    from_sim, from_html = asyncio.run(main())
    assert from_sim is not None and from_sim["vllm:num_requests_running"] == 0.0
    assert from_html is None


def test_a_scrape_the_parser_refuses_is_an_error_row_and_scraping_goes_on(tmp_path: Path) -> None:
    answered = 0
    enough = asyncio.Event()

    async def flaky(request: web.Request) -> web.StreamResponse:
        nonlocal answered
        answered += 1
        if answered >= 4:
            enough.set()
        good = answered % 2 == 1  # 1st (the probe), 3rd, ... answer; the 2nd, 4th, ... are garbage
        text = f"vllm:num_requests_running {answered}\n" if good else "vllm:num_requests_running one\n"
        return web.Response(text=text, content_type="text/plain")

    async def main() -> dict[str, Any]:
        async with serving(flaky) as url:
            scraper = ServerMetricsScraper(url, interval_s=0.02, out_path=tmp_path / SERVER_METRICS_NAME)
            assert await scraper.start()
            await asyncio.wait_for(enough.wait(), 60)
            return await scraper.stop()

    summary = asyncio.run(main())
    rows = load_server_metrics(tmp_path) or []
    assert summary["enabled"] and summary["samples"] >= 2 and summary["errors"] >= 1
    assert len(rows) == summary["samples"] + summary["errors"] >= 4
    # the probe, the first tick and the second answered in turn (a tick cut short by stop() may not)
    assert rows[0]["running"] == 1 and rows[2]["running"] == 3
    assert rows[1]["error"] == "not Prometheus text: \"could not convert string to float: 'one'\""
    for row in rows:
        assert ("error" in row) != ("raw" in row)
        assert "error" in row or row["running"] % 2 == 1
