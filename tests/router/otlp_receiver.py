"""A real OTLP trace receiver for tests: OTLP/HTTP (protobuf over POST /v1/traces) and OTLP/gRPC
(opentelemetry.proto.collector.trace.v1.TraceService/Export), decoding what arrives with the official
`opentelemetry-proto` classes. No OpenTelemetry Collector package exists for this machine (Debian has
no otelcol; PyPI none), so this is the receiving end of the wire protocol itself, not a mock of the
exporter: the router's SDK exporter sends to it over the network exactly as to a Collector.

Spans are kept flattened as dicts: trace_id / span_id / parent_span_id as hex, name, kind, start and
end (ns), attributes decoded to Python values, status code, and the resource's service.name.
"""

from __future__ import annotations

import gzip
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class SpanStore:
    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self.lock = threading.Lock()

    def add(self, req: trace_service_pb2.ExportTraceServiceRequest) -> None:
        out = []
        for rs in req.resource_spans:
            res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    out.append({
                        "trace_id": s.trace_id.hex(), "span_id": s.span_id.hex(),
                        "parent_span_id": s.parent_span_id.hex() or None, "name": s.name, "kind": s.kind,
                        "start": s.start_time_unix_nano, "end": s.end_time_unix_nano,
                        "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                        "status": s.status.code, "service": res.get("service.name"), "scope": ss.scope.name,
                    })
        with self.lock:
            self.requests += 1
            self.spans.extend(out)

    def wait_for(self, n: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= n:
                    return list(self.spans)
            time.sleep(0.05)
        with self.lock:
            return list(self.spans)


class HttpReceiver(SpanStore):
    """OTLP/HTTP: POST /v1/traces with an ExportTraceServiceRequest body (gzip or not)."""

    def __init__(self) -> None:
        super().__init__()
        store = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = trace_service_pb2.ExportTraceServiceRequest()
                req.ParseFromString(data)
                store.add(req)
                store.headers.append(dict(self.headers))
                body = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.headers: list[dict[str, str]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class GrpcReceiver(SpanStore):
    """OTLP/gRPC: the TraceService's Export on an insecure loopback port."""

    def __init__(self) -> None:
        super().__init__()
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        store = self
        self.metadata: list[dict[str, str]] = []

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # the proto's name
                store.metadata.append(dict(context.invocation_metadata()))
                store.add(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        self.server.stop(0)
