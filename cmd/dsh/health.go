package main

import (
	"fmt"
	"io"
	"sync"
)

// toolhostNotice returns an agent.ServerConfig.OnToolhost for dsh dev: it
// tells the user on w which toolhost went down (and why) and when it is
// back; a host that is up from the start says nothing.
func toolhostNotice(w io.Writer) func(name string, up bool, err error) {
	var mu sync.Mutex
	down := map[string]bool{}
	return func(name string, up bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case !up && !down[name]:
			down[name] = true
			fmt.Fprintf(w, "dsh: toolhost %s is down; its tools fail as unavailable until it is back: %v\n", name, err)
		case up && down[name]:
			delete(down, name)
			fmt.Fprintf(w, "dsh: toolhost %s is back\n", name)
		}
	}
}
