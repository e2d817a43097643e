#!/usr/bin/python3
"""Consume a dsh session's events from the DSH_EVENTS JetStream stream.

    pip install sdk/python      # dsh-toolhost; see docs/clients.md
    NATS_URL=nats://127.0.0.1:4222 ./consume_events.py SESSION_ID

Reads the session's events from the first, in order, and prints
"<seq> <event>[: text]" per event until the turn ends. Chunk deltas, most of
the events, are skipped by their Dsh-Event-Type header before decoding.
"""
import os
import sys

from dsh_toolhost.events import read_events, session_subject


def text_of(blocks) -> str:
    return "".join(b.text.text for b in blocks if b.WhichOneof("block") == "text").strip().replace("\n", "\\n")


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: consume_events.py SESSION_ID", file=sys.stderr)
        return 2
    url = os.environ.get("NATS_URL", "nats://127.0.0.1:4222")
    for msg in read_events(url, session_subject(sys.argv[1]), timeout=30):
        if msg.type == "assistant/chunk":
            continue
        if msg.omitted:  # over the server's max_payload: fetch it from the agent
            print(f"{msg.seq} omitted ({msg.type})")
            continue
        ev = msg.event
        kind = ev.WhichOneof("payload")
        text = text_of(getattr(ev, kind).content) if kind in ("assistant_message", "tool_result") else ""
        print(f"{ev.seq} {kind}" + (f": {text}" if text else ""), flush=True)
        if kind == "turn_end":
            return 0
    return 1


if __name__ == "__main__":
    sys.exit(main())
