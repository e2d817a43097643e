package sqlitestore

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"strings"
)

// writer is the committer's connection: one connection of the sqlite
// driver, used directly rather than through database/sql, with every
// statement of the commit path prepared once (BEGIN and COMMIT included).
// database/sql wrapped each statement in locking, argument conversion, a
// per-transaction Stmt and a Result (docs/arch/throughput.md §10); only the
// committer goroutine uses a writer, so none of that is needed.
type writer struct {
	conn driver.Conn

	begin, commit, dataVersion, savepoint, rollbackTo, releaseSavept driver.Stmt
	insertSession, lookupSession, insertBatch, raiseCursor           driver.Stmt

	inserts map[int]driver.Stmt // the group's multi-row inserts by row count
	closers []driver.Stmt       // every prepared statement
	args    []driver.NamedValue // scratch for one statement's arguments
	dest    [2]driver.Value     // scratch for one result row
}

// Statements of the commit path. BEGIN IMMEDIATE takes the write lock at
// once (a deferred BEGIN could fail to upgrade with SQLITE_BUSY mid-group).
const (
	insertSessionSQL = `INSERT INTO sessions (id, version, created_at, cwd, parent_session, seed_length, delegation_depth, header)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING`
	// raiseCursorSQL writes a session's cursor row, raised only if higher.
	raiseCursorSQL = `INSERT INTO cursors (sid, next) VALUES (?1, ?2)
			ON CONFLICT (sid) DO UPDATE SET next = excluded.next WHERE excluded.next > cursors.next`
)

// maxInsertRows is the most batch rows one multi-row INSERT takes (4
// parameters each; SQLite allows 32,766).
const maxInsertRows = 64

// openWriter opens the writer connection with d (the sqlite driver) and
// prepares its statements.
func openWriter(d driver.Driver, name string) (*writer, error) {
	c, err := d.Open(name)
	if err != nil {
		return nil, err
	}
	w := &writer{conn: c, inserts: make(map[int]driver.Stmt)}
	for _, p := range []struct {
		dst *driver.Stmt
		q   string
	}{
		{&w.begin, "BEGIN IMMEDIATE"},
		{&w.commit, "COMMIT"},
		{&w.dataVersion, "PRAGMA data_version"},
		{&w.insertSession, insertSessionSQL},
		{&w.lookupSession, `SELECT sid, ` + nextSeqOf("sessions.sid") + ` FROM sessions WHERE id = ?`},
		{&w.insertBatch, insertBatchSQL},
		{&w.raiseCursor, raiseCursorSQL},
		{&w.savepoint, "SAVEPOINT w"},
		{&w.rollbackTo, "ROLLBACK TO w"},
		{&w.releaseSavept, "RELEASE w"},
	} {
		if *p.dst, err = w.prepare(p.q); err != nil {
			return nil, errors.Join(err, w.close())
		}
	}
	return w, nil
}

func (w *writer) prepare(q string) (driver.Stmt, error) {
	st, err := w.conn.(driver.ConnPrepareContext).PrepareContext(context.Background(), q)
	if err != nil {
		return nil, fmt.Errorf("sqlitestore: prepare: %w", err)
	}
	w.closers = append(w.closers, st)
	return st, nil
}

// close finalises the statements and closes the connection.
func (w *writer) close() error {
	var errs []error
	for _, st := range w.closers {
		errs = append(errs, st.Close())
	}
	return errors.Join(append(errs, w.conn.Close())...)
}

// bind sets w.args to args (int64, string, []byte or nil each).
func (w *writer) bind(args ...any) []driver.NamedValue {
	w.args = w.args[:0]
	for i, a := range args {
		w.args = append(w.args, driver.NamedValue{Ordinal: i + 1, Value: a})
	}
	return w.args
}

// exec runs st with args. The context is never done: a request's own
// context is checked before it runs, and a statement interrupted half way
// would cost the whole group (the driver also starts a goroutine per
// statement to watch a context that can end).
func (w *writer) exec(st driver.Stmt, args []driver.NamedValue) (driver.Result, error) {
	return st.(driver.StmtExecContext).ExecContext(context.Background(), args)
}

// exec0 runs an argument-less statement.
func (w *writer) exec0(st driver.Stmt) error {
	_, err := w.exec(st, nil)
	return err
}

// queryRow runs st with args and returns its first row's columns (one or
// two) as int64 (ok false when there is no row).
func (w *writer) queryRow(st driver.Stmt, args []driver.NamedValue) (vals [2]int64, ok bool, err error) {
	rows, err := st.(driver.StmtQueryContext).QueryContext(context.Background(), args)
	if err != nil {
		return vals, false, err
	}
	dest := w.dest[:len(rows.Columns())]
	switch err := rows.Next(dest); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return vals, false, errors.Join(err, rows.Close())
	default:
		ok = true
		for i := range dest {
			v, isInt := dest[i].(int64)
			if !isInt {
				return vals, false, errors.Join(fmt.Errorf("sqlitestore: column %d is %T, want an integer", i, dest[i]), rows.Close())
			}
			vals[i] = v
		}
	}
	return vals, ok, rows.Close()
}

// rollback ends the transaction; one already rolled back (by an INSERT OR
// ROLLBACK that failed) is not an error.
func (w *writer) rollback() error {
	_, err := w.conn.(driver.ExecerContext).ExecContext(context.Background(), "ROLLBACK", nil)
	if err != nil && strings.Contains(err.Error(), "no transaction is active") {
		return nil
	}
	return err
}

// insertStmt returns the prepared INSERT of k batch rows (1 <= k <=
// maxInsertRows). It is INSERT OR ROLLBACK: a failing row rolls the whole
// transaction back (the group is then run again with a savepoint per
// request), so SQLite keeps no statement journal for it — a multi-row
// INSERT that could abort alone would copy every page it touches to one.
func (w *writer) insertStmt(k int) (driver.Stmt, error) {
	if st := w.inserts[k]; st != nil {
		return st, nil
	}
	var b strings.Builder
	b.WriteString(`INSERT OR ROLLBACK INTO batches (sid, seq, n, pb) VALUES (?, ?, ?, ?)`)
	for range k - 1 {
		b.WriteString(`, (?, ?, ?, ?)`)
	}
	st, err := w.prepare(b.String())
	if err != nil {
		return nil, err
	}
	w.inserts[k] = st
	return st, nil
}
