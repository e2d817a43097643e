package upstream

import (
	"context"
	"io"
	"net"
	"sync"
)

// copyBufSize is the size of the buffers a connection copies a request
// body through: io.Copy's own.
const copyBufSize = 32 << 10

// copyBufs holds the buffers copyConn.ReadFrom copies through.
var copyBufs = sync.Pool{New: func() any { return new([copyBufSize]byte) }}

// dialContext is d's DialContext with every connection wrapped in a
// copyConn.
func dialContext(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &copyConn{Conn: c}, nil
	}
}

// copyConn is a provider connection whose ReadFrom copies through a
// pooled buffer. Over HTTP/1.1 net/http writes the part of a request body
// past its write buffer with io.Copy(conn, body) (the body behind an
// io.LimitedReader, so no WriterTo); a *net.TCPConn's ReadFrom, finding
// neither a file nor a socket to splice from, falls back to io.Copy with
// a buffer allocated per call (min(32 KiB, the body's rest)): fresh memory,
// whose first touch faults. In a warm 1,000-session ladder that copy was
// the gateway's largest single item (11.7 % of its CPU;
// docs/arch/throughput.md §29). Only plain-HTTP/1.1 providers gain: over
// HTTPS net/http copies into the *tls.Conn wrapping this one, which has
// no ReadFrom (io.Copy allocates there as before), and HTTP/2 writes
// bodies through buffers of its own.
type copyConn struct{ net.Conn }

// ReadFrom copies r to the connection through a pooled buffer.
func (c *copyConn) ReadFrom(r io.Reader) (int64, error) {
	b := copyBufs.Get().(*[copyBufSize]byte)
	defer copyBufs.Put(b)
	return io.CopyBuffer(connWriter{c}, r, b[:])
}

// connWriter is the connection with nothing but Write (io.CopyBuffer would
// otherwise hand the copy back to ReadFrom); one pointer, so making it an
// io.Writer allocates nothing.
type connWriter struct{ c *copyConn }

func (w connWriter) Write(p []byte) (int, error) { return w.c.Conn.Write(p) }
