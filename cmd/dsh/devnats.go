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
	state atomic.Int32 // natsIdle, natsStarting, natsUp, natsFailed
}

const (
	natsIdle int32 = iota
	natsStarting
	natsUp
	natsFailed
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
			// Until NATS is up a dial fails at once without a syscall,
			// so retrying often is cheap; a delay chosen while idle (50
			// ms before) was still being slept when NATS came up, and a
			// one-shot run's exit waited for it.
			switch g.state.Load() {
			case natsIdle, natsStarting:
				return 2 * time.Millisecond
			case natsFailed:
				return time.Second
			}
			return 250 * time.Millisecond
		}),
	}
}

// publishOnClose is how long dsh dev's agent keeps publishing at shutdown:
// in one-shot mode (-p) long enough for the embedded NATS, started when
// the model began answering, to come up and take the run's events (the
// shutdown ends as soon as they are acknowledged, so it costs nothing when
// NATS was up already); the default otherwise. With a fast model the
// whole run can end before NATS is up: with a moment only, nothing was
// ever published, each start leaving its events and the last one's behind
// the durable cursor. What NATS has not acknowledged in time is still
// published by the next start.
func publishOnClose(prompt string) time.Duration {
	if prompt != "" {
		return oneShotPublish
	}
	return 0
}

// oneShotPublish bounds the wait at a one-shot run's exit (the issue's
// exit target is 50 ms after the final answer).
const oneShotPublish = 30 * time.Millisecond
