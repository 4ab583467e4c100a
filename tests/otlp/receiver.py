"""An OTLP trace receiver for the telemetry tests (tests/src/otlp.rs), over HTTP and gRPC.

POST /v1/traces takes an ExportTraceServiceRequest in protobuf, as a collector does, and so
does the gRPC service TraceService/Export; both keep its spans. GET /spans answers every
span received so far as JSON, one object each: trace_id, span_id, parent_span_id (hex, ""
for a root), name, kind, service (the resource's service.name), attributes (key to value),
status ("error", "ok" or "unset") and links (trace_id and span_id each). GET /counts answers
the spans received per service.

Usage: python receiver.py HTTP_PORT GRPC_PORT [--count-only] (binds 127.0.0.1; gRPC is up
before HTTP answers); --count-only keeps the counts, not the spans (for a load of them).
The test process stops it.
"""

import json
import sys
import threading
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

SPANS = []
COUNTS = {}
LOCK = threading.Lock()
COUNT_ONLY = "--count-only" in sys.argv


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
                    "links": [{"trace_id": link.trace_id.hex(), "span_id": link.span_id.hex()} for link in span.links],
                })
    return spans


def service_of(resource_spans):
    return next((value(a.value) for a in resource_spans.resource.attributes if a.key == "service.name"), None)


def keep(request):
    with LOCK:
        for resource_spans in request.resource_spans:
            service = service_of(resource_spans)
            COUNTS[service] = COUNTS.get(service, 0) + sum(len(s.spans) for s in resource_spans.scope_spans)
        if not COUNT_ONLY:
            SPANS.extend(decode(request))


class TraceService(trace_service_pb2_grpc.TraceServiceServicer):
    def Export(self, request, context):
        keep(request)
        return ExportTraceServiceResponse()


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
        keep(request)
        answer = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def do_GET(self):
        with LOCK:
            answer = json.dumps(SPANS if self.path == "/spans" else COUNTS).encode()
        self.send_response(200 if self.path in ("/spans", "/counts") else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

    def log_message(self, *args):
        pass


def main():
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(TraceService(), server)
    server.add_insecure_port(f"127.0.0.1:{int(sys.argv[2])}")
    server.start()
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()


if __name__ == "__main__":
    main()
