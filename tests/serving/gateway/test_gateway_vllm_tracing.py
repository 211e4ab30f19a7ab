"""A real vLLM-CPU engine exporting its OpenTelemetry spans (`--otlp-traces-endpoint`, OTLP/HTTP) to a receiver in
this process: its request span for a call through the gateway is a child of the `traceparent` the gateway sent."""

from __future__ import annotations

import http.server
import threading
import time

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from driver.testbed.engines import free_port
from tests.serving.engine_fixtures import start_engine

from .test_gateway_vllm import gateway_for

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(600)]

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


class OtlpReceiver:
    """`POST /v1/traces` (OTLP/HTTP protobuf) on 127.0.0.1, in a thread; `spans()`: every span received."""

    def __init__(self):
        self.bodies: list[bytes] = []
        bodies = self.bodies

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                bodies.append(self.rfile.read(int(self.headers["Content-Length"])))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> OtlpReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def spans(self) -> list:
        found = []
        for body in list(self.bodies):
            request = ExportTraceServiceRequest.FromString(body)
            found += [
                span for resource in request.resource_spans for scope in resource.scope_spans for span in scope.spans
            ]
        return found


@pytest.fixture
def traced_engine(tiny_model, tmp_path_factory):
    """An engine of its own that exports its spans to an OtlpReceiver (OTLP/HTTP, batched every 0.2 s)."""
    with OtlpReceiver() as receiver:
        engine = start_engine(
            tiny_model,
            tmp_path_factory,
            kv_cache_bytes=32 * 1024 * 1024,
            extra_args=("--otlp-traces-endpoint", receiver.url),
            env={"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_BSP_SCHEDULE_DELAY": "200"},
        )
        try:
            yield engine.wait_ready(), receiver
        finally:
            engine.stop()


def test_vllms_request_span_is_a_child_of_the_traceparent_the_gateway_sent(traced_engine, tmp_path):
    engine, receiver = traced_engine
    traceparent = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
    with gateway_for([engine], tmp_path) as gw:
        body = {"messages": [{"role": "user", "content": "Plan a trip to Oslo."}], "max_tokens": 4}
        headers = {"X-Maestro-Workflow": "wf-otel", "X-Maestro-Stage": "traced", "traceparent": traceparent}
        httpx.post(f"{gw.url}/v1/chat/completions", json=body, headers=headers, timeout=120).raise_for_status()
    deadline, mine = time.monotonic() + 60, []
    while not mine and time.monotonic() < deadline:  # vLLM exports when its batch processor's period is up
        mine = [s for s in receiver.spans() if s.trace_id.hex() == CALLER_TRACE]
        time.sleep(0.2)
    assert mine, (
        f"no span of trace {CALLER_TRACE} in {len(receiver.spans())} vLLM exported; see {engine.config.log_path}"
    )
    assert {s.parent_span_id.hex() for s in mine} == {CALLER_SPAN}
