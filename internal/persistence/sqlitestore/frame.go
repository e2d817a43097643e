package sqlitestore

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/dsh-dev/dsh/internal/persistence"
)

// batchRowBytes is the size at which an appended batch is split into
// another batches row: most flushes are one row, and no row grows without
// bound (one event larger than this is a row of its own).
const batchRowBytes = 64 << 10

// batchRow is one row of the batches table: the events seq .. seq+n-1,
// framed.
type batchRow struct {
	seq int64
	n   int
	pb  []byte
}

// packRows frames the encoded events of a batch starting at first into
// rows of about batchRowBytes.
func packRows(first int64, data [][]byte) []batchRow {
	var rows []batchRow
	splitRows(len(data), func(k int) int { return len(data[k]) }, func(i, j, framed int) {
		pb := make([]byte, 0, framed)
		for _, d := range data[i:j] {
			pb = protowire.AppendTag(pb, 1, protowire.BytesType)
			pb = protowire.AppendBytes(pb, d)
		}
		rows = append(rows, batchRow{seq: first + int64(i), n: j - i, pb: pb})
	})
	return rows
}

// splitRows splits n events, event k size(k) bytes encoded, into rows of
// about batchRowBytes: row(i, j, framed) for each row of the events i..j-1,
// framed bytes long. A row ends before the event that would take it past
// batchRowBytes (an event larger than that is a row of its own).
func splitRows(n int, size func(k int) int, row func(i, j, framed int)) {
	for i := 0; i < n; {
		framed, j := 0, i
		for j < n && (j == i || framed+size(j) <= batchRowBytes) {
			framed += protowire.SizeTag(1) + protowire.SizeBytes(size(j))
			j++
		}
		row(i, j, framed)
		i = j
	}
}

// unpackRow appends the events of one stored batch row (seq, n, pb) to out
// as persistence.Rows, checking that the row starts at want and frames
// exactly n events; the events themselves are decoded by
// persistence.DecodeRows.
func unpackRow(id string, want, seq, n int64, pb []byte, out []persistence.Row) ([]persistence.Row, error) {
	corrupt := func(err error) error { return &persistence.CorruptError{SessionID: id, Seq: want, Err: err} }
	if seq != want {
		return out, corrupt(fmt.Errorf("batch row at seq %d, want %d", seq, want))
	}
	var k int64
	for len(pb) > 0 {
		num, typ, m := protowire.ConsumeTag(pb)
		if m < 0 || num != 1 || typ != protowire.BytesType {
			return out, corrupt(fmt.Errorf("batch row at seq %d: bad frame %d", seq, k))
		}
		pb = pb[m:]
		ev, m := protowire.ConsumeBytes(pb)
		if m < 0 {
			return out, corrupt(fmt.Errorf("batch row at seq %d: frame %d: %w", seq, k, protowire.ParseError(m)))
		}
		pb = pb[m:]
		out = append(out, persistence.Row{Seq: seq + k, PB: ev})
		k++
	}
	if k != n || n <= 0 {
		return out, corrupt(fmt.Errorf("batch row at seq %d: %d events framed, n = %d", seq, k, n))
	}
	return out, nil
}
