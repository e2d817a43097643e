#!/usr/bin/env bash
# gen.sh regenerates dsh_toolhost/gen from ../../proto (the dsh contract: all
# four packages, llm, tools, session and agent) and proto/ (the vendored gRPC
# health and reflection protocols, and google/protobuf/field_mask.proto which
# protoc needs to parse agent.proto; its module comes with python3-protobuf)
# with Debian's protoc and grpc_python_plugin. `gen.sh --check` regenerates
# into a temporary directory and fails when the committed stubs differ
# (drift check).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
repo="$(cd "$here/../.." && pwd)"
out="$here/dsh_toolhost/gen"
check=0
if [[ "${1:-}" == "--check" ]]; then check=1; out="$(mktemp -d)"; trap 'rm -rf "$out"' EXIT; fi
command -v protoc >/dev/null || { echo "gen.sh: protoc missing (run scripts/setup-polyglot.sh)" >&2; exit 1; }
plugin="$(command -v grpc_python_plugin)" || { echo "gen.sh: grpc_python_plugin missing (run scripts/setup-polyglot.sh)" >&2; exit 1; }

if ((!check)); then rm -rf "$out"; fi
mkdir -p "$out"
protoc -I "$repo/proto" -I "$here/proto" \
	--python_out="$out" --grpc_python_out="$out" --plugin=protoc-gen-grpc_python="$plugin" \
	dsh/llm/v1/llm.proto dsh/tools/v1/tools.proto dsh/session/v1/session.proto dsh/agent/v1/agent.proto \
	grpc/health/v1/health.proto grpc/reflection/v1/reflection.proto

# protoc emits absolute imports ("from dsh.llm.v1 import llm_pb2"); make them
# package-relative so the stubs live inside dsh_toolhost without touching sys.path.
find "$out" -name '*.py' -print0 | xargs -0 sed -i -E \
	-e 's/^from (dsh|grpc\.health|grpc\.reflection)\.([a-z0-9_.]+) import ([a-z0-9_]+_pb2)/from dsh_toolhost.gen.\1.\2 import \3/'
for d in $(find "$out" -type d); do touch "$d/__init__.py"; done

if ((check)); then
	if ! diff -r -x __pycache__ "$here/dsh_toolhost/gen" "$out"; then
		echo "sdk/python/dsh_toolhost/gen is out of date with proto/: run sdk/python/scripts/gen.sh and commit" >&2
		exit 1
	fi
	echo "python stubs: no drift"
fi
