package jsonlstore

import (
	"bytes"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// goodFile returns a valid session file (two completed turns and an open
// third) and its events.
func goodFile(tb testing.TB) ([]byte, []*sessionv1.SessionEvent) {
	tb.Helper()
	var b persistencetest.Builder
	b.CompletedTurn(2)
	b.CompletedTurn(1)
	b.StartTurn("third")
	b.StartStep()
	b.AssistantMessage("", "c9")
	hl, err := encodeHeaderLine(persistencetest.Header("fz"))
	if err != nil {
		tb.Fatal(err)
	}
	lines, err := persistence.EncodeBatch("fz", 0, b.Events())
	if err != nil {
		tb.Fatal(err)
	}
	return joinLines(hl, lines), b.Events()
}

// FuzzScanMutated truncates a valid file and overwrites one byte of it, and
// checks that scan never panics and never silently drops a committed event:
// every event whose line lies wholly before the damage comes back unchanged,
// and every intact turn/end line after the damage comes back or the load is
// refused.
func FuzzScanMutated(f *testing.F) {
	data, _ := goodFile(f)
	n := uint(len(data))
	for _, c := range []struct {
		cut, pos uint
		b        byte
	}{{n, n, 0}, {n - 1, n, 0}, {n / 2, n, 0}, {n, n / 3, 'x'}, {n, n / 3, '\n'}, {n, 10, '}'}, {20, n, 0}, {n, n - 5, 0}} {
		f.Add(c.cut, c.pos, c.b)
	}
	f.Fuzz(func(t *testing.T, cut, pos uint, b byte) {
		orig, events := goodFile(t)
		cut = cut % (uint(len(orig)) + 1)
		data := append([]byte(nil), orig[:cut]...)
		damage := int(cut)
		if pos < cut && data[pos] != b {
			data[pos] = b
			damage = int(pos)
		}
		sc, err := scan("fz", data)
		if err != nil {
			return // refused: allowed, nothing silently dropped
		}
		// Lines wholly before the damage are intact and must come back.
		intact := 0
		off := bytes.IndexByte(orig, '\n') + 1
		for _, ev := range events {
			end := off + bytes.IndexByte(orig[off:], '\n') + 1
			if end > damage {
				break
			}
			if intact >= len(sc.events) || !cmp.Equal(ev, sc.events[intact], protocmp.Transform()) {
				t.Fatalf("event %d (intact line) missing or changed", ev.GetSeq())
			}
			intact++
			off = end
		}
		// An intact committed turn/end after the damage must come back.
		off = bytes.IndexByte(orig, '\n') + 1
		for _, ev := range events {
			end := off + bytes.IndexByte(orig[off:], '\n') + 1
			if ev.GetTurnEnd() != nil && off > damage && end <= len(data) && int(ev.GetSeq()) >= len(sc.events) {
				t.Fatalf("committed turn/end seq %d silently dropped (damage at %d)", ev.GetSeq(), damage)
			}
			off = end
		}
		if sc.valid > int64(len(data)) || (sc.torn == (sc.valid == int64(len(data)))) {
			t.Fatalf("valid %d, torn %v for %d bytes", sc.valid, sc.torn, len(data))
		}
	})
}

// FuzzScanRaw feeds arbitrary bytes: no panic, and a successful scan returns
// events with contiguous seqs inside the valid prefix.
func FuzzScanRaw(f *testing.F) {
	data, _ := goodFile(f)
	f.Add(data)
	f.Add(data[:len(data)/2])
	f.Add([]byte("{}\n"))
	f.Add([]byte(`{"type":"session","version":0,"header":{"id":"fz"}}` + "\n" + `{"seq":"0"}` + "\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := scan("fz", data)
		if err != nil {
			return
		}
		for i, ev := range sc.events {
			if ev.GetSeq() != int64(i) {
				t.Fatalf("events[%d].Seq = %d", i, ev.GetSeq())
			}
		}
		if sc.valid > int64(len(data)) || (sc.valid < int64(len(data)) && data[sc.valid-1] != '\n') {
			t.Fatalf("valid prefix %d does not end a line", sc.valid)
		}
	})
}
