#!/usr/bin/env bash
# setup-polyglot.sh installs what the Python and TypeScript SDKs need:
# Debian's grpcio/protobuf for /usr/bin/python3, protoc + grpc_python_plugin
# (for the stub drift check), pip, venv, setuptools and wheel (to build and
# install the Python package, as examples/clients does), the npm dependencies
# of sdk/typescript (buf and protoc-gen-es for its generated types), the
# reference MCP servers of tests/mcpservers (the bridge's tests), and
# Debian's postgresql (internal/pgtest starts a throwaway server from its
# binaries for the PostgreSQL store's tests; the tests fail rather than skip
# when DSH_REQUIRE_POSTGRES is set).
# Idempotent: it installs only what is missing and runs `apt-get update` only
# when a package cannot be found in the current lists.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
debs=(python3-grpcio python3-protobuf protobuf-compiler protobuf-compiler-grpc python3-pip python3-venv
	python3-setuptools python3-wheel postgresql)

missing=()
for p in "${debs[@]}"; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
		missing+=("$p")
	fi
done

if ((${#missing[@]} > 0)); then
	sudo=""
	if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
	echo "setup-polyglot: installing ${missing[*]}"
	need_update=0
	for p in "${missing[@]}"; do
		if ! apt-cache show "$p" >/dev/null 2>&1; then need_update=1; fi
	done
	if ((need_update)); then $sudo apt-get update -qq; fi
	DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [[ ! -d "$root/sdk/typescript/node_modules/@grpc/grpc-js" ]] ||
	[[ "$root/sdk/typescript/package-lock.json" -nt "$root/sdk/typescript/node_modules/.package-lock.json" ]]; then
	echo "setup-polyglot: npm ci in sdk/typescript"
	(cd "$root/sdk/typescript" && npm ci --no-audit --no-fund --loglevel=error)
fi

# The reference MCP servers the bridge is tested against (versions pinned in
# tests/mcpservers/package.json and its lockfile).
if [[ ! -d "$root/tests/mcpservers/node_modules/@modelcontextprotocol/server-everything" ]] ||
	[[ "$root/tests/mcpservers/package-lock.json" -nt "$root/tests/mcpservers/node_modules/.package-lock.json" ]]; then
	echo "setup-polyglot: npm ci in tests/mcpservers"
	(cd "$root/tests/mcpservers" && npm ci --no-audit --no-fund --loglevel=error)
fi
