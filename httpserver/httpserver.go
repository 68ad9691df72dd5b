// Package httpserver runs the HTTP servers of a sluice process — metrics
// and health, the intake API, the sink emulator — with one lifecycle, and
// writes their JSON answers.
package httpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// DefaultDrain is how long a server stopping lets the requests in flight
// finish: 5 s.
const DefaultDrain = 5 * time.Second

// Serve serves h on ln until ctx is done, then shuts the server down: it
// stops accepting and lets the requests in flight finish within drain. It
// returns nil after a shutdown caused by ctx, and the server's error if it
// failed before. Request headers must arrive within 10 s.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, drain time.Duration) error {
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return fmt.Errorf("serve %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), drain)
	defer cancel()
	err := srv.Shutdown(sctx)
	if serr := <-done; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// Background runs Serve in a goroutine of its own until the returned stop
// is called; stop shuts the server down (as Serve does when ctx is done)
// and returns Serve's error. For a server that lives beside a command's
// work, such as metrics beside a load, or an in-process emulator.
func Background(ctx context.Context, ln net.Listener, h http.Handler, drain time.Duration) (stop func() error) {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- Serve(sctx, ln, h, drain) }()
	return func() error {
		cancel()
		return <-done
	}
}

// WriteJSON answers status with v encoded as JSON. An encoding or write
// error is dropped: the client may be gone, and there is nothing to tell.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
