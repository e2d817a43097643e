package upstream

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"
)

// TestCopyConnCopiesThroughAPool: a body net/http hands to the
// connection (io.Copy of an io.LimitedReader, as it writes the part past
// its write buffer) arrives whole, and a dialled connection copies it
// without allocating a buffer per copy, where a *net.TCPConn allocates
// one each time (the premise: the case fails if Go stops doing so).
func TestCopyConnCopiesThroughAPool(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 3000) // 48,000 bytes: past one 32 KiB buffer
	for _, tc := range []struct {
		name   string
		dial   func(ctx context.Context, network, addr string) (net.Conn, error)
		allocs func(float64) bool
		want   string
	}{
		{"pooled (the transport's dialer)", NewTransport().DialContext, func(a float64) bool { return a < 1 }, "none"},
		{"plain TCPConn", (&net.Dialer{}).DialContext, func(a float64) bool { return a >= 1 }, "at least one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			got := make(chan int64, 1)
			go func() {
				c, err := l.Accept()
				if err != nil {
					got <- -1
					return
				}
				defer c.Close()
				n, _ := io.Copy(io.Discard, c)
				got <- n
			}()
			c, err := tc.dial(t.Context(), "tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			br := bytes.NewReader(nil)
			lr := &io.LimitedReader{R: br}
			runs := 0
			allocs := testing.AllocsPerRun(50, func() {
				br.Reset(body)
				lr.N = int64(len(body))
				if n, err := io.Copy(c, lr); err != nil || n != int64(len(body)) {
					t.Fatalf("copied %d bytes (%v), want %d", n, err, len(body))
				}
				runs++
			})
			c.Close()
			if n := <-got; n != int64(runs*len(body)) {
				t.Fatalf("the server read %d bytes, want %d", n, runs*len(body))
			}
			if !tc.allocs(allocs) {
				t.Errorf("%.2f allocations per copy, want %s", allocs, tc.want)
			}
		})
	}
}
