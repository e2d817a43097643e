// Command mkv3 writes a schema-version-3 database with the v3 store (75d4015).
package main

import (
	"context"
	"log"
	"os"

	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
)

func main() {
	if sqlitestore.SchemaVersion != 3 {
		log.Fatalf("this build writes schema version %d: run mkv3 in a checkout of 75d4015", sqlitestore.SchemaVersion)
	}
	ctx := context.Background()
	path := os.Args[1]
	s, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: path})
	if err != nil {
		log.Fatal(err)
	}
	for _, x := range []struct {
		id     string
		turns  []int
		cursor int64 // 0: never raised; -1: past the last event
	}{
		{"m", []int{3}, 2},
		{"n", []int{2, 1}, -1},
		{"o", []int{1}, 0},
	} {
		var b persistencetest.Builder
		for _, k := range x.turns {
			b.CompletedTurn(k)
		}
		if err := s.Create(ctx, persistencetest.Header(x.id)); err != nil {
			log.Fatal(err)
		}
		if err := s.Append(ctx, x.id, b.Events()); err != nil {
			log.Fatal(err)
		}
		c := x.cursor
		if c == -1 {
			c = b.Len()
		}
		if c > 0 {
			if err := s.SetPublishedCursor(ctx, x.id, c); err != nil {
				log.Fatal(err)
			}
		}
	}
	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
}
