package events_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
)

// BenchmarkPublish measures the publisher end to end against an embedded
// JetStream server: one op is one event handed to Durable (in batches of
// 16, as an agent flush would) until JetStream has acknowledged all of them.
func BenchmarkPublish(b *testing.B) { benchPublish(b, false) }

// BenchmarkPublishEncoded is BenchmarkPublish with each event's encoding
// handed in (DurableEncoded), as the agent's flush does with the SQLite
// store's bytes: the publisher marshals nothing.
func BenchmarkPublishEncoded(b *testing.B) { benchPublish(b, true) }

func benchPublish(b *testing.B, encoded bool) {
	srv := natstest.Start(b)
	p, err := events.New(b.Context(), events.Config{Conn: events.Conn{URL: srv.URL()}, Store: newMemStore(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close(context.Background())
	evs := mkEvents(0, int64(b.N))
	var pb [][]byte
	if encoded {
		pb = make([][]byte, len(evs))
		for i, ev := range evs {
			pb[i], _ = proto.Marshal(ev)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < len(evs); i += 16 {
		j := min(i+16, len(evs))
		if encoded {
			p.DurableEncoded("", "bench", evs[i:j], pb[i:j])
		} else {
			p.Durable("", "bench", evs[i:j])
		}
	}
	ctx, cancel := context.WithTimeout(b.Context(), 5*time.Minute)
	defer cancel()
	if err := p.Flush(ctx); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkDurable measures the caller's cost of handing over a batch of 16
// events while NATS is down and the session's queue is full (the steady
// state of a long outage: each batch is checked and dropped from memory).
// The events are reused; only their seqs advance.
func BenchmarkDurable(b *testing.B) {
	srv := natstest.Start(b)
	srv.Stop()
	p, err := events.New(b.Context(), events.Config{Conn: events.Conn{URL: srv.URL()}, Store: newMemStore(), Logger: slog.New(slog.DiscardHandler), QueueLimit: 1024})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		_ = p.Close(ctx) // NATS is down: the events stay behind the cursor
	}()
	p.Durable("", "bench", mkEvents(0, 1024))
	batch := mkEvents(1024, 1040)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for _, ev := range batch {
			ev.Seq += 16
		}
		p.Durable("", "bench", batch)
	}
}
