"""An OTLP/HTTP trace receiver for the telemetry tests (tests/src/otlp.rs).

POST /v1/traces takes an ExportTraceServiceRequest in protobuf, as a collector does, and
keeps its spans; GET /spans answers every span received so far as JSON, one object each:
trace_id, span_id, parent_span_id (hex, "" for a root), name, kind, service (the resource's
service.name), attributes (key to value) and status ("error", "ok" or "unset").

Usage: python receiver.py PORT (binds 127.0.0.1); the test process stops it.
"""

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

SPANS = []
LOCK = threading.Lock()


def value(any_value):
    kind = any_value.WhichOneof("value")
    return getattr(any_value, kind) if kind else None


def decode(request):
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                status = {Status.STATUS_CODE_ERROR: "error", Status.STATUS_CODE_OK: "ok"}.get(span.status.code, "unset")
                spans.append({
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex(),
                    "name": span.name,
                    "kind": Span.SpanKind.Name(span.kind),
                    "service": resource.get("service.name"),
                    "attributes": {a.key: value(a.value) for a in span.attributes},
                    "status": status,
                })
    return spans


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
            self.send_error(404 if self.path != "/v1/traces" else 415)
            return
        request = ExportTraceServiceRequest()
        try:
            request.ParseFromString(body)
        except Exception as error:  # a malformed body is the exporter's bug: say so
            self.send_error(400, str(error))
            return
        with LOCK:
            SPANS.extend(decode(request))
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        with LOCK:
            answer = json.dumps(SPANS).encode()
        self.send_response(200 if self.path == "/spans" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
