// Command fakeupstream is a chat-completions endpoint in its own process
// for the gateway's out-of-process benchmarks: every POST gets the same
// stream of --events content events written at once, as real SSE bytes.
// It prints "addr=<host:port>" once it listens.
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "listen address")
	events := flag.Int("events", 3, "content events per stream")
	flag.Parse()
	var body strings.Builder
	for i := range *events {
		fmt.Fprintf(&body, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d \"},\"finish_reason\":null}]}\n\n", i)
	}
	body.WriteString("data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":20}}\n\ndata: [DONE]\n\n")
	payload := body.String()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("addr=%s\n", lis.Addr())
	log.Fatal(http.Serve(lis, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, payload)
	})))
}
