package bash

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// capture collects one output stream: the whole stream in memory until it
// passes max bytes, then only its tail; from that moment the full stream is
// also spilled to a private file (its first maxSpill bytes; the file is kept
// and marked capped past that). Live chunks go to onData cut at UTF-8
// boundaries, at most maxLive bytes of them: a flood never reaches the
// caller whole, the result's tail and the spill file carry the rest.
type capture struct {
	mu       sync.Mutex
	max      int
	maxSpill int64
	maxLive  int64
	newSpill func() (*os.File, error)
	onData   func(string)

	liveSent   int64
	liveCapped bool
	spillCap   bool // the spill file holds only the first maxSpill bytes

	buf       []byte // everything (≤ max) or the tail
	total     int64  // bytes ever written
	spill     *os.File
	spillSize int64
	spillGone bool // spill failed or exceeded maxSpill
	live      []byte
}

func (c *capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.total += int64(len(p))
	if c.spill == nil && !c.spillGone && len(c.buf)+len(p) > c.max {
		c.openSpill()
	}
	if c.spill != nil && !c.spillCap {
		if room := c.maxSpill - c.spillSize; int64(len(p)) > room {
			if _, err := c.spill.Write(p[:room]); err != nil {
				c.dropSpill()
			} else {
				c.spillSize, c.spillCap = c.maxSpill, true
			}
		} else if _, err := c.spill.Write(p); err != nil {
			c.dropSpill()
		} else {
			c.spillSize += int64(len(p))
		}
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) > 2*c.max {
		c.buf = append([]byte(nil), c.buf[len(c.buf)-c.max:]...)
	}
	if c.onData != nil && !c.liveCapped {
		if c.maxLive > 0 && c.liveSent+int64(len(c.live)+len(p)) > c.maxLive {
			c.liveCapped = true
			c.live = nil
			c.onData(fmt.Sprintf("\n[live output capped at %d bytes; the result carries the tail and the spill file all of it]\n", c.maxLive))
			return len(p), nil
		}
		c.live = append(c.live, p...)
		n := completeUTF8(c.live)
		if n > 0 {
			c.onData(strings.ToValidUTF8(string(c.live[:n]), "\uFFFD"))
			c.liveSent += int64(n)
			c.live = append(c.live[:0], c.live[n:]...)
		}
	}
	return len(p), nil
}

func (c *capture) openSpill() {
	if c.newSpill == nil {
		c.spillGone = true
		return
	}
	f, err := c.newSpill()
	if err != nil {
		c.spillGone = true
		return
	}
	c.spill = f
	if _, err := f.Write(c.buf); err != nil {
		c.dropSpill()
		return
	}
	c.spillSize = int64(len(c.buf))
}

func (c *capture) dropSpill() {
	if c.spill != nil {
		name := c.spill.Name()
		c.spill.Close()
		os.Remove(name)
		c.spill = nil
	}
	c.spillGone = true
}

// finish flushes live output and closes the spill file.
func (c *capture) finish() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.onData != nil && !c.liveCapped && len(c.live) > 0 {
		c.onData(strings.ToValidUTF8(string(c.live), "\uFFFD"))
		c.live = nil
	}
	if c.spill != nil {
		c.spill.Close()
	}
}

// Output is a collected stream as the tool reports it.
type Output struct {
	// Text is the whole stream, or its tail when Truncated.
	Text string
	// Truncated says Text is only the tail.
	Truncated bool
	// SpillPath holds the full stream when Truncated; empty when the spill
	// was unavailable.
	SpillPath string
	// SpillCapped says SpillPath holds only the stream's first bytes (the
	// spill cap).
	SpillCapped bool
}

func (c *capture) output() Output {
	c.mu.Lock()
	defer c.mu.Unlock()
	b := c.buf
	if len(b) > c.max {
		b = b[len(b)-c.max:]
	}
	o := Output{Truncated: c.total > int64(len(b))}
	if o.Truncated {
		b = trimLeadingContinuation(b)
		if c.spill != nil && !c.spillGone {
			o.SpillPath, o.SpillCapped = c.spill.Name(), c.spillCap
		}
	}
	o.Text = strings.ToValidUTF8(string(b), "\uFFFD")
	return o
}

// since returns the bytes written after offset pos (as much as the tail
// still holds), whether some were lost, and the new offset.
func (c *capture) since(pos int64) (string, bool, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	start := c.total - int64(len(c.buf))
	lossy := pos < start
	from := max(pos, start) - start
	b := trimLeadingContinuation(c.buf[from:])
	return strings.ToValidUTF8(string(b), "\uFFFD"), lossy, c.total
}

func (c *capture) spillPath() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.spill != nil && !c.spillGone {
		return c.spill.Name()
	}
	return ""
}

// completeUTF8 is the length of the longest prefix of b not ending inside a
// UTF-8 sequence.
func completeUTF8(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if utf8.FullRune(b[i:]) {
				return len(b)
			}
			return i
		}
	}
	return len(b)
}

func trimLeadingContinuation(b []byte) []byte {
	for i := 0; i < len(b) && i < utf8.UTFMax; i++ {
		if utf8.RuneStart(b[i]) {
			return b[i:]
		}
	}
	return b
}
