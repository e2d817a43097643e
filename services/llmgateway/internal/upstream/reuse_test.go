package upstream

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dsh-dev/dsh/services/llmgateway/internal/provider"
)

// countingServer is a real loopback HTTP server streaming a short event
// stream that ends with an end marker, counting the TCP connections it
// accepted. With a tail, the end marker is flushed on its own and the
// handler returns (and the body's terminator follows) tail later, as a
// provider that flushes every event and then finishes its bookkeeping does.
func countingServer(t *testing.T, tail time.Duration) (string, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: a\n\ndata: b\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
		if tail > 0 {
			w.(http.Flusher).Flush()
			time.Sleep(tail) // the provider's pace, not a wait for an event
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL, &conns
}

// readToEnd reads one stream to its end marker the way the translators do
// (End at the marker, then Close), and waits for Close's background drain.
func readToEnd(c *Client, t *testing.T, url string) error {
	_, err := readToEndEOF(c, t, url)
	return err
}

// readToEndEOF is readToEnd that also reports whether the body's
// terminator had been read with the end marker (Close then needs no
// drain).
func readToEndEOF(c *Client, t *testing.T, url string) (eof bool, err error) {
	s, f := c.Open(t.Context(), Request{Name: "p", URL: url, Body: [][]byte{[]byte(`{}`)}})
	if f != nil {
		return false, f
	}
	defer func() {
		eof = s.eof
		s.Close()
		<-s.drained
	}()
	for {
		ev, f := s.Next()
		if f != nil {
			return false, f
		}
		if string(ev.Data) == "[DONE]" {
			s.End()
			return false, nil
		}
	}
}

// TestConnectionReuse: streams read to their end marker leave their
// connection in the pool, sequentially (one connection for all) and
// concurrently (no more connections than streams at once, round after
// round: the pool keeps far more than net/http's 2 idle connections per
// host). Not parallel: its hundreds of streams would starve the
// timing-bound tests of this package on a small machine.
func TestConnectionReuse(t *testing.T) {
	for _, tail := range []time.Duration{0, 2 * time.Millisecond} {
		t.Run(fmt.Sprintf("tail=%v", tail), func(t *testing.T) {
			t.Parallel()
			url, conns := countingServer(t, tail)
			c := client(0)
			defer c.HTTP.CloseIdleConnections()
			eofs := 0
			for range 20 {
				eof, err := readToEndEOF(c, t, url)
				if err != nil {
					t.Fatal(err)
				}
				if eof {
					eofs++
				}
			}
			// Without a tail the terminator leaves in the end marker's
			// write, and is usually read with it: those streams' Close
			// starts no drain, and their connections are reused as well
			// (checked below).
			if tail == 0 && eofs == 0 {
				t.Errorf("no stream of 20 read its terminator with the end marker")
			}
			// net/http hands a drained connection back to its pool from
			// its read loop, just after the body's EOF, so the next
			// request can occasionally race it and dial: allow a few, far
			// below the one per stream a connection that is never reused
			// costs (18 of 20 without the drain).
			if n := conns.Load(); n > 4 {
				t.Fatalf("20 sequential streams used %d connections, want at most 4 (connections are not reused)", n)
			}
			const width, rounds = 80, 3
			for range rounds {
				var wg sync.WaitGroup
				errs := make(chan error, width)
				for range width {
					wg.Go(func() {
						if err := readToEnd(c, t, url); err != nil {
							errs <- err
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					t.Fatal(err)
				}
			}
			if n := conns.Load(); n > width+1 {
				t.Fatalf("%d rounds of %d concurrent streams used %d connections, want at most %d", rounds, width, n, width+1)
			}
		})
	}
}

// TestCloseBeforeEndDoesNotDrain: a stream closed before its end marker (the caller
// stopped reading) does not wait for the rest of the body.
func TestCloseBeforeEndDoesNotDrain(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	c := client(0)
	s, f := c.Open(t.Context(), Request{Name: "p", URL: srv.URL})
	if f != nil {
		t.Fatal(f)
	}
	if _, f := s.Next(); f != nil {
		t.Fatal(f)
	}
	s.Close()
	select { // at once: no drain without the end marker
	case <-s.drained:
	case <-time.After(drainTimeout / 2):
		t.Fatal("Close drained a stream without its end marker")
	}
	if _, f := s.Next(); f == nil || f.Code == provider.CodeTimeout {
		t.Fatalf("Next after Close = %v, want a closed-stream failure", f)
	}
}

// TestDrainOutlivesTheCaller: the gateway's caller ends right after Close
// (a gRPC stream's context is cancelled as its handler returns), usually
// before the body's terminator, which a provider sends after its end
// marker, has arrived. The drain must still read it, or every such stream
// costs its connection: 20 sequential streams whose caller ends at Close
// used 20 connections before.
func TestDrainOutlivesTheCaller(t *testing.T) {
	t.Parallel()
	url, conns := countingServer(t, 20*time.Millisecond)
	c := client(0)
	defer c.HTTP.CloseIdleConnections()
	for range 20 {
		ctx, cancel := context.WithCancel(t.Context())
		s, f := c.Open(ctx, Request{Name: "p", URL: url, Body: [][]byte{[]byte(`{}`)}})
		if f != nil {
			t.Fatal(f)
		}
		for {
			ev, f := s.Next()
			if f != nil {
				t.Fatal(f)
			}
			if string(ev.Data) == "[DONE]" {
				s.End()
				break
			}
		}
		s.Close()
		cancel() // the caller is gone; the terminator is still 20 ms away
		<-s.drained
	}
	if n := conns.Load(); n > 4 {
		t.Fatalf("20 streams whose caller ended at Close used %d connections, want at most 4", n)
	}
}

// TestCallerEndCancelsBeforeTheEndMarker: before the end marker, the
// caller's end still cancels the request at once.
func TestCallerEndCancelsBeforeTheEndMarker(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: a\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // only the gateway's cancellation ends it
	}))
	defer srv.Close()
	c := client(0)
	ctx, cancel := context.WithCancel(t.Context())
	s, f := c.Open(ctx, Request{Name: "p", URL: srv.URL})
	if f != nil {
		t.Fatal(f)
	}
	defer s.Close()
	if _, f := s.Next(); f != nil {
		t.Fatal(f)
	}
	cancel()
	if _, f := s.Next(); f == nil || f.Code != provider.CodeAborted {
		t.Fatalf("Next after the caller ended = %v, want ABORTED", f)
	}
}
