# One image with every dsh binary; deploy/k8s picks the binary per workload.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/ ./cmd/... ./services/agent/cmd/... ./services/llmgateway/cmd/... ./services/toolhost/cmd/...

FROM debian:bookworm-slim
# bash and coreutils serve the built-in bash tool; ca-certificates the providers' TLS.
RUN apt-get update && apt-get install -y --no-install-recommends bash ca-certificates coreutils git \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/dsh"]
