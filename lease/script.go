package lease

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// script is a Lua script that a process sends whole (EVAL) the first time
// it runs it on a client, and by its SHA1 (EVALSHA, falling back to EVAL
// when the server answers NOSCRIPT, as after a restart) from then on. A
// plain redis.Script tries EVALSHA first every time, so the first call of
// each script on a server that has not cached it costs two commands where
// one does.
type script struct {
	lua  *redis.Script
	sent sync.Map // redis.Scripter → struct{}: clients this process has sent the body to
}

func newScript(src string) *script { return &script{lua: redis.NewScript(src)} }

// Run runs the script on c with keys and args, as redis.Script.Run does.
func (s *script) Run(ctx context.Context, c redis.Scripter, keys []string, args ...any) *redis.Cmd {
	if _, ok := s.sent.Load(c); ok {
		return s.lua.Run(ctx, c, keys, args...)
	}
	cmd := s.lua.Eval(ctx, c, keys, args...)
	if err := cmd.Err(); err == nil || errors.Is(err, redis.Nil) {
		s.sent.Store(c, struct{}{})
	}
	return cmd
}
