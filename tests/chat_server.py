"""A real HTTP server on loopback that speaks the chat-completions protocol, scripted.

Each POST /v1/chat/completions takes the next entry of the script: a reply text (or a
function of the request's messages that returns one), optionally after a delay. Requests
are kept, so a test can read what the client sent. The answers carry `usage` counted the
way a server does (here: whitespace tokens), so token accounting is exercised end to end.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Say:
    text: str | Callable[[list[dict]], str]
    delay_s: float = 0.0
    raw: bool = False        # send `text` itself as the body, not wrapped in a chat completion


class ChatServer:
    def __init__(self, script: list[Say]):
        self.script, self.requests = list(script), []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    server.requests.append(body)
                    say = server.script.pop(0) if server.script else Say('{"error": "script exhausted"}')
                time.sleep(say.delay_s)
                text = say.text(body["messages"]) if callable(say.text) else say.text
                prompt = sum(len(m["content"].split()) for m in body["messages"])
                out = {"id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion", "created": int(time.time()),
                       "model": body["model"],
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": text}}],
                       "usage": {"prompt_tokens": prompt, "completion_tokens": len(text.split()),
                                 "total_tokens": prompt + len(text.split())}}
                data = text.encode() if say.raw else json.dumps(out).encode()
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client gave up (a timeout test)
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def proposal(name: str, edits: list[dict], hypothesis: str | None = None) -> str:
    return json.dumps({"name": name, "hypothesis": hypothesis or f"changing {name} improves accuracy because the "
                       "health report says so", "expected_effect": "validation accuracy rises",
                       "success_criterion": "validation accuracy beats the control beyond the noise floor",
                       "rollback": f"undo {name}", "edits": edits})
