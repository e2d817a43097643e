#!/usr/bin/python3
"""Drive a dsh session from Python: create it, send a prompt, print its events
(and the live output of running tools) until the turn ends, wait until idle.

    pip install sdk/python      # dsh-toolhost; see docs/clients.md
    DSH_AGENT=127.0.0.1:7700 ./drive_session.py "list the files"

Prints "<seq> <event>[: text]" per event (chunk deltas skipped) and, last,
"session <id> <status>". $DSH_TOKEN is sent as a bearer token.
"""
import os
import sys

from dsh_toolhost.client import AgentClient
from dsh_toolhost.gen.dsh.agent.v1 import agent_pb2


def text_of(blocks) -> str:
    return "".join(b.text.text for b in blocks if b.WhichOneof("block") == "text").strip().replace("\n", "\\n")


def main() -> int:
    prompt = " ".join(sys.argv[1:]) or "say hello"
    with AgentClient(os.environ.get("DSH_AGENT", "127.0.0.1:7700"), token=os.environ.get("DSH_TOKEN")) as agent:
        session = agent.create_session(cwd=os.getcwd(), provider=os.environ.get("DSH_PROVIDER", ""),
                                       model=os.environ.get("DSH_MODEL", ""))
        sid = session.header.id
        events = agent.stream_events(sid, include_progress=True)
        agent.send(sid, prompt)
        for resp in events:
            if resp.HasField("progress"):  # live and not durable: not in the log, not on NATS
                print(f"progress {resp.progress.tool_name}: {resp.progress.output.text.strip()}")
                continue
            ev = resp.event
            kind = ev.WhichOneof("payload")
            if kind == "assistant_chunk":
                continue  # deltas: the whole message follows as assistant_message
            text = text_of(getattr(ev, kind).content) if kind in ("assistant_message", "tool_result") else ""
            print(f"{ev.seq} {kind}" + (f": {text}" if text else ""), flush=True)
            if kind == "turn_end":
                events.cancel()
        idle = agent.wait_idle(sid, timeout=30)
        print("session", sid, agent_pb2.AgentStatus.Name(idle.status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
