# One image with every dsh binary; deploy/k8s picks the binary per workload.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/... ./services/agent/cmd/... ./services/llmgateway/cmd/... ./services/toolhost/cmd/toolhost
# The sandbox launcher with its C first stage (static; the image has gcc):
# it starts on every bash call, and without cgo it pays a Go runtime start.
RUN CGO_ENABLED=1 go build -trimpath -ldflags "-s -w" -o /out/ ./services/toolhost/cmd/dsh-sandbox-launcher

FROM debian:bookworm-slim
# bash and coreutils serve the built-in bash tool; ca-certificates the providers' TLS.
# The user dsh (65532) is the one every pod of deploy/k8s runs as
# (runAsUser: 65532; go test ./deploy/k8s checks they agree). /workspace is
# the toolhost's workspace (a volume in Kubernetes) and the working
# directory of every binary, so a session created without a cwd works there.
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates coreutils git \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 65532 dsh \
    && useradd --uid 65532 --gid 65532 --home-dir /workspace --no-create-home --shell /bin/bash dsh \
    && mkdir -p /workspace /data \
    && chown 65532:65532 /workspace /data
COPY --from=build /out/ /usr/local/bin/
WORKDIR /workspace
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dsh"]
