//go:build tools

package tools
import (
 _ "github.com/segmentio/kafka-go"
 _ "github.com/redis/go-redis/v9"
 _ "github.com/go-redsync/redsync/v4"
 _ "github.com/go-redsync/redsync/v4/redis/goredis/v9"
 _ "golang.org/x/time/rate"
 _ "github.com/urfave/cli/v2"
 _ "github.com/twmb/franz-go/pkg/kfake"
 _ "github.com/alicebob/miniredis/v2"
 _ "github.com/stretchr/testify/require"
 _ "go.uber.org/goleak"
 _ "golang.org/x/sync/errgroup"
 _ "github.com/schollz/progressbar/v3"
)

