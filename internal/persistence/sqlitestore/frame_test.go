package sqlitestore

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
)

// TestPackRows: a batch is split before the event that would take a row
// past batchRowBytes (an event larger than that is a row of its own), and
// unpacking the rows gives back every event with its seq.
func TestPackRows(t *testing.T) {
	t.Parallel()
	small, big := bytes.Repeat([]byte{1}, 100), bytes.Repeat([]byte{2}, batchRowBytes)
	tests := []struct {
		name   string
		data   [][]byte
		starts []int64 // row seqs, from first = 10
	}{
		{"one event", [][]byte{small}, []int64{10}},
		{"small events share a row", [][]byte{small, small, small}, []int64{10}},
		{"a big event after small ones", [][]byte{small, small, big, small}, []int64{10, 12, 13}},
		{"big events", [][]byte{big, big}, []int64{10, 11}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rows := packRows(10, tt.data)
			var starts []int64
			var got []persistence.Row
			want := int64(10)
			for _, r := range rows {
				starts = append(starts, r.seq)
				var err error
				if got, err = unpackRow("s", want, r.seq, int64(r.n), r.pb, got); err != nil {
					t.Fatal(err)
				}
				want = r.seq + int64(r.n)
			}
			if !slices.Equal(starts, tt.starts) {
				t.Fatalf("rows at %v, want %v", starts, tt.starts)
			}
			if len(got) != len(tt.data) {
				t.Fatalf("%d events back, want %d", len(got), len(tt.data))
			}
			for i, r := range got {
				if r.Seq != 10+int64(i) || !bytes.Equal(r.PB, tt.data[i]) {
					t.Fatalf("event %d: seq %d, %d bytes", i, r.Seq, len(r.PB))
				}
			}
		})
	}
}

// FuzzUnpackRow: any stored bytes unpack to events or a *CorruptError,
// never a panic; what unpacks packs back to the same events (the bytes may
// differ: a length varint may be stored longer than needed).
func FuzzUnpackRow(f *testing.F) {
	for _, r := range packRows(0, [][]byte{{1, 2}, {}, bytes.Repeat([]byte{3}, 300)}) {
		f.Add(r.pb, int64(r.n))
	}
	f.Add([]byte{0x0a, 0x05, 1}, int64(1))
	f.Add([]byte{0x12, 0x00}, int64(1))
	f.Fuzz(func(t *testing.T, pb []byte, n int64) {
		rows, err := unpackRow("s", 0, 0, n, pb, nil)
		if err != nil {
			var ce *persistence.CorruptError
			if !errors.As(err, &ce) {
				t.Fatalf("error %v is not a *CorruptError", err)
			}
			return
		}
		data := make([][]byte, len(rows))
		for i, r := range rows {
			data[i] = r.PB
		}
		var again []persistence.Row
		for _, r := range packRows(0, data) {
			if again, err = unpackRow("s", r.seq, r.seq, int64(r.n), r.pb, again); err != nil {
				t.Fatalf("repacked row: %v", err)
			}
		}
		if len(again) != len(rows) {
			t.Fatalf("%d events repacked, %d stored", len(again), len(rows))
		}
		for i := range rows {
			if again[i].Seq != rows[i].Seq || !bytes.Equal(again[i].PB, rows[i].PB) {
				t.Fatalf("event %d changed by a repack", i)
			}
		}
	})
}

// TestEncodeBatch: the rows encodeBatch marshals each event straight into
// are the rows packRows makes of the events marshalled one by one (the
// same bytes, split at the same events), also where an event is larger
// than a row.
func TestEncodeBatch(t *testing.T) {
	t.Parallel()
	var b persistencetest.Builder
	b.StartTurn("go")
	b.StartStep()
	b.Chunks(3, "small")
	b.Chunks(3, strings.Repeat("x", batchRowBytes/2))
	b.Chunks(1, strings.Repeat("y", batchRowBytes+1))
	b.Chunks(2, "small")
	evs := b.Events()[1:] // from seq 1: a batch need not start the log
	var data [][]byte
	for _, ev := range evs {
		pb, err := pbMarshal.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		data = append(data, pb)
	}
	want := packRows(1, data)
	got, err := encodeBatch("s", evs, true)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) || len(got) < 4 {
		t.Fatalf("%d rows, want %d (and at least 4)", len(got), len(want))
	}
	for i := range want {
		if got[i].seq != want[i].seq || got[i].n != want[i].n || !bytes.Equal(got[i].pb, want[i].pb) {
			t.Errorf("row %d: seq %d n %d (%d bytes), want seq %d n %d (%d bytes)",
				i, got[i].seq, got[i].n, len(got[i].pb), want[i].seq, want[i].n, len(want[i].pb))
		}
	}
}
