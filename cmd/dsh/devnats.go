package main

import (
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// natsGate is how dsh dev's agent dials the embedded NATS server, which
// starts in the background: until the server is up, a dial fails at once
// (no TCP connect to a port nobody listens on yet) and the publisher
// retries every few milliseconds while the server is starting, so it
// connects as soon as the server is ready instead of after a 250 ms
// reconnect wait (issue 19: start and stop of `dsh dev -p`). Once up, real
// outages get the usual reconnect delay.
type natsGate struct {
	state atomic.Int32 // natsIdle, natsStarting, natsUp
}

const (
	natsIdle int32 = iota
	natsStarting
	natsUp
)

var errNATSNotUp = errors.New("embedded NATS is not up yet")

// Dial implements nats.CustomDialer.
func (g *natsGate) Dial(network, address string) (net.Conn, error) {
	if g.state.Load() != natsUp {
		return nil, errNATSNotUp
	}
	return net.DialTimeout(network, address, 2*time.Second)
}

// options are the publisher's NATS options.
func (g *natsGate) options() []nats.Option {
	return []nats.Option{
		nats.SetCustomDialer(g),
		nats.CustomReconnectDelay(func(int) time.Duration {
			switch g.state.Load() {
			case natsStarting:
				return 2 * time.Millisecond
			case natsIdle:
				return 50 * time.Millisecond
			}
			return 250 * time.Millisecond
		}),
	}
}

// publishOnClose is how long dsh dev's agent keeps publishing at shutdown:
// a moment in one-shot mode (-p), the default otherwise.
func publishOnClose(prompt string) time.Duration {
	if prompt != "" {
		return time.Millisecond
	}
	return 0
}
