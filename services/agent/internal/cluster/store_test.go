package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/persistencetest"
	"github.com/dsh-dev/dsh/internal/persistence/pgstore"
	"github.com/dsh-dev/dsh/services/agent/internal/cluster"
)

// memLease is a row of memStore's lease table.
type memLease struct {
	owner string
	epoch int64
	live  bool
}

// memStore is one replica's view of a shared store, in memory: stored
// headers, pending creates and the lease table (cluster.FencedStore). It
// counts claims, and its hooks let a test act at a point of a call.
type memStore struct {
	owner string

	mu      sync.Mutex
	stored  map[string]*sessionv1.SessionHeader
	pending map[string]*sessionv1.SessionHeader
	leases  map[string]memLease
	claims  int

	afterRead   func(id string) // after ReadHeader, without the lock
	afterCreate func(id string) // after Create registered the session, without the lock
}

var _ cluster.FencedStore = (*memStore)(nil)

func newMemStore(owner string) *memStore {
	return &memStore{owner: owner, stored: map[string]*sessionv1.SessionHeader{},
		pending: map[string]*sessionv1.SessionHeader{}, leases: map[string]memLease{}}
}

func (s *memStore) lease(id string) (memLease, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leases[id], s.claims
}

func (s *memStore) Claim(_ context.Context, id, address string, _ time.Duration) (pgstore.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[id]
	if l.live && l.owner != s.owner {
		return pgstore.Lease{}, &pgstore.HeldError{Lease: pgstore.Lease{SessionID: id, Owner: l.owner, Address: l.owner + ":7700", Epoch: l.epoch}}
	}
	s.claims++
	l = memLease{owner: s.owner, epoch: l.epoch + 1, live: true}
	s.leases[id] = l
	return pgstore.Lease{SessionID: id, Owner: s.owner, Address: address, Epoch: l.epoch}, nil
}

func (s *memStore) RenewHeld(context.Context, []string, time.Duration) ([]string, error) {
	return nil, nil
}

func (s *memStore) Release(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.leases[id]; l.owner == s.owner {
		l.live = false
		s.leases[id] = l
	}
	return nil
}

func (s *memStore) Lookup(_ context.Context, id string) (pgstore.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.leases[id]
	if !ok {
		return pgstore.Lease{}, fmt.Errorf("session %q has no lease: %w", id, persistence.ErrNotFound)
	}
	return pgstore.Lease{SessionID: id, Owner: l.owner, Epoch: l.epoch}, nil
}

func (s *memStore) Create(_ context.Context, h *sessionv1.SessionHeader) error {
	s.mu.Lock()
	id := h.GetId()
	_, isStored := s.stored[id]
	_, isPending := s.pending[id]
	if isStored || isPending {
		s.mu.Unlock()
		return fmt.Errorf("session %q: %w", id, persistence.ErrExists)
	}
	s.pending[id] = proto.CloneOf(h)
	s.mu.Unlock()
	if s.afterCreate != nil {
		s.afterCreate(id)
	}
	return nil
}

func (s *memStore) Materialize(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.pending[id]; ok {
		delete(s.pending, id)
		s.stored[id] = h
	}
	return nil
}

func (s *memStore) Discard(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.pending, id)
	return nil
}

func (s *memStore) ReadHeader(_ context.Context, id string) (*sessionv1.SessionHeader, error) {
	s.mu.Lock()
	h, ok := s.stored[id]
	s.mu.Unlock()
	if s.afterRead != nil {
		s.afterRead(id)
	}
	if !ok {
		return nil, fmt.Errorf("session %q: %w", id, persistence.ErrNotFound)
	}
	return proto.CloneOf(h), nil
}

func (s *memStore) ReadEvents(context.Context, string, int64) ([]*sessionv1.SessionEvent, error) {
	return nil, nil
}

func (s *memStore) Load(ctx context.Context, id string) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	h, err := s.ReadHeader(ctx, id)
	return h, nil, err
}

func (s *memStore) Append(context.Context, string, []*sessionv1.SessionEvent) error { return nil }

func (s *memStore) List(context.Context) ([]*sessionv1.SessionHeader, error) { return nil, nil }

func (s *memStore) PublishedCursor(context.Context, string) (int64, error) { return 0, nil }

func (s *memStore) SetPublishedCursor(context.Context, string, int64) error { return nil }

func (s *memStore) Close() error { return nil }

// TestCreateTakenIDClaimsNothing: Store.Create of an id that is taken is
// ErrExists and claims no lease, whoever holds the session: a session
// nobody holds (its owner stopped or died) must not move to the replica a
// client (of any tenant) sent a colliding CreateSession to, and a session
// this replica holds keeps its lease. A new id is created under a lease of
// this replica; a live lease of another replica is that replica's to
// forward to; an id stored between the header read and the claim gives the
// fresh claim up.
func TestCreateTakenIDClaimsNothing(t *testing.T) {
	const me, other = "replica-a", "replica-b"
	gone := memLease{owner: other, epoch: 7} // released or expired
	tests := []struct {
		name   string
		stored bool     // the id's session is stored
		lease  memLease // its lease row before the call
		// storeMeanwhile stores the session between the header read and
		// the claim, as a replica that created it and let it go would.
		storeMeanwhile bool
		wantErr        error
		wantElsewhere  bool
		wantLease      memLease
		wantClaims     int
		wantHeld       bool
	}{
		{name: "taken, nobody holds it", stored: true, lease: gone,
			wantErr: persistence.ErrExists, wantLease: gone},
		{name: "taken, another replica holds it", stored: true, lease: memLease{owner: other, epoch: 3, live: true},
			wantErr: persistence.ErrExists, wantLease: memLease{owner: other, epoch: 3, live: true}},
		{name: "new", wantLease: memLease{owner: me, epoch: 1, live: true}, wantClaims: 1, wantHeld: true},
		{name: "new, nobody holds its old lease", lease: gone,
			wantLease: memLease{owner: me, epoch: 8, live: true}, wantClaims: 1, wantHeld: true},
		{name: "new, another replica is creating it", lease: memLease{owner: other, epoch: 1, live: true},
			wantElsewhere: true, wantLease: memLease{owner: other, epoch: 1, live: true}},
		{name: "stored between the read and the claim", lease: gone, storeMeanwhile: true,
			wantErr: persistence.ErrExists, wantLease: memLease{owner: me, epoch: 8}, wantClaims: 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			fs := newMemStore(me)
			if tc.stored {
				fs.stored["s"] = persistencetest.Header("s")
			}
			if tc.lease != (memLease{}) {
				fs.leases["s"] = tc.lease
			}
			if tc.storeMeanwhile {
				fs.afterRead = func(id string) {
					fs.mu.Lock()
					fs.stored[id] = persistencetest.Header(id)
					fs.mu.Unlock()
				}
			}
			m := cluster.New(fs, cluster.Config{Address: me + ":7700"})
			err := cluster.NewStore(fs, m).Create(ctx, persistencetest.Header("s"))
			var elsewhere *cluster.OwnedElsewhereError
			switch {
			case tc.wantElsewhere:
				if !errors.As(err, &elsewhere) || elsewhere.Owner != other {
					t.Fatalf("Create = %v; want OwnedElsewhereError naming %s", err, other)
				}
			case !errors.Is(err, tc.wantErr):
				t.Fatalf("Create = %v; want %v", err, tc.wantErr)
			}
			if l, claims := fs.lease("s"); l != tc.wantLease || claims != tc.wantClaims {
				t.Errorf("after Create the lease is %+v after %d claims; want %+v after %d", l, claims, tc.wantLease, tc.wantClaims)
			}
			if got := m.Holds("s"); got != tc.wantHeld {
				t.Errorf("after Create Holds = %v, want %v", got, tc.wantHeld)
			}
			fs.mu.Lock()
			_, stored := fs.stored["s"]
			_, pending := fs.pending["s"]
			fs.mu.Unlock()
			if want := tc.stored || tc.storeMeanwhile || tc.wantErr == nil && !tc.wantElsewhere; stored != want || pending {
				t.Errorf("after Create stored = %v, pending = %v; want stored = %v, not pending", stored, pending, want)
			}
		})
	}
}

// TestCreateTakenIDHeldHere: two creates of one id on this replica. The
// second, whether it overlaps the first or comes after it, is ErrExists,
// and the lease the first claimed stays held (giving it up would leave the
// created session without an owner, its appends fenced). Neither claims
// it again.
func TestCreateTakenIDHeldHere(t *testing.T) {
	for _, overlap := range []bool{true, false} {
		t.Run(fmt.Sprintf("overlapping=%v", overlap), func(t *testing.T) {
			ctx := t.Context()
			fs := newMemStore("replica-a")
			m := cluster.New(fs, cluster.Config{Address: "replica-a:7700"})
			st := cluster.NewStore(fs, m)
			inCreate, resume := make(chan struct{}), make(chan struct{})
			if overlap {
				var once sync.Once
				fs.afterCreate = func(string) {
					once.Do(func() {
						close(inCreate)
						<-resume
					})
				}
			}
			create := func() error { return st.Create(ctx, persistencetest.Header("s")) }
			var errs []error
			if overlap {
				first := make(chan error, 1)
				go func() { first <- create() }()
				<-inCreate // the first is registered, not yet stored
				second := make(chan error, 1)
				go func() { second <- create() }()
				time.Sleep(20 * time.Millisecond) // let the second run as far as it can
				close(resume)
				errs = []error{<-first, <-second}
			} else {
				errs = []error{create(), create()}
			}
			var created, exists int
			for _, err := range errs {
				switch {
				case err == nil:
					created++
				case errors.Is(err, persistence.ErrExists):
					exists++
				default:
					t.Fatalf("Create = %v", err)
				}
			}
			if created != 1 || exists != 1 {
				t.Fatalf("%d created, %d ErrExists; want one of each", created, exists)
			}
			if l, claims := fs.lease("s"); l != (memLease{owner: "replica-a", epoch: 1, live: true}) || claims != 1 || !m.Holds("s") {
				t.Errorf("after both the lease is %+v after %d claims, Holds = %v; want replica-a's epoch 1, live, after 1 claim, held", l, claims, m.Holds("s"))
			}
		})
	}
}
