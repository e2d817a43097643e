package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	agentv1 "github.com/dsh-dev/dsh/gen/go/dsh/agent/v1"
	llmv1 "github.com/dsh-dev/dsh/gen/go/dsh/llm/v1"
	sessionv1 "github.com/dsh-dev/dsh/gen/go/dsh/session/v1"
	"github.com/dsh-dev/dsh/internal/persistence"
	"github.com/dsh-dev/dsh/internal/persistence/jsonlstore"
	"github.com/dsh-dev/dsh/internal/persistence/sqlitestore"
	"github.com/dsh-dev/dsh/internal/session"
)

// sessionSource is where `dsh sessions` reads: a running agent, or, when
// none answers, the store a previous `dsh dev` left in its data directory.
type sessionSource interface {
	list(ctx context.Context) ([]*agentv1.Session, error)
	get(ctx context.Context, id string) (*agentv1.Session, error)
	// events calls each for every event from seq from (then live ones
	// with follow, on an agent only).
	events(ctx context.Context, id string, from int64, follow bool, each func(*sessionv1.SessionEvent) error) error
	messages(ctx context.Context, id string) ([]*llmv1.Message, error)
}

// remoteSource reads through the agent service.
type remoteSource struct{ c agentv1.AgentServiceClient }

func (r remoteSource) list(ctx context.Context) ([]*agentv1.Session, error) {
	var out []*agentv1.Session
	token := ""
	for {
		resp, err := r.c.ListSessions(ctx, &agentv1.ListSessionsRequest{PageSize: 500, PageToken: token})
		if err != nil {
			return nil, rpcError("list sessions", err)
		}
		out = append(out, resp.GetSessions()...)
		if token = resp.GetNextPageToken(); token == "" {
			return out, nil
		}
	}
}

func (r remoteSource) get(ctx context.Context, id string) (*agentv1.Session, error) {
	resp, err := r.c.GetSession(ctx, &agentv1.GetSessionRequest{SessionId: id})
	if err != nil {
		return nil, rpcError("get session", err)
	}
	return resp.GetSession(), nil
}

func (r remoteSource) events(ctx context.Context, id string, from int64, follow bool, each func(*sessionv1.SessionEvent) error) error {
	stream, err := r.c.StreamEvents(ctx, &agentv1.StreamEventsRequest{SessionId: id, FromSeq: from, NoFollow: !follow})
	if err != nil {
		return rpcError("stream events", err)
	}
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return rpcError("stream events", err)
		}
		if err := each(resp.GetEvent()); err != nil {
			return err
		}
	}
}

func (r remoteSource) messages(ctx context.Context, id string) ([]*llmv1.Message, error) {
	resp, err := r.c.GetMessages(ctx, &agentv1.GetMessagesRequest{SessionId: id})
	if err != nil {
		return nil, rpcError("get messages", err)
	}
	return resp.GetMessages(), nil
}

// localStore is what localSource needs of a store: listing and reading
// stored logs exactly as they are (never repairing them).
type localStore interface {
	List(ctx context.Context) ([]*sessionv1.SessionHeader, error)
	persistence.Reader
	Close() error
}

// localSource reads a data directory's store directly, read-only in effect
// (nothing is appended; an interrupted turn is shown as it is).
type localSource struct{ st localStore }

// openLocal opens the store in data: sessions.db (SQLite) or sessions/
// (JSONL). It returns the path it opened, or an error when data holds
// neither.
func openLocal(ctx context.Context, data string) (*localSource, string, error) {
	db := filepath.Join(data, "sessions.db")
	if fi, err := os.Stat(db); err == nil && fi.Mode().IsRegular() {
		st, err := sqlitestore.Open(ctx, sqlitestore.Config{Path: db})
		if err != nil {
			return nil, db, err
		}
		return &localSource{st: st}, db, nil
	}
	dir := filepath.Join(data, "sessions")
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		st, err := jsonlstore.Open(jsonlstore.Config{Root: dir, ReadOnly: true})
		if err != nil {
			return nil, dir, err
		}
		return &localSource{st: st}, dir, nil
	}
	return nil, "", fmt.Errorf("no session store in %s (neither sessions.db nor sessions/)", data)
}

func (l *localSource) close() { _ = l.st.Close() }

func (l *localSource) list(ctx context.Context) ([]*agentv1.Session, error) {
	hs, err := l.st.List(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]*agentv1.Session, len(hs))
	for i, h := range hs {
		out[i] = &agentv1.Session{Header: h, Status: agentv1.AgentStatus_AGENT_STATUS_UNLOADED}
	}
	return out, nil
}

func (l *localSource) read(ctx context.Context, id string, from int64) (*sessionv1.SessionHeader, []*sessionv1.SessionEvent, error) {
	h, err := l.st.ReadHeader(ctx, id)
	if errors.Is(err, persistence.ErrNotFound) {
		return nil, nil, &exitError{code: 1, msg: fmt.Sprintf("session %s is not in the local store", id)}
	}
	if err != nil {
		return nil, nil, err
	}
	evs, err := l.st.ReadEvents(ctx, id, from)
	return h, evs, err
}

func (l *localSource) get(ctx context.Context, id string) (*agentv1.Session, error) {
	h, evs, err := l.read(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	s := &agentv1.Session{Header: h, Status: agentv1.AgentStatus_AGENT_STATUS_UNLOADED, NextSeq: int64(len(evs))}
	return s, nil
}

func (l *localSource) events(ctx context.Context, id string, from int64, _ bool, each func(*sessionv1.SessionEvent) error) error {
	_, evs, err := l.read(ctx, id, from)
	if err != nil {
		return err
	}
	for _, ev := range evs {
		if err := each(ev); err != nil {
			return err
		}
	}
	return nil
}

func (l *localSource) messages(ctx context.Context, id string) ([]*llmv1.Message, error) {
	_, evs, err := l.read(ctx, id, 0)
	if err != nil {
		return nil, err
	}
	return session.DeriveMessages(evs), nil
}
