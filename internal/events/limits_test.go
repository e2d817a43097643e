package events_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/dsh-dev/dsh/internal/events"
	"github.com/dsh-dev/dsh/internal/natstest"
)

func streamConfig(t *testing.T, url string) jetstream.StreamConfig {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return info.Config
}

// TestStreamLimits: the stream gets the configured limits with the oldest
// messages discarded (so it fits its volume and never refuses the agent),
// both when the publisher creates it and on a stream created unbounded
// earlier; past the byte limit publishing goes on and the stream stays
// within it.
func TestStreamLimits(t *testing.T) {
	t.Parallel()
	srv, _ := startPublished(t, "before", 5)
	if c := streamConfig(t, srv.URL()); c.MaxAge != 0 || c.MaxBytes != -1 {
		t.Fatalf("unconfigured: max age %v, max bytes %d; want unbounded", c.MaxAge, c.MaxBytes)
	}

	const maxBytes = 16 << 10
	limited := newPublisher(t, srv.URL(), newMemStore(), func(c *events.Config) {
		c.Limits = events.StreamLimits{MaxAge: time.Hour, MaxBytes: maxBytes}
	})
	for i := range int64(40) {
		limited.Durable("acme", "big", mkEvents(i*10, i*10+10))
	}
	flush(t, limited)
	c := streamConfig(t, srv.URL())
	if c.MaxAge != time.Hour || c.MaxBytes != maxBytes || c.Discard != jetstream.DiscardOld {
		t.Fatalf("limits on the existing stream: max age %v, max bytes %d, discard %v", c.MaxAge, c.MaxBytes, c.Discard)
	}
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), events.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Bytes > maxBytes || info.State.LastSeq < 400 {
		t.Fatalf("stream holds %d bytes (limit %d), last seq %d: want the oldest discarded and every publish taken", info.State.Bytes, maxBytes, info.State.LastSeq)
	}

	fresh := natstest.Start(t)
	created := newPublisher(t, fresh.URL(), newMemStore(), func(c *events.Config) {
		c.Limits = events.StreamLimits{MaxAge: 2 * time.Hour, MaxBytes: 1 << 20}
	})
	created.Durable("", "s", mkEvents(0, 1))
	flush(t, created)
	if c := streamConfig(t, fresh.URL()); c.MaxAge != 2*time.Hour || c.MaxBytes != 1<<20 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("created stream: max age %v, max bytes %d, discard %v", c.MaxAge, c.MaxBytes, c.Discard)
	}
}
