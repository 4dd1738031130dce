"""A stand-in for `python -m vllm.entrypoints.cli.main serve` (copied into a fake site dir as that module):
standard library only, vLLM-style start-up log lines, /health, /v1/models, streamed /v1/completions with
usage, and vllm:* counters on /metrics (no graphpool_* series)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {"generation": 0, "prompt": 0, "requests": 0}
LOCK = threading.Lock()
START_DELAY_S = 0.5  # so that start-up is measurably above zero

BOOT_LOG = [
    "INFO 05-02 10:00:00 [api_server.py:1880] vLLM API server version 0.26.0",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:01 [core.py:77] Initializing a V1 LLM engine (v0.26.0) with config: "
    "model='/tmp/vllm-models/smollm2-135m', compilation_config={'level': 3, 'cudagraph_mode': "
    "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [4, 2, 1], 'max_cudagraph_capture_size': 4}",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:03 [gpu_model_runner.py:2370] Model loading took 0.2605 GiB and "
    "0.42 seconds",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:12 [monitor.py:34] torch.compile takes 7.31 s in total",
    "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):   0%|          | 0/3 [00:00<?, ?it/s]"
    "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE):  33%|###3      | 1/3 [00:00<00:00,  9.1it/s]"
    "\rCapturing CUDA graphs (mixed prefill-decode, PIECEWISE): 100%|##########| 3/3 [00:00<00:00, 10.2it/s]",
    "\rCapturing CUDA graphs (decode, FULL):   0%|          | 0/3 [00:00<?, ?it/s]"
    "\rCapturing CUDA graphs (decode, FULL): 100%|##########| 3/3 [00:00<00:00, 31.0it/s]",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:13 [gpu_model_runner.py:3480] Graph capturing finished in 1 secs, "
    "took 0.05 GiB",
    "(EngineCore_DP0 pid=212) INFO 05-02 10:00:13 [core.py:210] init engine (profile, create kv cache, warmup model) "
    "took 9.87 seconds",
]


def make_handler(served: str, max_len: int) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def _json(self, body: object, status: int = 200) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/health":
                self._json({})
            elif self.path == "/v1/models":
                self._json({"object": "list", "data": [{"id": served, "object": "model", "max_model_len": max_len}]})
            elif self.path == "/metrics":
                with LOCK:
                    c = dict(COUNTS)
                labels = f'engine="0",model_name="{served}"'
                text = (
                    "# HELP vllm:generation_tokens_total Number of generation tokens processed.\n"
                    "# TYPE vllm:generation_tokens_total counter\n"
                    f"vllm:generation_tokens_total{{{labels}}} {c['generation']}.0\n"
                    "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.\n"
                    "# TYPE vllm:prompt_tokens_total counter\n"
                    f"vllm:prompt_tokens_total{{{labels}}} {c['prompt']}.0\n"
                    "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.\n"
                    "# TYPE vllm:num_preemptions_total counter\n"
                    f"vllm:num_preemptions_total{{{labels}}} 0.0\n"
                    "# HELP vllm:request_success_total Count of successfully processed requests.\n"
                    "# TYPE vllm:request_success_total counter\n"
                    f'vllm:request_success_total{{{labels},finished_reason="length"}} {c["requests"]}.0\n'
                    f'vllm:request_success_total{{{labels},finished_reason="stop"}} 0.0\n'
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)
            else:
                self._json({"error": "not found"}, 404)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = body["prompt"]
            n_prompt = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
            n_out = int(body["max_tokens"])
            with LOCK:
                COUNTS["prompt"] += n_prompt
                COUNTS["generation"] += n_out
                COUNTS["requests"] += 1
            usage = {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out}
            base = {"id": "cmpl-0", "object": "text_completion", "created": 0, "model": served}
            if not body.get("stream"):
                self._json({**base, "choices": [{"index": 0, "text": "t1 " * n_out, "logprobs": None,
                                                 "finish_reason": "length"}], "usage": usage})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(n_out):
                time.sleep(0.002)
                choice = {"index": 0, "text": f"t{i} ", "logprobs": None,
                          "finish_reason": "length" if i == n_out - 1 else None}
                self.wfile.write(f"data: {json.dumps({**base, 'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\ndata: [DONE]\n\n".encode())
            self.wfile.flush()

    return Handler


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--max-model-len", type=int, required=True)
    args, _ = p.parse_known_args()  # vLLM's other flags: logged, not used
    print(f"fake vllm argv: {' '.join(sys.argv[1:])}", flush=True)
    print(f"fake vllm PYTHONPATH={os.environ.get('PYTHONPATH', '')}", flush=True)
    for line in BOOT_LOG:
        print(line, flush=True)
        time.sleep(START_DELAY_S / len(BOOT_LOG))
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.served_model_name, args.max_model_len))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
