package upstream

import (
	"io"
	"net/http"
)

// partsReader reads a request body held in parts, in order, without
// joining them first: net/http copies a body into its connection's write
// buffer whatever reader it is given, so a body read from its parts is
// copied once, where one joined per request is copied twice (and
// allocated). A Read fills p from as many parts as fit.
type partsReader struct {
	parts [][]byte
	off   int // into parts[0]
}

func (r *partsReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) && len(r.parts) > 0 {
		c := copy(p[n:], r.parts[0][r.off:])
		n += c
		r.off += c
		if r.off == len(r.parts[0]) {
			r.parts, r.off = r.parts[1:], 0
		}
	}
	if n == 0 && len(r.parts) == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// setBody makes parts req's body, with its length and a GetBody that
// reads them again (net/http resends a request whose reused connection
// failed before the response).
func setBody(req *http.Request, parts [][]byte) {
	n := 0
	for _, p := range parts {
		n += len(p)
	}
	if n == 0 {
		req.Body, req.GetBody, req.ContentLength = http.NoBody, nil, 0
		return
	}
	req.ContentLength = int64(n)
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(&partsReader{parts: parts}), nil }
	req.Body, _ = req.GetBody()
}
