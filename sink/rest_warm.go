package sink

import (
	"cmp"
	"context"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// warmMaxAge is how long a connection opened by Warm waits for its first
// request before it is closed instead (servers and load balancers close
// connections that send nothing, typically after 60 s).
const warmMaxAge = 10 * time.Second

// warmPool holds connections opened ahead of the first requests; the
// transport's dialer takes them before dialing.
type warmPool struct {
	target *url.URL
	addr   string // host:port of the API
	proxy  func(*http.Request) (*url.URL, error)
	dial   func(ctx context.Context, network, addr string) (net.Conn, error)

	mu    sync.Mutex
	conns []warmConn
}

type warmConn struct {
	c  net.Conn
	at time.Time
}

// dialContext is the transport's dialer: a warmed connection to addr if
// one is fresh, else a new one.
func (w *warmPool) dialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if c := w.take(addr); c != nil {
		return c, nil
	}
	return w.dial(ctx, network, addr)
}

func (w *warmPool) take(addr string) net.Conn {
	if addr != w.addr {
		return nil
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.conns) > 0 {
		wc := w.conns[len(w.conns)-1]
		w.conns = w.conns[:len(w.conns)-1]
		if time.Since(wc.at) < warmMaxAge {
			return wc.c
		}
		_ = wc.c.Close()
	}
	return nil
}

// fill opens connections until n fresh ones wait; an error when none of
// those it tried opened.
func (w *warmPool) fill(ctx context.Context, n int) error {
	if w.proxy != nil {
		if p, err := w.proxy(&http.Request{URL: w.target}); err != nil || p != nil {
			return nil // the transport dials the proxy, not the API
		}
	}
	w.mu.Lock()
	fresh := w.conns[:0]
	for _, wc := range w.conns {
		if time.Since(wc.at) < warmMaxAge {
			fresh = append(fresh, wc)
		} else {
			_ = wc.c.Close()
		}
	}
	w.conns = fresh
	missing := n - len(w.conns)
	w.mu.Unlock()
	if missing <= 0 {
		return nil
	}
	type dialed struct {
		c   net.Conn
		err error
	}
	results := make(chan dialed, missing)
	for range missing {
		go func() {
			c, err := w.dial(ctx, "tcp", w.addr)
			results <- dialed{c, err}
		}()
	}
	var firstErr error
	opened := 0
	for range missing {
		d := <-results
		if d.err != nil {
			firstErr = cmp.Or(firstErr, d.err)
			continue
		}
		opened++
		w.mu.Lock()
		w.conns = append(w.conns, warmConn{d.c, time.Now()})
		w.mu.Unlock()
	}
	if opened == 0 {
		return firstErr
	}
	return nil
}

func (w *warmPool) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, wc := range w.conns {
		_ = wc.c.Close()
	}
	w.conns = nil
}
