package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
	"github.com/dsh-dev/dsh/internal/pgtest"
	"github.com/dsh-dev/dsh/internal/session"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// replica opens a fenced store handle for owner: one "replica".
func replica(t *testing.T, dsn, owner string) *pgstore.Store {
	t.Helper()
	s, err := pgstore.Open(t.Context(), pgstore.Config{DSN: dsn, Owner: owner, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// expire ends a session's lease now, as if its owner had been paused past
// the TTL (the database's clock decides expiry).
func expire(t *testing.T, dsn, id string) {
	t.Helper()
	c, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if _, err := c.Exec(t.Context(), `UPDATE dsh_leases SET expires_at = now() - interval '1 millisecond' WHERE session_id = $1`, id); err != nil {
		t.Fatal(err)
	}
}

// TestFencing: A holds the session, B cannot claim it; A's lease expires
// (A is paused), B claims it with the next epoch and its load repairs A's
// open turn; A wakes up: its append is refused with nothing written and
// its renewal reports the loss; B goes on writing.
func TestFencing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := pgtest.Database(t)
	a, b := replica(t, dsn, "replica-a"), replica(t, dsn, "replica-b")
	lost := make(chan string, 1)
	ma := cluster.New(a, cluster.Config{Address: "10.0.0.1:7700", OnLost: func(id string, err error) {
		if !errors.Is(err, persistence.ErrFenced) {
			t.Errorf("OnLost(%q, %v): want ErrFenced", id, err)
		}
		lost <- id
	}})
	mb := cluster.New(b, cluster.Config{Address: "10.0.0.2:7700"})

	la, err := ma.Acquire(ctx, "s")
	if err != nil || la.Epoch != 1 {
		t.Fatalf("A: Acquire = %+v, %v; want epoch 1", la, err)
	}
	var log persistencetest.Builder
	log.CompletedTurn(3)
	log.StartTurn("unfinished")
	log.StartStep()
	log.Chunks(2, "half")
	if err := a.Create(ctx, persistencetest.Header("s")); err != nil {
		t.Fatal(err)
	}
	if err := a.Append(ctx, "s", log.Events()); err != nil {
		t.Fatal(err)
	}

	// B meets a live lease: it learns where to forward, and cannot write.
	var elsewhere *cluster.OwnedElsewhereError
	if _, err := mb.Acquire(ctx, "s"); !errors.As(err, &elsewhere) || elsewhere.Owner != "replica-a" || elsewhere.Address != "10.0.0.1:7700" {
		t.Fatalf("B: Acquire of a live lease = %v; want OwnedElsewhereError naming replica-a at 10.0.0.1:7700", err)
	}
	more := persistencetest.Continue(log.Events())
	more.Chunks(1, "from b")
	if err := b.Append(ctx, "s", more.Events()[log.Len():]); !errors.Is(err, persistence.ErrFenced) {
		t.Fatalf("B: Append without a lease = %v; want ErrFenced", err)
	}

	// A is paused past its TTL; B claims with the next epoch and loads:
	// the crash repair closes A's open turn.
	expire(t, dsn, "s")
	lb, err := mb.Acquire(ctx, "s")
	if err != nil || lb.Epoch != 2 || lb.Owner != "replica-b" {
		t.Fatalf("B: Acquire of an expired lease = %+v, %v; want epoch 2 for replica-b", lb, err)
	}
	_, loaded, err := b.Load(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if last := loaded[len(loaded)-1]; last.GetTurnEnd().GetReason().GetInterrupted() == nil || int64(len(loaded)) <= log.Len() {
		t.Fatalf("B's load did not close A's open turn: %d events, last %v", len(loaded), last)
	}

	// A wakes up and goes on with its turn: refused, nothing written.
	aNext := persistencetest.Continue(log.Events())
	aNext.Chunks(2, "late")
	if err := a.Append(ctx, "s", aNext.Events()[log.Len():]); !errors.Is(err, persistence.ErrFenced) {
		t.Fatalf("A: Append after losing the lease = %v; want ErrFenced", err)
	}
	if err := ma.RenewAll(ctx); err != nil {
		t.Fatal(err)
	}
	if id := <-lost; id != "s" || ma.Holds("s") {
		t.Fatalf("A: lost %q, still holds: %v", id, ma.Holds("s"))
	}

	// B writes on; the log is B's repair and turn after A's events.
	bNext := persistencetest.Continue(loaded)
	bNext.CompletedTurn(2)
	if err := b.Append(ctx, "s", bNext.Events()[len(loaded):]); err != nil {
		t.Fatalf("B: Append as the owner: %v", err)
	}
	_, final, err := b.Load(ctx, "s")
	if err != nil {
		t.Fatal(err)
	}
	if len(final) != len(bNext.Events()) {
		t.Fatalf("final log has %d events, want %d", len(final), len(bNext.Events()))
	}
	for i, ev := range bNext.Events() {
		if !proto.Equal(ev, final[i]) {
			t.Fatalf("event %d differs from what A then B wrote:\n%v\n%v", i, ev, final[i])
		}
	}
	// Graceful hand-off: B releases, A claims at once with epoch 3.
	if err := mb.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if l, err := ma.Acquire(ctx, "s"); err != nil || l.Epoch != 3 {
		t.Fatalf("A: Acquire after B released = %+v, %v; want epoch 3", l, err)
	}
}

// TestExpiredButUnclaimed: a lease that expired with no other claim is
// still the owner's (the epoch did not move): renewal and appends succeed.
func TestExpiredButUnclaimed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := pgtest.Database(t)
	a := replica(t, dsn, "replica-a")
	ma := cluster.New(a, cluster.Config{Address: "a:1", OnLost: func(id string, err error) { t.Errorf("lost %q: %v", id, err) }})
	if _, err := ma.Acquire(ctx, "s"); err != nil {
		t.Fatal(err)
	}
	expire(t, dsn, "s")
	if err := ma.RenewAll(ctx); err != nil || !ma.Holds("s") {
		t.Fatalf("RenewAll = %v, holds %v", err, ma.Holds("s"))
	}
	var log persistencetest.Builder
	log.CompletedTurn(1)
	if err := a.Create(ctx, persistencetest.Header("s")); err != nil {
		t.Fatal(err)
	}
	if err := a.Append(ctx, "s", log.Events()); err != nil {
		t.Fatal(err)
	}
}

// TestUnfencedStoreHasNoLeases: a store opened without an Owner (a single
// replica) refuses lease operations instead of pretending.
func TestUnfencedStoreHasNoLeases(t *testing.T) {
	t.Parallel()
	s, err := pgstore.Open(t.Context(), pgstore.Config{DSN: pgtest.Database(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := cluster.New(s, cluster.Config{}).Acquire(t.Context(), "s"); !errors.Is(err, pgstore.ErrNotFenced) {
		t.Fatalf("Acquire on an unfenced store = %v; want ErrNotFenced", err)
	}
}

// TestStealingReplicas: three replicas keep taking one session from each
// other (each steal expires the holder's lease, as a pause would) while
// they append. Whatever the interleaving, every acknowledged batch is in
// the final log exactly as its writer sent it, the log is valid, and each
// stretch of it was written under one epoch.
func TestStealingReplicas(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := pgtest.Database(t)
	const id = "contended"
	type ack struct {
		owner  string
		events []*sessionv1.SessionEvent
	}
	var (
		mu     sync.Mutex
		acks   []ack
		fenced int
	)
	first := replica(t, dsn, "seed")
	if _, err := first.Claim(ctx, id, "seed:0", cluster.DefaultTTL); err != nil {
		t.Fatal(err)
	}
	var seed persistencetest.Builder
	seed.CompletedTurn(1)
	if err := first.Create(ctx, persistencetest.Header(id)); err != nil {
		t.Fatal(err)
	}
	if err := first.Append(ctx, id, seed.Events()); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for r := range 3 {
		owner := fmt.Sprintf("replica-%d", r)
		s := replica(t, dsn, owner)
		m := cluster.New(s, cluster.Config{Address: owner + ":7700"})
		wg.Go(func() {
			for range 15 {
				expire(t, dsn, id)
				if _, err := m.Acquire(ctx, id); err != nil {
					var elsewhere *cluster.OwnedElsewhereError
					if errors.As(err, &elsewhere) {
						continue // another replica claimed between the expiry and this claim
					}
					t.Error(err)
					return
				}
				_, evs, err := s.Load(ctx, id)
				if errors.Is(err, persistence.ErrFenced) {
					mu.Lock()
					fenced++
					mu.Unlock()
					continue // stolen before the repair
				}
				if err != nil {
					t.Error(err)
					return
				}
				b := persistencetest.Continue(evs)
				b.StartTurn(owner)
				b.StartStep()
				b.Chunks(2, owner)
				half := b.Len()
				b.EndStep()
				b.EndTurn()
				for _, batch := range [][]*sessionv1.SessionEvent{b.Events()[len(evs):half], b.Events()[half:]} {
					err := s.Append(ctx, id, batch)
					if errors.Is(err, persistence.ErrFenced) {
						mu.Lock()
						fenced++
						mu.Unlock()
						break
					}
					if err != nil {
						t.Errorf("%s: %v", owner, err)
						return
					}
					mu.Lock()
					acks = append(acks, ack{owner, batch})
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	final := replica(t, dsn, "final")
	if _, err := final.Claim(ctx, id, "final:0", cluster.DefaultTTL); err != nil {
		// a replica may still hold a live lease; take it over
		expire(t, dsn, id)
		if _, err := final.Claim(ctx, id, "final:0", cluster.DefaultTTL); err != nil {
			t.Fatal(err)
		}
	}
	_, log, err := final.Load(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := persistence.CheckLoaded(id, log); err != nil {
		t.Fatalf("final log invalid: %v", err)
	}
	for _, a := range acks {
		for _, ev := range a.events {
			if ev.GetSeq() >= int64(len(log)) || !proto.Equal(ev, log[ev.GetSeq()]) {
				t.Fatalf("%s's acknowledged event %d (%s) is not in the log as written", a.owner, ev.GetSeq(), session.TypeName(ev))
			}
		}
	}
	t.Logf("%d acknowledged batches, %d fenced, %d events", len(acks), fenced, len(log))
	if len(acks) == 0 {
		t.Fatal("no append was acknowledged")
	}
}

// TestCreatedSessionOutlivesItsReplica: a session created through a
// replica's Store (CreateSession acknowledged) and not yet appended to is
// stored at once, so every replica can find it: while its creator holds
// the lease, another replica's load is told to forward (not "not found");
// once the creator died (its lease expired), the next replica claims and
// loads the empty session. Stored lazily, at the first append, it lived in
// the creator's memory alone: other replicas answered NOT_FOUND, and a
// creator killed (or starved past its lease) before the first prompt took
// the acknowledged session with it, so its clients waited for it forever
// (TestChaosReplicas, under CPU starvation).
func TestCreatedSessionOutlivesItsReplica(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	dsn := pgtest.Database(t)
	a, b := replica(t, dsn, "replica-a"), replica(t, dsn, "replica-b")
	ma := cluster.New(a, cluster.Config{Address: "10.0.0.1:7700"})
	mb := cluster.New(b, cluster.Config{Address: "10.0.0.2:7700"})
	sa, sb := cluster.NewStore(a, ma), cluster.NewStore(b, mb)

	if err := sa.Create(ctx, persistencetest.Header("new")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ReadHeader(ctx, "new"); err != nil {
		t.Fatalf("B: ReadHeader of a session A created = %v; want it stored", err)
	}
	var elsewhere *cluster.OwnedElsewhereError
	if _, _, err := sb.Load(ctx, "new"); !errors.As(err, &elsewhere) || elsewhere.Owner != "replica-a" {
		t.Fatalf("B: Load of a session A created and holds = %v; want OwnedElsewhereError naming replica-a", err)
	}

	// A dies before the session's first event: its lease expires.
	expire(t, dsn, "new")
	h, evs, err := sb.Load(ctx, "new")
	if err != nil || h.GetId() != "new" || len(evs) != 0 {
		t.Fatalf("B: Load after A died = %v, %d events, %v; want the empty session", h, len(evs), err)
	}
	if !mb.Holds("new") {
		t.Fatal("B loaded the session without claiming it")
	}
	// B writes its first events under its own epoch.
	var log persistencetest.Builder
	log.CompletedTurn(1)
	if err := sb.Append(ctx, "new", log.Events()); err != nil {
		t.Fatalf("B: first Append = %v", err)
	}
}
