package upstream

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// bodyCases are bodies in parts: none, one, and many of mixed sizes, past
// the connection's write buffer (writeBufferSize).
func bodyCases() map[string][][]byte {
	many := [][]byte{[]byte(`{"messages":[`)}
	for i := range 200 {
		many = append(many, []byte(fmt.Sprintf(`{"i":%d,"pad":%q},`, i, strings.Repeat("x", i*7))))
	}
	many = append(many, []byte(`{}]}`))
	return map[string][][]byte{
		"none":  nil,
		"one":   {[]byte(`{"a":1}`)},
		"big":   {bytes.Repeat([]byte("y"), 3*writeBufferSize+5)},
		"many":  many,
		"split": {[]byte(`{"a"`), []byte(`:`), []byte(`1}`)},
	}
}

// TestPartsReader: a body's parts read as their concatenation, whatever
// the reads' sizes (iotest.TestReader), and GetBody reads them again from
// the start as often as net/http asks (a resend after a reused connection
// failed).
func TestPartsReader(t *testing.T) {
	for name, parts := range bodyCases() {
		t.Run(name, func(t *testing.T) {
			want := bytes.Join(parts, nil)
			if err := iotest.TestReader(&partsReader{parts: parts}, want); err != nil {
				t.Fatal(err)
			}
			req, err := http.NewRequest(http.MethodPost, "http://x/", nil)
			if err != nil {
				t.Fatal(err)
			}
			setBody(req, parts)
			if req.ContentLength != int64(len(want)) {
				t.Fatalf("ContentLength %d, want %d", req.ContentLength, len(want))
			}
			if len(want) == 0 {
				if req.Body != http.NoBody || req.GetBody != nil {
					t.Fatalf("an empty body is %v (GetBody %v), want http.NoBody", req.Body, req.GetBody != nil)
				}
				return
			}
			for i, r := range []func() (io.ReadCloser, error){func() (io.ReadCloser, error) { return req.Body, nil }, req.GetBody, req.GetBody} {
				rc, err := r()
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				if err != nil || !bytes.Equal(got, want) {
					t.Fatalf("read %d: %d bytes (%v), want the %d of the parts", i, len(got), err, len(want))
				}
			}
		})
	}
}

// TestBodyInParts: a body given in parts reaches the provider byte for
// byte, with its Content-Length (not chunked).
func TestBodyInParts(t *testing.T) {
	type got struct {
		body     []byte
		length   int64
		encoding []string
	}
	recv := make(chan got, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		recv <- got{b, r.ContentLength, r.TransferEncoding}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	c := client(10 * time.Second)
	for name, parts := range bodyCases() {
		t.Run(name, func(t *testing.T) {
			s, f := c.Open(t.Context(), Request{Name: "p", URL: srv.URL, Body: parts})
			if f != nil {
				t.Fatal(f)
			}
			g := <-recv
			s.End()
			s.Close()
			want := bytes.Join(parts, nil)
			if !bytes.Equal(g.body, want) || g.length != int64(len(want)) || len(g.encoding) != 0 {
				t.Fatalf("provider got %d bytes, Content-Length %d, Transfer-Encoding %v; want the %d bytes of the parts, their length, none",
					len(g.body), g.length, g.encoding, len(want))
			}
		})
	}
}
