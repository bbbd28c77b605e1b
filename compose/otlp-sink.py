#!/usr/bin/env python3
"""A stand-in OpenTelemetry collector for `bench --traces`: accepts OTLP/HTTP exports at
POST /v1/traces, answers each as a collector does (200, an empty protobuf reply), and keeps
nothing but counts, which it writes to the file given as its second argument when stopped."""
import http.server
import signal
import sys

host, port = sys.argv[1].rsplit(":", 1)
counts = {"exports": 0, "bytes": 0}


class Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        length = int(self.headers.get("Content-Length", "0"))
        body = self.rfile.read(length)
        counts["exports"] += 1
        counts["bytes"] += len(body)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def stop(*_):
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as out:
            out.write(f"{counts['exports']} exports, {counts['bytes']} bytes\n")
    sys.exit(0)


signal.signal(signal.SIGTERM, stop)
http.server.ThreadingHTTPServer.allow_reuse_address = True
server = http.server.ThreadingHTTPServer((host, int(port)), Sink)
try:
    server.serve_forever()
finally:
    stop()
