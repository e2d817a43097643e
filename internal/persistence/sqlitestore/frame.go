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
	for i := 0; i < len(data); {
		size, j := 0, i
		for j < len(data) && (j == i || size+len(data[j]) <= batchRowBytes) {
			size += len(data[j]) + protowire.SizeTag(1) + protowire.SizeVarint(uint64(len(data[j])))
			j++
		}
		pb := make([]byte, 0, size)
		for _, d := range data[i:j] {
			pb = protowire.AppendTag(pb, 1, protowire.BytesType)
			pb = protowire.AppendBytes(pb, d)
		}
		rows = append(rows, batchRow{seq: first + int64(i), n: j - i, pb: pb})
		i = j
	}
	return rows
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
